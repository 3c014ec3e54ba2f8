"""The distributed workflow in the session: launch a scenario's ranks, measure every rank, gate the maximum over
ranks like any result (a fresh launch is a fresh set of processes, so the gate replicates by launching again);
and A/B of two configurations of a distributed scenario, in the same ranks."""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Callable, Mapping

from bench_core.core.records import Measurement
from bench_core.core.scenario import Scenario
from bench_core.timing.counts import QUICK
from bench_core.workflows.distributed import launch as launcher
from bench_core.workflows.distributed.launch import (BACKENDS, Topology, ab_result, builder_location, measurement_from,
                                                     preflight)
from bench_core.workflows import measured
from bench_core.workflows.outcome import Outcome
from bench_core.workflows.stored_gate import gate


def run_distributed(session, scenario: Scenario, build: Callable, *, nproc: int = 2,
                    params: Mapping[str, Any] | None = None, items_per_rank: int | None = None,
                    warmup: int | None = None, repeats: int | None = None, validate: bool = True,
                    scaling: bool = False) -> Outcome:
    """Launch the scenario's ranks (`build(ctx) -> RankStep`, a module-level function), measure every rank, and
    gate the maximum over ranks. The command line's topology beats `nproc`. With `scaling`, the same step also
    runs at world size 1, for the weak-scaling efficiency."""
    topology = session.config.topology or Topology(nproc)
    w, r = measured.counts(session.config, warmup, repeats)
    scenario = scenario.with_metadata(device=session.config.device)
    spec = rank_spec(session, scenario.name, build, topology, params, warmup=w, repeats=r, validate=validate)
    launches = iter(range(1, 1000))

    def launch(ranks: Topology, validate_now: bool) -> Measurement:
        doc = launcher.run_ranks(scenario.name, {**spec, "validate": validate_now}, ranks, session.config.timeout_s,
                        launch=next(launches))
        return measurement_from(scenario, doc, device=session.config.device, warmup=w, repeats=r,
                                items_per_rank=items_per_rank, environment=session.environment)

    m = launch(topology, validate)
    if scaling and topology.world_size > 1 and topology.nnodes == 1 and not session.config.quick:   # a launch more
        one = launch(Topology(1), False)
        m = replace(m, ranks=replace(m.ranks, one_rank_ms=one.primary_ms))
    if session.config.count_flops:
        session.not_counted(scenario.name, "FLOPs not counted", "distributed scenarios are not counted yet")
    return gate(session, m, lambda: launch(topology, False))


def diagnose_distributed(session, scenario: Scenario, build: Callable, *, nproc: int = 2,
                         params: Mapping[str, Any] | None = None, warmup: int | None = None,
                         repeats: int | None = None, **_measured) -> None:
    """The diagnose pass of a measured distributed scenario, after its outcome is recorded: a launch of its own,
    one trace per rank, with the spec it was measured with."""
    from bench_core.workflows.diagnose.passes import profile_distributed

    topology = session.config.topology or Topology(nproc)
    w, r = measured.counts(session.config, warmup, repeats)
    spec = rank_spec(session, scenario.name, build, topology, params, checked=False, warmup=w, repeats=r,
                     validate=False)
    profile_distributed(session, scenario.name, spec, topology)


def rank_spec(session, name: str, build: Callable, topology, params: Mapping[str, Any] | None, *,
              checked: bool = True, **mode) -> dict:
    """What every rank is told: where the builder is, this session's device and settings, and the mode's
    counts; the topology checked before any process starts (a ScenarioError of scenario `name`), unless it was
    already (`checked=False`: the rendezvous port is not probed again after a launch)."""
    backend = preflight(name, topology, session.config.device) if checked else BACKENDS[session.config.device]
    file, function = builder_location(name, build)
    return {"scenario": name, "builder_file": file, "builder": function,
            # this process's import path: a builder imports what the benchmark file imports
            "import_roots": [p for p in sys.path if p], "params": dict(params or {}),
            "device": session.config.device, "quick": session.config.quick, "seed": 0,
            "threads": session.config.threads, "backend": backend,
            "malloc_pinned": session.environment.get("malloc") == "pinned",
            "collective_timeout_s": session.config.timeout_s or 1800, **mode}


def ab_distributed(session, name: str, build: Callable, baseline: Mapping[str, Any], candidate: Mapping[str, Any],
                   *, nproc: int = 2, params: Mapping[str, Any] | None = None, rounds: int = 16,
                   pairs: int = 16, warmup: int = 1, alpha: float = 0.01, min_effect: float = 0.01):
    """Two configurations of a distributed scenario (`baseline` and `candidate`: the parameters each side's
    `build(ctx)` gets on top of `params`), in the same ranks, rounds of fresh instances of both; decided
    like `ab_rounds` on the slowest rank of each step, after checking both sides start and end equal.
    The default of 16 rounds x 16 pairs is measured in docs/distributed.md."""
    from bench_core.workflows.ab import source_identity

    topology = session.config.topology or Topology(nproc)
    if session.config.quick:
        rounds, pairs, warmup = QUICK.rounds, QUICK.pairs, 0
    spec = rank_spec(session, name, build, topology, params, warmup=warmup, rounds=rounds, pairs=pairs,
                     ab={"baseline": dict(baseline), "candidate": dict(candidate)})
    doc = launcher.run_ranks(name, spec, topology, session.config.timeout_s)
    code = source_identity(build)
    res = ab_result(doc, alpha=alpha, min_effect=min_effect, environment=session.environment,
                    params={"device": session.config.device, "rounds": rounds, "pairs": pairs, "warmup": warmup,
                            "alpha": alpha, "min_effect": min_effect, "seed": 0, "shared_params": dict(params or {}),
                            "order": "random per pair; both sides built anew every round, in the same ranks"},
                    identities={"baseline": {**code, "params": dict(baseline)},
                                "candidate": {**code, "params": dict(candidate)}})
    return Outcome(name, decision=res)
