"""One benchmark session, without pytest: collect results, gate them against a baseline, store them.

The pytest plugin is a thin shell over this class; scripts can drive it directly.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from bench_core.deciding.gate import (Comparison, GateConfig, baseline_warnings, decide_family, estimate, noise_prior,
                                     scenario_differences)
from bench_core.deciding.sequential import planned_looks, possible_slowdown, replicate_until_decided
from bench_core.deciding.verdicts import INCOMPARABLE, INCONCLUSIVE, SLOWER
from bench_core.core.errors import ScenarioError, StorageError
from bench_core.timing.measuring import measure
from bench_core.core.records import Measurement
from bench_core.core.scenario import Scenario
from bench_core.files import storage

DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 20
QUICK_WARMUP = 1
QUICK_REPEATS = 5


@dataclass(frozen=True)
class AgainstConfig:
    """Side by side with another revision (`--bench-against REV`): rounds of fresh instances, pairs per round.

    The threshold is smaller than the stored-baseline gate's: alternated samples in one process reach
    1-2% here, where separate runs drift by 5-29%.

    Sequential: the first look comes after `rounds` rounds; a possible slowdown it leaves undecided runs
    on, look by look every `rounds` rounds, up to `max_rounds` (3 x rounds unless given), alpha split
    over the looks. Round-to-round spread here is mostly the pairs' own noise (the set of allocations
    adds about 0-2%), so more rounds buy precision where they are needed, and unchanged code mostly
    stops at the first look (benchmarks/against_quality.py measures both).
    """

    rev: str
    rounds: int = 12         # 12 x (1 first call + 4 pairs) x 2 sides = 120 calls at the first look
    pairs: int = 4
    warmup: int = 0          # the first call of each instance (kept apart) already warms it
    seed: int = 0
    threshold: float = 0.02
    max_rounds: int | None = None
    quick_rounds: int = 3
    quick_pairs: int = 2
    processes: int = 6       # worker mode: pairs of processes (the unit of evidence there), the session's pool
    quick_processes: int = 3  # the same under --bench-quick (--bench-worker-pairs sets both)
    process_rounds: int = 2  # worker mode: rounds of fresh instances in each pair

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

    def looks(self, quick: bool = False) -> tuple[int, ...]:
        """The numbers of rounds at which a scenario may be decided."""
        if quick:
            return (self.quick_rounds,)
        return planned_looks(self.rounds, self.max_rounds, self.rounds)


@dataclass(frozen=True)
class SessionConfig:
    device: str = "cpu"
    warmup: int | None = None          # None: the scenario's own choice, else the default
    repeats: int | None = None
    quick: bool = False
    threads: int | None = None
    results_dir: Path | None = Path(".bench/results")
    baselines_dir: Path = Path("baselines")
    save: str | None = None
    append: bool = False
    save_incomplete: bool = False      # store an interrupted or failing session as a baseline run all the same
    strict: bool = False               # inconclusive and incomparable fail their items too
    markdown: Path | None = None       # a Markdown report appended here (e.g. $GITHUB_STEP_SUMMARY)
    wide: bool = False                 # tables with every column and unwrapped notes, however wide
    plots: Path | None = None          # a distribution plot per scenario written here (matplotlib, optional)
    count_flops: bool = False          # count each step's FLOPs once, after its window (torch's FLOP counter)
    peak_tflops: float | None = None   # the device's peak for utilization (else a known GPU's, or the CPU's measured)
    timeout_s: float | None = 600.0    # per scenario, everything included; None or 0: no limit
    compare: str | None = None
    pb_json: Path | None = None
    gate: GateConfig = field(default_factory=GateConfig)
    profile: Any = None                # a diagnose.ProfileConfig: one profiler pass after each measurement
    references_dir: Path = Path("references")
    save_references: bool = False      # record references instead of checking against them
    against: AgainstConfig | None = None
    topology: Any = None               # a distributed.Topology given on the command line (--bench-nproc...), or None


class BenchSession:
    def __init__(self, config: SessionConfig, environment: Mapping[str, Any],
                 measure_fn: Callable[..., Measurement] = measure):
        self.config = config
        self.environment = dict(environment)
        self.results: list[Measurement] = []
        self.errors: list[tuple[str, str]] = []
        self.comparisons: list[Comparison] = []
        self.decisions: list[tuple[str, Any]] = []   # (name, ABResult)
        self.profiles: list[Any] = []                 # diagnose.ProfileResult, never mixed into results
        self._measure = measure_fn
        self.progress = None                          # a progress.Progress, when someone is watching
        self.family_size: int | None = None           # scenarios in this session, once collection knows
        self.revision = None                          # revisions.LoadedRevision under --bench-against
        self._workers = None                          # worker.WorkerPool, once a scenario needs worker mode
        self.against_records: list[dict] = []         # per scenario: rounds, both sides' code, decision
        self.one_side: list[tuple[str, str]] = []     # scenarios that exist on one side only
        self.baseline: dict[str, list[Measurement]] | None = None
        if config.against is not None and (config.compare is not None or config.save is not None):
            raise ValueError("--bench-against compares two revisions in this run: it does not mix with a stored "
                             "baseline (--bench-compare / --bench-save); use one or the other")
        if config.save is not None:  # a name given empty (an unset $BASELINE in CI) is an error, not "no save"
            path = storage.baseline_path(config.baselines_dir, config.save)
            if path.exists() and not config.append:  # fail before the run, not after minutes of it
                raise StorageError(path, f"baseline {config.save!r} already exists and is never silently overwritten",
                                   hint="pass --bench-append to add this session as another run, or pick a new name")
        self.prior = None                             # the run-to-run variance prior fitted from the baseline
        self.baseline_notes: list[str] = []           # what makes the baseline hard to trust
        self.replicas: dict[str, list[Measurement]] = {}   # the gate's fresh-process runs, by scenario
        self.uncounted: list[str] = []                # why a step's FLOPs could not be counted (not an error)
        if config.compare is not None:
            self.baseline = storage.by_scenario(storage.load_baseline(config.baselines_dir, config.compare))
            self.prior = noise_prior(self.baseline)
            created = [r["created"] for r in storage.baseline_runs(config.baselines_dir, config.compare)]
            self.baseline_notes = baseline_warnings(config.compare, created[-config.gate.window:]
                                                    if config.gate.window else created, prior=self.prior)

    # -- measuring -------------------------------------------------------------------------------
    def counts(self, warmup: int | None, repeats: int | None) -> tuple[int, int]:
        """Command line beats quick mode beats the scenario's own choice beats the defaults."""
        c = self.config
        w = c.warmup if c.warmup is not None else QUICK_WARMUP if c.quick else warmup if warmup is not None else DEFAULT_WARMUP
        r = c.repeats if c.repeats is not None else QUICK_REPEATS if c.quick else repeats if repeats is not None else DEFAULT_REPEATS
        return w, r

    def measure(self, scenario: Scenario, fn: Callable[[], Any], *, warmup: int | None = None,
                repeats: int | None = None, **kwargs) -> Measurement:
        """Measure without recording (errors are recorded: they belong in the report)."""
        w, r = self.counts(warmup, repeats)
        scenario = scenario.with_metadata(device=self.config.device)
        if self.progress is not None:
            kwargs = {"progress": self.progress.scenario(scenario.name), **kwargs}
        try:
            return self._measure(fn, scenario=scenario, device=self.config.device, warmup=w, repeats=r,
                                 threads=self.config.threads, environment=self.environment, **kwargs)
        except ScenarioError as exc:
            self.errors.append((scenario.name, exc.problem))
            raise
        except TypeError as exc:  # a wrong keyword from the benchmark itself
            self.errors.append((scenario.name, str(exc)))
            raise ScenarioError(scenario.name, str(exc)) from exc

    def limited(self, scenario: Scenario):
        """The scenario's time limit, as a context: a hang fails that scenario, by name."""
        from bench_core.timing.sampling import time_limit

        return time_limit(self.config.timeout_s, scenario.name)

    def run(self, scenario: Scenario, fn: Callable[[], Any], *,
            replicate: Callable[[int, int], Measurement] | None = None, **kwargs) -> tuple[Measurement, Comparison | None]:
        """Measure, gate, record; all within the time limit. `replicate(warmup, repeats)` measures the
        scenario once more in a fresh process, for a possible slowdown the gate cannot decide on one run."""
        try:
            with self.limited(scenario):
                return self._run(scenario, fn, replicate, **kwargs)
        except ScenarioError as exc:
            if not any(n == scenario.name for n, _ in self.errors):
                self.errors.append((scenario.name, exc.problem))
            raise

    def _run(self, scenario: Scenario, fn: Callable[[], Any], replicate, **kwargs) -> tuple[Measurement, Comparison | None]:
        first = self.measure(scenario, fn, **kwargs)
        if self.config.count_flops:  # after the timed window, profiler-free: one more step, counted
            first = self.count_work(first, fn, kwargs.get("setup"))   # before the gate, which compares the counts
        counts = self.counts(kwargs.get("warmup"), kwargs.get("repeats"))
        m, c = self.gate(first, None if replicate is None else lambda: replicate(*counts))
        self.results.append(m)
        if self.config.profile is not None:  # after the measurement, never inside it
            from bench_core.workflows.diagnose.profile import profile
            from bench_core.workflows.diagnose.trace_analysis import roofline_hypotheses

            if self.config.profile.with_flops:
                self.measure_cpu_roofs()
            peak = self.peak_flops(m)
            roof = () if m.work is None else tuple(roofline_hypotheses(m.work, m.summary.median / 1e3, peak,
                                                                       self.bandwidth(m)))
            self.profiles.append(profile(scenario.name, fn, self.config.profile, setup=kwargs.get("setup"),
                                         peak_flops=peak, extra=roof))
        return m, c

    def count_work(self, m: Measurement, fn: Callable[[], Any], setup: Callable[[], Any] | None) -> Measurement:
        """The result with its counted work; on the CPU the machine's matmul peak is measured once, for the
        utilization figure, and kept in the environment."""
        from bench_core.timing.flops import count

        try:
            work = count(fn, setup)
        except Exception as exc:  # noqa: BLE001 - a step the counter cannot run is not counted, and says why
            self.uncounted.append(f"{m.name}: FLOPs not counted: {type(exc).__name__}: {exc}")
            return m
        self.measure_cpu_roofs()
        return replace(m, work=work.to_dict())

    def measure_cpu_roofs(self) -> None:
        """On the CPU, the machine's matmul peak and copy bandwidth, measured once per session (outside every
        timed window) and kept in the environment: the roofs utilization is a share of."""
        from bench_core.timing.flops import cpu_bandwidth, cpu_peak

        if self.config.device == "cpu" and "cpu_peak_flops" not in self.environment:
            self.environment["cpu_peak_flops"] = cpu_peak()
            self.environment["cpu_bandwidth_bytes_per_s"] = cpu_bandwidth()

    def bandwidth(self, m: Measurement) -> float | None:
        """Memory bandwidth, bytes/s, for the roofline: a known GPU's, or the CPU's measured copy rate."""
        from bench_core.timing.flops import known_bandwidth

        if m.device == "cuda":
            return known_bandwidth(self.environment.get("gpu_name"))
        return self.environment.get("cpu_bandwidth_bytes_per_s")

    def peak_flops(self, m: Measurement) -> float | None:
        """The peak FLOP/s that utilization is a share of: the user's, a known GPU's for the scenario's dtype,
        or on the CPU (float32) the matmul peak measured here."""
        from bench_core.timing.flops import known_peak

        if self.config.peak_tflops is not None:
            return self.config.peak_tflops * 1e12
        dtype = m.scenario.metadata.get("dtype")
        if m.device == "cuda":
            t = known_peak(self.environment.get("gpu_name"), dtype)
            return None if t is None else t * 1e12
        return self.environment.get("cpu_peak_flops") if dtype in (None, "float32") else None

    # -- distributed scenarios ------------------------------------------------------------------------
    def run_distributed(self, scenario: Scenario, build: Callable, *, nproc: int = 2,
                        params: Mapping[str, Any] | None = None, items_per_rank: int | None = None,
                        warmup: int | None = None,
                        repeats: int | None = None, validate: bool = True, scaling: bool = False,
                        ) -> tuple[Measurement, Comparison | None]:
        """Launch the scenario's ranks (`build(ctx) -> rank.RankStep`, a module-level function), measure every
        rank, and gate the maximum over ranks like any result. The command line's topology beats `nproc`.
        With `scaling`, the same step also runs at world size 1, for the weak-scaling efficiency.
        A fresh launch is a fresh set of processes, so the gate replicates by launching again."""
        from bench_core.workflows.distributed.launch import Topology, measurement_from, run_ranks

        topology = self.config.topology or Topology(nproc)
        w, r = self.counts(warmup, repeats)
        scenario = scenario.with_metadata(device=self.config.device)
        spec = self._rank_spec(scenario.name, build, topology, params, warmup=w, repeats=r, validate=validate)
        launches = iter(range(1, 1000))

        def launch(ranks: Topology, validate_now: bool) -> Measurement:
            doc = run_ranks(scenario.name, {**spec, "validate": validate_now}, ranks, self.config.timeout_s,
                            launch=next(launches))
            return measurement_from(scenario, doc, device=self.config.device, warmup=w, repeats=r,
                                    items_per_rank=items_per_rank, environment=self.environment)

        try:
            m = launch(topology, validate)
            if scaling and topology.world_size > 1 and topology.nnodes == 1 and not self.config.quick:   # a launch more
                one = launch(Topology(1), False)
                m = replace(m, ranks=replace(m.ranks, one_rank_ms=one.primary_ms))
            m, c = self.gate(m, lambda: launch(topology, False))
        except ScenarioError as exc:
            if not any(n == scenario.name for n, _ in self.errors):
                self.errors.append((scenario.name, exc.problem))
            raise
        self.results.append(m)
        if self.config.count_flops:
            self.uncounted.append(f"{scenario.name}: FLOPs not counted: distributed scenarios are not counted yet")
        if self.config.profile is not None:   # after the measurement, in a launch of its own
            self.profile_distributed(scenario.name, {**spec, "validate": False}, topology)
        return m, c

    def _rank_spec(self, name: str, build: Callable, topology, params: Mapping[str, Any] | None, **mode) -> dict:
        """What every rank is told: where the builder is, this session's device and settings, and the mode's
        counts; checked before any process starts (a failure is recorded against `name`)."""
        import sys

        from bench_core.workflows.distributed.launch import builder_location, preflight

        try:
            backend = preflight(name, topology, self.config.device)
            file, function = builder_location(name, build)
        except ScenarioError as exc:
            self.errors.append((name, exc.problem))
            raise
        return {"scenario": name, "builder_file": file, "builder": function,
                # this process's import path: a builder imports what the benchmark file imports
                "import_roots": [p for p in sys.path if p], "params": dict(params or {}),
                "device": self.config.device, "quick": self.config.quick, "seed": 0, "threads": self.config.threads,
                "backend": backend, "collective_timeout_s": self.config.timeout_s or 1800, **mode}

    def profile_distributed(self, name: str, spec: Mapping[str, Any], topology) -> None:
        """The diagnose pass of a distributed scenario: one trace per rank, each with its hypotheses, and what the
        ranks' traces say together (communication not overlapped, a rank the others wait for) in a file beside."""
        from dataclasses import asdict

        from bench_core.workflows.diagnose.profile import ProfileResult
        from bench_core.workflows.distributed.launch import run_ranks
        from bench_core.core.redact import redact
        from bench_core.workflows.diagnose.trace_analysis import Hypothesis, TraceFacts, rank_hypotheses

        cfg = asdict(self.config.profile)
        cfg["folder"] = str(Path(cfg["folder"]).resolve())
        doc = run_ranks(name, {**spec, "scenario": name, "profile": cfg}, topology, self.config.timeout_s, launch=0)
        facts = [TraceFacts.from_dict(r["profile"]["facts"]) for r in doc["ranks"]]
        together = rank_hypotheses(facts)
        for r, f in zip(doc["ranks"], facts):
            p = r["profile"]
            rows = tuple(Hypothesis(**h) for h in p["hypotheses"])
            if r["rank"] == 0:   # the ranks' joint rows once, with rank 0's report
                rows += tuple(together)
            self.profiles.append(ProfileResult(p["scenario"], None if p["trace"] is None else Path(p["trace"]),
                                               p["redaction"], p["table"], f, rows, p["refused"]))
        if together:
            clean, _ = redact([h.to_dict() for h in together])
            shown, _ = redact(name)
            storage.write_rank_hypotheses(Path(cfg["folder"]), shown, {
                "scenario": shown, "traces": [r["profile"]["trace"] for r in doc["ranks"]],
                "facts": [f.to_dict() for f in facts], "hypotheses": clean})

    def ab_distributed(self, name: str, build: Callable, baseline: Mapping[str, Any], candidate: Mapping[str, Any],
                       *, nproc: int = 2, params: Mapping[str, Any] | None = None, rounds: int = 16,
                       pairs: int = 16, warmup: int = 1, alpha: float = 0.01, min_effect: float = 0.01):
        """Two configurations of a distributed scenario (`baseline` and `candidate`: the parameters each side's
        `build(ctx)` gets on top of `params`), in the same ranks, rounds of fresh instances of both; decided
        like `ab_rounds` on the slowest rank of each step, after checking both sides start and end equal.

        16 rounds x 16 pairs: on 2 gloo ranks here (a 12 ms step) 8 x 4 found a 10% costlier step 3 times in 12
        and 16 x 16 every time in 6, with no false call in 26 A/A (benchmarks/distributed_quality.py)."""
        from bench_core.workflows.distributed.launch import Topology, ab_result, run_ranks
        from bench_core.workflows.ab import source_identity

        topology = self.config.topology or Topology(nproc)
        if self.config.quick:
            rounds, pairs, warmup = 3, 2, 0
        spec = self._rank_spec(name, build, topology, params, warmup=warmup, rounds=rounds, pairs=pairs,
                               ab={"baseline": dict(baseline), "candidate": dict(candidate)})
        try:
            doc = run_ranks(name, spec, topology, self.config.timeout_s)
        except ScenarioError as exc:
            self.errors.append((name, exc.problem))
            raise
        code = source_identity(build)
        res = ab_result(doc, alpha=alpha, min_effect=min_effect, environment=self.environment,
                        params={"device": self.config.device, "rounds": rounds, "pairs": pairs, "warmup": warmup,
                                "alpha": alpha, "min_effect": min_effect, "seed": 0, "shared_params": dict(params or {}),
                                "order": "random per pair; both sides built anew every round, in the same ranks"},
                        identities={"baseline": {**code, "params": dict(baseline)},
                                    "candidate": {**code, "params": dict(candidate)}})
        self.decisions.append((name, res))
        return res

    # -- side by side with another revision -------------------------------------------------------
    def open_revision(self, root: Path) -> None:
        """Extract --bench-against's revision and make it importable beside the current code."""
        from bench_core.workflows.side_by_side.revisions import LoadedRevision

        self.revision = LoadedRevision(root, self.config.against.rev)

    def worker_pool(self):
        """The worker processes of this session's worker-mode comparisons, kept from scenario to scenario."""
        if self._workers is None:
            from bench_core.workflows.worker import WorkerPool

            self._workers = WorkerPool(self.config.timeout_s or 600.0)
        return self._workers

    def close_revision(self) -> None:
        """The revision's extracted tree, and every worker process that served it, ended."""
        if self._workers is not None:
            self._workers.close()
        if self.revision is not None:
            self.revision.close()

    def run_against(self, scenario: Scenario, live, rebuild: Callable[[int], Any], rev_build: Callable[[int], Any],
                    *, items: int | None = None, proof: Mapping[str, Any] | None = None, clock=None,
                    backend=None) -> tuple[Measurement, Comparison | None]:
        """Measure the current code (`live`, then `rebuild(round)`) and the revision's (`rev_build(round)`)
        side by side in this process; returns the current side's result and the decision. The revision
        failing leaves the current side measured on its own, with the reason kept; the current side failing
        fails the scenario."""
        from bench_core.timing.backends import backend_for
        from bench_core.timing.sampling import Sampler
        from bench_core.timing.protocol import run_rounds

        a = self.config.against
        looks, pairs = a.looks(self.config.quick), a.quick_pairs if self.config.quick else a.pairs
        build = {"candidate": lambda r: live if r == 0 else rebuild(r), "baseline": rev_build}

        def sides(go_on):
            return run_rounds(build, Sampler(scenario.name, backend or backend_for(self.config.device), clock),
                              rounds=looks[0], pairs=pairs, warmup=a.warmup, seed=a.seed, extend_to=looks[1:],
                              go_on=go_on)
        how = (f"{looks[0]} rounds" if len(looks) == 1 else
               f"{looks[0]} rounds, {looks[-1]} at most for a possible slowdown (looks at {', '.join(map(str, looks))})")
        return self._side_by_side(scenario, live, sides, f"{how} x {pairs} pairs, fresh instances every round, one "
                                                         f"process", items, proof, clock, backend, looks)

    def run_against_workers(self, scenario: Scenario, live, sides: Mapping[str, tuple[Mapping, Mapping]], *,
                            items: int | None = None, proof: Mapping[str, Any] | None = None
                            ) -> tuple[Measurement, Comparison | None]:
        """The same in pairs of worker processes, one per side (`sides[side]`: the worker's init and the
        test it serves, see `worker`), for code that cannot be loaded twice into one process. Each process
        keeps a bias of its own, so the pair of processes is the unit of evidence: the interval is wider,
        and says so. The pairs are the session's pool, kept from scenario to scenario. The current side's
        result is a plain measurement of `live`, here."""
        from bench_core.timing.backends import CpuBackend
        from bench_core.timing.sampling import Sampler
        from bench_core.timing.protocol import run_processes

        a = self.config.against
        k, rounds = (a.quick_processes, 1) if self.config.quick else (a.processes, a.process_rounds)
        pairs = a.quick_pairs if self.config.quick else a.pairs

        pool = self.worker_pool()
        proof = dict(proof or {})
        ran = proof["workers_ran"] = {side: [] for side in sides}    # each worker's own word on what it loaded

        def release(side, j, worker, ok):
            ran[side].append(worker.ran)
            pool.release(side, j, worker, ok)

        def run(go_on):
            spawn = {side: (lambda j, side=side: pool.get(side, j, *sides[side])) for side in sides}
            return run_processes(spawn, Sampler(scenario.name, CpuBackend()), processes=k, rounds=rounds, pairs=pairs,
                                 seed=a.seed, release=release)
        return self._side_by_side(scenario, live, run, f"{k} pairs of worker processes x {rounds} rounds x "
                                                         f"{pairs} pairs (the code cannot be loaded twice into one "
                                                         f"process)", items, proof, None, None)

    def _side_by_side(self, scenario, live, sides, method, items, proof, clock, backend, looks=()):
        from bench_core.core.records import ColdStart, Memory
        from bench_core.timing.sampling import set_threads
        from bench_core.deciding.rounds import estimate_rounds
        from bench_core.timing.protocol import SideError

        a, dev = self.config.against, self.config.device
        scenario = scenario.with_metadata(device=dev)
        threads = set_threads(self.config.threads)
        rev = f"{a.rev} ({self.revision.revision.commit[:12]})"
        thr = scenario.noise_threshold if scenario.noise_threshold is not None else a.threshold
        gate = replace(self.config.gate, threshold=thr)
        budget = f"--bench-max-rounds, now {looks[-1]}" if looks else "--bench-rounds"

        def judge(res, timer: str) -> Comparison:
            first = res if not isinstance(res, list) else res[0]
            theirs = first.scenarios.get("baseline")
            diffs = scenario_differences(theirs.with_metadata(device=dev), scenario) if theirs is not None else {}
            est = estimate_rounds(scenario.name, res, thr, timer=timer, differences=diffs, looks=looks)
            (c,) = decide_family([est], gate, family_size=self.family_size,
                                 advice=f"more rounds would narrow it ({budget}), or a quieter runner")
            return c

        def go_on(res) -> bool:  # in this process: timed as the Measurement below will be
            return possible_slowdown(judge(res, "cuda_event" if dev == "cuda" else "host"), gate.chase_p)

        try:
            with self.limited(scenario):
                res = sides(go_on)
        except SideError as exc:
            if exc.side == "candidate":
                self.errors.append((scenario.name, exc.problem))
                raise ScenarioError(scenario.name, exc.problem) from exc
            self.one_side.append((scenario.name, f"not compared: {rev} failed: {exc.problem.split(': ', 1)[1]}"))
            res = None
        if res is None or isinstance(res, list):  # the current side was not timed here: measure it plainly
            with self.limited(scenario):
                m = self.measure(scenario, live.fn, setup=live.setup, items=items, clock=clock, backend=backend)
        else:
            cur = [x for r in res.candidate for x in r]
            cold = res.cold["candidate"][0]
            m = Measurement(scenario=scenario, device=dev, mode="per_call" if live.block_size == 1 else "block",
                            block_size=live.block_size, warmup=a.warmup, repeats=len(cur),
                            host_ms=tuple(x.host_ms for x in cur),
                            gpu_ms=tuple(x.gpu_ms for x in cur) if dev == "cuda" else None,
                            cold_start=ColdStart(cold.host_ms, cold.gpu_ms, res.load_ms.get("candidate")),
                            items=items, threads=threads, memory=Memory(), environment=self.environment)
        self.results.append(m)
        if res is None:
            return m, None
        c = judge(res, m.timer)
        ran = f"; {len(res.baseline)} rounds ran" if len(looks) > 1 and not isinstance(res, list) else ""
        c = replace(c, method=f"side by side with {rev}: {method}{ran}")
        self.comparisons.append(c)
        rounds = [r.to_dict() for r in (res if isinstance(res, list) else [res])]
        self.against_records.append({"scenario": scenario.name, "comparison": c.to_dict(), "method": c.method,
                                     "rounds": rounds[0] if len(rounds) == 1 else rounds, "code": dict(proof or {})})
        return m, c

    # -- gating ----------------------------------------------------------------------------------
    def gate(self, m: Measurement, replicate: Callable[[], Measurement] | None = None
             ) -> tuple[Measurement, Comparison | None]:
        """Compare one fresh result with the baseline; returns the result to keep and the comparison.

        Decided now, before the other scenarios exist, so the family adjustment is Bonferroni over
        every scenario the baseline holds. A possible slowdown that this process cannot decide is
        measured again in fresh processes (`replicate`, one new process per call), look by look up to
        the gate's `max_runs`, and decided on all the runs: a slow process cannot tell its own state
        from a regression, other processes can.
        """
        if self.baseline is None:
            return m, None
        gate = self.config.gate
        base = self.baseline.get(m.name, ())
        runs = [m]

        def judge(runs) -> Comparison:
            (c,) = decide_family([estimate(m.name, base, runs, gate, self.prior)], gate, family_size=len(self.baseline))
            return c

        why_not = []

        def fresh():
            if self.progress is not None:
                self.progress.note(m.name, f"possible slowdown: measuring again in fresh process {len(runs)} "
                                           f"(runs go up to {gate.max_runs})")
            try:
                return replicate()
            except ScenarioError as exc:
                why_not.append(f"replication stopped: {exc.problem}")
                return None
        c = replicate_until_decided(runs, judge, None if replicate is None else fresh, gate)
        extra = len(runs) - 1
        method = f"stored baseline ({c.baseline_runs} runs) vs this process" + (
            f" and {extra} fresh process(es)" if extra else "")
        c = replace(c, method=method, reason="; ".join([c.reason, *why_not]))
        if extra:
            self.replicas[m.name] = runs[1:]
        self.comparisons.append(c)
        return m, c

    def fails(self, c: Comparison | None) -> bool:
        """Slower, incomparable, or input that can never be decided: never green by accident. Strict: any
        comparison that decided nothing fails as well."""
        if c is None:
            return False
        return c.verdict in (SLOWER, INCOMPARABLE) or c.unusable or (self.config.strict and c.verdict == INCONCLUSIVE)

    def outcome(self) -> str:
        """One line: how many comparisons decided what. Said even when nothing was decided."""
        from collections import Counter

        n = Counter(c.verdict for c in self.comparisons)
        decided = n[SLOWER] + n["faster"] + n["unchanged"]
        line = (f"gate: {decided} of {len(self.comparisons)} scenario(s) decided: {n[SLOWER]} slower, "
                f"{n['faster']} faster, {n['unchanged']} unchanged; {n[INCONCLUSIVE]} inconclusive, "
                f"{n[INCOMPARABLE]} incomparable")
        if self.comparisons and not decided:
            line += " (nothing was decided: see the reasons above; --bench-strict makes this fail)"
        return line

    @property
    def compared_with(self) -> str | None:
        """What the comparisons are against, in words: a stored baseline or another revision."""
        if self.config.against is not None:
            return f"revision {self.config.against.rev!r}"
        return f"baseline {self.config.compare!r}" if self.config.compare else None

    def missing_from_run(self) -> list[str]:
        if self.baseline is None:
            return []
        seen = {m.name for m in self.results} | {n for n, _ in self.errors}
        return [n for n in self.baseline if n not in seen]

    def ab(self, name: str, baseline: Callable[[], Any], candidate: Callable[[], Any], *, validation=None,
           state_hash: str | None = None, rounds: int | None = None, **kwargs):
        """Interleaved A/B of two callables on this session's device, after their correctness result.

        With `rounds`, `baseline` and `candidate` are factories of steps and every round builds both anew
        (`interleaved.ab_rounds`): the interval then covers what each instance's allocations add.
        """
        from bench_core.workflows.ab import ab, ab_rounds

        if rounds is not None:
            if self.config.quick:
                rounds, kwargs = 3, {**kwargs, "pairs": 2, "max_rounds": 3}
            kwargs["rounds"] = rounds
            ab = ab_rounds
        elif self.config.quick:
            kwargs.setdefault("repeats", 10)
            kwargs.setdefault("warmup", 1)
        if state_hash is None and validation is not None:
            state_hash = validation.state_hash
        try:
            res = ab(baseline, candidate, device=self.config.device, correctness=validation, state_hash=state_hash,
                     environment=self.environment, name=name, **kwargs)
        except ScenarioError as exc:
            self.errors.append((name, exc.problem))
            raise
        if self.config.count_flops:  # after the A/B, profiler-free: one more step of each side, counted
            from bench_core.timing.flops import count

            counted = {}
            for side, fn in (("baseline", baseline), ("candidate", candidate)):
                try:
                    counted[side] = count(fn if rounds is None else fn()).flops
                except Exception as exc:  # noqa: BLE001 - not counted, and says why; the A/B stands
                    self.uncounted.append(f"{name} ({side}): FLOPs not counted: {type(exc).__name__}: {exc}")
            res = replace(res, flops=counted)
        self.decisions.append((name, res))
        return res

    def reference(self, name: str, variant, state, model, optimizer=None, *, steps: int = 3, tolerance=None):
        """Record reference NAME (when saving references; returns None) or check `variant` against it
        (returns the report). A missing reference is a StorageError whose problem starts "no reference"."""
        from bench_core.workflows.validation.correctness import check_reference, save_reference

        path = self.config.references_dir / f"{name}.pt"
        if self.config.save_references:
            save_reference(path, variant, state, model, optimizer, steps=steps)
            return None
        if not path.exists():
            raise StorageError(path, f"no reference {name!r} recorded yet")
        return check_reference(path, variant, model, optimizer, tolerance=tolerance)

    # -- reporting -------------------------------------------------------------------------------
    def summary_sections(self) -> list[tuple[str, str]]:
        """The end-of-session report as (title, text) sections, in reading order."""
        from bench_core.output.tables import comparison_table, decisions_table, below, resource_table, session_table, work_table
        from bench_core.workflows.diagnose.trace_analysis import hypotheses_table

        if not self.results and not self.errors and not self.decisions:
            return []
        wide = self.config.wide
        out = [("bench_core results", session_table(self.results, self.errors, wide=wide))] \
            if self.results or self.errors else []   # a session of A/B decisions only has no results table
        if any(m.ranks is not None for m in self.results):
            from bench_core.output.tables import ranks_table

            out.append(("bench_core distributed scenarios (every rank)", ranks_table(self.results, wide=wide)))
        if self.config.count_flops and self.results:
            text = work_table(self.results, self.peak_flops, wide=wide, bandwidth_of=self.bandwidth)
            out.append(("bench_core work and utilization (counted FLOPs)",
                        text + below(self.uncounted, wide)))
        if self.results:
            wait = {p.scenario: p.facts.stage_us["batch_read"] / p.facts.step_us for p in self.profiles
                    if p.facts.step_us and "batch_read" in p.facts.stage_us}
            out.append(("bench_core resource needs", resource_table(self.results, self.environment, wait, wide)))
        if self.decisions:
            out.append(("bench_core A/B decisions (interleaved, paired)", decisions_table(self.decisions, wide=wide)))
        for p in self.profiles:
            where = f"trace: {p.trace_path}" if p.trace_path else "trace: not written"
            out.append((f"bench_core diagnose: {p.scenario} (profiled separately; not in any result)",
                        f"{p.table}\n{hypotheses_table(p.hypotheses, p.facts)}\n{where} ({p.redaction})"))
        if self.compared_with is not None:
            text = comparison_table(self.comparisons, self.config.gate.alpha, wide=wide)
            lines = []   # the session's own lines: warnings, the prior, the outcome; wrapped as the tables fit
            missing = self.missing_from_run()
            if missing:
                lines.append(f"in the baseline but not run now: {', '.join(missing)}")
            if self.revision is not None:
                lines.append(f"baseline = {self.revision.revision.label} ({self.revision.revision.commit[:12]}); "
                             f"current = {_describe(self.revision.current)}; "
                             f"{self.comparisons[0].method if self.comparisons else ''}")
            if self._workers is not None and self._workers.started:
                lines.append(f"worker mode: {len(self._workers.scenarios)} scenario(s) in {self._workers.started} "
                             f"worker processes, kept from scenario to scenario")
            lines += [f"{name}: {note}" for name, note in self.one_side]
            lines += [f"warning: {note}" for note in self.baseline_notes]
            if self.prior is not None:
                lines.append(f"run-to-run variance prior: {math.expm1(math.sqrt(self.prior.variance)):.1%} spread, "
                             f"worth {self.prior.df:.3g} runs ({self.prior.source})")
            lines.append(self.outcome())
            text += below(lines, wide)
            out.append((f"bench_core comparison with {self.compared_with}", text))
        return [(self.shown(title), self.shown(text)) for title, text in out]

    def shown(self, text: str) -> str:
        """Text for the terminal: in a diagnose session, whose report may be shared, with secrets redacted."""
        if self.config.profile is None:
            return text
        from bench_core.core.redact import redact

        return redact(text)[0]

    # -- storing ---------------------------------------------------------------------------------
    def finish(self, incomplete: str | None = None) -> tuple[list[str], list[str]]:
        """Write what the session produced: (lines to show, failures). Every write is attempted on its own,
        so one that fails (a read-only folder, a full disk) loses nothing else; each failure names its file.

        `incomplete` says why the session is not whole (interrupted, scenarios failed): such a session is
        never stored as a baseline run, unless `save_incomplete`.
        """
        lines: list[str] = []
        failures: list[str] = []
        if not self.results and not self.errors and not self.decisions:
            return lines, failures

        def attempt(write: Callable[[], str]) -> None:
            try:
                lines.append(write())
            except Exception as exc:  # noqa: BLE001 - every write gets its chance, every failure is said
                failures.append(str(exc))

        if self.config.results_dir is not None:
            attempt(self._write_session)
            for name, res in self.decisions:
                attempt(lambda name=name, res=res: f"decision record for {name!r} written to "
                                                   f"{storage.write_decision(self.config.results_dir, res.to_dict(), name)}")
        if self.config.pb_json is not None:
            from bench_core.files.pytest_benchmark import to_pytest_benchmark

            attempt(lambda: "pytest-benchmark JSON written to " + str(storage.write_pytest_benchmark(
                self.config.pb_json, to_pytest_benchmark(self.results, self.environment, storage.now_iso()))))
        if self.config.markdown is not None:
            attempt(self._write_markdown)
        if self.config.plots is not None:
            attempt(self._write_plots)
        if self.config.save is not None and self.results:
            if incomplete and not self.config.save_incomplete:
                lines.append(f"baseline {self.config.save!r} NOT saved: {incomplete}; a baseline run must be a "
                             f"whole, passing session (--bench-save-incomplete stores it anyway)")
            else:
                attempt(self._save_baseline)
        return lines, failures

    def plot_groups(self) -> list[tuple[str, str, list[tuple[str, tuple[float, ...]]]]]:
        """(name, title, groups) for every plot: a result with its baseline runs and fresh processes, and
        each A/B decision's two sides. The figure the gate compares: GPU time where there is one."""
        out = []
        for m in self.results:
            groups = [("this run", m.primary_ms)]
            groups += [(f"fresh process {i + 1}", r.primary_ms) for i, r in enumerate(self.replicas.get(m.name, ()))]
            if self.baseline is not None:
                groups += [(f"baseline run {i}", r.primary_ms) for i, r in enumerate(self.baseline.get(m.name, ()))]
            title = f"{m.name}: {m.timer} time" + (f" against baseline {self.config.compare!r}" if self.baseline else "")
            out.append((m.name, title, groups))
        for name, r in self.decisions:
            out.append((f"ab-{name}", f"A/B {name}: baseline and candidate, interleaved pairs",
                        [("baseline", tuple(r.baseline_ms)), ("candidate", tuple(r.candidate_ms))]))
        return out

    def _write_plots(self) -> str:
        from bench_core.output.plots import png

        written = [storage.write_plot(self.config.plots, self.shown(name), png(self.shown(title), groups))
                   for name, title, groups in self.plot_groups() if all(len(g) for _, g in groups)]
        return f"{len(written)} distribution plot(s) written to {self.config.plots}"

    def _write_markdown(self) -> str:
        from bench_core.output.tables import comparison_notes, markdown

        notes = [f"{n}: {t}" for n, t in self.one_side]
        notes += sorted({c.method for c in self.comparisons if c.method})
        notes += [f"warning: {n}" for n in self.baseline_notes]
        notes += comparison_notes(self.comparisons)
        text = markdown(f"bench_core: {self.compared_with or 'results'}",
                        self.outcome() if self.compared_with else None, self.comparisons,
                        [c for c in self.comparisons if self.fails(c)], self.results, self.errors, self.decisions, notes)
        return f"Markdown report appended to {storage.append_text(self.config.markdown, self.shown(text))}"

    def _write_session(self) -> str:
        against = None
        if self.revision is not None:
            against = {"baseline": self.revision.revision.to_dict(), "current": self.revision.current.to_dict(),
                       "scenarios": self.against_records,
                       "one_side": [{"scenario": n, "note": t} for n, t in self.one_side]}
        p = storage.write_session(self.config.results_dir, self.results, self.environment,
                                  [{"scenario": n, "problem": p} for n, p in self.errors],
                                  [c.to_dict() for c in self.comparisons], against=against, replicas=self.replicas)
        return f"results written to {p}"

    def _save_baseline(self) -> str:
        path, n = storage.save_baseline(self.config.baselines_dir, self.config.save, self.results,
                                        self.environment, append=self.config.append)
        return f"baseline {self.config.save!r} saved to {path} ({n} run{'s' if n != 1 else ''})"


def _describe(rev) -> str:
    commit = rev.commit[:12] if rev.commit else "no commit"
    return f"working tree at {commit}" + (f", dirty (diff sha256 {rev.diff_sha256[:12]})" if rev.dirty else ", clean")
