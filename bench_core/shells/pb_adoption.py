"""pytest-benchmark suites, adopted unchanged: with bench_core installed, the `benchmark` fixture is a bench_core
scenario (`workflows.adopted` translates its calls into one `bench.run`), so every gate, the history and the
reports take it as they take a `bench` test; pytest-benchmark's own options keep their meaning or are refused,
and a test whose timing bench_core did not take is counted as not measured, never passed over.

`--bench-pb-fixture leave` gives the fixture back to pytest-benchmark; `-p no:bench_core` leaves it all alone.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import replace

import pytest

from bench_core.shells import options as opt
from bench_core.shells.replay import NAMES_ENV
from bench_core.workflows.adopted import PbCalls, PbOptions, plain

try:   # pytest-benchmark checks that its fixture's value is its own type
    from pytest_benchmark.fixture import BenchmarkFixture as _PbFixture
except ImportError:   # pragma: no cover - a dependency; without it the fixture is bench_core's alone
    _PbFixture = object

_ONLY_SKIP = "Skipping non-benchmark (--benchmark-only active)."   # pytest-benchmark's own reason

# pytest-benchmark's options that would gate or store what it no longer measures: refused, naming ours
REFUSED = {
    "--benchmark-save": f"{opt.SAVE} NAME",
    "--benchmark-autosave": f"{opt.SAVE} NAME",
    "--benchmark-save-data": f"{opt.SAVE} NAME (every raw sample is kept)",
    "--benchmark-compare": f"{opt.COMPARE} NAME, or {opt.AGAINST} REV",
    "--benchmark-compare-fail": f"{opt.COMPARE} NAME or {opt.AGAINST} REV (a gate with a noise model)",
}
# options that keep their meaning; every other --benchmark-* option given is named as not applied
KEPT = ("--benchmark-disable", "--benchmark-enable", "--benchmark-skip", "--benchmark-only",
        "--benchmark-min-rounds", "--benchmark-warmup", "--benchmark-warmup-iterations", "--benchmark-json",
        "--benchmark-group-by")
EQUIVALENT = {"--benchmark-timer": "bench_core's clocks: synced host time, CUDA events under --gpu",
              "--benchmark-cprofile": f"{opt.PROFILE} DIR", "--benchmark-histogram": f"{opt.PLOTS} DIR",
              "--benchmark-max-time": f"{opt.REPEATS} N", "--benchmark-disable-gc": "always paused during samples"}


def given_flags(config) -> list[str]:
    """The --benchmark-* flags given for this run (command line, PYTEST_ADDOPTS, the ini file's addopts), by name."""
    tokens = [str(a) for a in config.invocation_params.args] + shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    try:
        tokens += [str(t) for t in config.getini("addopts")]
    except (ValueError, KeyError):   # pragma: no cover - pytest always knows addopts
        pass
    return sorted({t.split("=", 1)[0] for t in tokens if t.startswith("--benchmark-")})


def pb_options(config, given: list[str]) -> PbOptions:
    """The session's pytest-benchmark options that keep their meaning (None where not given)."""
    def value(flag):
        return config.getoption(flag.lstrip("-").replace("-", "_"), None) if flag in given else None
    disabled = bool(config.getoption("benchmark_disable", False)) and not config.getoption("benchmark_enable", False)
    return PbOptions(warmup=value("--benchmark-warmup"), warmup_iterations=value("--benchmark-warmup-iterations"),
                     min_rounds=value("--benchmark-min-rounds"), disabled=disabled)


def check(given: list[str], options: PbOptions, gated: bool) -> list[str]:
    """pytest-benchmark's options given: a UsageError for one that bench_core cannot honour; otherwise the lines
    naming those with no effect here (for the header)."""
    refused = [f"{flag} (use {REFUSED[flag]})" for flag in given if flag in REFUSED]
    if refused:
        raise pytest.UsageError(f"bench_core: the benchmark fixture is measured by bench_core, so pytest-benchmark "
                                f"would store or compare nothing: {'; '.join(refused)}; or leave the fixture to "
                                f"pytest-benchmark ({opt.PB_FIXTURE} leave)")
    if options.disabled and gated:
        raise pytest.UsageError("bench_core: --benchmark-disable runs each benchmark once, unmeasured, so a gate "
                                "over it could only pass by accident: drop one or the other")
    ignored = [f"{flag} ({EQUIVALENT[flag]})" if flag in EQUIVALENT else flag for flag in given
               if flag not in KEPT and flag not in REFUSED]
    return [f"bench_core: pytest-benchmark option(s) not applied to the benchmark fixture: {', '.join(ignored)}"] \
        if ignored else []


class AdoptedBenchmark(PbCalls, _PbFixture):
    """pytest-benchmark's fixture object, measured by bench_core. Its attributes are pytest-benchmark's (name,
    fullname, param, params, group, extra_info); `measurement` is bench_core's result."""

    def __init__(self, node, name, run, metadata, marker, options):   # noqa: D107 - pytest-benchmark's own is not run
        PbCalls.__init__(self, name, run, metadata=metadata, marker=marker, options=options)
        spec = getattr(node, "callspec", None)
        self.fullname = node.nodeid
        self.param = spec.id if spec is not None else None
        self.params = dict(spec.params) if spec is not None else None
        self.disabled = options.disabled
        self.skipped = False
        self.has_error = False
        self.stats = None
        self.cprofile_stats = None
        self._cleanup_callbacks = []
        self._mode = None

    def _cleanup(self):   # pragma: no cover - pytest-benchmark's fixture calls it; bench_core's says unused itself
        pass


class Adoption:
    """The plugin that holds the `benchmark` fixture while bench_core adopts it (registered at configure, after
    pytest-benchmark, so its fixture is the one tests get)."""

    def __init__(self, session, options: PbOptions, header: list[str]):
        self.session, self.options, self.header = session, options, header
        self.names: dict[str, str] = {}
        self.fixtures: dict[str, AdoptedBenchmark] = {}

    @pytest.fixture
    def benchmark(self, request):
        """pytest-benchmark's `benchmark`, measured by bench_core (see `workflows.adopted`)."""
        from bench_core.shells.bench_fixture import BenchFixture, isolated

        c = request.config
        if c.getoption("benchmark_skip", False) and not c.getoption("benchmark_only", False):   # as there: only wins
            pytest.skip("Benchmarks are skipped (--benchmark-skip was used).")
        node = request.node
        marker = node.get_closest_marker("benchmark")
        fixture = AdoptedBenchmark(node, self.names.get(node.nodeid, node.name),
                                   BenchFixture(self.session, request).run, metadata(request),
                                   dict(marker.kwargs) if marker else {}, self.options)
        self.fixtures[node.nodeid] = fixture
        with isolated(self.session, request):
            yield fixture
        if fixture.extra_info and fixture.measurement is not None:
            self.session.annotate(fixture.measurement.name, extra_info=plain(fixture.extra_info))

    def pytest_sessionstart(self, session):
        """--benchmark-json is written from bench_core's samples (by the session's reporters), not by
        pytest-benchmark, which measured nothing."""
        pb = getattr(session.config, "_benchmarksession", None)
        if pb is not None:
            pb.json = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        """--benchmark-only keeps `bench` tests too, and --benchmark-skip skips them: they are benchmarks as
        much as the fixture's."""
        skip = config.getoption("benchmark_skip", False) and not config.getoption("benchmark_only", False)
        for item in items:
            if "bench" in getattr(item, "fixturenames", ()):
                item.own_markers[:] = [m for m in item.own_markers
                                       if not (m.name == "skip" and m.kwargs.get("reason") == _ONLY_SKIP)]
                if skip:
                    item.add_marker(pytest.mark.skip(reason="Skipping benchmark (--benchmark-skip active)."))

    def pytest_collection_finish(self, session):
        """A scenario is named after its test, as pytest-benchmark names it; two tests of one name in different
        files are told apart by their node ids."""
        uses = [i for i in session.items if "benchmark" in getattr(i, "fixturenames", ())]
        seen: dict[str, int] = {}
        for item in uses:
            seen[item.name] = seen.get(item.name, 0) + 1
        self.names = {i.nodeid: (i.nodeid if seen[i.name] > 1 else i.name) for i in uses}
        self.names.update(json.loads(os.environ.get(NAMES_ENV) or "{}"))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        fixture = self.fixtures.pop(item.nodeid, None) if call.when == "call" else None
        if fixture is not None and report.passed and fixture.used is None and self.session.serving is None:
            self.session.not_measured(item.nodeid, "requested the benchmark fixture but never called it")

    def pytest_report_header(self, config):
        return self.header


def metadata(request) -> dict:
    """What a pytest-benchmark test's scenario records of its test: its parameters, the device and dtype it was
    given, and the test itself (informational)."""
    node = request.node
    spec = getattr(node, "callspec", None)
    out: dict = {"test": node.nodeid}
    if spec is not None:
        out["params"] = {k: plain(v) for k, v in spec.params.items()}
    for name in ("device", "dtype"):
        if name in node.fixturenames:
            out[f"test_{name}"] = plain(request.getfixturevalue(name))
    return out


class LeftAlone:
    """`--bench-pb-fixture leave`: pytest-benchmark measures its tests itself, and each one that ran is counted
    as not measured by bench_core."""

    def __init__(self, session):
        self.session = session

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        if call.when == "call" and report.passed and "benchmark" in getattr(item, "fixturenames", ()):
            self.session.not_measured(item.nodeid, f"measured by pytest-benchmark, not bench_core "
                                                   f"({opt.PB_FIXTURE} leave)")


def register(config, session, gated: bool) -> None:
    """Adopt the fixture (or leave it, counting), as the session's settings say."""
    if session.config.pb_fixture == "leave":
        config.pluginmanager.register(LeftAlone(session), "bench_core_pb_left")
        return
    given = given_flags(config)
    options = pb_options(config, given)
    header = check(given, options, gated)
    if session.config.concurrent is not None:   # as pytest-benchmark under xdist: each benchmark once, unmeasured
        options = replace(options, disabled=True)
    header.insert(0, "bench_core: tests using pytest-benchmark's `benchmark` fixture are measured by bench_core "
                     f"({opt.PB_FIXTURE} leave gives them back); the `benchmark:` line is pytest-benchmark's own")
    config.pluginmanager.register(Adoption(session, options, header), "bench_core_pb")
