"""Side by side for a distributed scenario: each side's ranks launched from its own tree (its builder file, its
import roots first, the launcher in its counterpart of this folder, by its interpreter), a fresh launch of each
side every round, the sides' order alternating round by round; each launch's per-step figure is the slowest
rank's, its median the round's figure for its side, and the rounds are decided by the one rounds decision every
side-by-side scenario takes. Each side's ranks report the project files they loaded, and a side that ran the other
tree's differing code fails the scenario, naming the file."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from bench_core.core.errors import ScenarioError
from bench_core.core.records import Measurement
from bench_core.core.scenario import Scenario
from bench_core.timing.protocol import Rounds
from bench_core.timing.sampling import Sample
from bench_core.workflows.distributed import launch as launcher
from bench_core.workflows.distributed.launch import Topology, measurement_from
from bench_core.workflows import measured
from bench_core.workflows.distributed.launched import rank_spec, run_distributed
from bench_core.workflows.outcome import Outcome
from bench_core.workflows.side_by_side.compare import Judge, check_processes

SIDES_ORDER = (("baseline", "candidate"), ("candidate", "baseline"))   # alternated round by round


def their_roots(roots, current_root: Path, rev_root: Path, own_environment: bool = False) -> list[str]:
    """The revision's import roots: each root inside this tree as its counterpart in the revision's tree (where it
    has one), the others (the environment's) as they are; none of them where its ranks run in an environment of
    their own (`own_environment`: --bench-against-python), whose packages are its own."""
    out = []
    for p in roots:
        q = Path(p).resolve()
        if q.is_relative_to(current_root):
            there = rev_root / q.relative_to(current_root)
            if there.exists():
                out.append(str(there))
        elif not own_environment:
            out.append(p)
    return out


def _sides(loaded, spec: Mapping[str, Any], theirs: Path, python: str | None) -> tuple[dict, dict, dict]:
    """Each side's rank spec, launch folder and interpreter: the revision's builder file and import roots, its
    counterpart of this folder (its root where it has none), --bench-against-python's interpreter."""
    proof_roots = [str(loaded.current_root), str(loaded.root)]
    pythons = {"candidate": sys.executable, "baseline": python or sys.executable}
    here = Path.cwd().resolve()
    specs = {"candidate": {**spec, "proof_roots": proof_roots},
             "baseline": {**spec, "proof_roots": proof_roots, "builder_file": str(theirs),
                          "import_roots": their_roots(spec["import_roots"], loaded.current_root, loaded.root,
                                                      own_environment=pythons["baseline"] != sys.executable)}}
    there = loaded.root / here.relative_to(loaded.current_root) if here.is_relative_to(loaded.current_root) else here
    return specs, {"candidate": here, "baseline": there if there.is_dir() else loaded.root}, pythons


def against_distributed(session, scenario: Scenario, build: Callable, *, nproc: int = 2,
                        params: Mapping[str, Any] | None = None, items_per_rank: int | None = None,
                        warmup: int | None = None, repeats: int | None = None, validate: bool = True,
                        scaling: bool = False) -> Outcome:
    """The scenario measured on both sides (see the module), decided; the current side's result is its first
    launch (validated, as a plain run's), with every rank kept."""
    loaded, a, name = session.revision, session.config.against, scenario.name
    topology = session.config.topology or Topology(nproc)
    w, r = measured.counts(session.config, warmup, repeats)
    scenario = scenario.with_metadata(device=session.config.device)
    spec = rank_spec(session, name, build, topology, params, warmup=w, repeats=r, validate=False)
    mine = Path(spec["builder_file"])
    label = loaded.revision.label
    # a builder outside the repository (an installed package's) is the same file on both sides
    theirs = loaded.counterpart(mine) if mine.is_relative_to(loaded.current_root) else mine
    if not theirs.exists():
        return run_distributed(session, scenario, build, nproc=nproc, params=params, items_per_rank=items_per_rank,
                               warmup=warmup, repeats=repeats, validate=validate, scaling=scaling).alone(
            f"measured on the current tree only: {theirs.relative_to(loaded.root)} does not exist in {label}", new=True)
    for asked, what in ((scaling, "the one-rank scaling figure"), (session.config.count_flops, "FLOPs"),
                        (session.config.profile is not None, "the diagnose pass")):
        if asked:
            session.not_counted(name, f"{what} not taken", "side by side measures the step time only")
    specs, cwds, pythons = _sides(loaded, spec, theirs, a.python)
    rounds = a.looks(session.config.quick)[0]
    samples: dict[str, list] = {"baseline": [], "candidate": []}
    cold: dict[str, list] = {"baseline": [], "candidate": []}
    ran: dict[str, list] = {"baseline": [], "candidate": []}
    first: dict[str, Measurement] = {}
    launches = iter(range(1, 100_000))

    def launch(side: str) -> Measurement:
        check = validate and side == "candidate" and side not in first   # the current side's, as a plain run's
        doc = launcher.run_ranks(name, {**specs[side], "validate": check}, topology, session.config.timeout_s,
                                 launch=next(launches), cwd=cwds[side], python=pythons[side])
        ran[side].append({"files": doc.get("loaded", {}), "interpreter": pythons[side], "torch": doc.get("torch")})
        return measurement_from(scenario, doc, device=session.config.device, warmup=w, repeats=r,
                                items_per_rank=items_per_rank, environment=session.environment)

    for k in range(rounds):
        for side in SIDES_ORDER[k % 2]:
            try:
                m = launch(side)
            except ScenarioError as exc:
                if side == "candidate":
                    raise
                return run_distributed(session, scenario, build, nproc=nproc, params=params,
                                       items_per_rank=items_per_rank, warmup=warmup, repeats=repeats,
                                       validate=validate, scaling=scaling).alone(
                    f"not compared: {label} failed in round {k + 1} of {rounds}: {exc.problem}")
            first.setdefault(side, m)
            # a launch is one draw of its processes' biases: its median is the round's figure for its side
            # (pairing the two launches' samples one by one would pair nothing that ran together)
            samples[side].append((Sample(float(np.median(m.host_ms)),
                                         None if m.gpu_ms is None else float(np.median(m.gpu_ms))),))
            cold[side].append(Sample(m.cold_start.first_call_ms, m.cold_start.first_call_gpu_ms))
    check_processes(name, ran, loaded)
    res = Rounds(baseline=tuple(samples["baseline"]), candidate=tuple(samples["candidate"]),
                 cold={side: tuple(v) for side, v in cold.items()}, seed=a.seed)
    m = first["candidate"]
    thr = scenario.noise_threshold if scenario.noise_threshold is not None else a.threshold
    judge = Judge(scenario, session.config.device, thr, replace(session.config.gate, threshold=thr),
                  session.family_size, (rounds,))
    commit = loaded.revision.commit
    c = replace(judge(res, m.timer), method=(
        f"side by side with {a.label} ({commit[:12] if commit else 'no commit'}): {rounds} rounds, each side's "
        f"{topology.world_size} rank(s) launched afresh from its own tree every round, the order alternating; the "
        f"slowest rank per step"))
    return Outcome.side_by_side_of(m, c, res.to_dict(), {"why_processes": "a distributed scenario: each side's ranks "
                                                                          "are processes of their own",
                                                          "processes_ran": ran})
