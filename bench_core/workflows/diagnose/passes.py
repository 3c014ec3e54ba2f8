"""The diagnose workflow: one profiler pass after a scenario's measurement (never inside it), with the
roofline's hypotheses beside the trace's; for a distributed scenario, a launch of its own with one trace per
rank and what the ranks' traces say together."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

from bench_core.core.records import Measurement
from bench_core.core.redact import redact
from bench_core.files import artifacts
from bench_core.timing.flops import bandwidth_for, peak_flops_for
from bench_core.workflows.counted_work import measure_cpu_roofs
from bench_core.workflows.diagnose.profile import ProfileResult, profile
from bench_core.workflows.diagnose.trace_analysis import Hypothesis, TraceFacts, rank_hypotheses, roofline_hypotheses


def diagnose_after(session, m: Measurement, fn: Callable[[], Any], setup: Callable[[], Any] | None) -> None:
    if session.config.profile.with_flops:
        measure_cpu_roofs(session)
    peak = peak_flops_for(m, session.environment, session.config.peak_tflops)
    roof = () if m.work is None else tuple(roofline_hypotheses(m.work, m.summary.median / 1e3, peak,
                                                               bandwidth_for(m, session.environment)))
    session.record_profile(profile(m.name, fn, session.config.profile, setup=setup, peak_flops=peak, extra=roof))


def profile_distributed(session, name: str, spec: Mapping[str, Any], topology) -> None:
    """One trace per rank, each with its hypotheses, and what the ranks' traces say together (communication not
    overlapped, a rank the others wait for) in a file beside."""
    from bench_core.workflows.distributed.launch import run_ranks

    cfg = asdict(session.config.profile)
    cfg["folder"] = str(Path(cfg["folder"]).resolve())
    doc = run_ranks(name, {**spec, "scenario": name, "profile": cfg}, topology, session.config.timeout_s, launch=0)
    facts = [TraceFacts.from_dict(r["profile"]["facts"]) for r in doc["ranks"]]
    together = rank_hypotheses(facts)
    for r, f in zip(doc["ranks"], facts):
        p = r["profile"]
        rows = tuple(Hypothesis(**h) for h in p["hypotheses"])
        if r["rank"] == 0:   # the ranks' joint rows once, with rank 0's report
            rows += tuple(together)
        session.record_profile(ProfileResult(p["scenario"], None if p["trace"] is None else Path(p["trace"]),
                                              p["redaction"], p["table"], f, rows, p["refused"]))
    if together:
        clean, _ = redact([h.to_dict() for h in together])
        shown, _ = redact(name)
        artifacts.write_rank_hypotheses(Path(cfg["folder"]), shown, {
            "scenario": shown, "traces": [r["profile"]["trace"] for r in doc["ranks"]],
            "facts": [f.to_dict() for f in facts], "hypotheses": clean})
