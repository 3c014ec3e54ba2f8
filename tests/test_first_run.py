"""What a new user meets on a first run, each once a defect: files bench_core leaves in the repository, an
interrupted run in the history, counts that cannot work, hints that contradict the table, the next step after a
failing gate."""
import json
import subprocess

from bench_core.output.html import strip_svg
from bench_core.output.tables import sample_shape

BENCH = '''
from bench_core import Scenario
from fakes import FakeClock, work

LEVEL = {level}

def test_alpha(bench):
    clock = FakeClock()
    bench.run(Scenario("alpha", ("forward",)), work(clock, 3.0, LEVEL), clock=clock)
'''


def _bt(pytester):
    import fakes

    pytester.makeconftest(f"import sys; sys.path.insert(0, {str(fakes.__file__.rsplit('/', 1)[0])!r})")
    return pytester


def _git(root, *args) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
                               "HOME": str(root), "PATH": "/usr/bin:/bin"}).stdout


def test_a_saved_baseline_leaves_no_lock_and_the_results_folder_ignores_itself(pytester):
    bt = _bt(pytester)
    bt.makepyfile(test_b=BENCH.format(level=2.0))
    _git(bt.path, "init", "-q")
    _git(bt.path, "add", "-A")
    _git(bt.path, "commit", "-qm", "v1")
    res = bt.runpytest("--bench-save", "main")
    assert res.ret == 0
    assert sorted(p.name for p in (bt.path / "baselines").iterdir()) == ["main.json"]
    assert _git(bt.path, "status", "--porcelain", "--untracked-files=all").split() == ["??", "baselines/main.json"]
    res = bt.runpytest("--bench-against", "HEAD", "--bench-rounds", "3", "--bench-pairs", "1")
    assert "clean" in res.stdout.str() and "dirty" not in res.stdout.str()   # a baseline is data, not code that runs
    (bt.path / "helper.py").write_text("X = 1\n")                             # new code is
    assert "dirty" in bt.runpytest("--bench-against", "HEAD", "--bench-rounds", "3", "--bench-pairs", "1").stdout.str()


def test_an_interrupted_run_is_not_added_to_the_history_nor_followed_by_advice(pytester):
    bt = _bt(pytester)
    bt.makepyfile(test_b=BENCH.format(level=2.0) + "\n\ndef test_stop():\n    raise KeyboardInterrupt\n")
    res = bt.runpytest_subprocess("--bench-save", "main")   # in its own process: the interrupt stays there
    out = " ".join(res.stdout.str().split())
    assert "history: this run NOT added to" in out and "the session was interrupted" in out
    assert "baseline 'main' NOT saved" in out and "next:" not in out
    assert not (bt.path / ".bench" / "history.sqlite").exists()
    assert list((bt.path / ".bench" / "results").glob("session-*.json"))   # the part that ran is kept there


def test_counts_that_cannot_work_are_refused_before_anything_is_built(pytester):
    bt = _bt(pytester)
    bt.makepyfile(test_b=BENCH.format(level=2.0))
    res = bt.runpytest("--bench-repeats", "0")
    assert res.ret == 4
    assert res.stderr.str().count("--bench-repeats takes at least 2 samples (a spread needs two), got 0") == 1
    assert bt.runpytest("--bench-warmup", "-1").ret == 4


def test_the_history_page_marks_the_median_every_table_gives():
    assert "median 2.5<" in strip_svg([1.0, 2.0, 3.0, 4.0])


def test_the_cluster_hint_names_threads_only_where_more_than_one_ran():
    samples = [1.0] * 10 + [3.0] * 10
    assert "--bench-threads 1" in sample_shape(samples, threads=4)
    one = sample_shape(samples, threads=1)
    assert "--bench-threads" not in one and "torch ran on one thread here" in one


def test_a_failing_gate_says_how_to_look_into_it_and_how_to_accept_it(pytester):
    bt = _bt(pytester)
    bt.makepyfile(test_b=BENCH.format(level=2.0))
    for extra in ([], ["--bench-append"], ["--bench-append"]):
        assert bt.runpytest("--bench-save", "main", *extra).ret == 0
    bt.makepyfile(test_b=BENCH.format(level=4.0))
    res = bt.runpytest("--bench-compare", "main", "--bench-min-runs", "1")
    assert res.ret == 1
    res.stdout.fnmatch_lines(["next: where the time went: rerun with --bench-profile DIR*",
                              "      to accept the change: store this code as a new baseline*"])
    same = bt.runpytest("--bench-compare", "main", "--bench-min-runs", "1", "-k", "nothing")
    assert "next:" not in same.stdout.str()


def test_a_table_that_must_wrap_never_splits_a_scenario_name():
    from bench_core.output.fitting import fit

    name = "fsdp2_train_step[mlp-bf16-compiled-activation-checkpointing]"
    rows = [[name, "a note long enough to need wrapping " * 4, "1.0"], ["short", "x", "2.0"]]
    text = fit(["scenario", "notes", "ms"], rows)
    assert max(map(len, text.splitlines())) <= 120 and name in text.splitlines()[2]


def test_a_childs_colours_never_reach_a_reason_line(tmp_path):
    from bench_core.files.children import log_tail

    (tmp_path / "log").write_text("\x1b[33m==== 1 failed in 0.2s ====\x1b[0m\nERROR: \x1b[1mnot found\x1b[0m\n")
    assert log_tail(tmp_path / "log") == "==== 1 failed in 0.2s ==== / ERROR: not found"


def test_a_child_run_to_its_end_says_its_exit_or_that_it_was_ended_at_its_limit_with_its_last_lines(tmp_path):
    import sys

    from bench_core.files.children import alive, run_logged

    ended = []
    done = run_logged([sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"], tmp_path / "a.log",
                      30, tail_lines=1, ending=lambda proc: ended.append(proc.poll()))
    assert (done.code, done.tail, ended) == (3, "two", [3])   # ended (reaped) after a clean exit too
    hung = run_logged([sys.executable, "-c", "import os, time; print(os.getpid()); print('waiting', flush=True); "
                                             "time.sleep(60)"], tmp_path / "b.log", 0.5)   # printed within 0.1 s
    pid, waiting = (tmp_path / "b.log").read_text().split()
    assert hung.code is None and hung.tail.endswith("waiting") and not alive(int(pid))


CUSTOM_CONFTEST = """
import sys
sys.path.insert(0, {fakes!r})


def pytest_addoption(parser):
    parser.addoption("--model-size", default="small")


def pytest_generate_tests(metafunc):
    if "size" in metafunc.fixturenames:
        metafunc.parametrize("size", [metafunc.config.getoption("--model-size")])
"""

CUSTOM_TEST = """
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

def test_model(bench, size):
    bench.run(Scenario(f"model[{{size}}]", ("forward",)), work_on_shared_clock({ms}), clock=SHARED_CLOCK)
"""


def test_the_gates_fresh_processes_get_the_sessions_conftest_options(pytester):
    """A conftest option that names the test (`--model-size`): the fresh processes that decide a possible slowdown
    ran without it, found no such test, and a real regression ended inconclusive, exit 0."""
    import fakes

    pytester.makeconftest(CUSTOM_CONFTEST.format(fakes=str(fakes.__file__.rsplit("/", 1)[0])))
    pytester.makepyfile(test_m=CUSTOM_TEST.format(ms=2.0))
    for extra in ([], ["--bench-append"], ["--bench-append"]):
        assert pytester.runpytest("--model-size", "large", "--bench-save", "main", *extra).ret == 0
    pytester.makepyfile(test_m=CUSTOM_TEST.format(ms=3.0))
    res = pytester.runpytest("--model-size", "large", "--bench-compare", "main", "--bench-min-runs", "2",
                             "--bench-max-runs", "2")   # one fresh process
    out = " ".join(res.stdout.str().split())
    assert res.ret == 1 and "model[large]" in out and "slower" in out and "not found" not in out, out


def test_a_gate_over_tests_that_were_all_skipped_fails(pytester):
    bt = _bt(pytester)
    bt.makepyfile(test_b=BENCH.format(level=2.0))
    assert bt.runpytest("--bench-save", "main").ret == 0
    res = bt.runpytest("--bench-compare", "main", "--benchmark-skip")
    out = " ".join(res.stdout.str().split())
    assert res.ret == 1 and "gate: 0 of 0 scenario(s) decided" in out and "(nothing was compared: the session fails)" \
        in out


def test_the_default_measures_the_program_as_users_run_it_and_a_changed_one_is_said_first(pytester):
    """glibc malloc as it is and torch's own threads by default; pinning malloc or setting threads lowers noise by
    changing the program, which the header and the Markdown report say before any figure."""
    import torch

    pytester.makepyfile(test_s="""
from bench_core import Scenario

def test_s(bench):
    bench.run(Scenario("s", ("forward",)), lambda: None)
""")
    plain = pytester.runpytest("--bench-quick", "--bench-out", "out")
    plain.assert_outcomes(passed=1)
    assert "changed program" not in plain.stdout.str()
    doc = json.loads(next((pytester.path / "out").glob("session-*.json")).read_text())
    assert doc["results"][0]["threads"] == torch.get_num_threads() and doc["environment"]["malloc"].startswith("as-is")
    changed = pytester.runpytest("--bench-quick", "--bench-no-out", "--bench-malloc", "pinned", "--bench-threads", "1",
                                 "--bench-md", "report.md")
    changed.stdout.fnmatch_lines(["bench_core: measuring a changed program, as asked: glibc malloc's thresholds pinned "
                                  "(--bench-malloc pinned); torch CPU threads set to 1 (--bench-threads 1)*"])
    assert (pytester.path / "report.md").read_text().splitlines()[2].startswith("> **measuring a changed program")
    assert torch.get_num_threads() == doc["results"][0]["threads"]   # the session left this process as it found it
