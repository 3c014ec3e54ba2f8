"""pytest plugin: options, the `bench` fixture, per-test gate failures, the end-of-session tables.

A thin shell: everything real lives in bench_core.session and below.
"""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bench_core.files import children
from bench_core.shells import options as opt, replay

_KEY = pytest.StashKey["object"]()
_SIGTERM = pytest.StashKey["object"]()
_DESELECTED = pytest.StashKey[bool]()    # -k or -m left tests out on purpose   # the SIGTERM handler the session replaced
_STORED = pytest.StashKey["object"]()   # finish()'s lines, or the exception that stopped it
GPU_MARKER = "gpu"


def pytest_addoption(parser):
    opt.add_to_pytest(parser.getgroup("bench_core", "bench_core benchmarks"))


def pytest_configure(config):
    config.addinivalue_line("markers", f"{GPU_MARKER}: needs a CUDA device; skipped without {opt.GPU}")
    if not _active(config):
        return
    from bench_core.core.errors import BenchError
    from bench_core.files.machine import fingerprint
    from bench_core.session import BenchSession
    from bench_core.timing.devices import cuda_available
    from bench_core.workflows import worker

    device = "cuda" if config.getoption(opt.GPU) else "cpu"
    if device == "cuda" and not cuda_available():
        raise pytest.UsageError(
            "--gpu was given but CUDA is not available (no driver, no device, or a CPU-only torch build). "
            "Refusing to run on the CPU instead: a GPU run must never pass by quietly measuring the CPU."
        )
    try:
        root = _project_root(config)
        scfg = opt.session_config(config.getoption, root, device)
        shared = xdist_share(config)
        if shared and (scfg.save or scfg.compare or scfg.against):
            raise ValueError(f"under pytest-xdist ({shared}) each process runs only its share of the scenarios, so "
                             f"a baseline would be stored, or a gate decided, from a part of the suite: run the "
                             f"benchmarks without -n when storing or gating")
        malloc = worker.settle_malloc(scfg.malloc, serving=scfg.serve is not None)
        session = BenchSession(scfg, {**fingerprint(device, root=str(root)), "malloc": malloc})
        if config.getoption("verbose") > -2:   # -qq silences it
            session.watch(lambda line: _progress_line(config, line))
        config.stash[_KEY] = session
        config.stash[_SIGTERM] = children.sigterm_as_interrupt()
        if scfg.serve is not None:
            from bench_core.shells import serving

            serving.start(config, session)
        elif scfg.against is not None:
            session.open_revision(root)
    except (BenchError, ValueError) as exc:
        raise pytest.UsageError(f"bench_core: {exc}") from None


def pytest_report_header(config):
    if config.pluginmanager.hasplugin("benchmark"):   # its header line is about its own fixture, not ours
        return ["bench_core: `bench` measures with bench_core's own sampler and counts; the `benchmark:` line above "
                "is pytest-benchmark's, whose defaults apply only to its `benchmark` fixture"]
    return None


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


def pytest_collection_modifyitems(config, items):
    if not config.getoption(opt.GPU):
        skip = pytest.mark.skip(reason=f"needs a CUDA device: run with {opt.GPU}")
        for item in items:
            if GPU_MARKER in item.keywords:
                item.add_marker(skip)


def pytest_deselected(items):
    if items:
        items[0].config.stash[_DESELECTED] = True


def pytest_collection_finish(session):
    bench = _session(session.config)
    if bench is not None:  # the family each decision is adjusted for, before any is taken (after -k, -m)
        bench.collected(sum(1 for i in session.items if "bench" in getattr(i, "fixturenames", ())
                            and not i.get_closest_marker("skip")))


def pytest_unconfigure(config):
    session = _session(config)
    if session is not None:
        session.close_revision()
    previous = config.stash.get(_SIGTERM, None)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


class BenchFixture:
    """What a benchmark sees: the device, the size knob, and `run` to measure its scenario."""

    def __init__(self, session, request):
        from bench_core.timing.counts import Sizing

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

        session = self._session
        if session.serving is not None:
            from bench_core.shells import serving

            return serving.serve(session, self._request, self._sizing, scenario, fn, kwargs)
        try:
            if session.revision is not None:
                m, c = replay.run_against(session, self._request, self._sizing, scenario, fn, kwargs)
            else:
                replicate = replay.replicator(session, self._request, scenario.name) \
                    if session.baseline is not None else None
                m, c = session.run(scenario, fn, replicate=replicate, **kwargs)
        except ScenarioError as exc:
            pytest.fail(self._session.shown(str(exc)), pytrace=False)
        why = session.failed_to_compare(scenario.name) if c is None and session.config.strict else None
        if why is not None:
            self._reported(m, None)
            pytest.fail(f"scenario {scenario.name!r}: not compared with {session.compared_with}: {why} "
                        f"(--bench-strict)", pytrace=False)
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
                grew = f"its work grew ({'; '.join(c.grown)}); timing " if c.grown else ""
                pytest.fail(self._session.shown(f"scenario {m.name!r}: {grew}{c.verdict} against "
                                                f"{self._session.compared_with}: {c.reason}\n{table}"), pytrace=False)
        return m

    def run_distributed(self, scenario, build, *, nproc=2, params=None, **kwargs):
        """A scenario of several ranks: `build(ctx) -> bench_core.workflows.distributed.rank_program.RankStep` runs in every rank (a
        module-level function of the benchmark file), launched by torch's elastic launcher; the result is the
        maximum over ranks of each step, with every rank kept. `--bench-nproc` beats `nproc`."""
        from bench_core.core.errors import ScenarioError

        session = self._session
        if session.revision is not None:
            pytest.skip(f"{opt.AGAINST} does not compare distributed scenarios yet; gate them against a stored "
                        f"baseline ({opt.COMPARE})")
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
                pytest.skip(f"{exc}: record one with {opt.REF_SAVE}")
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
    """The fixture; around the test, the process-wide state it may change: each scenario starts from the
    session's state, and one that leaves a setting changed or a process behind is named (and it is undone)."""
    from bench_core.workflows import isolation

    session = _session(request.config)
    if session is None:  # pragma: no cover - configure always builds one
        pytest.skip("bench_core session not configured")
    before = isolation.capture()
    yield BenchFixture(session, request)
    kept = set(session.workers.pids()) if session.workers is not None else set()   # the pool's, on purpose
    said = isolation.restore(before, kept)
    if said:
        session.left_changed(request.node.name, said)


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
    incomplete = None
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        incomplete = "the session was interrupted"
    elif session.testsfailed:
        incomplete = f"{session.testsfailed} test(s) failed"
    lines, failures = bench.finish(incomplete)
    wrong = [f"no scenario was compared with {bench.compared_with}: the session fails (the reasons are under the "
             f"comparison table)"] if bench.nothing_compared() else []   # a gate that compared nothing never passes
    missing = bench.missing_from_run()
    if missing and bench.config.strict and not session.config.stash.get(_DESELECTED, False):
        wrong.append(f"--bench-strict: {len(missing)} scenario(s) of the baseline were not run now "
                     f"({', '.join(missing)}); select on purpose with -k or -m, or record a new baseline")
    session.config.stash[_STORED] = (lines, failures, wrong)
    if (failures or wrong) and exitstatus == 0:  # losing results silently is worse than a red run
        session.exitstatus = 1
