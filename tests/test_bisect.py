"""bench-core bisect: the search on its own (fake decisions), then through real pytest runs in temporary worktrees
of a throwaway repository (fake clocks: each commit's step takes a known time)."""
import json
import subprocess

import pytest

from bench_core.deciding.verdicts import INCONCLUSIVE, SLOWER, UNCHANGED
from bench_core.workflows.bisect import Step, planned_decisions, search
from test_fidelity import CONFTEST, GIT_ENV

COMMITS = [f"{i:02d}" * 20 for i in range(16)]


def _decider(first_bad, inconclusive=()):
    asked, thresholds = [], []

    def decide(commit, alpha, factor, threshold=None):
        asked.append((commit, alpha, factor))
        thresholds.append(threshold)
        if (commit, factor) in inconclusive:
            return Step(commit, INCONCLUSIVE)
        bad = first_bad is not None and COMMITS.index(commit) >= first_bad
        return Step(commit, SLOWER if bad else UNCHANGED, 1.25 if bad else 1.0, 1.2, 1.3, 0.99, 12)
    decide.thresholds = thresholds
    return decide, asked


@pytest.mark.parametrize("first_bad", [0, 1, 7, 9, 15])
def test_the_search_names_the_first_bad_commit_within_its_planned_decisions(first_bad):
    decide, asked = _decider(first_bad)
    found = search("g" * 40, COMMITS, "step", decide, alpha=0.01)
    assert found.outcome == "found" and found.first_bad == COMMITS[first_bad]
    assert found.last_good == ("g" * 40 if first_bad == 0 else COMMITS[first_bad - 1])
    assert len(asked) <= planned_decisions(16) == 6
    assert {a for _, a, _ in asked} == {0.01 / 6}      # every decision at its share of the search's alpha
    assert "first bad commit: " + COMMITS[first_bad] in "\n".join(found.lines())
    # BAD first, at the comparison's own threshold; the commits between at a quarter of its 1.25x step
    assert decide.thresholds[0] is None and all(t == pytest.approx(0.0625) for t in decide.thresholds[1:])
    assert found.threshold == pytest.approx(0.0625) and "threshold 6.2%" in "\n".join(found.lines())


def test_no_slowdown_ends_the_search_at_once_and_an_undecided_step_reports_the_range_proved():
    decide, asked = _decider(None)
    found = search("g" * 40, COMMITS, "step", decide)
    assert found.outcome == "no change in range" and len(asked) == 1 and found.first_bad is None
    # commit 7 stays inconclusive, even with three times the rounds: the range proved is (3, 9]... [8..15]
    decide, asked = _decider(9, inconclusive={(COMMITS[7], 1), (COMMITS[7], 3)})
    found = search("g" * 40, COMMITS, "step", decide)
    assert found.outcome == "undecided" and found.first_bad == COMMITS[15] and found.last_good == "g" * 40
    assert [(c, f) for c, _, f in asked][-2:] == [(COMMITS[7], 1), (COMMITS[7], 3)]
    decide, _ = _decider(9, inconclusive={(COMMITS[7], 1)})     # decided on its second try
    assert search("g" * 40, COMMITS, "step", decide).first_bad == COMMITS[9]


@pytest.mark.parametrize("bad, outcome, said", [
    (Step("x", INCONCLUSIVE, 0.992, 0.944, 1.042, 0.997, 36), "no change in range",
     "is not slower than gggggggggggg for step by 5% or more (its interval reaches 1.042x at most)"),
    (Step("x", INCONCLUSIVE, 1.01, 0.95, 1.08, 0.997, 36), "undecided", "undecided: the first bad commit is after"),
])
def test_an_undecided_bad_commit_whose_interval_rules_out_the_slowdown_searched_for_is_no_change(bad, outcome, said):
    found = search("g" * 40, COMMITS, "step", lambda commit, *a: bad)
    assert found.outcome == outcome and said in "\n".join(found.lines())


def test_a_slowdown_smaller_than_searched_for_is_still_found_and_named_as_such():
    def decide(commit, *a):
        slow = COMMITS.index(commit) >= 4
        return Step(commit, SLOWER if slow else UNCHANGED, 1.03 if slow else 1.0, 1.02, 1.04, 0.99, 12)
    found = search("g" * 40, COMMITS, "step", decide)
    assert found.first_bad == COMMITS[4]
    assert "(1.030x against gggggggggggg, smaller than the 5% slowdown searched for)" in "\n".join(found.lines())


WORK = '''
from bench_core import Scenario
from fakes import SHARED_CLOCK, work_on_shared_clock

LEVEL = {level}


def test_step(bench):
    bench.run(Scenario("step", ("compute",), noise_threshold=0.1), work_on_shared_clock(LEVEL), clock=SHARED_CLOCK)
'''


def test_bisect_finds_the_commit_that_made_a_scenario_25_percent_slower_in_worktrees(tmp_path, capsys):
    """3 commits after GOOD, commit 2 makes the step 25% slower: bisect names it from real pytest runs, each in a
    temporary worktree (BAD first, then commit 1, good, then commit 2, bad: a middle step of each verdict); the
    user's tree (and its untracked data) is left as it was."""
    from bench_core.shells.cli import main

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True,
                              env={**GIT_ENV, "HOME": str(tmp_path)}).stdout.strip()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "data.bin").write_text("untracked data")
    (tmp_path / ".gitignore").write_text("data.bin\n.bench/\n")
    git("init", "-q")
    shas = []
    for i in range(4):
        (tmp_path / "test_work.py").write_text(WORK.format(level=1.25 if i >= 2 else 1.0) + f"# commit {i}\n")
        git("add", "-A")
        git("commit", "-qm", f"commit {i}")
        shas.append(git("rev-parse", "HEAD"))
    code = main(["bisect", shas[0], shas[-1], "-k", "step", "--repo", str(tmp_path), "--", "--bench-rounds", "6",
                 "--bench-pairs", "2", "--bench-threads", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"first bad commit: {shas[2]}" in out and f"last good: {shas[1]}" in out
    (record,) = (tmp_path / ".bench").glob("bisect-*.json")
    doc = json.loads(record.read_text())
    assert doc["outcome"] == "found" and len(doc["steps"]) <= planned_decisions(3)
    assert all(s["ratio"] is not None for s in doc["steps"])
    assert git("status", "--porcelain") == "" and (tmp_path / "data.bin").read_text() == "untracked data"
    assert git("worktree", "list").count("\n") == 0     # every temporary worktree removed


def test_each_commits_worktree_has_its_submodules_at_that_commits_own_version(tmp_path):
    """A plain `git worktree add` leaves a submodule empty, so a step would run without its code (or fail): each
    commit's worktree gets every submodule at the commit it records, as a worktree of the user's clone, all removed
    afterwards; a submodule the user never checked out is named."""
    from bench_core.workflows.bisect import BisectError, worktree
    from test_revisions import _tree, git, with_submodule, write

    root = with_submodule(tmp_path)
    git(root, "commit", "-qm", "v1")
    write(root, {"workload/work.py": "AMOUNT = 20\n"})       # the workload bumped 10x
    git(root / "workload", "commit", "-qam", "large")
    git(root, "commit", "-qam", "v2")

    def head(repo):
        return subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=repo, capture_output=True, text=True).stdout.strip()
    with worktree(root, head(root), tmp_path / "tree") as tree:
        assert (tree / "workload" / "work.py").read_text() == "AMOUNT = 2\n"
    assert not (tmp_path / "tree").exists()
    for repo in (root, root / "workload"):
        listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
        assert listed.count("\n") == 1       # only the user's own checkout is left
    assert (root / "workload" / "work.py").read_text() == "AMOUNT = 20\n"   # the user's tree untouched

    bare = _tree(tmp_path, "fresh")
    git(bare, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(tmp_path / "workload"), "workload")
    git(bare, "commit", "-qm", "v1")
    git(bare, "submodule", "deinit", "-q", "--all")
    with pytest.raises(BisectError, match="submodule workload, which is not checked out here"):
        with worktree(bare, "HEAD", tmp_path / "tree2"):
            pass


def test_a_bisect_step_reads_the_session_file_through_its_owner_and_a_damaged_one_is_inconclusive_saying_so(tmp_path):
    from bench_core.files import storage
    from bench_core.workflows.bisect import _step_from

    bad = tmp_path / "session-1.json"
    bad.write_text('{"format": "bench_core.session", "schema_version": 1, "environment": {}, "results": []\n'
                   '<<<<<<< HEAD\n')
    step = _step_from("abc", "s", [bad], [])
    assert step.verdict == "inconclusive" and "cannot be read" in step.note and "conflict markers" in step.note
    good = tmp_path / "session-2.json"
    rec = {"scenario": "s", "comparison": {"verdict": "slower", "ratio": 1.2}, "rounds": {"round_log_ratios": [0.1]}}
    doc = {"format": storage.SESSION_FORMAT, "schema_version": storage.SCHEMA_VERSION, "environment": {},
           "results": [], "against": storage.against_section({}, {}, [rec], [("t", "not compared: gone")])}
    good.write_text(json.dumps(doc))
    assert _step_from("abc", "s", [good], []).ratio == 1.2
    assert "not compared: gone" in _step_from("abc", "t", [good], []).note
