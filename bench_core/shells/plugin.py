"""pytest plugin: options, the `bench` fixture, per-test gate failures, the end-of-session tables.

A thin shell: everything real lives in bench_core.session and below.
"""
from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench_core.files import children
from bench_core.shells import configs, options as opt

_KEY = pytest.StashKey["object"]()
_SIGTERM = pytest.StashKey["object"]()   # the SIGTERM handler the session replaced
_DESELECTED = pytest.StashKey[bool]()    # -k or -m left tests out on purpose
_STORED = pytest.StashKey["object"]()   # finish()'s lines, or the exception that stopped it
_TIMED = pytest.StashKey["dict"]()      # a shard's tests' durations, by test id
GPU_MARKER = "gpu"


def pytest_addoption(parser):
    opt.add_to_pytest(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", f"{GPU_MARKER}: needs a CUDA device; skipped without {opt.GPU}")
    if not _active(config):
        return
    from bench_core.core.errors import BenchError
    from bench_core.core.modes import SERVE, SIDE_BY_SIDE
    from bench_core.files.machine import fingerprint
    from bench_core.session import BenchSession
    from bench_core.timing.devices import cuda_available
    from bench_core.workflows.malloc import settle_malloc

    device = "cuda" if config.getoption(opt.GPU) else "cpu"
    if device == "cuda" and not cuda_available():
        raise pytest.UsageError(
            "--gpu was given but CUDA is not available (no driver, no device, or a CPU-only torch build). "
            "Refusing to run on the CPU instead: a GPU run must never pass by quietly measuring the CPU."
        )
    try:
        root = _project_root(config)
        values, project = _values(config)
        scfg = configs.session_config(values, root, device, **_pytest_benchmark(config, values),
                                  **opt.project_defaults(project))
        shared = xdist_share(config)
        if shared:   # measurements taken beside other tests are refused, and nothing is written
            scfg = replace(scfg, concurrent=shared, results_dir=None, history=None, pb_json=None, markdown=None)
        malloc = settle_malloc(scfg.malloc, serving=scfg.mode == SERVE)
        session = BenchSession(scfg, {**fingerprint(device, root=str(root)), "malloc": malloc})
        if config.getoption("verbose") > -2:   # -qq silences it
            session.watch(lambda line: _progress_line(config, line))
        config.stash[_KEY] = session
        config.stash[_SIGTERM] = children.sigterm_as_interrupt()
        from bench_core.shells import pb_adoption

        pb_adoption.register(config, session, gated=scfg.gated)
        if scfg.mode == SERVE:
            from bench_core.shells import serving

            serving.start(config, session)
        elif scfg.mode == SIDE_BY_SIDE:
            session.open_revision(root, Path(str(config.rootpath)))
    except (BenchError, ValueError) as exc:
        raise pytest.UsageError(f"bench_core: {exc}") from None


def _values(config):
    """Each option's value (the command line's, else the project's [tool.bench_core] setting, else its default),
    and the project's settings."""
    from bench_core.files.project_config import read_table

    path = Path(str(config.rootpath)) / "pyproject.toml"
    project = opt.settings(read_table(path), str(path))
    return opt.values(config.getoption, project), project


def _pytest_benchmark(config, values) -> dict:
    """The session's fields that pytest-benchmark's own options give, where bench_core adopts its fixture:
    --benchmark-json (replaced each run, as there) and --benchmark-group-by."""
    if not config.pluginmanager.hasplugin("benchmark") or values(opt.PB_FIXTURE) == "leave":
        return {}
    from bench_core.output.summary import GROUP_KEYS

    out = {"group_by": config.getoption("benchmark_group_by", None)}
    keys = [k.strip() for k in (out["group_by"] or "").split(",") if k.strip()]
    wrong = [k for k in keys if k not in GROUP_KEYS and not (k.startswith("param:") and len(k) > 6)]
    if wrong:   # pytest-benchmark would group by nothing: said now, not as one table silently
        raise ValueError(f"--benchmark-group-by {out['group_by']}: unknown key(s) {', '.join(wrong)}; choose from "
                         f"{', '.join(GROUP_KEYS)} or param:NAME")
    path = config.getoption("benchmark_json", None)
    if path is not None:
        out.update(pb_json=Path(str(path)).absolute(), pb_json_replaces=True)
    return out


def xdist_share(config) -> str | None:
    """In words, when this pytest runs only a share of the tests (a pytest-xdist worker, or its controller with
    -n): None otherwise."""
    if hasattr(config, "workerinput"):
        return f"worker {config.workerinput.get('workerid', '?')}"
    n = config.getoption("numprocesses", None)
    return f"-n {n}" if n not in (None, 0, "0") else None


def _project_root(config) -> Path:
    """Where relative paths (baselines, results, references, plots) resolve: the git repository pytest was started
    in, else pytest's rootdir. Not the rootdir alone: an absolute path among the arguments (`--bench-md
    $GITHUB_STEP_SUMMARY`) can move it outside the project."""
    from bench_core.files import git

    top = git.output(str(config.invocation_params.dir), "rev-parse", "--show-toplevel")
    return Path(top) if top else Path(str(config.rootpath))


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


def pytest_report_header(config):
    """What a reader must know before any figure: a program changed to lower noise (pinned malloc, set
    threads), and how a revision's side got its compiled code (reused, built, cached)."""
    bench = _session(config)
    if bench is None:
        return []
    compiled = bench.revision.compiled if bench.revision is not None else None
    return [f"bench_core: {line}" for line in (bench.changed_program(), compiled and compiled.said) if line]


def pytest_collection_modifyitems(config, items):
    if not config.getoption(opt.GPU):
        skip = pytest.mark.skip(reason=f"needs a CUDA device: run with {opt.GPU}")
        for item in items:
            if GPU_MARKER in item.keywords:
                item.add_marker(skip)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_shard(config, items):
    """--bench-shard K/N: this runner keeps its part of the selection (after -k and -m, so that every runner given
    the same command splits the same tests), the others deselected; the session records which part it ran."""
    bench = _session(config)
    if bench is None or bench.config.shard is None:
        return
    from bench_core.workflows import shards

    k, n = bench.config.shard
    ids = [i.nodeid for i in items]
    c = bench.config
    try:
        durations = shards.read_durations(c.shard_durations) if c.shard_durations is not None else None
    except shards.ShardError as exc:
        raise pytest.UsageError(f"{opt.SHARD_DURATIONS}: {exc}") from None
    where = shards.assign(ids, n, durations)
    gone = [i for i in items if where[i.nodeid] != k]
    if gone:
        config.hook.pytest_deselected(items=gone)
    items[:] = [i for i in items if where[i.nodeid] == k]
    known = sum(1 for t in ids if durations and durations.get(t, 0) > 0)   # what `assign` deals by
    balanced = (f"by the durations in {c.shard_durations} ({known} of {len(ids)} tests known)" if known else
                "round robin" + (f" ({c.shard_durations} is not there yet)" if c.shard_durations is not None and
                                 durations is None else ""))
    bench.shard = shards.record(k, n, shards.split_id(ids, durations), len(items), {
        "device": c.device, "quick": c.quick, "threads": c.threads, "malloc": c.malloc, "warmup": c.warmup,
        "repeats": c.repeats, "timeout_s": c.timeout_s, "pb_fixture": c.pb_fixture}, balanced)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A shard's tests timed whole (setup, call, teardown) for the next run's balance (`bench-core merge
    --durations`)."""
    started = time.perf_counter()
    yield
    bench = _session(item.config)
    if bench is not None and bench.shard is not None:
        item.config.stash.setdefault(_TIMED, {})[item.nodeid] = round(time.perf_counter() - started, 4)


def pytest_deselected(items):
    if items:
        items[0].config.stash[_DESELECTED] = True


def pytest_collection_finish(session):
    bench = _session(session.config)
    if bench is not None:  # the family each decision is adjusted for, before any is taken (after -k, -m)
        measuring = ("bench", "benchmark") if bench.config.pb_fixture == "adopt" else ("bench",)
        items = [i for i in session.items if set(measuring) & set(getattr(i, "fixturenames", ()))]
        bench.collected(sum(1 for i in items if not i.get_closest_marker("skip")),
                        tuple(dict.fromkeys(Path(str(i.path)) for i in items)))


def pytest_unconfigure(config):
    session = _session(config)
    if session is not None:
        session.close_revision()
        from bench_core.timing.sampling import restore_threads

        restore_threads()
    previous = config.stash.get(_SIGTERM, None)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def bench(request):
    """The fixture; around the test, the process-wide state it may change: each scenario starts from the
    session's state, and one that leaves a setting changed or a process behind is named (and it is undone)."""
    from bench_core.shells.bench_fixture import BenchFixture, isolated

    session = _session(request.config)
    if session is None:  # pragma: no cover - configure always builds one
        pytest.skip("bench_core session not configured")
    with isolated(session, request):
        yield BenchFixture(session, request)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = _session(config)
    if session is None:
        return
    for title, text in session.summary_sections():
        terminalreporter.section(title)
        terminalreporter.write_line(text)
    lines, failures, wrong = config.stash.get(_STORED, ([], [], []))
    for line in lines:
        terminalreporter.write_line(line)
    for failure in failures:
        terminalreporter.write_line(f"bench_core: could not store: {failure}", red=True)
    for problem in wrong:
        terminalreporter.write_line(f"bench_core: {problem}", red=True)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    bench = _session(session.config)
    if bench is None:
        return
    from bench_core.output.reporters import INTERRUPTED

    incomplete = None
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        incomplete = INTERRUPTED
    elif session.testsfailed:
        incomplete = f"{session.testsfailed} test(s) failed"
    if bench.shard is not None:
        bench.shard = {**bench.shard, "durations": session.config.stash.get(_TIMED, {})}
    lines, failures = bench.finish(incomplete)
    wrong = [f"no scenario was compared with {bench.compared_with}: the session fails (the reasons are under the "
             f"comparison table)"] if bench.nothing_compared() else []   # a gate that compared nothing never passes
    if bench.unmeasured and bench.config.strict:
        wrong.append(f"--bench-strict: {len(bench.unmeasured)} test(s) timed something bench_core did not measure "
                     f"({', '.join(t for t, _ in bench.unmeasured)})")
    missing = bench.missing_from_run()
    # a revision's test this tree no longer defines was not left out by -k or -m: it is not here to select
    if missing and bench.config.strict and (bench.revision is not None
                                            or not session.config.stash.get(_DESELECTED, False)):
        fix = ("renamed or removed here: a bench test renamed is compared again when both sides declare the same "
               "literal Scenario(\"NAME\"); a pytest-benchmark test is named by its test, so a rename starts a new "
               "scenario, compared once the revision has it" if bench.revision is not None else
               "select on purpose with -k or -m, or record a new baseline")
        wrong.append(f"--bench-strict: {len(missing)} scenario(s) of {bench.compared_side} were not run now "
                     f"({', '.join(missing)}); {fix}")
    session.config.stash[_STORED] = (lines, failures, wrong)
    if (failures or wrong) and exitstatus == 0:  # losing results silently is worse than a red run
        session.exitstatus = 1
