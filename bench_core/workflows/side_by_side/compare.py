"""Side by side with another git revision (`--bench-against REV`): both versions of a scenario measured in this
run, in rounds of fresh instances alternated pair by pair (or, for code that cannot be loaded twice into one
process, in pairs of worker processes), and decided by the one rounds decision with the gate's verdicts."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from bench_core.core.errors import ScenarioError
from bench_core.core.records import ColdStart, Measurement, Memory
from bench_core.core.scenario import Scenario
from bench_core.deciding.explained import explained
from bench_core.files.atomic import ignored_by_git
from bench_core.files.children import LIMIT_S
from bench_core.deciding.comparison import Comparison
from bench_core.deciding.estimate import scenario_differences
from bench_core.deciding.gate import decide_family
from bench_core.deciding.rounds import estimate_rounds
from bench_core.deciding.sequential import planned_looks, possible_change
from bench_core.deciding.verdicts import FASTER, SLOWER
from bench_core.timing.backends import CpuBackend, backend_for
from bench_core.timing.counts import QUICK
from bench_core.timing.protocol import (PAIRS_MAX, ROUND_PAIRS_MS, ROUND_WARM_MS, SideError, on_side, run_processes,
                                        run_rounds, run_served, with_pair)
from bench_core.timing.sampling import Sampler, set_threads
from bench_core.workflows import measured
from bench_core.workflows.outcome import Outcome
from bench_core.workflows.side_by_side.fidelity import kept_note


@dataclass(frozen=True)
class AgainstConfig:
    """Side by side with another revision (`--bench-against REV`): rounds of fresh instances, pairs per round.

    The threshold is smaller than the stored-baseline gate's: alternated samples in one process agree far
    more closely than separate runs do (docs/side-by-side.md has the figures).

    Sequential: the first look comes after `rounds` rounds; a possible change (either way) it leaves undecided runs
    on, look by look every `rounds` rounds, up to `max_rounds` (3 x rounds unless given), alpha split
    over the looks, so more rounds are spent only where they are needed.
    """

    rev: str | None          # None: this tree, compared in another interpreter (`python`)
    rounds: int = 12         # 12 x (a first call and 2 samples a side, 1 call ahead): 85 calls at the first look
    pairs: int = 2           # the least: with each sample after a call of its own step, a third and fourth pair of
                             # a step of some 20 ms buy less than they cost (docs/side-by-side.md); a short step
                             # gets more (`pairs_ms`)
    warmup: int = 0          # calls after the first, whatever they take; `warm_ms` is what settles an instance
    warm_ms: float = ROUND_WARM_MS   # each instance's first call and untimed calls after it take this long at least
    pairs_ms: float = ROUND_PAIRS_MS  # more pairs (up to PAIRS_MAX) for a step whose pairs would take less
    seed: int = 0
    threshold: float = 0.02
    max_rounds: int | None = None
    processes: int = 6       # worker mode: pairs of processes (the unit of evidence there), the session's pool
    quick_processes: int = QUICK.worker_pairs   # the same under --bench-quick (--bench-worker-pairs sets both)
    process_rounds: int = 2  # worker mode: rounds of fresh instances in each pair
    processes_only: bool = False   # every scenario in process mode, not only where one process cannot hold both
    python: str | None = None      # the revision's side in this interpreter (another environment)
    build: str | None = None       # how the project builds its compiled code in place, run in the revision's tree

    def __post_init__(self):
        if self.rounds < 3 or self.pairs < 1:
            raise ValueError(f"--bench-against needs at least 3 rounds and 1 pair per round, got {self.rounds} "
                             f"and {self.pairs} (the interval comes from the spread between rounds)")
        if min(self.processes, self.quick_processes) < 3:
            raise ValueError(f"--bench-worker-pairs needs at least 3 pairs of processes, got "
                             f"{min(self.processes, self.quick_processes)} (the interval comes from the spread between "
                             f"pairs)")
        if self.max_rounds is None:
            object.__setattr__(self, "max_rounds", 3 * self.rounds)
        if self.max_rounds < self.rounds:
            raise ValueError(f"--bench-max-rounds ({self.max_rounds}) must be at least --bench-rounds "
                             f"({self.rounds}); equal to it turns the later looks off")

    @property
    def in_processes(self) -> bool:
        return self.processes_only or self.python is not None

    @property
    def label(self) -> str:
        where = f" under {self.python}" if self.python else ""
        return f"{self.rev or 'this tree'}{where}"

    def looks(self, quick: bool = False) -> tuple[int, ...]:
        """The numbers of rounds at which a scenario may be decided."""
        if quick:
            return (QUICK.rounds,)
        return planned_looks(self.rounds, self.max_rounds, self.rounds)


def _cpus_held_text(threads: int | None) -> str:
    import random

    from bench_core.timing.sampling import shared_cpus

    return (", both of a round's children held to the same CPU(s), drawn per round from those other work left free"
            if shared_cpus(random.Random(0), threads) is not None else "")


def _malloc_text(pinned: bool) -> str:
    return ", glibc malloc thresholds pinned" if pinned else ""


def _pairs_text(pairs: int, a: AgainstConfig) -> str:
    more = f" (more, up to {PAIRS_MAX}, where {pairs} would take under {a.pairs_ms:g} ms)" if a.pairs_ms > 0 else ""
    return f"{pairs} pairs{more}"


def open_revision(session, root: Path, project: Path | None = None) -> None:
    """Extract --bench-against's revision and make it importable beside the current code, and give its tree the
    compiled code its side runs (built by --bench-against-python's interpreter, when given; with no revision, in a
    copy of this tree); `project`: pytest's rootdir, whose counterpart in the revision's tree is where its build
    runs (a package in a subfolder of its repository). (glibc malloc's thresholds were pinned in this process at
    the session's start, `--bench-malloc`, as in process mode's servers, so that a step that frees large blocks
    does not fault them in afresh on some calls and not others.)"""
    from bench_core.workflows.side_by_side.revisions import LoadedRevision

    from bench_core.workflows.side_by_side import compiled

    c = session.config   # its stored baselines and references are data, not code: they never make the tree dirty
    own = [p if p.suffix == "" else p.parent for p in (c.results_dir, c.history) if isinstance(p, Path)]
    session.revision = loaded = LoadedRevision(root, c.against.rev, data=(c.baselines_dir, c.references_dir, *own))
    try:
        code = (compiled.survey_tree(loaded.current_root) if c.against.rev is None else
                compiled.survey(loaded.current_root, loaded.root, loaded.revision.commit))
    except OSError as exc:   # git could not list the trees
        raise compiled.CompiledError(f"the trees' compiled code could not be listed: {exc}") from None
    python = compiled.Interpreter.of(c.against.python) if c.against.python and code.present else None
    if not code.present or (c.against.rev is None and (python is None or
                                                      python.runs_builds_of(compiled.Interpreter.this()))):
        return   # (one tree, and an interpreter that runs this one's builds: both sides run the same binaries)
    label, tree = loaded.revision.label, None
    if c.against.rev is None:   # one tree in two interpreters: the other's side gets a copy to build in
        loaded.use_copy()
        # what the copy holds: the commit, this tree's changes, and its compiled sources as read now
        label = "the other interpreter"
        tree = f"{loaded.current.commit}:{loaded.current.diff_sha256}:{code.digests[0]}"
    cache = compiled.cache_folder(loaded.current_root / ".bench" / "builds")
    ignored_by_git(cache)
    top, here = loaded.current_root.resolve(), Path(project or root).resolve()
    where = here.relative_to(top).as_posix() if here.is_relative_to(top) else "."
    loaded.compiled = compiled.prepare(code, loaded.current_root, loaded.root, label, loaded.revision.commit or "",
                                       c.against.build, cache, where, python, tree)


def worker_pool(session):
    """The worker processes of this session's worker-mode comparisons, kept from scenario to scenario."""
    if session.workers is None:
        from bench_core.workflows.worker import WorkerPool

        session.workers = WorkerPool(session.config.timeout_s or LIMIT_S)
    return session.workers


def close_revision(session) -> None:
    """The revision's extracted tree, and every worker process that served it, ended."""
    if session.workers is not None:
        session.workers.close()
    if session.revision is not None:
        session.revision.close()


def run_against(session, scenario: Scenario, live, rebuild: Callable[[int], Any], rev_build: Callable[[int], Any],
                *, items: int | None = None, proof: Mapping[str, Any] | None = None, clock=None,
                backend=None, servers: Callable[[], Mapping] | None = None) -> Outcome:
    """Measure the current code (`live`, then `rebuild(round)`) and the revision's (`rev_build(round)`)
    side by side in this process; the outcome holds the current side's result and the decision. The revision
    failing leaves the current side measured on its own, with the reason kept; the current side failing
    fails the scenario. `servers()`: each side's server, for what only a process of its own can count (host
    instructions)."""
    a, quick = session.config.against, session.config.quick
    looks, pairs = a.looks(quick), QUICK.pairs if quick else a.pairs
    build = {"candidate": lambda r: live if r == 0 else rebuild(r), "baseline": rev_build}

    def explain():   # a slower or faster verdict: where the time moved, from alternated profiler passes of each side
        from bench_core.workflows.diagnose.moved import alternated, op_times

        theirs = on_side("baseline", lambda: rev_build(-1))
        dev = session.config.device
        got = alternated({"baseline": lambda: op_times(theirs.fn, theirs.setup, device=dev),
                          "candidate": lambda: op_times(live.fn, live.setup, device=dev)})
        return got["baseline"], got["candidate"]

    def signatures():   # after the rounds: one step of each side, counted exactly (a fresh revision instance)
        from bench_core.workflows.counted_work import signature_of

        theirs = on_side("baseline", lambda: rev_build(-1))
        return (signature_of(session, scenario.name, theirs.fn, theirs.setup, "revision"),
                signature_of(session, scenario.name, live.fn, live.setup, "current"))

    def sides(judge):
        return run_rounds(build, Sampler(scenario.name, backend or backend_for(session.config.device), clock),
                          rounds=looks[0], pairs=pairs, warmup=a.warmup, warm_ms=a.warm_ms, seed=a.seed,
                          extend_to=looks[1:], go_on=judge.go_on, pairs_ms=a.pairs_ms)
    how = (f"{looks[0]} rounds" if len(looks) == 1 else
           f"{looks[0]} rounds, {looks[-1]} at most for a possible change (looks at {', '.join(map(str, looks))})")
    method = f"{how} x {_pairs_text(pairs, a)}, fresh instances every round, one process" + \
        _malloc_text(session.environment.get("malloc") == "pinned")
    return _side_by_side(session, scenario, live, sides, method, items, proof, clock, backend, looks,
                         signatures=signatures, explain=explain,
                         instructions=None if servers is None else lambda: count_instructions(session, scenario.name,
                                                                                             servers()))


def run_against_processes(session, scenario: Scenario, live, sides: Mapping[str, tuple[Mapping, Mapping]], *,
                          items: int | None = None, proof: Mapping[str, Any] | None = None) -> Outcome:
    """The same with each side in pytest processes of its own (`sides[side]`: its servers' init and the test item
    they serve, see `workflows.worker`). Where the servers can fork, every round runs the test item afresh in a
    freshly forked child, with a heap laid out afresh, from a server that never ran the step (so every child starts
    from the allocator state a fresh process of the side has: `workflows.side_server`); each round is then a unit
    of evidence and the looks are those of one process. Where the servers cannot fork (CUDA), each process keeps a
    bias of its own, so the pair of processes is the unit: more pairs, a wider interval, and the method says so.
    Servers are the session's pool, kept from scenario to scenario of one test file. The current side's result is
    its own samples, or a plain measurement of `live`."""
    from bench_core.workflows.side_server import can_fork

    a, quick = session.config.against, session.config.quick
    pool = worker_pool(session)
    proof = dict(proof or {})
    ran = proof["processes_ran"] = {side: [] for side in sides}    # each server's own word on what it loaded
    malloc = _malloc_text(session.config.malloc == "pinned")
    sampler = Sampler(scenario.name, CpuBackend())
    spawn = {side: (lambda j, side=side: pool.get(side, j, *sides[side])) for side in sides}
    release = _release_to(pool, lambda side, report: ran[side].append(report))

    if can_fork(session.config.device):
        looks, pairs = a.looks(quick), QUICK.pairs if quick else a.pairs
        # a child's first call is not a cold start of the side as a plain run has it (its server imported the code):
        # that is observed here, on this process's own instance of the current side, as a plain run observes it
        first = Sampler(scenario.name, backend_for(session.config.device))
        with session.limited(scenario):
            if live.setup is not None:
                first.call("setup before the first call", live.setup)
            cold = first.sample(live.fn, what="the first call (cold start)")

        profiled: list = []   # a slower or faster verdict's profiler passes, in each side's own process

        def run(judge):
            res = _forked_rounds(session, scenario.name, spawn, release, profiled,
                                 lambda servers: run_served(servers, sampler, rounds=looks[0], pairs=pairs,
                                                            warmup=a.warmup, warm_ms=a.warm_ms, seed=a.seed,
                                                            extend_to=looks[1:], go_on=judge.go_on,
                                                            pairs_ms=a.pairs_ms, threads=session.config.threads),
                                 judge)
            check_processes(scenario.name, ran, session.revision)
            return res
        how = (f"{looks[0]} rounds" if len(looks) == 1 else
               f"{looks[0]} rounds, {looks[-1]} at most for a possible change")
        return _side_by_side(session, scenario, live, run, f"{how} x {_pairs_text(pairs, a)}, each side a pytest "
                                                           f"process of its own, every round the test run afresh in "
                                                           f"a freshly forked child"
                                                           f"{_cpus_held_text(session.config.threads)}{malloc}",
                             items, proof, None, None, looks, cold=cold,
                             signatures=lambda: _served_signatures(session, scenario.name, ran),
                             explain=lambda: tuple(profiled) if profiled else None,
                             instructions=lambda: count_instructions(session, scenario.name, sides))
    k, rounds = (a.quick_processes, 1) if quick else (a.processes, a.process_rounds)
    pairs = QUICK.pairs if quick else a.pairs

    def run_pairs(judge):
        res = run_processes(spawn, sampler, processes=k, rounds=rounds, pairs=pairs, seed=a.seed, release=release,
                            warm_ms=a.warm_ms, threads=session.config.threads)
        check_processes(scenario.name, ran, session.revision)
        return res
    return _side_by_side(session, scenario, live, run_pairs, f"{k} pairs of pytest processes x {rounds} rounds x "
                                                             f"{pairs} pairs (processes that cannot fork: a "
                                                             f"process is the unit){malloc}", items, proof, None, None,
                         current_here=True)


def _forked_rounds(session, name: str, spawn, release, profiled: list, rounds, judge):
    """`rounds(pair)` (`run_served`) on a pair of servers from the pool, ended after the scenario; a slower or
    faster verdict's profiler passes go to `profiled`."""
    def work(pair):
        res = rounds(pair)
        if not session.config.quick and judge(res, "host").verdict in (SLOWER, FASTER):
            profiled.extend(_profile_served(session, name, pair))
        return res
    return with_pair(spawn, 0, work, seed=session.config.against.seed, release=release)


def _profile_served(session, name: str, servers) -> list:
    """Profiler passes of each side in its own server, both sides at once (after the rounds, never inside them):
    [baseline passes, candidate passes], or empty where a side could not be profiled, which the session says."""
    times: dict[str, list] = {}
    try:
        for side in ("baseline", "candidate"):
            servers[side].start_profile()
        for side in ("baseline", "candidate"):
            times[side] = servers[side].profiled()
    except ScenarioError as exc:
        session.not_counted(name, "no profiler pass", exc.problem)
        return []
    return [times["baseline"], times["candidate"]]


def _release_to(pool, keep: Callable[[str, Mapping], Any]):
    """A pair's `release` for `with_pair`: each server's own report on what it ran kept (`keep(side, report)`),
    then the server told its item is done and returned to `pool`, or ended if anything went wrong."""
    def release(side, j, worker, ok):
        keep(side, worker.ran)
        if ok:
            try:
                worker.done()
            except ScenarioError:
                ok = False
        pool.release(worker, ok)
    return release


def count_instructions(session, name: str, sides: Mapping[str, tuple[Mapping, Mapping]]) -> tuple:
    """(baseline, current) host instructions of one step, each counted by a server of its own side run under
    valgrind's callgrind (`sides`: as for process mode), after the comparison; None where not counted, and the
    session says why."""
    import shutil

    if shutil.which("valgrind") is None:
        session.not_counted(name, "instructions not counted", "valgrind is not installed (e.g. apt install valgrind)")
        return None, None
    pool = worker_pool(session)
    folder, reports = pool.scratch(), {}
    spawn = {side: (lambda j, side=side: pool.get(side, j, {**sides[side][0], "instructions": folder},
                                                  sides[side][1])) for side in sides}
    try:
        with_pair(spawn, 0, lambda pair: None, release=_release_to(pool, reports.__setitem__))
    except SideError as exc:
        session.not_counted(name, "instructions not counted", exc.problem)
        return None, None
    for side in ("baseline", "candidate"):
        if "instructions" not in reports.get(side, {}):
            session.not_counted(name, "instructions not counted",
                                reports.get(side, {}).get("instructions_error", "its server did not count"), side)
    return tuple(reports.get(side, {}).get("instructions") for side in ("baseline", "candidate"))


def _served_signatures(session, name: str, ran: Mapping[str, list]):
    """(baseline, current) work signatures as each side's server counted them (None where it could not)."""
    from bench_core.core.signature import Signature

    out = []
    for side in ("baseline", "candidate"):
        report = ran[side][-1] if ran.get(side) else {}
        if "signature" in report:
            out.append(Signature.from_dict(report["signature"]))
        else:
            session.not_counted(name, "work signature not counted",
                                report.get("signature_error", "its server did not count it"), side)
            out.append(None)
    return tuple(out)


def check_processes(name: str, ran: Mapping[str, list], loaded) -> None:
    """Each side ran its own code: no file of the other tree that differs from its own counterpart was loaded by
    a side's process (a project installed from the current tree, say). Fails naming the file."""
    from bench_core.workflows.side_by_side.fidelity import crossed

    trees = {"candidate": (loaded.current_root, loaded.root), "baseline": (loaded.root, loaded.current_root)}
    for side, reports in ran.items():
        own, other = trees[side]
        jit = () if loaded.compiled is None else tuple(loaded.compiled.extensions_folder(s).resolve()
                                                       for s in ("candidate", "baseline"))
        theirs = jit[side == "candidate"] if jit else None   # the other side's just-in-time builds
        for report in reports:
            files = report.get("files", {})
            built = [f for f in files if any(Path(f).is_relative_to(d) for d in jit)]
            wrong = crossed({f: s for f, s in files.items() if f not in built}, own, other) + [
                f for f in built if Path(f).is_relative_to(theirs)]
            if wrong:
                raise ScenarioError(name, f"the {side}'s process loaded {', '.join(wrong)} from the other side's "
                                          f"tree, where it differs: it did not run its own code (is the project "
                                          f"installed from one tree? its import roots come first on PYTHONPATH)")


@dataclass(frozen=True)
class Judge:
    """Decides a scenario's rounds with the gate's verdicts."""

    scenario: Scenario
    device: str
    threshold: float
    gate: Any
    family_size: int | None
    looks: tuple[int, ...]

    def __call__(self, res, timer: str) -> Comparison:
        theirs = res.scenarios.get("baseline")
        diffs = scenario_differences(theirs.with_metadata(device=self.device), self.scenario) \
            if theirs is not None else {}
        est = estimate_rounds(self.scenario.name, res, self.threshold, timer=timer, differences=diffs, looks=self.looks)
        ran = len(res.baseline)
        if self.looks and ran < self.looks[-1]:   # the keep-going rule stopped it: more of the same would not help
            said = (f"it stopped after {ran} of up to {self.looks[-1]} rounds, where its rounds did not point to a "
                    f"change beyond {self.threshold / 2:.1%} clearly enough to chase (one-sided p >= "
                    f"{self.gate.chase_p:g}); more rounds at each look (--bench-rounds, now {self.looks[0]}) or a "
                    f"quieter runner would narrow it")
        else:
            budget = f"--bench-max-rounds, now {self.looks[-1]}" if self.looks else "--bench-rounds"
            said = f"more rounds would narrow it ({budget}), or a quieter runner"
        (c,) = decide_family([est], self.gate, family_size=self.family_size, advice=lambda _more: said)
        return c

    def go_on(self, res) -> bool:   # in this process: timed as the Measurement below will be
        # chased while a change of more than half the threshold looks likely, either way (`possible_change`)
        return possible_change(self(res, "cuda_event" if self.device == "cuda" else "host"), self.gate.chase_p,
                               beyond=self.threshold / 2)


def _side_by_side(session, scenario, live, sides, method, items, proof, clock, backend, looks=(), cold=None,
                  signatures=None, explain=None, instructions=None, current_here=False):
    """`current_here`: the current side's result is a plain measurement in this process, not its own samples in
    the rounds (worker mode's processes each keep a bias of their own)."""
    a, dev = session.config.against, session.config.device
    scenario = scenario.with_metadata(device=dev)
    threads = set_threads(session.config.threads)
    commit = session.revision.revision.commit
    rev = f"{a.label} ({commit[:12] if commit else 'no commit'})"
    thr = scenario.noise_threshold if scenario.noise_threshold is not None else a.threshold
    judge = Judge(scenario, dev, thr, replace(session.config.gate, threshold=thr), session.family_size, tuple(looks))
    failed = None
    try:
        with session.limited(scenario):
            res = sides(judge)
    except SideError as exc:
        if exc.side == "candidate":
            raise ScenarioError(scenario.name, exc.problem) from exc
        failed, res = f"not compared: {rev} failed: {exc.problem.split(': ', 1)[1]}", None
    if res is None or current_here:
        with session.limited(scenario):
            m = measured.measure(session, scenario, live.fn, setup=live.setup, items=items, clock=clock,
                                 backend=backend)
    else:
        m = _current_side(session, scenario, live, res, items, threads, cold)
    counted = None
    from bench_core.workflows.counted_work import counts_signature, with_facts

    if res is not None and counts_signature(session, scenario):
        if signatures is None:
            session.not_counted(scenario.name, "work signature not counted in process mode")
        else:
            counted = signatures()
            if session.config.instructions:
                counted = _with_instructions(session, scenario.name, counted, instructions)
            m = replace(m, signature=counted[1]) if counted[1] is not None else m
    if res is None:
        return Outcome(m.name, m, not_compared=failed)
    c = judge(res, m.timer)
    c = replace(c, method=f"side by side with {rev}: {method}")   # the rounds each scenario ran: its row
    kept = kept_note({side: [k for r in reports for k in r.get("kept", [])]
                      for side, reports in (proof or {}).get("processes_ran", {}).items()})
    if kept is not None:
        c = replace(c, notes=c.notes + (kept,))
    if counted is not None:
        c = with_facts(session, c, *counted, scenario)
    if explain is not None and c.verdict in (SLOWER, FASTER) and not session.config.quick and clock is None:
        try:
            step = (c.candidate_median - c.baseline_median if None not in (c.candidate_median, c.baseline_median)
                    else None)
            passes = explain()
            if passes is not None:   # None: a side could not be profiled, which the session says
                c = replace(c, moved=tuple(explained(*passes, step_ms=step)))
        except Exception as exc:  # noqa: BLE001 - the verdict stands; the explanation says why it is missing
            session.not_counted(scenario.name, "no profiler pass", f"{type(exc).__name__}: {exc}")
    return Outcome.side_by_side_of(m, c, res.to_dict(), proof)


def _with_instructions(session, name, counted, instructions):
    """The two signatures with each side's host instructions per step, where both are counted."""
    if instructions is None:
        session.not_counted(name, "instructions not counted", "this comparison has no process of each side")
        return counted
    counts = instructions()
    return tuple(sig if sig is None or n is None else replace(sig, instructions=n) for sig, n in zip(counted, counts))


def _current_side(session, scenario, live, res, items, threads, cold=None) -> Measurement:
    """The current side's result, from its own samples in the rounds; its cold start, round 0's first call unless
    observed apart (`cold`)."""
    cur = [x for r in res.candidate for x in r]
    cold = cold or res.cold["candidate"][0]
    dev = session.config.device
    return Measurement(scenario=scenario, device=dev, mode="per_call" if live.block_size == 1 else "block",
                       block_size=live.block_size, warmup=session.config.against.warmup, repeats=len(cur),
                       host_ms=tuple(x.host_ms for x in cur),
                       gpu_ms=tuple(x.gpu_ms for x in cur) if dev == "cuda" else None,
                       cold_start=ColdStart(cold.host_ms, cold.gpu_ms, res.load_ms.get("candidate")),
                       items=items, threads=threads, memory=Memory(), environment=session.environment)
