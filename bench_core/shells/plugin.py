"""pytest plugin: options, the `bench` fixture, per-test gate failures, the end-of-session tables.

A thin shell: everything real lives in bench_core.session and below.
"""
from __future__ import annotations

from pathlib import Path

import pytest

OPT_GPU = "--gpu"
OPT_WARMUP = "--bench-warmup"
OPT_REPEATS = "--bench-repeats"
OPT_QUICK = "--bench-quick"
OPT_THREADS = "--bench-threads"
OPT_OUT = "--bench-out"
OPT_NO_OUT = "--bench-no-out"
OPT_SAVE = "--bench-save"
OPT_APPEND = "--bench-append"
OPT_SAVE_INCOMPLETE = "--bench-save-incomplete"
OPT_COMPARE = "--bench-compare"
OPT_BASELINES = "--bench-baselines"
OPT_THRESHOLD = "--bench-threshold"
OPT_ALPHA = "--bench-alpha"
OPT_RUN_NOISE = "--bench-run-noise"
OPT_ALLOW_ENV = "--bench-allow-env-mismatch"
OPT_MIN_RUNS = "--bench-min-runs"
OPT_MAX_RUNS = "--bench-max-runs"
OPT_WINDOW = "--bench-baseline-window"
OPT_PB_JSON = "--bench-pb-json"
OPT_PROFILE = "--bench-profile"
OPT_REF_SAVE = "--bench-ref-save"
OPT_REFS = "--bench-references"
OPT_PROFILE_SHAPES = "--bench-profile-shapes"
OPT_PROFILE_MEMORY = "--bench-profile-memory"
OPT_PROFILE_STACK = "--bench-profile-stack"
OPT_PROFILE_FLOPS = "--bench-profile-flops"
OPT_PROFILE_TB = "--bench-profile-tensorboard"
OPT_PROFILE_REFUSE = "--bench-profile-refuse-sensitive"
OPT_TIMEOUT = "--bench-timeout"
OPT_STRICT = "--bench-strict"
OPT_MD = "--bench-md"
OPT_WIDE = "--bench-wide"
OPT_PLOTS = "--bench-plots"
OPT_FLOPS = "--bench-flops"
OPT_PEAK = "--bench-peak-tflops"
OPT_AGAINST = "--bench-against"
OPT_ROUNDS = "--bench-rounds"
OPT_PAIRS = "--bench-pairs"
OPT_WORKER_PAIRS = "--bench-worker-pairs"
OPT_MAX_ROUNDS = "--bench-max-rounds"
OPT_NPROC = "--bench-nproc"
OPT_NNODES = "--bench-nnodes"
OPT_NODE_RANK = "--bench-node-rank"
OPT_RDZV = "--bench-rdzv-endpoint"

_KEY = pytest.StashKey["object"]()
_STORED = pytest.StashKey["object"]()   # finish()'s lines, or the exception that stopped it
GPU_MARKER = "gpu"


def pytest_addoption(parser):
    g = parser.getgroup("bench_core", "bench_core benchmarks")
    g.addoption(OPT_GPU, action="store_true", help="run scenarios on CUDA; stop at once if CUDA is not available")
    g.addoption(OPT_WARMUP, type=int, default=None, help="untimed warmup calls per scenario (overrides scenarios)")
    g.addoption(OPT_REPEATS, type=int, default=None, help="timed samples per scenario (overrides scenarios)")
    g.addoption(OPT_QUICK, action="store_true", help="smoke run: smallest sizes, 1 warmup, 5 samples")
    g.addoption(OPT_THREADS, default=None, metavar="N|auto",
                help="torch CPU threads; on the CPU the default is 1 (on a loaded runner more threads split the "
                     "samples into clusters); 'auto' keeps torch's own default; recorded in every result")
    g.addoption(OPT_OUT, default=".bench/results", help="folder for the session's JSON results (never overwritten)")
    g.addoption(OPT_NO_OUT, action="store_true", help="write no session JSON")
    g.addoption(OPT_SAVE, metavar="NAME", default=None, help="store this session as baseline NAME")
    g.addoption(OPT_APPEND, action="store_true", help="with --bench-save: add this session as another run of NAME")
    g.addoption(OPT_SAVE_INCOMPLETE, action="store_true",
                help="with --bench-save: store the session even when it was interrupted or a test failed")
    g.addoption(OPT_COMPARE, metavar="NAME", default=None, help="gate every scenario against baseline NAME")
    g.addoption(OPT_BASELINES, default="baselines", help="folder of stored baselines")
    g.addoption(OPT_THRESHOLD, type=float, default=None, help="default noise threshold, a fraction (0.05 = 5%%)")
    g.addoption(OPT_ALPHA, type=float, default=None, help="family-wise significance level of the gate")
    g.addoption(OPT_RUN_NOISE, type=float, default=None,
                help="fallback run-to-run spread, a fraction, for a baseline too small to fit its own")
    g.addoption(OPT_MIN_RUNS, type=int, default=None,
                help="processes (this one + fresh ones) before the gate says slower or faster (3; 1: this one decides)")
    g.addoption(OPT_MAX_RUNS, type=int, default=None,
                help="the gate's replication budget: a possible slowdown is measured in fresh processes up to "
                     "this many runs in all (7)")
    g.addoption(OPT_WINDOW, type=int, default=None, metavar="N",
                help="compare with the latest N runs of the baseline (a rolling window; the noise prior uses all)")
    g.addoption(OPT_ALLOW_ENV, action="store_true", help="compare even when the environments differ")
    g.addoption(OPT_MD, metavar="PATH", default=None,
                help="append a Markdown report here (e.g. \"$GITHUB_STEP_SUMMARY\"): verdicts first, then tables")
    g.addoption(OPT_WIDE, action="store_true",
                help="tables with every column and notes unwrapped (by default they fit 120 columns)")
    g.addoption(OPT_PLOTS, metavar="DIR", default=None,
                help="write a distribution plot per scenario (this run, baseline runs, A and B) to DIR "
                     "(needs matplotlib: pip install -e \".[plots]\")")
    g.addoption(OPT_FLOPS, action="store_true",
                help="count each step's FLOPs once after its window (torch's FLOP counter) and report achieved "
                     "FLOP/s and the share of the peak")
    g.addoption(OPT_PEAK, type=float, default=None, metavar="TFLOPS",
                help="the device's peak for utilization (default: a known GPU's for the dtype, or on the CPU a "
                     "matmul peak measured once)")
    g.addoption(OPT_STRICT, action="store_true",
                help="with a comparison: inconclusive and incomparable fail their test items too")
    g.addoption(OPT_TIMEOUT, type=float, default=600.0,
                help="seconds a scenario may take, everything included; a hang fails it by name (0: no limit)")
    g.addoption(OPT_AGAINST, metavar="REV", default=None,
                help="measure every scenario side by side with git revision REV in this run, and decide each")
    g.addoption(OPT_ROUNDS, type=int, default=None, help="with --bench-against: rounds of fresh instances (12)")
    g.addoption(OPT_PAIRS, type=int, default=None, help="with --bench-against: alternated pairs per round (4)")
    g.addoption(OPT_WORKER_PAIRS, type=int, default=None, metavar="N",
                help="with --bench-against, for code that cannot be loaded twice into one process: pairs of worker "
                     "processes, the unit of evidence there (6; 3 under --bench-quick); each pair serves every such "
                     "scenario in turn")
    g.addoption(OPT_MAX_ROUNDS, type=int, default=None,
                help="with --bench-against: a possible slowdown the first look leaves undecided runs on, a look every "
                     "--bench-rounds rounds, up to this many (3 x --bench-rounds; equal to it: one look)")
    g.addoption(OPT_NPROC, type=int, default=None, metavar="N",
                help="distributed scenarios: ranks on this host (default: each scenario's own, 2); under --gpu one GPU "
                     "per rank")
    g.addoption(OPT_NNODES, type=int, default=1, metavar="N",
                help="distributed scenarios over N hosts: run the same suite on each, with the same "
                     f"{OPT_RDZV}; needs {OPT_NPROC}")
    g.addoption(OPT_NODE_RANK, type=int, default=0, metavar="K", help="this host's index among --bench-nnodes (0: "
                                                                    "hosts the rendezvous)")
    g.addoption(OPT_RDZV, default=None, metavar="HOST:PORT",
                help="where the hosts of a multi-host run meet (node 0's address and a free port)")
    g.addoption(OPT_PB_JSON, default=None, help="also write the results in pytest-benchmark's JSON format here")
    g.addoption(OPT_REF_SAVE, action="store_true",
                help="save reference files (starting state + baseline outputs) for bench.reference checks")
    g.addoption(OPT_REFS, default="references", help="folder of reference files")
    g.addoption(OPT_PROFILE, metavar="DIR", default=None,
                help="diagnose: after each measurement, one profiler pass; traces and hypotheses go to DIR")
    g.addoption(OPT_PROFILE_SHAPES, action="store_true", help="diagnose: record input shapes (adds cost)")
    g.addoption(OPT_PROFILE_MEMORY, action="store_true", help="diagnose: profile memory, and show memory by op")
    g.addoption(OPT_PROFILE_STACK, action="store_true", help="diagnose: record Python stacks (adds cost)")
    g.addoption(OPT_PROFILE_FLOPS, action="store_true",
                help="diagnose: the profiler's FLOP estimates (matmuls, 2D convolutions), a FLOPs-sorted table")
    g.addoption(OPT_PROFILE_TB, action="store_true", help="diagnose: also write for the TensorBoard profiler plugin")
    g.addoption(OPT_PROFILE_REFUSE, action="store_true",
                help="diagnose: refuse to write a trace holding sensitive strings, instead of redacting them")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{GPU_MARKER}: needs a CUDA device; skipped without {OPT_GPU}")
    if not _active(config):
        return
    from bench_core.deciding.gate import GateConfig
    from bench_core.files.machine import fingerprint
    from bench_core.core.errors import BenchError
    from bench_core.session import AgainstConfig, BenchSession, SessionConfig
    from bench_core.timing.devices import cuda_available

    device = "cuda" if config.getoption(OPT_GPU) else "cpu"
    if device == "cuda" and not cuda_available():
        raise pytest.UsageError(
            "--gpu was given but CUDA is not available (no driver, no device, or a CPU-only torch build). "
            "Refusing to run on the CPU instead: a GPU run must never pass by quietly measuring the CPU."
        )
    gate_kw = {k: v for k, v in (("threshold", config.getoption(OPT_THRESHOLD)), ("alpha", config.getoption(OPT_ALPHA)),
                                 ("run_noise", config.getoption(OPT_RUN_NOISE)),
                                 ("min_runs", config.getoption(OPT_MIN_RUNS)),
                                 ("max_runs", config.getoption(OPT_MAX_RUNS)),
                                 ("window", config.getoption(OPT_WINDOW))) if v is not None}
    try:
        gate = GateConfig(allow_env_mismatch=config.getoption(OPT_ALLOW_ENV), **gate_kw)
        root = Path(str(config.rootpath))
        prof = None
        folder = config.getoption(OPT_PROFILE)
        if folder and Path(folder).exists() and not Path(folder).is_dir():  # found now, not after measuring
            raise ValueError(f"{OPT_PROFILE} {folder}: is a file; give a folder for the traces")
        if config.getoption(OPT_PROFILE):
            from bench_core.workflows.diagnose.profile import ProfileConfig, check_cuda_profiling

            if device == "cuda":
                check_cuda_profiling()
            prof = ProfileConfig(folder=Path(config.getoption(OPT_PROFILE)), device=device,
                                 record_shapes=config.getoption(OPT_PROFILE_SHAPES),
                                 profile_memory=config.getoption(OPT_PROFILE_MEMORY),
                                 with_stack=config.getoption(OPT_PROFILE_STACK),
                                 with_flops=config.getoption(OPT_PROFILE_FLOPS),
                                 tensorboard=config.getoption(OPT_PROFILE_TB),
                                 refuse_sensitive=config.getoption(OPT_PROFILE_REFUSE))
        against = None
        if config.getoption(OPT_AGAINST) is not None:
            kw = {k: v for k, v in (("rounds", config.getoption(OPT_ROUNDS)), ("pairs", config.getoption(OPT_PAIRS)),
                                    ("max_rounds", config.getoption(OPT_MAX_ROUNDS)),
                                    ("processes", config.getoption(OPT_WORKER_PAIRS)),
                                    ("quick_processes", config.getoption(OPT_WORKER_PAIRS)),
                                    ("threshold", config.getoption(OPT_THRESHOLD))) if v is not None}
            against = AgainstConfig(config.getoption(OPT_AGAINST), **kw)
        scfg = SessionConfig(
            device=device, warmup=config.getoption(OPT_WARMUP), repeats=config.getoption(OPT_REPEATS),
            quick=config.getoption(OPT_QUICK), threads=_threads(config.getoption(OPT_THREADS), device),
            results_dir=None if config.getoption(OPT_NO_OUT) else root / config.getoption(OPT_OUT),
            baselines_dir=root / config.getoption(OPT_BASELINES), save=config.getoption(OPT_SAVE),
            append=config.getoption(OPT_APPEND), save_incomplete=config.getoption(OPT_SAVE_INCOMPLETE),
            compare=config.getoption(OPT_COMPARE),
            pb_json=config.getoption(OPT_PB_JSON), gate=gate, profile=prof,
            references_dir=root / config.getoption(OPT_REFS), save_references=config.getoption(OPT_REF_SAVE),
            against=against, timeout_s=config.getoption(OPT_TIMEOUT) or None, strict=config.getoption(OPT_STRICT),
            markdown=Path(config.getoption(OPT_MD)) if config.getoption(OPT_MD) else None,
            wide=config.getoption(OPT_WIDE),
            plots=root / config.getoption(OPT_PLOTS) if config.getoption(OPT_PLOTS) else None,
            count_flops=config.getoption(OPT_FLOPS), peak_tflops=config.getoption(OPT_PEAK),
            topology=_topology(config),
        )
        if scfg.plots is not None:  # found now, not after minutes of measuring
            from bench_core.output.plots import NEEDS, available

            if not available():
                raise ValueError(f"{OPT_PLOTS}: {NEEDS}")
        session = BenchSession(scfg, fingerprint(device, root=str(root)))
        if config.getoption("verbose") > -2:   # -qq silences it
            from bench_core.output.progress import Progress

            session.progress = Progress(lambda line: _progress_line(config, line))
        if against is not None:
            session.open_revision(root)
        config.stash[_KEY] = session
    except (BenchError, ValueError) as exc:
        raise pytest.UsageError(f"bench_core: {exc}") from None


CPU_DEFAULT_THREADS = 1


def _topology(config):
    """The command line's placement of distributed ranks, or None: each scenario's own world size, one host."""
    from bench_core.workflows.distributed.launch import Topology

    nproc, nnodes = config.getoption(OPT_NPROC), config.getoption(OPT_NNODES)
    endpoint, node_rank = config.getoption(OPT_RDZV), config.getoption(OPT_NODE_RANK)
    if nproc is None:
        if nnodes != 1 or endpoint is not None or node_rank != 0:
            raise ValueError(f"{OPT_NNODES}, {OPT_NODE_RANK} and {OPT_RDZV} place ranks on several hosts: give "
                             f"{OPT_NPROC} too (ranks per host, the same on every host)")
        return None
    return Topology(nproc, nnodes, node_rank, endpoint)


def _threads(value, device: str) -> int | None:
    """--bench-threads: a count, 'auto' (torch's default), or unset: one thread on the CPU, where torch's default
    on a loaded shared runner split samples into two clusters 30x apart; torch's default on a GPU run."""
    if value is None:
        return CPU_DEFAULT_THREADS if device == "cpu" else None
    if str(value).lower() == "auto":
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise ValueError(f"{OPT_THREADS} takes a positive count or 'auto', got {value!r}")
    return int(value)


def _progress_line(config, line: str) -> None:
    """A line in pytest's own output, past output capture (a test's prints stay captured)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(line)


def _active(config) -> bool:
    # `pytest --help` must work even where torch or CUDA is broken: build no session for it.
    return not config.getoption("help", False)


def _session(config):
    return config.stash.get(_KEY, None)


def pytest_collection_modifyitems(config, items):
    if not config.getoption(OPT_GPU):
        skip = pytest.mark.skip(reason=f"needs a CUDA device: run with {OPT_GPU}")
        for item in items:
            if GPU_MARKER in item.keywords:
                item.add_marker(skip)


def pytest_collection_finish(session):
    bench = _session(session.config)
    if bench is not None:  # the family each decision is adjusted for, before any is taken (after -k, -m)
        bench.family_size = sum(1 for i in session.items if "bench" in getattr(i, "fixturenames", ())
                                and not i.get_closest_marker("skip"))


def pytest_unconfigure(config):
    session = _session(config)
    if session is not None:
        session.close_revision()


class BenchFixture:
    """What a benchmark sees: the device, the size knob, and `run` to measure its scenario."""

    def __init__(self, session, request):
        from bench_core.workflows.side_by_side.capture import Sizing

        self._session = session
        self._request = request
        self._node = request.node
        self._sizing = Sizing(session.config.device, session.config.quick)
        self.device, self.quick = self._sizing.device, self._sizing.quick

    @property
    def on_gpu(self) -> bool:
        return self._sizing.on_gpu

    def size(self, cpu, gpu, quick=None):
        """Pick a size: small on the CPU, realistic on the GPU, smallest in --bench-quick."""
        return self._sizing.size(cpu, gpu, quick)

    def run(self, scenario, fn, **kwargs):
        from bench_core.core.errors import ScenarioError

        try:
            if self._session.revision is not None:
                m, c = self._run_against(scenario, fn, kwargs)
            else:
                replicate = self._replicator(scenario.name) if self._session.baseline is not None else None
                m, c = self._session.run(scenario, fn, replicate=replicate, **kwargs)
        except ScenarioError as exc:
            pytest.fail(self._session.shown(str(exc)), pytrace=False)
        return self._reported(m, c)

    def _reported(self, m, c):
        """The result on this test's report, and its failure when the gate says so."""
        from bench_core.output.tables import session_table

        s = m.summary
        self._node.user_properties.append(("bench_median_ms", s.median))
        self._node.user_properties.append(("bench_n", s.n))
        # per-test section: shown with this test's report (failures, -rA, JUnit system-out)
        self._node.add_report_section("call", "bench_core", self._session.shown(session_table([m], wide=self._session.config.wide)))
        if c is not None:
            from bench_core.output.tables import comparison_table

            self._node.user_properties.append(("bench_verdict", c.verdict))
            if self._session.fails(c):
                table = comparison_table([c], self._session.config.gate.alpha, wide=self._session.config.wide)
                pytest.fail(self._session.shown(f"scenario {m.name!r}: {c.verdict} against "
                                                f"{self._session.compared_with}: {c.reason}\n{table}"), pytrace=False)
        return m

    def run_distributed(self, scenario, build, *, nproc=2, params=None, **kwargs):
        """A scenario of several ranks: `build(ctx) -> bench_core.workflows.distributed.rank_program.RankStep` runs in every rank (a
        module-level function of the benchmark file), launched by torch's elastic launcher; the result is the
        maximum over ranks of each step, with every rank kept. `--bench-nproc` beats `nproc`."""
        from bench_core.core.errors import ScenarioError

        session = self._session
        if session.revision is not None:
            pytest.skip(f"{OPT_AGAINST} does not compare distributed scenarios yet; gate them against a stored "
                        f"baseline ({OPT_COMPARE})")
        self._skip_without_gpus(scenario.name, nproc)
        try:
            m, c = session.run_distributed(scenario, build, nproc=nproc, params=params, **kwargs)
        except ScenarioError as exc:
            pytest.fail(session.shown(str(exc)), pytrace=False)
        from bench_core.core.ranks import problems

        wrong = problems(m.ranks)
        if wrong:   # measured and kept, but a step that computes the wrong thing fails its test
            pytest.fail(f"scenario {m.name!r}: " + "; ".join(wrong), pytrace=False)
        return self._reported(m, c)

    def _skip_without_gpus(self, name, nproc):
        """A scenario's own world size on a runner with fewer GPUs is skipped, saying so; a --bench-nproc the
        runner cannot give is an error (raised when the launch is checked)."""
        config = self._session.config
        if config.topology is None and config.device == "cuda":
            from bench_core.workflows.distributed.launch import gpus_short

            short = gpus_short(nproc)
            if short:
                pytest.skip(f"{name}: {short}")

    def ab_distributed(self, name, build, *, baseline, candidate, nproc=2, **kwargs):
        """Two configurations of a distributed scenario (the builder parameters of each side), timed in the same
        ranks and decided; a candidate that does not start and end equal to the baseline fails this test."""
        from bench_core.core.errors import ScenarioError
        from bench_core.deciding.verdicts import REJECTED

        self._skip_without_gpus(name, nproc)
        try:
            res = self._session.ab_distributed(name, build, baseline, candidate, nproc=nproc, **kwargs)
        except ScenarioError as exc:
            pytest.fail(self._session.shown(str(exc)), pytrace=False)
        self._node.user_properties.append(("bench_ab_verdict", res.verdict))
        if res.verdict == REJECTED:
            pytest.fail(f"A/B {name!r}: {res.reason}", pytrace=False)
        return res

    def _run_against(self, scenario, fn, kwargs):
        """Side by side with --bench-against's revision: this call's step is round 0 of the current side;
        every other instance comes from calling the test function again (this tree's, and the revision's)."""
        from bench_core.workflows.side_by_side.capture import capture, instance_from

        req, session = self._request, self._session
        loaded = session.revision
        name = scenario.name

        def value_of(arg):
            return req.node.funcargs[arg] if arg in req.node.funcargs else req.getfixturevalue(arg)

        def rebuild(_round):
            return capture(req.function, value_of, self._sizing, "current tree", name)

        theirs, why, isolate = self._revision_function()
        if isolate:  # cannot share this process: both sides in pairs of worker processes
            sides = self._worker_sides(name)
            if sides is not None:
                return session.run_against_workers(scenario, instance_from(fn, kwargs, scenario), sides,
                                                   items=kwargs.get("items"), proof={"why_workers": why})
        if theirs is None:  # the revision lacks it or cannot load it: measured alone, and reported
            session.one_side.append((name, f"measured on the current tree only: {why}"))
            return session.run(scenario, fn, **kwargs)

        def rev_build(_round):
            return capture(theirs, value_of, self._sizing, f"revision {loaded.revision.label}", name)

        live = instance_from(fn, kwargs, scenario)
        return session.run_against(scenario, live, rebuild, rev_build, items=kwargs.get("items"),
                                   proof=loaded.proof(req.path, req.function, theirs),
                                   clock=kwargs.get("clock"), backend=kwargs.get("backend"))

    def _revision_function(self):
        """(the revision's version of this test function, None, False), or (None, why there is none, whether
        the reason is that it cannot share this process)."""
        from bench_core.workflows.side_by_side.revisions import RevisionError

        req, loaded = self._request, self._session.revision
        if req.cls is not None:
            return None, "only module-level test functions are compared side by side", False
        if not loaded.counterpart(req.path).exists():
            return None, f"{loaded.counterpart(req.path).relative_to(loaded.root)} does not exist in " \
                         f"{loaded.revision.label}", False
        try:
            module = loaded.module_for(req.path)
        except Exception as exc:
            detail = str(exc) if isinstance(exc, RevisionError) else f"{type(exc).__name__}: {exc}"
            return None, (f"{loaded.revision.label}'s test module cannot be loaded beside the current code "
                          f"({detail}): code that registers global names (a torch.library operator) or a "
                          f"compiled extension cannot be loaded twice into one process"), True
        theirs = getattr(module, req.function.__name__, None)
        return (theirs, None, False) if theirs is not None else (
            None, f"{req.function.__name__} does not exist in {loaded.revision.label}", False)

    def _worker_spec(self, name):
        """The test a worker process serves to call this test again (its init is per side), or why it
        cannot: the test takes a fixture other than its parameters, or a parameter JSON cannot carry."""
        import inspect
        import json

        req = self._request
        params = dict(getattr(getattr(req.node, "callspec", None), "params", {}))
        needs = set(inspect.signature(req.function).parameters) - {"bench"}
        try:
            json.dumps(params)
        except TypeError:
            needs.add("a parameter JSON cannot carry")
        if needs - set(params):
            return None, f"worker processes cannot be given {sorted(needs - set(params))}"
        return {"scenario": name, "function": req.function.__name__, "params": params,
                "test_file": str(req.path)}, None

    def _worker_init(self, side, roots):
        config = self._session.config
        return {"side": side, "import_roots": roots, "device": config.device, "quick": config.quick,
                "threads": config.threads}

    def _worker_sides(self, name):
        """Each side's worker init and test for --bench-against's worker mode, or None when there can be none."""
        from bench_core.workflows.worker import import_roots

        req, session, loaded = self._request, self._session, self._session.revision
        spec, why = self._worker_spec(name)
        if spec is None:
            session.one_side.append((name, why))
            return None
        return {"candidate": (self._worker_init("candidate", import_roots(loaded.current_root, loaded.current_root)),
                              spec),
                "baseline": (self._worker_init("baseline", import_roots(loaded.current_root, loaded.root)),
                             {**spec, "test_file": str(loaded.counterpart(req.path))})}

    def _replicator(self, name):
        """The gate's replication: this test measured again in a fresh process of this tree, which imports
        what this process imports (its whole sys.path)."""
        import sys

        from bench_core.core.errors import ScenarioError
        from bench_core.workflows.worker import Worker

        session = self._session
        spec, why = self._worker_spec(name)

        def replicate(warmup, repeats):
            if spec is None:
                raise ScenarioError(name, why)
            init = self._worker_init("candidate", [p for p in sys.path if p])
            with Worker(init, timeout_s=session.config.timeout_s or 600.0, spec=spec) as worker:
                worker.wait_ready()
                worker.build()
                return worker.measure(warmup, repeats, session.environment)
        return replicate

    def validate(self, baseline, candidate, state, model, optimizer=None, **kwargs):
        """Correctness from a saved state. Returns the report for the test to assert on; passed to
        `ab` as `validation`, a failed report rejects the candidate there without timing it."""
        from bench_core.workflows.validation.correctness import validate

        rep = validate(baseline, candidate, state, model, optimizer, **kwargs)
        self._node.user_properties.append(("bench_correct", rep.ok))
        return rep

    def reference(self, name, variant, state, model, optimizer=None, *, steps=3, tolerance=None):
        """Across commits: with --bench-ref-save, record `variant`'s outputs from `state` as reference
        NAME; otherwise check `variant` against the saved reference (skip when there is none yet)."""
        from bench_core.core.errors import StorageError

        try:
            rep = self._session.reference(name, variant, state, model, optimizer, steps=steps, tolerance=tolerance)
        except StorageError as exc:
            if exc.problem.startswith("no reference"):
                pytest.skip(f"{exc}: record one with {OPT_REF_SAVE}")
            raise
        if rep is None:
            return None
        self._node.user_properties.append(("bench_reference_ok", rep.ok))
        if not rep.ok:
            pytest.fail(f"reference {name!r}: the current code no longer matches\n{rep.table()}", pytrace=False)
        return rep

    def ab(self, name, baseline, candidate, *, validation=None, **kwargs):
        """Interleaved A/B timing after correctness; an incorrect candidate fails this test."""
        from bench_core.deciding.verdicts import REJECTED
        from bench_core.core.errors import ScenarioError

        try:
            res = self._session.ab(name, baseline, candidate, validation=validation, **kwargs)
        except ScenarioError as exc:
            pytest.fail(str(exc), pytrace=False)
        self._node.user_properties.append(("bench_ab_verdict", res.verdict))
        if res.verdict == REJECTED:
            pytest.fail(f"A/B {name!r}: candidate rejected as incorrect\n{validation.table()}", pytrace=False)
        return res


@pytest.fixture
def bench(request):
    session = _session(request.config)
    if session is None:  # pragma: no cover - configure always builds one
        pytest.skip("bench_core session not configured")
    return BenchFixture(session, request)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = _session(config)
    if session is None:
        return
    for title, text in session.summary_sections():
        terminalreporter.section(title)
        terminalreporter.write_line(text)
    lines, failures = config.stash.get(_STORED, ([], []))
    for line in lines:
        terminalreporter.write_line(line)
    for failure in failures:
        terminalreporter.write_line(f"bench_core: could not store: {failure}", red=True)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    bench = _session(session.config)
    if bench is None:
        return
    incomplete = None
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        incomplete = "the session was interrupted"
    elif session.testsfailed:
        incomplete = f"{session.testsfailed} test(s) failed"
    lines, failures = bench.finish(incomplete)
    session.config.stash[_STORED] = (lines, failures)
    if failures and exitstatus == 0:  # losing results silently is worse than a red run
        session.exitstatus = 1
