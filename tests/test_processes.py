"""Process mode of --bench-against: each side a pytest process of its own, in its own tree and interpreter,
through the real plugin in throwaway repositories (fake clocks: each side's server times its own fake steps)."""
import json
import sys
from pathlib import Path

import pytest

from test_fidelity import CONFTEST, commit_all

PARAMETRIZED = CONFTEST + '''
import pytest
import torch


@pytest.fixture
def scale():
    return {scale}
'''

PARAM_TEST = '''
import pytest
import torch
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_step(bench, scale, dtype):
    ms = scale * (2.0 if dtype is torch.float32 else 1.0)
    bench.run(Scenario(f"step[{dtype}]", ("forward",)), work_on_shared_clock(ms), clock=SHARED_CLOCK)
'''


def _against(pytester, *args, out="out"):
    # one pair of servers (malloc pinned) unless a test names its malloc: what most tests here check does not depend
    # on how many pairs take the rounds, and each pair is two pytest processes to start; the pairs malloc as-is
    # asks for are checked where it is named
    pinned = () if "--bench-malloc" in args else ("--bench-malloc", "pinned")
    res = pytester.runpytest(*args, *pinned, "--bench-out", out)
    files = list((pytester.path / out).glob("session-*.json"))
    return res, (json.loads(files[0].read_text()) if files else None)


def test_a_test_with_a_fixture_and_parameters_json_cannot_carry_is_compared_in_processes(pytester):
    """A fixture (changed in the revision) and a torch dtype parameter: both reach each side's own test, because
    each side's pytest collects and sets up its own item; a 3x change of the fixture is found in both items."""
    pytester.makeconftest(PARAMETRIZED.format(scale=1.0))
    pytester.makepyfile(test_p=PARAM_TEST)
    commit_all(pytester.path)
    pytester.makeconftest(PARAMETRIZED.format(scale=3.0))
    res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-quick")
    res.assert_outcomes(failed=2)
    res.stdout.fnmatch_lines(["*scenario 'step?torch.float32?': slower against revision 'HEAD'*"])
    recs = {r["scenario"]: r for r in doc["against"]["scenarios"]}
    assert sorted(recs) == ["step[torch.bfloat16]", "step[torch.float32]"]
    for rec in recs.values():
        assert rec["comparison"]["ratio"] == pytest.approx(3.0, rel=0.03)
        assert "--bench-against-processes" in rec["code"]["why_processes"]
    from helpers import orphaned_workers

    assert orphaned_workers() == []


def test_another_interpreter_is_a_side_of_its_own_and_the_record_names_both(pytester):
    """--bench-against-python alone: this tree against itself in another interpreter (here the same one under
    another path), so only the environments differ; the record says which interpreter and torch each side ran."""
    pytester.makeconftest(PARAMETRIZED.format(scale=1.0))
    pytester.makepyfile(test_p=PARAM_TEST)
    commit_all(pytester.path)
    other = Path(sys.executable).with_name("python3")   # the same environment under another name
    if not other.exists() or other == Path(sys.executable):
        pytest.skip("no second name for this interpreter in its environment")
    res, doc = _against(pytester, "--bench-against-python", str(other), "--bench-quick", "-k", "f32")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines([f"*comparison with revision 'this tree under {other}'*"])
    (rec,) = doc["against"]["scenarios"]
    assert rec["comparison"]["ratio"] == pytest.approx(1.0, rel=0.03)
    ran = rec["code"]["processes_ran"]
    assert ran["baseline"][0]["interpreter"] == str(other) and ran["candidate"][0]["interpreter"] == sys.executable
    assert ran["baseline"][0]["torch"] and ran["baseline"][0]["python"]


def test_an_interpreter_that_does_not_exist_is_refused_naming_the_option(pytester):
    pytester.makepyfile(test_p="def test_x():\n    pass\n")
    res = pytester.runpytest("--bench-against-python", "/nonexistent/python")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*--bench-against-python /nonexistent/python: no such interpreter*"])


def test_a_revision_that_does_not_compile_is_named_with_its_own_error_in_process_mode(pytester):
    """The revision's side fails to collect: not compared, with the revision's SyntaxError in the reason, and
    --bench-strict fails the item."""
    pytester.makeconftest(PARAMETRIZED.format(scale=1.0))
    pytester.makepyfile(test_p=PARAM_TEST.replace("def test_step(", "def test_step(:"))
    commit_all(pytester.path)
    pytester.makepyfile(test_p=PARAM_TEST)
    # one run: under --bench-strict the scenario not compared fails its item, and the reason is the same as without
    # (where a scenario not compared passes: test_fidelity's strict test, in one process)
    res, _ = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-quick", "-k", "f32",
                      "--bench-strict")
    res.assert_outcomes(failed=1)
    out = " ".join(res.stdout.str().split())
    assert "not compared: HEAD" in out and "the baseline's process (pytest test_p.py in" in out
    assert "SyntaxError: invalid syntax" in out and "def test_step(:" in out


def test_a_side_that_loaded_the_other_trees_changed_file_is_named(tmp_path):
    from bench_core.workflows.side_by_side.fidelity import crossed
    from bench_core.workflows.side_by_side.revisions import file_sha256

    own, other = tmp_path / "rev", tmp_path / "cur"
    for tree, text in ((own, "A = 1\n"), (other, "A = 2\n")):
        (tree / "pkg").mkdir(parents=True)
        (tree / "pkg" / "m.py").write_text(text)
        (tree / "pkg" / "same.py").write_text("B = 1\n")
    loaded = {str(other / "pkg" / "m.py"): file_sha256(other / "pkg" / "m.py"),
              str(other / "pkg" / "same.py"): file_sha256(other / "pkg" / "same.py"),
              str(own / "pkg" / "x.py"): None}
    assert crossed(loaded, own, other) == ["pkg/m.py"]   # the same content, or its own tree's file, is no crossing


BUILDS = CONFTEST + '''
import os
import pytest

LOG = {log!r}


def _built(what):
    with open(LOG, "a") as f:
        f.write(f"{{what}} {{os.getpid()}} {{os.getcwd()}}\\n")


@pytest.fixture(scope="module")
def data():
    _built("module")
    yield 1.0
    _built("module_end")


@pytest.fixture
def model(data):
    _built("function")
    return data
'''

BUILDS_TEST = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock


def test_step(bench, model):
    bench.run(Scenario("step", ("forward",)), work_on_shared_clock(model), clock=SHARED_CLOCK)
'''


def test_every_round_runs_the_whole_test_afresh_in_a_child_of_a_server_that_never_ran_it(pytester, tmp_path,
                                                                                         monkeypatch):
    """#48: a forked child inherits its server's allocator state, which glibc's malloc as-is tunes from what the
    server freed (a memory-bound A/A called faster in 2 of 16 when the servers had run the step). So the server
    never runs the test: its first run (counting, what it loaded) and every round run in children forked from it,
    each building the module's fixture and the test's own afresh, as a fresh process does; each round is then a
    unit of evidence, one pair of servers, at either malloc."""
    from bench_core.timing.counts import QUICK
    from bench_core.workflows.malloc import PINNED_MALLOC

    for name in PINNED_MALLOC:
        monkeypatch.delenv(name, raising=False)
    log = tmp_path / "builds.log"
    pytester.makeconftest(BUILDS.format(log=str(log)))
    pytester.makepyfile(test_p=BUILDS_TEST)
    commit_all(pytester.path)
    import os

    for malloc in ("as-is", "pinned"):
        log.write_text("")
        res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-quick",
                            "--bench-malloc", malloc, out=f"out-{malloc}")
        res.assert_outcomes(passed=1)
        (rec,) = doc["against"]["scenarios"]
        ran = rec["code"]["processes_ran"]
        assert all(len(r) == 1 for r in ran.values()) and "units" not in rec["rounds"]
        assert "each side a pytest process of its own, every round the test run afresh" in rec["method"]
        assert all(not report["malloc"] for r in ran.values() for report in r) == (malloc == "as-is")
        # the session's own build (this process: pytester runs in it) gives the current side's live instance
        builds = [b for b in (line.split() for line in log.read_text().splitlines()) if int(b[1]) != os.getpid()]
        for side, (report,) in ran.items():
            here = [(what, int(p)) for what, p, cwd in builds if cwd == report["tree"]]
            children = sorted({p for _, p in here})
            assert report["pid"] not in children                      # the server built nothing
            assert len(children) == QUICK.rounds + 1                  # its first run's child, one child per round
            # and tears down what it built, the module's fixture too, before it ends
            assert all([w for w, p in here if p == child] == ["module", "function", "module_end"] for child in children)


RENDEZVOUS_TEST = '''
import os
import time
from pathlib import Path

from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

HERE = Path({here!r})


def note(*fields):
    with open(HERE / "events.log", "a") as f:
        f.write(" ".join(map(str, fields)) + "\\n")


def test_step(bench):
    note("body_start", os.getpid(), time.monotonic())
    if os.getpid() != {coordinator}:   # a side's process: on with its body only once the other side's has begun
        (HERE / f"body-{{os.getpid()}}").touch()
        deadline = time.monotonic() + 60
        while len(list(HERE.glob("body-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    note("body_end", os.getpid(), time.monotonic())
    work = work_on_shared_clock(1.0)   # timed on the fake clock: the verdict never depends on this machine's load

    def step():
        note("call", os.getpid(), time.monotonic())
        work()
    bench.run(Scenario("step", ("forward",)), step, clock=SHARED_CLOCK)
'''


def test_the_sides_first_runs_go_side_by_side_in_children_and_call_the_step_only_once_both_got_there(pytester,
                                                                                                   tmp_path):
    """Each side's first run of its test (what it loaded, what its step's first call imports, which its server
    then imports for the rounds' children) goes in a child of its server beside the other side's (a model's
    construction, an import it makes, does not wait for the other side's), and neither calls its step before both
    have got to bench.run. Each side's test waits for the other's to begin: run one after the other, the first would
    wait out its 60 s. The servers themselves never call it."""
    import os

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_p=RENDEZVOUS_TEST.format(here=str(tmp_path), coordinator=os.getpid()))
    commit_all(pytester.path)
    res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-quick")
    res.assert_outcomes(passed=1)
    (rec,) = doc["against"]["scenarios"]
    servers = {r[0]["pid"] for r in rec["code"]["processes_ran"].values()}
    events = [(what, int(pid), float(t)) for what, pid, t in
              (line.split() for line in (tmp_path / "events.log").read_text().splitlines())]
    firsts = list(dict.fromkeys(p for what, p, _ in events if what == "body_start" and p != os.getpid()))[:2]
    assert len(firsts) == 2 and not set(firsts) & servers
    a, b = ([t for what, p, t in events if p == pid and what.startswith("body")] for pid in firsts)
    assert a[0] < b[1] and b[0] < a[1]   # side by side: each began before the other ended
    calls = [t for what, p, t in events if what == "call" and p in firsts]
    assert calls and max(a[1], b[1]) < min(calls)
    assert not [p for what, p, _ in events if p in servers]


def test_one_process_pins_glibc_malloc_thresholds_in_itself_and_says_so(pytester, monkeypatch):
    """Asked to (--bench-malloc pinned), where one process holds both sides its own glibc malloc thresholds are
    fixed as the servers' are (a step that frees large blocks then reuses them on every call, not on some); 'as-is',
    the default, or the user's own setting, leaves them alone, and the method line says which."""
    from bench_core.workflows.malloc import PINNED_MALLOC, pin_malloc

    for name in PINNED_MALLOC:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(PARAMETRIZED.format(scale=1.0))
    pytester.makepyfile(test_p=PARAM_TEST.replace(", ids=[\"f32\", \"bf16\"]", "").replace("torch.bfloat16", "1.0"))
    commit_all(pytester.path)
    res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-quick", "--bench-malloc", "pinned")
    res.assert_outcomes(passed=2)
    assert all("one process, glibc malloc thresholds pinned" in r["method"] for r in doc["against"]["scenarios"])
    res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-quick", "--bench-malloc", "as-is",
                        out="out-as-is")   # the default
    assert not any("malloc" in r["method"] for r in doc["against"]["scenarios"])
    assert doc["environment"]["malloc"] == "as-is"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    assert pin_malloc() is False                      # the user's own setting stands


def test_every_measuring_process_gets_the_sessions_malloc_policy_and_results_record_it(monkeypatch, tmp_path):
    """--bench-malloc: this process pinned (or not), the gate's fresh processes told by option, distributed ranks
    by their spec, servers by their variables; the user's own variables win; the policy is a comparability field
    where both results recorded it, and older records without it stay comparable."""

    from bench_core.core.environment import differences
    from bench_core.session import SessionConfig
    from bench_core.shells.replay import replica_for
    from bench_core.workflows.malloc import PINNED_MALLOC, settle_malloc
    from bench_core.workflows.worker import server_env

    for name in PINNED_MALLOC:
        monkeypatch.delenv(name, raising=False)
    assert settle_malloc("as-is") == "as-is" and settle_malloc("pinned", serving=True) == "as-is"
    assert settle_malloc("pinned") == "pinned"
    assert "MALLOC_MMAP_THRESHOLD_" not in __import__("os").environ   # this process's own: nothing else changed
    assert {k: server_env([], "pinned")[k] for k in PINNED_MALLOC} == PINNED_MALLOC
    assert not set(PINNED_MALLOC) & set(server_env([], "as-is"))
    for name, value in PINNED_MALLOC.items():   # a server started with the pinned variables says so
        monkeypatch.setenv(name, value)
    assert settle_malloc("as-is", serving=True) == "pinned"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    assert settle_malloc("pinned") == (f"set by the environment: MALLOC_MMAP_THRESHOLD_={1 << 20}, "
                                       f"MALLOC_TRIM_THRESHOLD_={PINNED_MALLOC['MALLOC_TRIM_THRESHOLD_']}")

    for policy in ("pinned", "as-is"):
        config = SessionConfig(results_dir=None, malloc=policy)
        argv = replica_for(config, "t.py::test", "t", tmp_path, None).command(tmp_path / "r.json", 1, 3)
        assert f"--bench-malloc={policy}" in argv and "-n" not in argv
        assert argv[-3:] == [f"--bench-replica={tmp_path / 'r.json'}", "--bench-warmup=1", "--bench-repeats=3"]
    xdist = replica_for(config, "t.py::test", "t", tmp_path, None, xdist=True).command(tmp_path / "r.json", 1, 3)
    assert xdist[xdist.index("-n") + 1] == "0"   # alone on its cores, where a project's addopts say -n 4

    cpu = {"device": "cpu", "cpu_model": "x", "cpu_count": 2}
    assert differences({**cpu, "malloc": "pinned"}, {**cpu, "malloc": "as-is"}) == {"malloc": ("pinned", "as-is")}
    assert differences({**cpu, "malloc": "pinned"}, cpu) == {}       # a record from before it was recorded

    from bench_core.deciding.gate import compare_runs
    from helpers import ENV, meas

    c = compare_runs("s", [meas([1.0, 1.1, 0.9], env={**ENV, "malloc": "pinned"})],
                     [meas([1.0, 1.1, 0.9], env={**ENV, "malloc": "as-is"})])
    assert c.verdict == "incomparable" and "malloc: 'pinned' -> 'as-is'" in c.reason
    assert "the same --bench-malloc" in c.reason


def test_distributed_ranks_are_told_the_sessions_malloc_policy():
    from types import SimpleNamespace

    from bench_core.session import SessionConfig
    from bench_core.workflows.distributed.launch import Topology
    from bench_core.workflows.distributed.launched import rank_spec

    for recorded, pinned in (("pinned", True), ("as-is", False)):
        session = SimpleNamespace(config=SessionConfig(results_dir=None), environment={"malloc": recorded}, errors=[])
        assert rank_spec(session, "s", _rank_builder, Topology(2), None)["malloc_pinned"] is pinned


def _rank_builder(ctx):   # a rank imports its builder from its file: module level
    return lambda: None


SIZED = CONFTEST + '''
import pytest


def pytest_addoption(parser):
    parser.addoption("--size", default="1", help="the model's size")
    parser.addoption("--tiny", action="store_true")


@pytest.fixture
def size(request):
    return float(request.config.getoption("--size")) * (0.5 if request.config.getoption("--tiny") else 1.0)
'''

SIZED_TEST = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock


def test_step(bench, size):
    bench.run(Scenario("step", ("forward",)), work_on_shared_clock(size), clock=SHARED_CLOCK)
'''


def test_the_sessions_own_options_reach_both_sides_servers(pytester, monkeypatch):
    """A conftest's custom option (a model size) given to the session reaches each side's server as typed, from the
    command line and from PYTEST_ADDOPTS; selection options (-k) stay the session's. A revision whose conftest
    lacks the option is not compared, with pytest's own usage error."""
    pytester.makeconftest(SIZED)
    pytester.makepyfile(test_p=SIZED_TEST)
    commit_all(pytester.path)
    monkeypatch.setenv("PYTEST_ADDOPTS", "--tiny")
    res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-quick",
                        "--size", "6", "-k", "step")
    res.assert_outcomes(passed=1)
    (rec,) = doc["against"]["scenarios"]
    for side in ("baseline", "candidate"):
        assert rec["code"]["processes_ran"][side][0]["forwarded"] == ["--tiny", "--size", "6"]
        samples = [s[0] for r in rec["rounds"]["samples_host_gpu_ms"][side] for s in r]
        assert samples and all(ms == pytest.approx(3.0, rel=0.05) for ms in samples)   # 6 x 0.5 ms, fake clock

    monkeypatch.delenv("PYTEST_ADDOPTS")
    pytester.makeconftest(SIZED.replace('parser.addoption("--tiny", action="store_true")', "pass"))
    commit_all(pytester.path, "no --tiny")
    pytester.makeconftest(SIZED)   # the working tree has it, the revision has not
    res, _ = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-quick",
                      "--tiny", out="out-missing")
    out = " ".join(res.stdout.str().split())
    assert "not compared: HEAD" in out and "unrecognized arguments: --tiny" in out


# 512 x 512 (about 1.2 ms a matmul here, one thread): the profiler pass's times are real, and with a busy process on
# each core a preemption (2.5 ms seen) inside one of the revision's two profiled 128 x 128 matmuls (0.02 ms) made its
# one a step read as more time than the tree's four
MATMULS = '''
import torch
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

A = torch.randn(512, 512)


def test_step(bench):
    tick = work_on_shared_clock({ms})

    def step():
        for _ in range({n}):
            A @ A
        tick()
    bench.run(Scenario("step", ("forward",)), step, clock=SHARED_CLOCK)
'''


def test_a_slower_verdict_in_process_mode_gets_a_profiler_pass_in_each_sides_own_process(pytester):
    """Process mode's slower verdict (decided on the fake clock) is followed by profiler passes of each side in
    fresh rounds of its own server: the revision's 1 matmul per step against the tree's 16, with calls per step."""
    from test_fidelity import COUNTED_OP_TIMES

    pytester.makeconftest(COUNTED_OP_TIMES)
    pytester.makepyfile(test_p=MATMULS.format(ms=1.0, n=1))
    commit_all(pytester.path)
    # sixteen matmuls against one: a move no preempted pass hides, and a fake step that moves by more than they take
    pytester.makepyfile(test_p=MATMULS.format(ms=150.0, n=16))
    res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-rounds", "3",
                        "--bench-max-rounds", "3", "--bench-pairs", "1")
    res.assert_outcomes(failed=1)
    (rec,) = doc["against"]["scenarios"]
    assert rec["comparison"]["verdict"] == "slower"
    (mm,) = [t for t in rec["comparison"]["moved"] if t.startswith("aten::mm ")]
    assert mm.endswith("calls 1 -> 16)")
    res.stdout.fnmatch_lines(["*step: time moved (profiler passes after measuring, a hypothesis): aten::mm +*"])


KEPT = CONFTEST + '''
import pytest
import torch


@pytest.fixture(scope="module")
def weights():
    return {"w": torch.ones(4)}


@pytest.fixture(scope="session")
def size():
    return 1.0


@pytest.fixture
def model(weights, size):
    return size
'''


def test_a_wider_scoped_fixture_holding_torch_state_is_rebuilt_every_forked_round_and_named_only_where_reused(
        pytester):
    """A module-scoped fixture holding a tensor is rebuilt in every forked round, as the whole test is, so no side
    reports it kept and no note names it; a server that cannot fork (CUDA) builds it once and its rounds reuse it,
    its allocation's bias then out of the interval, which the note says, naming it."""
    from bench_core.workflows.side_by_side.fidelity import kept_note

    pytester.makeconftest(KEPT)
    pytester.makepyfile(test_p=BUILDS_TEST)
    commit_all(pytester.path)
    res, doc = _against(pytester, "--bench-against", "HEAD", "--bench-against-processes", "--bench-quick")
    res.assert_outcomes(passed=1)
    (rec,) = doc["against"]["scenarios"]
    assert all(r[0]["kept"] == [] for r in rec["code"]["processes_ran"].values())
    assert not [n for n in rec["comparison"]["notes"] if "reused by every round" in n]
    note = kept_note({"baseline": ["weights (module)"], "candidate": ["weights (module)"]})
    assert note.startswith("fixture(s) weights (module) hold torch state") and "reused by every round" in note
    assert kept_note({"baseline": [], "candidate": []}) is None


def test_torch_state_is_found_inside_containers_objects_and_closures_and_nothing_else_counts():
    import torch

    from bench_core.workflows.side_by_side.fidelity import holds_torch_state

    t = torch.zeros(2)

    class Holder:
        def __init__(self):
            self.net = torch.nn.Linear(2, 2)

    def closure():
        return t
    assert all(holds_torch_state(v) for v in (t, torch.nn.ReLU(), [1, (t,)], {"a": t}, Holder(), closure))
    assert not any(holds_torch_state(v) for v in (1.0, "cuda", [1, 2], {"a": None}, torch.float32, len, None))
    assert not holds_torch_state([[[t]]])   # deeper than two levels: not looked into
