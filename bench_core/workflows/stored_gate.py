"""The stored-baseline gate: measure a scenario in this process (`workflows.measured`) and, when the session
compares with a stored baseline, decide it there and then; a possible change (slower or faster) this process
cannot decide is measured again in fresh processes (`workflows.replicas`), look by look, and decided on all the
runs (a slow process cannot tell its own state from a regression, other processes can)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from bench_core.core.errors import ScenarioError
from bench_core.core.records import Measurement
from bench_core.core.scenario import Scenario
from bench_core.deciding.comparison import Comparison
from bench_core.deciding.estimate import estimate, noise_prior
from bench_core.deciding.gate import baseline_warnings, decide_family, gate_advice
from bench_core.deciding.sequential import replicate_until_decided
from bench_core.deciding.signature_diff import latest
from bench_core.files import storage
from bench_core.workflows import measured
from bench_core.workflows.outcome import Outcome
from bench_core.workflows.replicas import Replica
from bench_core.workflows.counted_work import (count_op_times, count_signature, count_work, counts_signature,
                                               with_facts)


def load_baseline(config) -> tuple[dict[str, list[Measurement]], Any, list[str]]:
    """The baseline's runs by scenario, the run-to-run variance prior fitted from them, and what makes the
    baseline hard to trust, in words."""
    baseline = storage.by_scenario(storage.load_baseline(config.baselines_dir, config.compare))
    prior = noise_prior(baseline)
    created = [r["created"] for r in storage.baseline_runs(config.baselines_dir, config.compare)]
    notes = baseline_warnings(config.compare, created[-config.gate.window:] if config.gate.window else created,
                              prior=prior)
    return baseline, prior, notes


def run(session, scenario: Scenario, fn: Callable[[], Any], replica: Replica | None, **kwargs) -> Outcome:
    """Measure (and count the step's work, where asked), and gate against the stored baseline, measuring again in
    fresh processes started as `replica` says where one run cannot decide."""
    first = measured.measure(session, scenario, fn, **kwargs)
    if session.config.count_flops:  # after the timed window, profiler-free: one more step, counted
        first = count_work(session, first, fn, kwargs.get("setup"))   # before the gate, which compares the counts
    if counts_signature(session, scenario):    # the same: what one step does, counted exactly
        first = count_signature(session, first, fn, kwargs.get("setup"))
        if not session.config.quick:            # and where its time goes, for a later verdict's explanation
            first = count_op_times(session, first, fn, kwargs.get("setup"))
    if session.config.instructions:
        session.not_counted(scenario.name, "instructions not counted", "they are counted side by side "
                            "(--bench-against), where each side has a process of its own")
    counts = measured.counts(session.config, kwargs.get("warmup"), kwargs.get("repeats"))
    again = None if replica is None else (lambda: replica.measure(scenario.name, session.environment, *counts,
                                                                  session.config.timeout_s))
    return gate(session, first, again)


def _explained(c: Comparison, base, runs) -> Comparison:
    """A slower or faster verdict with where the time moved: this run's profiler pass against the baseline runs'
    (both taken with the work signature), named only where the passes establish it (`deciding.explained`);
    unchanged where either side has none."""
    from bench_core.deciding.explained import explained
    from bench_core.deciding.verdicts import FASTER, SLOWER

    theirs = [r.op_times for r in base if r.op_times is not None]
    ours = [r.op_times for r in runs if r.op_times is not None]
    if c.verdict not in (SLOWER, FASTER) or not theirs or not ours:
        return c
    step = c.candidate_median - c.baseline_median if None not in (c.candidate_median, c.baseline_median) else None
    return replace(c, moved=tuple(explained(theirs, ours, step)))


def gate(session, m: Measurement, replicate: Callable[[], Measurement] | None = None) -> Outcome:
    """Compare one fresh result with the baseline: the result to keep, its comparison and the fresh-process runs
    it took.

    Decided now, before the other scenarios exist, so the family adjustment is Bonferroni over every scenario
    the baseline holds. `replicate()` is one more run in a fresh process.
    """
    if session.baseline is None:
        return Outcome(m.name, m)
    config = session.config.gate
    base = session.baseline.get(m.name, ())
    runs = [m]

    def judge(runs) -> Comparison:
        (c,) = decide_family([estimate(m.name, base, runs, config, session.prior)], config,
                             family_size=len(session.baseline),
                             advice=gate_advice(session.config.compare, chase=config.chase))
        return c

    why_not = []

    def fresh():
        if session.progress is not None:
            session.progress.note(m.name, f"possible change: measuring again in fresh process {len(runs)} "
                                          f"(runs go up to {config.max_runs})")
        try:
            return replicate()
        except ScenarioError as exc:
            why_not.append(f"replication stopped: {exc.problem}")
            return None
    c = replicate_until_decided(runs, judge, None if replicate is None else fresh, config)
    extra = len(runs) - 1
    method = f"stored baseline ({c.baseline_runs} runs) vs this process" + (
        f" and {extra} fresh process(es)" if extra else "")
    c = replace(c, method=method, reason="; ".join([c.reason, *why_not]))
    c = with_facts(session, c, latest(base), m.signature, m.scenario)   # against the latest baseline run's
    c = _explained(c, base, runs)
    return Outcome(m.name, m, c, replicas=tuple(runs[1:]))
