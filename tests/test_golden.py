"""A seeded fake-clock session through every workflow, compared with what it printed and decided before.

Plain run, stored-baseline gate with fresh-process replication, side by side with a revision, A/B with one
instance a side and A/B with rounds of fresh instances: verdicts, intervals, p-values and the report's text
are kept in `golden/session.json`. A change that moves code around must leave every one of them as it was;
a change that means to alter a figure rewrites the file on purpose (`BENCH_GOLDEN_WRITE=1 pytest
tests/test_golden.py`) and says so in its commit.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench_core import Scenario, measure
from bench_core.deciding.comparison import GateConfig
from bench_core.timing.protocol import Instance
from bench_core.workflows.ab import ab, ab_rounds
from bench_core.workflows.outcome import Outcome
from bench_core.session import BenchSession, SessionConfig
from bench_core.workflows.side_by_side.compare import AgainstConfig
from bench_core.workflows.side_by_side.revisions import Revision
from fakes import FakeClock
from helpers import ENV, FreshProcesses

ITEMS = {"fwd": 8}
GOLDEN = Path(__file__).parent / "golden" / "session.json"


def _steps(clock, levels):
    """A step whose i-th call takes levels[i] ms (the last repeats), with a seeded jitter of 1%."""
    rng = np.random.default_rng(len(levels))
    state = {"i": 0}

    def fn():
        clock.advance_ms(levels[min(state["i"], len(levels) - 1)] * (1 + 0.01 * rng.standard_normal()))
        state["i"] += 1
    return fn


def _session(tmp_path, **kw):
    return BenchSession(SessionConfig(**{"results_dir": tmp_path / "res", "baselines_dir": tmp_path / "bl",
                                         "repeats": 12, "warmup": 1, "threads": 1, **kw}), ENV)


def _scenarios():
    return [Scenario("fwd", ("forward",), {"dtype": "float32", "batch": 8}),
            Scenario("train", ("forward", "backward", "optimizer_step"), {"dtype": "float32"})]


def _plain_and_stored_gate(tmp_path) -> dict:
    levels = {"fwd": 2.0, "train": 5.0}
    out = {}
    for run in range(5):                 # the baseline: five runs, each its own session and clock
        s = _session(tmp_path, save="main", append=run > 0)
        clock = FakeClock()
        for sc in _scenarios():
            s.run(sc, _steps(clock, [levels[sc.name] * (1 + 0.01 * run)]), clock=clock, items=ITEMS.get(sc.name))
        if run == 0:
            out["plain"] = _texts(s)
        s.finish()

    def replicate_at(name, level):
        def replicate(warmup, repeats):
            clock = FakeClock()
            sc = next(x for x in _scenarios() if x.name == name).with_metadata(device="cpu")
            return measure(_steps(clock, [level]), scenario=sc, warmup=warmup, repeats=repeats, clock=clock,
                           environment=ENV)
        return replicate

    s = _session(tmp_path, compare="main", gate=GateConfig())
    s.family_size = 2
    clock = FakeClock()
    now = {"fwd": 2.0 * 1.4, "train": 5.0}      # fwd regressed by 40%, train did not
    for sc in _scenarios():
        s.run(sc, _steps(clock, [now[sc.name]]), clock=clock, items=ITEMS.get(sc.name),
              replica=FreshProcesses(replicate_at(sc.name, now[sc.name])))
    out["gate"] = {"comparisons": [_comparison(c) for c in s.comparisons], "fails": [s.fails(c) for c in s.comparisons],
                   "outcome": s.outcome(), **_texts(s)}
    return out


def _comparison(c) -> dict:
    d = c.to_dict()
    keep = ("name", "verdict", "ratio", "ci_low", "ci_high", "p_value", "p_adjusted", "baseline_runs",
            "candidate_runs", "method", "reason", "adjustment", "looks")
    return {k: (round(d[k], 9) if isinstance(d.get(k), float) else d.get(k)) for k in keep}


def _texts(s) -> dict:
    # the created-at dates of stored runs are the only figures that differ from run to run of this test
    return {title: re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+", "<date>", text) for title, text in s.summary_sections()}


def _side_by_side() -> dict:
    rng = np.random.default_rng(11)
    biases = {(side, r): float(np.exp(rng.normal(0, 0.03))) for side in ("baseline", "candidate") for r in range(12)}
    clock = FakeClock()

    def build(side, ms):
        return lambda r: Instance(lambda: clock.advance_ms(ms * biases[(side, r)]))
    s = BenchSession(SessionConfig(results_dir=None, threads=1,
                                   against=AgainstConfig("HEAD", rounds=4, pairs=2, max_rounds=12)),
                     ENV)
    s.revision = SimpleNamespace(revision=Revision("HEAD", "0123456789abcdef"),
                                 current=Revision("working tree", "fedcba9876543210"), compiled=None,
                                 not_here=lambda files, ran: [])   # every test of the revision's is here
    s.family_size = 1
    cand = build("candidate", 5.4)
    s.run_against(Scenario("s", ("compute",)), cand(0), cand, build("baseline", 5.0), clock=clock)
    return {"comparisons": [_comparison(c) for c in s.comparisons], "rounds": s.side_by_side[0].to_dict()["rounds"],
            **_texts(s)}


def _ab() -> dict:
    clock = FakeClock()
    plain = ab(_steps(clock, [2.0]), _steps(clock, [1.8]), clock=clock, repeats=20, warmup=2, name="plain")
    rng = np.random.default_rng(8)

    def factory(ms):
        return lambda: (lambda k=float(np.exp(rng.normal(0, 0.005))): clock.advance_ms(ms * k))
    rounds = ab_rounds(factory(2.1), factory(2.0), clock=clock, name="rounds")
    s = BenchSession(SessionConfig(results_dir=None), ENV)
    s.record(Outcome("plain", decision=plain))
    s.record(Outcome("rounds", decision=rounds))
    keep = ("verdict", "speedup", "ci_low", "ci_high", "p_value", "reason")
    return {name: {k: getattr(r, k) for k in keep} for name, r in s.decisions} | _texts(s)


def run_everything(tmp_path) -> dict:
    return json.loads(json.dumps({"plain_and_gate": _plain_and_stored_gate(tmp_path), "side_by_side": _side_by_side(),
                                  "ab": _ab()}))


def test_every_workflow_decides_and_prints_as_before(tmp_path):
    got = run_everything(tmp_path)
    if os.environ.get("BENCH_GOLDEN_WRITE"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    for part in want:
        assert got[part] == want[part], part
