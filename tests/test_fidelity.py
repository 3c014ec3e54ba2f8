"""Each side runs its own code, or the comparison says it cannot (#27's table), in throwaway repositories run
through the real plugin: a conftest fixture built from changed code, a revision whose test does not compile, a
sibling module found on sys.path only after the revision was loaded."""
import json
import subprocess

import fakes

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "PATH": "/usr/bin:/bin"}
CONFTEST = f"import sys; sys.path.insert(0, {str(fakes.__file__.rsplit('/', 1)[0])!r})\n"


def commit_all(path, message="v1"):
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", message]):
        if args[0] == "init" and (path / ".git").exists():
            continue
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, env={**GIT_ENV, "HOME": str(path)})


# Each operator's profiled time made of its calls alone (1 ms a call, 1% apart from pass to pass), the calls still
# counted by torch's profiler: whether a verdict's explanation names an operator then never depends on how busy
# this machine is while it profiles (in this process, and in a side's server, which loads this conftest too).
COUNTED_OP_TIMES = CONFTEST + '''
import itertools
import pytest
import bench_core.workflows.diagnose.moved as _moved

_REAL, _PASS = _moved.op_times, itertools.count()


def _from_calls(*args, **kwargs):
    j = next(_PASS) % 3
    return {op: (n * (1.0 + 0.01 * j), n) for op, (_, n) in _REAL(*args, **kwargs).items()}


@pytest.fixture(autouse=True, scope="session")
def _op_times_from_calls():
    _moved.op_times = _from_calls
    yield
    _moved.op_times = _REAL
'''

FIXTURE_CONFTEST = CONFTEST + '''
import pytest
from mymodel import Model


@pytest.fixture
def model():
    return Model()
'''

FIXTURE_TEST = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock


def test_model(bench, model):
    bench.run(Scenario("model", ("forward",)), work_on_shared_clock(model.cost()), clock=SHARED_CLOCK)
'''


def test_a_fixture_built_from_changed_code_is_compared_with_each_side_in_its_own_process(pytester):
    """The model comes from a conftest fixture, 2 -> 16 layers: in one process both sides would get the
    current tree's model (a 12x regression passed as unchanged); each side now runs in a pytest process of its
    own tree, with its own fixture, and the 8x is found. The record names why, and which files each side ran."""
    pytester.makeconftest(FIXTURE_CONFTEST)
    pytester.makepyfile(mymodel="class Model:\n    def cost(self):\n        return 2.0\n", test_m=FIXTURE_TEST)
    commit_all(pytester.path)
    pytester.makepyfile(mymodel="class Model:\n    def cost(self):\n        return 16.0\n")
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-out", "out",
                             "--bench-malloc", "pinned")   # one pair of servers a side: cheaper, same point
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*scenario 'model': slower against revision 'HEAD'*"])
    (rec,) = json.loads(next((pytester.path / "out").glob("*.json")).read_text())["against"]["scenarios"]
    # each side's calls carry +-2% of jitter whose phase comes from its child's pid (fakes.work_on_shared_clock), so
    # the ratio of two medians lies within 8 x 0.98/1.02 and 8 x 1.02/0.98, and no closer: 7.81 came from one run
    assert 8.0 * 0.98 / 1.02 <= rec["comparison"]["ratio"] <= 8.0 * 1.02 / 0.98
    # named where it is written, and through which changed file its code runs
    assert "the fixture 'model' (conftest.py, through mymodel.py)" in rec["code"]["why_processes"]
    ran = rec["code"]["processes_ran"]
    model_files = {side: [f for f in ran[side][0]["files"] if f.endswith("mymodel.py")] for side in ran}
    assert model_files["candidate"] == [str(pytester.path / "mymodel.py")]
    assert model_files["baseline"][0] != model_files["candidate"][0] and ran["baseline"][0]["forked_rounds"]
    assert ran["baseline"][0]["pid"] != ran["candidate"][0]["pid"]


def test_a_fixture_whose_code_is_the_same_on_both_sides_is_compared(pytester):
    pytester.makeconftest(FIXTURE_CONFTEST)
    pytester.makepyfile(mymodel="class Model:\n    def cost(self):\n        return 2.0\n", test_m=FIXTURE_TEST)
    commit_all(pytester.path)
    pytester.makepyfile(test_m=FIXTURE_TEST.replace("model.cost()", "2 * model.cost()"))   # the test changed
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3",
                             "--bench-no-out")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*scenario 'model': slower against revision 'HEAD'*"])


def test_a_revision_whose_test_does_not_compile_fails_with_its_own_error(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_s=FIXTURE_TEST.replace(", model", "").replace("model.cost()", "2.0")
                        .replace("def test_model", "def test_model(:\n    pass\n\ndef test_other"))
    commit_all(pytester.path)
    pytester.makepyfile(test_s=FIXTURE_TEST.replace(", model", "").replace("model.cost()", "2.0"))
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*HEAD's test module does not load, so it cannot be compared: SyntaxError*"])


def test_a_sibling_module_is_imported_from_the_revisions_own_tree(pytester):
    """A test imports a module beside it, on sys.path only once pytest collected the test (after the revision
    was loaded): the revision's side must import the revision's copy."""
    pytester.makeconftest(CONFTEST)
    bench_dir = pytester.mkdir("benchmarks")
    (bench_dir / "helper.py").write_text("COST = 2.0\n")
    (bench_dir / "test_h.py").write_text(FIXTURE_TEST.replace(", model", "").replace("model.cost()", "helper.COST")
                                         .replace("from bench_core", "import helper\nfrom bench_core"))
    commit_all(pytester.path)
    (bench_dir / "helper.py").write_text("COST = 20.0\n")
    res = pytester.runpytest("benchmarks", "--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3",
                             "--bench-no-out")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*scenario 'model': slower against revision 'HEAD'*"])


def test_what_was_not_compared_is_counted_and_strict_fails_it_but_not_a_new_scenario(pytester):
    """gamma is broken in the revision (not compared), delta does not exist there (new): the outcome line counts
    both; --bench-strict fails gamma's item and never delta's."""
    from test_plugin import AGAINST_V1, AGAINST_V2

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sides=AGAINST_V1)
    commit_all(pytester.path)
    pytester.makepyfile(test_sides=AGAINST_V2)
    args = ["--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3", "--bench-no-out", "-k",
            "gamma or delta or beta"]
    res = pytester.runpytest(*args)
    res.assert_outcomes(passed=3)
    out = " ".join(res.stdout.str().split())
    assert "gate: " in out and "of 1 scenario(s) decided" in out and "; 1 not compared (--bench-strict fails them); " \
                                                                        "1 new (nothing to compare with)" in out
    res = pytester.runpytest(*args, "--bench-strict", "-k", "gamma or delta")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*scenario 'gamma': not compared with revision 'HEAD': not compared: HEAD*"
                              "broken in the old revision*(--bench-strict)*"])


def test_a_revisions_test_this_tree_no_longer_has_is_named_and_strict_fails_the_session(pytester):
    """beta renamed with its scenario (as a pytest-benchmark test's name is its scenario's): the new one is new, and
    the revision's test_beta, which nothing here compared, is named; --bench-strict fails the session for it. A
    rename that keeps the literal scenario name is compared, and nothing is missing."""
    from test_plugin import AGAINST_V1

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sides=AGAINST_V1)
    commit_all(pytester.path)
    args = ["--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3", "--bench-no-out", "-k",
            "alpha or beta"]
    pytester.makepyfile(test_sides=AGAINST_V1.replace("def test_beta(", "def test_beta_renamed(").replace(
        'Scenario("beta"', 'Scenario("beta2"'))
    res = pytester.runpytest(*args)
    res.assert_outcomes(passed=2)
    assert res.ret == 0
    out = " ".join(res.stdout.str().split())
    assert "in HEAD but not run now: test_sides.py::test_beta" in out and "1 new (nothing to compare with)" in out
    assert "1 in HEAD but not run now (--bench-strict fails them)" in out
    res = pytester.runpytest(*args, "--bench-strict")
    assert res.ret == 1
    res.stdout.fnmatch_lines(["*--bench-strict: 1 scenario(s) of HEAD were not run now (test_sides.py::test_beta)*"])
    pytester.makepyfile(test_sides=AGAINST_V1.replace("def test_beta(", "def test_beta_renamed("))
    res = pytester.runpytest(*args, "--bench-strict")
    assert res.ret == 0 and "not run now" not in res.stdout.str()


def test_a_test_the_revision_lacks_is_new_in_process_mode_too(pytester):
    """In process mode (here asked for; compiled code sends every scenario there) a test this tree added was sent to
    the revision's server, which had no such item, and read "not compared: HEAD failed: ... 0 test items here
    match"; it is new, as in one process, found before any server is asked."""
    from test_plugin import AGAINST_V1

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sides=AGAINST_V1)
    commit_all(pytester.path)
    pytester.makepyfile(test_sides=AGAINST_V1 + '''
def test_added(bench):
    bench.run(Scenario("added", ("forward",)), work_on_shared_clock(1.0), clock=SHARED_CLOCK)
''')
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-against-processes", "--bench-quick",
                             "--bench-malloc", "pinned", "--bench-no-out", "--bench-strict", "-k", "added")
    res.assert_outcomes(passed=1)   # new: never failed, not even under --bench-strict
    out = " ".join(res.stdout.str().split())
    assert "added: measured on the current tree only: test_added does not exist in HEAD" in out
    assert "1 new (nothing to compare with)" in out and "not compared" not in out


def test_a_gate_that_compared_nothing_fails_the_session(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_other="def test_nothing():\n    pass\n")
    commit_all(pytester.path)
    pytester.makepyfile(test_new=FIXTURE_TEST.replace(", model", "").replace("model.cost()", "2.0"))
    # added, not committed: new in this tree (an untracked file would be run against the revision's code as well)
    subprocess.run(["git", "add", "test_new.py"], cwd=pytester.path, check=True)
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out")
    res.assert_outcomes(passed=2)
    assert res.ret == 1
    out = " ".join(res.stdout.str().split())     # notes wrap at 120 columns
    assert "gate: 0 of 0 scenario(s) decided" in out and "1 new (nothing to compare with) (nothing was compared: " \
                                                          "the session fails)" in out
    res.stdout.fnmatch_lines(["bench_core: no scenario was compared with revision 'HEAD': the session fails*"])


def test_a_renamed_and_moved_test_is_found_by_its_scenario_name(pytester):
    """The test was renamed and its file moved, the scenario kept its name, and it got 10x slower: compared with
    the revision's test that declares that scenario, not measured alone and passed (#27)."""
    plain = FIXTURE_TEST.replace(", model", "").replace("model.cost()", "{cost}")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_old=plain.format(cost=2.0).replace("def test_model", "def test_before"))
    commit_all(pytester.path)
    (pytester.path / "test_old.py").unlink()
    pytester.makepyfile(test_moved=plain.format(cost=20.0).replace("def test_model", "def test_after"))
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-rounds", "5", "--bench-pairs", "3", "--bench-no-out")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*scenario 'model': slower against revision 'HEAD'*"])


TWO = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock


def test_two(bench):
    bench.run(Scenario("first", ("forward",)), work_on_shared_clock(1.0), clock=SHARED_CLOCK)
    bench.run(Scenario("second", ("forward",)), work_on_shared_clock({cost}), clock=SHARED_CLOCK)
'''


def test_a_second_scenario_in_one_test_is_never_compared_with_the_first_ones_step(pytester):
    """#28: two bench.run calls in one test stored the first one's samples under the second's name."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_two=TWO.format(cost=3.0))
    commit_all(pytester.path)
    pytester.makepyfile(test_two=TWO.format(cost=9.0))
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-wide")
    out = res.stdout.str()
    assert "second: not compared: HEAD" in out and "test measures more than one scenario" in out
    assert "only its first ('first')" in out and "1 not compared" in out   # counted; --bench-strict fails it


def test_the_fidelity_checks_resolve_a_modules_file_once_a_process(monkeypatch):
    """`project_files` walks every loaded module's file at each check (a fixture's, the revision's test module's):
    where each lies is resolved once a process (`revisions.resolved`), as a side's server does (#27); a relative
    name is resolved each time, from the working directory of the moment."""
    from pathlib import Path

    from bench_core.workflows.side_by_side import fidelity

    here = Path(__file__).parent
    first = fidelity.project_files([commit_all], [here])
    calls = []
    real = Path.resolve

    def counted(self, *args, **kwargs):
        calls.append(str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "resolve", counted)
    again = fidelity.project_files([commit_all], [here])
    monkeypatch.undo()
    assert again == first and Path(__file__).resolve() in first
    assert not [c for c in calls if c.endswith(".py") and Path(c).is_absolute()]   # no module's file again
    assert str(here) in calls   # the roots, each time


def test_a_benchmark_written_since_and_never_committed_measures_the_revisions_code_too(pytester):
    """The flow 'I wrote a benchmark; was main faster?': the test file is untracked, the revision has none. It is
    copied into the revision's tree (with its conftest), so each side runs it against its own code, and the
    summary says so; a benchmark of code the revision lacks is new there, not a failure."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(mymodel="class Model:\n    def cost(self):\n        return 2.0\n")
    commit_all(pytester.path)
    pytester.makepyfile(mymodel="class Model:\n    def cost(self):\n        return 8.0\n",
                        test_new=FIXTURE_TEST.replace("model.cost()", "Model().cost()").replace(
                            "def test_model(bench, model):", "from mymodel import Model\n\n\ndef test_model(bench):"))
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-out", "out")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*scenario 'model': slower against revision 'HEAD'*",
                              "*model: HEAD's side ran this tree's test file, which git does not track*"])
    (rec,) = json.loads(next((pytester.path / "out").glob("*.json")).read_text())["against"]["scenarios"]
    assert rec["code"]["test_from_this_tree"] == "test_new.py" and 3.5 <= rec["comparison"]["ratio"] <= 4.5
    pytester.makepyfile(test_new=FIXTURE_TEST.replace("model.cost()", "Model().speed()").replace(
        "def test_model(bench, model):", "from mymodel import Model\nModel.speed = Model.cost\nfrom mymodel import "
                                         "Faster\n\n\ndef test_model(bench):"),
                        mymodel="class Model:\n    def cost(self):\n        return 8.0\n\n\nclass Faster(Model):\n"
                                "    pass\n")
    res = pytester.runpytest("--bench-against", "HEAD", "--bench-quick", "--bench-no-out", "--bench-strict")
    res.assert_outcomes(passed=1)   # new here: nothing to compare with, never failed
