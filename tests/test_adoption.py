"""pytest-benchmark suites adopted unchanged, end to end through the plugin: three suites in the shapes real
projects write (a parametrized op suite with device and dtype fixtures from its conftest, a model suite whose train
step uses `pedantic` with a setup, a plain one with groups and extra_info), each gated side by side and against a
stored baseline. Every step advances the shared fake clock, which the conftest puts under bench_core's samplers
(`timing.sampling.HOST_CLOCK`), so no decision here depends on this machine's speed."""
import json
import subprocess

import pytest

from bench_core.workflows.adopted import MIN_ROUNDS, PbCalls, PbOptions, counts

CONFTEST = '''
import sys
sys.path.insert(0, {fakes!r})
import pytest
import bench_core.timing.sampling as sampling
from fakes import SHARED_CLOCK


@pytest.fixture(autouse=True, scope="session")
def _fake_host_clock():
    real = sampling.HOST_CLOCK
    sampling.HOST_CLOCK = SHARED_CLOCK
    yield
    sampling.HOST_CLOCK = real


@pytest.fixture(params=["cpu"])
def device(request):
    return request.param


@pytest.fixture
def dtype():
    return "float32"
'''

OPS = '''
import pytest
from fakes import work_on_shared_clock

MS = {("add", 8): 1.0, ("add", 16): 2.0, ("mul", 8): 1.0, ("mul", 16): 2.0}


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("size", [8, 16])
def test_op(benchmark, device, dtype, op, size):
    step = work_on_shared_clock(MS[op, size])

    def run(x):
        step()
        return x * 2
    assert benchmark(run, size) == size * 2
'''

MODEL = '''
from fakes import work_on_shared_clock

STEP_MS = 2.0


def test_train_step(benchmark):
    step, losses, prepared = work_on_shared_clock(STEP_MS), [], []

    def make_batch():
        prepared.append(1)
        return (len(losses),), {}

    def train(i):
        step()
        losses.append(1.0 / (i + 1))
        return losses[-1]
    loss = benchmark.pedantic(train, setup=make_batch, rounds=10, warmup_rounds=2)
    assert 0 < loss <= 1.0 and len(prepared) == len(losses)


def test_eval_step(benchmark):
    step = work_on_shared_clock(1.0)
    assert benchmark.pedantic(lambda: step() or 7, rounds=8, iterations=2) == 7
'''

PLAIN = '''
import pytest
from fakes import work_on_shared_clock

PARSE_MS = 1.0


@pytest.mark.benchmark(group="io")
def test_parse(benchmark):
    step = work_on_shared_clock(PARSE_MS)
    benchmark.extra_info["rows"] = 100
    assert benchmark(lambda: step() or 100) == 100


def test_render(benchmark):
    benchmark.group = "render"
    step = work_on_shared_clock(0.5)
    benchmark(step)
    benchmark.extra_info["pages"] = 3
'''

# each suite, and the change that makes one of its tests 1.5x slower
SUITES = {
    "ops": (OPS, ('("mul", 8): 1.0', '("mul", 8): 1.5'), "test_op[cpu-8-mul]"),
    "model": (MODEL, ("STEP_MS = 2.0", "STEP_MS = 3.0"), "test_train_step"),
    "plain": (PLAIN, ("PARSE_MS = 1.0", "PARSE_MS = 1.5"), "test_parse"),
}


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(root), "PATH": "/usr/bin:/bin"})


@pytest.fixture
def pb(pytester):
    """A pytester whose inner sessions time on the shared fake clock, with a conftest's device and dtype."""
    import fakes

    pytester.makeconftest(CONFTEST.format(fakes=str(fakes.__file__.rsplit("/", 1)[0])))
    pytester.makefile(".gitignore", "\n".join([".bench/", "baselines/", "__pycache__/"]))
    return pytester


def _committed(pytester, **files):
    _git(pytester.path, "init", "-q")
    pytester.makepyfile(**files)
    _git(pytester.path, "add", "-A")
    _git(pytester.path, "commit", "-qm", "v1")


def _verdicts(res) -> dict:
    out = {}
    for line in res.stdout.lines:
        words = line.split()
        if len(words) > 2 and not words[0].endswith(":") and words[-1] in ("slower", "faster", "unchanged",
                                                                         "inconclusive", "incomparable"):
            out[words[0]] = words[-1]
    return out


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_a_slower_test_of_each_suite_fails_side_by_side_and_identical_code_is_never_slower(pb, suite):
    source, (before, after), slowed = SUITES[suite]
    _committed(pb, test_suite=source)
    same = pb.runpytest("--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3")
    assert same.ret == 0, same.stdout.str()
    assert "slower" not in _verdicts(same).values() and _verdicts(same)
    pb.makepyfile(test_suite=source.replace(before, after))
    _git(pb.path, "commit", "-qam", "one test 1.5x slower")
    res = pb.runpytest("--bench-against", "HEAD~1", "--bench-rounds", "5", "--bench-pairs", "3")
    verdicts = _verdicts(res)
    assert res.ret == 1 and verdicts[slowed] == "slower", res.stdout.str()
    assert [n for n, v in verdicts.items() if v == "slower"] == [slowed]
    res.assert_outcomes(failed=1, passed=len(verdicts) - 1)   # every other test's own asserts passed
    out = " ".join(res.stdout.str().split())
    assert f"gate: {len(verdicts)} of {len(verdicts)} scenario(s) decided: 1 slower" in out


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_a_slower_test_of_each_suite_fails_against_a_stored_baseline_of_three_runs(pb, suite):
    source, (before, after), slowed = SUITES[suite]
    pb.makepyfile(test_suite=source)
    for extra in ([], ["--bench-append"], ["--bench-append"]):
        saved = pb.runpytest("--bench-save", "base", *extra)
        assert saved.ret == 0, saved.stdout.str()
    assert len(json.loads((pb.path / "baselines" / "base.json").read_text())["runs"]) == 3
    same = pb.runpytest("--bench-compare", "base", "--bench-min-runs", "1", "--bench-max-runs", "1")
    assert "slower" not in _verdicts(same).values() and same.ret == 0, same.stdout.str()
    pb.makepyfile(test_suite=source.replace(before, after))
    res = pb.runpytest("--bench-compare", "base", "--bench-min-runs", "1", "--bench-max-runs", "2")   # one fresh more
    verdicts = _verdicts(res)
    assert res.ret == 1 and [n for n, v in verdicts.items() if v == "slower"] == [slowed], res.stdout.str()


def test_a_changed_conftest_fixture_moves_its_tests_to_processes_and_says_why_on_the_terminal(pb):
    _committed(pb, test_suite=OPS.replace("[8, 16]", "[8]"))
    (pb.path / "conftest.py").write_text((pb.path / "conftest.py").read_text().replace('return "float32"',
                                                                                       'return "float32"  # v2'))
    res = pb.runpytest("--bench-against", "HEAD", "--bench-rounds", "4", "--bench-pairs", "2",
                     "--bench-malloc", "pinned")   # one pair of servers a side: cheaper, same point
    out = " ".join(res.stdout.str().split())
    said = "2 scenarios (test_op[cpu-8-add], test_op[cpu-8-mul]): each side in a process of its own: in one process " \
        "HEAD's side would run the current tree's code for the fixture"
    assert res.ret == 0 and said in out and "the fixture 'dtype' (conftest.py)" in out.split(said, 1)[1], out


def test_a_mixed_suite_is_one_session_one_table_one_outcome(pb):
    bench_test = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

def test_native(bench):
    bench.run(Scenario("native", ("forward",)), work_on_shared_clock(1.0), clock=SHARED_CLOCK)
'''
    _committed(pb, test_plain=PLAIN, test_native=bench_test)
    res = pb.runpytest("--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3")
    assert res.ret == 0 and set(_verdicts(res)) == {"native", "test_parse", "test_render"}, res.stdout.str()
    assert res.stdout.str().count("gate: ") == 1 and "gate: 3 of 3 scenario(s) decided" in res.stdout.str()


UNMEASURED = PLAIN + '''

def test_forgot(benchmark):
    pass
'''


def test_a_test_bench_core_did_not_measure_is_counted_and_fails_under_strict(pb):
    _committed(pb, test_suite=UNMEASURED)
    res = pb.runpytest("--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3")
    out = " ".join(res.stdout.str().split())
    assert res.ret == 0 and "1 not measured by bench_core (--bench-strict fails them)" in out
    assert "test_suite.py::test_forgot: not measured by bench_core: requested the benchmark fixture but never" in out
    strict = pb.runpytest("--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3", "--bench-strict")
    assert strict.ret == 1
    strict.stdout.fnmatch_lines(["*--bench-strict: 1 test(s) timed something bench_core did not measure "
                                 "(test_suite.py::test_forgot)*"])


def test_left_to_pytest_benchmark_a_gate_that_compared_nothing_fails(pb):
    _committed(pb, test_suite=PLAIN)
    # pytest-benchmark's own timing of a step on the fake clock runs to its time limit (1 s a test by default): 10 ms
    # here, its own option, which it applies to what is left to it
    fast = "--benchmark-max-time=0.01"
    res = pb.runpytest("--bench-against", "HEAD", "--bench-pb-fixture", "leave", fast)
    assert res.ret == 1, res.stdout.str()
    out = " ".join(res.stdout.str().split())
    assert "2 not measured by bench_core" in out and "nothing was compared: the session fails" in out
    saved = pb.runpytest("--bench-save", "base", "--bench-pb-fixture", "leave", fast)
    assert saved.ret == 1 and not (pb.path / "baselines" / "base.json").exists()
    saved.stdout.fnmatch_lines(["*baseline 'base' NOT saved: no scenario was measured by bench_core (2 test(s) timed "
                                "outside bench_core)*"])
    assert "next:" not in saved.stdout.str()


def test_pytest_benchmark_options_keep_their_meaning_or_are_refused(pb):
    pb.makepyfile(test_suite=PLAIN)
    refused = pb.runpytest("--benchmark-compare-fail=median:5%")
    assert refused.ret == 4
    refused.stderr.fnmatch_lines(["*--benchmark-compare-fail (use --bench-compare NAME or --bench-against REV*"])
    named = pb.runpytest("--benchmark-max-time=1", "--benchmark-json=pb.json", "--benchmark-min-rounds=30",
                         "--benchmark-warmup=off", "--bench-no-out")
    assert named.ret == 0
    named.stdout.fnmatch_lines(["bench_core: pytest-benchmark option(s) not applied to the benchmark fixture: "
                                "--benchmark-max-time (--bench-repeats N)"])
    named.stdout.fnmatch_lines(["*bench_core results: group io*", "*bench_core results: group render*"])
    doc = json.loads((pb.path / "pb.json").read_text())   # pytest-benchmark's layout, from bench_core's samples
    by_name = {b["name"]: b for b in doc["benchmarks"]}
    assert by_name["test_parse"]["group"] == "io" and by_name["test_parse"]["extra_info"]["rows"] == 100
    assert by_name["test_render"]["group"] == "render" and by_name["test_render"]["extra_info"]["pages"] == 3
    assert by_name["test_parse"]["stats"]["rounds"] == 30 and by_name["test_parse"]["options"]["warmup"] == 0
    assert by_name["test_parse"]["stats"]["median"] == pytest.approx(1e-3, rel=0.03)
    (pb.path / "pb.json").write_text("{}")
    again = pb.runpytest("--benchmark-json=pb.json", "--bench-no-out")   # replaced each run, as there
    assert again.ret == 0 and len(json.loads((pb.path / "pb.json").read_text())["benchmarks"]) == 2
    skipped = pb.runpytest("--benchmark-skip", "--bench-no-out")
    skipped.assert_outcomes(skipped=2)
    gated = pb.runpytest("--benchmark-disable", "--bench-save", "x")
    assert gated.ret == 4
    by_func = pb.runpytest("--benchmark-group-by=func,param:size", "--bench-no-out")
    by_func.stdout.fnmatch_lines(["*bench_core results: test_parse, size=None*", "*bench_core results: test_render*"])
    unknown = pb.runpytest("--benchmark-group-by=grop", "--bench-no-out")   # never one table, silently
    assert unknown.ret == 4
    unknown.stderr.fnmatch_lines(["*--benchmark-group-by grop: unknown key(s) grop; choose from group, name*"])


def test_project_settings_fill_what_the_command_line_does_not_give(pb):
    pb.makepyfile(test_suite=PLAIN)
    pb.makepyprojecttoml("[tool.bench_core]\nrepeats = 7\nthreads = 1\nstrict = true\n")
    res = pb.runpytest("--bench-no-out")
    res.stdout.fnmatch_lines(["*n: 7*"])
    res = pb.runpytest("--bench-no-out", "--bench-repeats", "4")
    res.stdout.fnmatch_lines(["*n: 4*"])
    res = pb.runpytest("--bench-no-out", "--bench-quick")    # a project's counts are defaults: a smoke run beats them
    res.stdout.fnmatch_lines(["*n: 5*"])
    pb.makepyprojecttoml("[tool.bench_core]\nrepeat = 7\n")
    bad = pb.runpytest("--bench-no-out")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(["*pyproject.toml: [[]tool.bench_core[]] repeat: not a setting "
                              "(did you mean 'repeats'?)*"])
    pb.makepyprojecttoml("[tool.bench_core]\nrepeats = 'many'\n")
    bad = pb.runpytest("--bench-no-out")
    bad.stderr.fnmatch_lines(["*pyproject.toml: [[]tool.bench_core[]] repeats = 'many': give an integer*"])
    pb.makepyprojecttoml("[tool.bench_core]\nsave = 'main'\n")
    bad = pb.runpytest("--bench-no-out")
    bad.stderr.fnmatch_lines(["*[[]tool.bench_core[]] save: --bench-save is given per run, on the command line*"])


def test_under_xdist_nothing_is_measured_or_written(pb):
    """pytest-benchmark runs each benchmark once under xdist, so such suites pass there: adopted, they still do; a
    `bench` test, which would measure beside the other worker, is refused."""
    pytest.importorskip("xdist")
    native = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

def test_native(bench):
    bench.run(Scenario("native", ("forward",)), work_on_shared_clock(1.0), clock=SHARED_CLOCK)
'''
    pb.makepyfile(test_suite=PLAIN, test_native=native)
    res = pb.runpytest("-n", "2", "-p", "xdist")
    res.assert_outcomes(passed=2, failed=1)
    out = " ".join(res.stdout.str().split())
    assert "scenario 'native': not measured: under pytest-xdist (worker gw" in out
    assert "Run the benchmarks in one process" in out and not (pb.path / ".bench").exists()


# -- the translation itself, without pytest --------------------------------------------------------------------


def _recording():
    calls = []

    def run(scenario, step, **options):
        calls.append((scenario, options))
        setup = options.get("setup")
        for _ in range(options.get("repeats") or 3):
            if setup is not None:
                setup()
            step()
        return "measured"
    return calls, run


def test_pedantic_setup_teardown_and_the_result_follow_pytest_benchmark():
    calls, run = _recording()
    log = []
    fx = PbCalls("t", run)
    got = fx.pedantic(lambda x: log.append(("call", x)) or x, setup=lambda: (log.append("setup") or ((5,), {})),
                      teardown=lambda x: log.append(("teardown", x)), rounds=6, warmup_rounds=1)
    assert got == 5 and fx.measurement == "measured"
    assert log[:4] == ["setup", ("call", 5), ("teardown", 5), "setup"] and log[-1] == ("teardown", 5)
    assert log.count("setup") == log.count(("teardown", 5)) == 6
    scenario, options = calls[0]
    assert options["warmup"] == 1 and options["repeats"] == 6 and scenario.window == ("call",)
    with pytest.raises(RuntimeError, match="used once a test"):
        fx(lambda: None)


def test_a_pedantic_call_that_cannot_be_honoured_as_asked_says_so():
    calls, run = _recording()
    PbCalls("t", run).pedantic(lambda: None, rounds=1, iterations=4)
    scenario, options = calls[0]
    assert options["repeats"] == MIN_ROUNDS and options["mode"] == "block" and options["block_size"] == 4
    assert scenario.metadata["notes"] == (f"rounds=1 raised to {MIN_ROUNDS}: fewer samples give no spread to "
                                          f"decide on",)
    with pytest.raises(ValueError, match="more than 1 `iterations` with a `setup`"):
        PbCalls("u", run).pedantic(lambda: None, setup=lambda: None, iterations=2)


def test_markers_and_options_map_to_counts_and_unapplied_ones_are_named():
    assert counts({}, PbOptions()) == (None, None, [])
    warmup, repeats, notes = counts({"warmup": False, "min_rounds": 50, "timer": "x"}, PbOptions(warmup=True))
    assert (warmup, repeats) == (0, 50) and notes == ["timer='x' not applied: bench_core times with its own clocks: "
                                                      "a host clock read after synchronizing, CUDA events under --gpu"]
    assert counts({}, PbOptions(warmup=True, warmup_iterations=4, min_rounds=2))[:2] == (4, 20)


def test_disabled_benchmarks_run_once_unmeasured():
    calls, run = _recording()
    seen = []
    assert PbCalls("t", run, options=PbOptions(disabled=True))(lambda x: seen.append(x) or x, 3) == 3
    assert seen == [3] and calls == []


DUPLICATE = '''
from fakes import work_on_shared_clock

MS = 1.0


def test_mm(benchmark):
    benchmark(work_on_shared_clock(MS))
'''


def test_two_tests_of_one_name_keep_their_names_in_the_gates_fresh_processes(pb):
    """Named by node id where two files share a test name; a fresh process that runs one of them alone must name it
    the same, or the gate's replication finds nothing and a real slowdown ends inconclusive, green."""
    (pb.path / "a").mkdir()
    (pb.path / "b").mkdir()
    (pb.path / "a" / "test_ma.py").write_text(DUPLICATE)
    (pb.path / "b" / "test_mb.py").write_text(DUPLICATE)
    for extra in ([], ["--bench-append"], ["--bench-append"]):
        assert pb.runpytest("--bench-save", "base", *extra).ret == 0
    (pb.path / "a" / "test_ma.py").write_text(DUPLICATE.replace("MS = 1.0", "MS = 3.0"))
    res = pb.runpytest("--bench-compare", "base", "--bench-min-runs", "2", "--bench-max-runs", "2")  # one fresh
    out = " ".join(res.stdout.str().split())
    assert res.ret == 1 and _verdicts(res).get("a/test_ma.py::test_mm") == "slower", out


TWO_CLASSES = '''
from fakes import work_on_shared_clock

MS = 1.0


class TestA:
    def test_fwd(self, benchmark):
        benchmark(work_on_shared_clock(MS))


class TestB:
    def test_fwd(self, benchmark):   # pedantic with a setup, in each side's own server
        step, made = work_on_shared_clock(1.0), []
        assert benchmark.pedantic(lambda x: step() or x, setup=lambda: made.append(1) or ((len(made),), {}),
                                  rounds=6) == len(made)
'''


def test_two_classes_with_one_method_name_are_each_served_their_own(pb):
    _committed(pb, test_two=TWO_CLASSES)
    pb.makepyfile(test_two=TWO_CLASSES.replace("MS = 1.0", "MS = 1.5"))
    res = pb.runpytest("--bench-against", "HEAD", "--bench-rounds", "4", "--bench-pairs", "2",
                     "--bench-malloc", "pinned")   # one pair of servers a side: cheaper, same point
    verdicts = _verdicts(res)
    assert res.ret == 1 and sorted(verdicts.values()) == ["slower", "unchanged"], res.stdout.str()
    # a method needs its class's instance: each side's own pytest makes it, and the terminal says so
    assert "a test method (TestA.test_fwd) is run by each side's own pytest" in " ".join(res.stdout.str().split())


def test_benchmark_only_beats_benchmark_skip_as_there(pb):
    pb.makepyfile(test_suite=PLAIN)
    pb.runpytest("--benchmark-skip", "--benchmark-only", "--bench-no-out").assert_outcomes(passed=2)


def test_a_pedantic_teardown_runs_when_the_measurement_stops_inside():
    torn = []

    def run(scenario, step, **options):
        options["setup"]()
        step()
        raise RuntimeError("a gate failed the test here")
    with pytest.raises(RuntimeError):
        PbCalls("t", run).pedantic(lambda: None, setup=lambda: None, teardown=lambda: torn.append(1), rounds=5)
    assert torn == [1]
