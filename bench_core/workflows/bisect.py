"""`bench-core bisect GOOD BAD -k SCENARIO`: the first commit where a scenario got slower, by binary search over
the commits between GOOD and BAD, each step a side-by-side decision (`--bench-against GOOD`, the same engine as a
pytest run's) of one commit in a temporary worktree; the user's tree is never touched.

The error statement: the search plans at most ceil(log2(n)) + 2 decisions over n commits (the first checks that
BAD is slower than GOOD at all; one more is kept for a step that needs its rounds run again), and each decision is
made at alpha / that many, so the whole search is wrong with probability at most alpha (Bonferroni). A step left
inconclusive is run once more with three times the rounds; if it still is, the search stops and reports the
narrowest range it proved.

The question of the middle steps: once BAD is found slower by a ratio r, each commit between is asked whether it is
at GOOD's level or at BAD's, not whether it differs from GOOD by 2%: its threshold is a quarter of the step, so
"unchanged" means within half the step of GOOD (the gate's equivalence margin is twice its threshold). A step of
10% then decides a good commit once its interval lies within +-5%, not +-4%, about a third fewer rounds. A slowdown
that came in two halves is found at the commit where the second half came in; the record says which threshold the
middle steps used.
"""
from __future__ import annotations

import math
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from bench_core.core.errors import BenchError, StorageError
from bench_core.deciding.verdicts import FASTER, INCONCLUSIVE, SLOWER, UNCHANGED
from bench_core.files import storage


class BisectError(BenchError):
    pass


MIN_CHANGE = 0.05   # the smallest slowdown a search is for, unless asked otherwise


@dataclass(frozen=True)
class Step:
    """One decision: `commit` against GOOD."""

    commit: str
    verdict: str
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float | None = None
    rounds: int | None = None
    facts: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Bisection:
    good: str
    bad: str
    scenario: str
    commits: tuple[str, ...]                # GOOD's descendants up to BAD, oldest first
    steps: tuple[Step, ...]
    outcome: str                            # "found", "no change in range", "undecided"
    first_bad: str | None = None
    last_good: str | None = None
    alpha: float = 0.01
    planned: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    threshold: float | None = None          # the middle steps' threshold (None: the comparison's own)
    min_change: float = MIN_CHANGE          # the smallest slowdown the search is for

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steps"] = [asdict(s) for s in self.steps]
        return d

    def lines(self) -> list[str]:
        out = [f"{s.commit[:12]}: {s.verdict}" + (f" {s.ratio:.3f}x [{s.ci_low:.3f}, {s.ci_high:.3f}] "
                                                   f"({s.confidence:.1%}), {s.rounds} rounds"
                                                   if s.ratio is not None and s.ci_low is not None else "")
               + (f"; {s.note}" if s.note else "") + "".join(f"\n  work signature: {f}" for f in s.facts)
               for s in self.steps]
        if self.outcome == "found":
            step = next(s for s in reversed(self.steps) if s.commit == self.first_bad and s.verdict == SLOWER)
            smaller = (f", smaller than the {self.min_change:.0%} slowdown searched for"
                       if step.ratio < 1 + self.min_change else "")
            out.append(f"first bad commit: {self.first_bad} ({step.ratio:.3f}x against {self.good[:12]}{smaller}); "
                       f"last good: {self.last_good}")
        elif self.outcome == "no change in range":
            bad = self.steps[-1]
            why = ("" if bad.verdict != INCONCLUSIVE else
                   f" by {self.min_change:.0%} or more (its interval reaches {bad.ci_high:.3f}x at most)")
            out.append(f"no change in range: {self.bad[:12]} is not slower than {self.good[:12]} for "
                       f"{self.scenario}{why}")
        else:
            out.append(f"undecided: the first bad commit is after {self.last_good} and at or before {self.first_bad} "
                       f"(the narrowest range proved)")
        middle = ("" if self.threshold is None else
                  f"; the commits between at threshold {self.threshold:.1%} (a quarter of BAD's step: 'unchanged' "
                  f"within half of it)")
        return out + [f"{len(self.steps)} decisions (at most {self.planned} planned), each at alpha "
                      f"{self.alpha / self.planned:.2g}, {self.alpha:g} for the whole search{middle}"] + list(self.notes)


def planned_decisions(n: int) -> int:
    return math.ceil(math.log2(max(n, 1))) + 2


MIN_THRESHOLD = 0.02   # side by side's own threshold: the middle steps' is never below it


def middle_threshold(bad: Step) -> float | None:
    """The middle steps' threshold from BAD's decision (a quarter of its step), where that is above side by
    side's own; None otherwise."""
    if bad.verdict != SLOWER or bad.ratio is None or (bad.ratio - 1) / 4 <= MIN_THRESHOLD:
        return None
    return (bad.ratio - 1) / 4


def search(good: str, commits: Sequence[str], scenario: str, decide: Callable[..., Step], *,
           alpha: float = 0.01, retry_factor: int = 3, min_change: float = MIN_CHANGE) -> Bisection:
    """Binary search for the first commit of `commits` (oldest first, the last is BAD) slower than `good`;
    `decide(commit, alpha_per_step, rounds_factor, threshold)` is one side-by-side decision against `good`
    (threshold None: the comparison's own). BAD not slower, or undecided with an interval that rules out a
    slowdown of `min_change` or more: no change in range (BAD slower by less than that is searched all the same,
    and named as smaller than asked)."""
    if not commits:
        raise BisectError(f"no commits between {good[:12]} and the bad one: nothing to bisect")
    planned = planned_decisions(len(commits))
    per = alpha / planned
    steps: list[Step] = []
    threshold: float | None = None

    def judged(commit: str) -> str | None:
        step = decide(commit, per, 1, threshold)
        if step.verdict == INCONCLUSIVE and len(steps) + 2 <= planned:
            steps.append(step)
            step = decide(commit, per, retry_factor, threshold)
        steps.append(step)
        if step.verdict == SLOWER:
            return "bad"
        if step.verdict in (UNCHANGED, FASTER):
            return "good"
        return None
    first = judged(commits[-1])
    args = dict(good=good, bad=commits[-1], scenario=scenario, commits=tuple(commits), alpha=alpha, planned=planned,
                min_change=min_change)
    if first != "bad":
        ruled_out = steps[-1].ci_high is not None and steps[-1].ci_high < 1 + min_change
        none = first == "good" or ruled_out
        return Bisection(steps=tuple(steps), outcome="no change in range" if none else "undecided",
                         first_bad=None if none else commits[-1], last_good=None if none else good, **args)
    threshold = middle_threshold(steps[-1])
    lo, hi = -1, len(commits) - 1            # commits[lo] good (-1: GOOD itself), commits[hi] bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(steps) >= planned:
            break
        verdict = judged(commits[mid])
        if verdict == "bad":
            hi = mid
        elif verdict == "good":
            lo = mid
        else:
            break
    last_good = good if lo < 0 else commits[lo]
    return Bisection(steps=tuple(steps), outcome="found" if hi - lo == 1 else "undecided", first_bad=commits[hi],
                     last_good=last_good, threshold=threshold, **args)


# --- one step: a temporary worktree at the commit, pytest --bench-against GOOD in it ----------------------------

def commits_between(root: Path, good: str, bad: str) -> list[str]:
    from bench_core.files import git

    out = git.run(root, "rev-list", "--reverse", "--ancestry-path", f"{good}..{bad}")
    if out.returncode != 0:
        raise BisectError(f"git rev-list {good}..{bad} failed in {root}: {out.stderr.strip()}")
    return out.stdout.split()


def resolve(root: Path, rev: str) -> str:
    from bench_core.files import git

    sha = git.output(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if not sha:
        raise BisectError(f"revision {rev!r} is unknown in {root}")
    return sha


def pytest_step(root: Path, good: str, scenario: str, select: str, pytest_args: Sequence[str], *,
                timeout_s: float = 3600.0, build: str | None = None):
    """`decide` for `search`: the commit checked out in a temporary worktree (data the user's tree does not
    track linked in, as --bench-against does), `pytest PYTEST_ARGS -k SELECT --bench-against GOOD` run there, and
    its decision for `scenario` read from its session file. `build`: the project's compiled code is built in place
    in each commit's worktree first (and GOOD's by the step's own --bench-build), each build cached in the
    project's `.bench/builds`, so a commit built once is never built again."""
    import os

    from bench_core.files import children
    from bench_core.workflows.side_by_side import compiled
    from bench_core.workflows.side_by_side.revisions import link_untracked

    cache = compiled.cache_folder(root / ".bench" / "builds")

    def decide(commit: str, alpha: float, rounds_factor: int, threshold: float | None = None) -> Step:
        with tempfile.TemporaryDirectory(prefix="bench_core-bisect-") as tmp, \
                worktree(root, commit, Path(tmp) / "tree") as tree:
            out = Path(tmp) / "out"
            link_untracked(root, tree)
            argv = [sys.executable, "-m", "pytest", *pytest_args, "-k", select, "-p", "no:cacheprovider",
                    "--bench-against", good, "--bench-alpha", f"{alpha:.6g}", "--bench-out", str(out),
                    "--bench-history", "none"]
            if threshold is not None:
                argv += ["--bench-threshold", f"{threshold:.4g}"]
            if rounds_factor > 1:   # the first look itself later: an undecided A/A does not run on by itself
                argv += ["--bench-rounds", str(12 * rounds_factor), "--bench-max-rounds", str(36 * rounds_factor)]
            env = None
            if build:
                try:
                    compiled.ensure_built(root, tree, commit, commit[:12], build, cache)
                except compiled.CompiledError as exc:
                    return Step(commit, INCONCLUSIVE, note=str(exc))
                argv += ["--bench-build", build]
                env = {**os.environ, compiled.CACHE_ENV: str(cache)}
            ran = children.run_logged(argv, Path(tmp) / "log", timeout_s, tail_lines=5, cwd=str(tree), env=env)
            tail = [ran.tail] if ran.code is not None else [f"ran past {timeout_s:g} s and was ended", ran.tail]
            return _step_from(commit, scenario, sorted(out.glob("session-*.json")), tail)
    return decide


@contextmanager
def worktree(root: Path, commit: str, tree: Path) -> Iterator[Path]:
    """`commit` checked out at `tree` as a temporary worktree of `root`, each submodule it records checked out at
    its commit as a worktree of the user's clone of it (a plain `git worktree add` leaves submodules empty, so the
    step would run without their code); all removed afterwards."""
    from bench_core.files import git

    added = git.run(root, "worktree", "add", "--detach", "--force", str(tree), commit)
    if added.returncode != 0:
        raise BisectError(f"git worktree add {commit[:12]} failed: {added.stderr.strip()}")
    subs: list[tuple[Path, Path]] = []
    try:
        _add_submodules(root, tree, commit, subs)
        yield tree
    finally:
        for repo, path in reversed(subs):
            git.run(repo, "worktree", "remove", "--force", str(path))
        git.run(root, "worktree", "remove", "--force", str(tree))


def _add_submodules(repo: Path, tree: Path, commit: str, added: list[tuple[Path, Path]]) -> None:
    from bench_core.files import git
    from bench_core.workflows.side_by_side.revisions import submodules_at

    for path, at in submodules_at(repo, commit):
        sub = repo / path
        if not (sub / ".git").exists():
            raise BisectError(f"commit {commit[:12]} has the submodule {path}, which is not checked out here: run "
                              f"`git submodule update --init` first, so each commit runs with its own copy of it")
        out = git.run(sub, "worktree", "add", "--detach", "--force", str(tree / path), at)
        if out.returncode != 0:
            raise BisectError(f"the submodule {path} at {at[:12]} (as {commit[:12]} records it) could not be checked "
                              f"out: {out.stderr.strip()} (fetch it first: git -C {path} fetch)")
        added.append((sub, tree / path))
        _add_submodules(sub, tree / path, at, added)


def _step_from(commit: str, scenario: str, files: list[Path], tail: list[str]) -> Step:
    if not files:
        return Step(commit, INCONCLUSIVE, note="the run wrote no results: " + " / ".join(tail))
    try:
        rec, why = storage.side_by_side_record(storage.session_doc(files[-1]), scenario)
    except StorageError as exc:
        return Step(commit, INCONCLUSIVE, note=f"the run's session file cannot be read: {exc}")
    if rec is None:
        return Step(commit, INCONCLUSIVE, note=f"scenario {scenario!r} was not compared: "
                                               f"{'; '.join(why) or 'no test measured it'}")
    c = rec["comparison"]
    rounds = rec["rounds"]   # a list in files of version 1 to 2 (one per pair of processes in worker mode)
    n = (len(set(rounds.get("units") or ())) or len(rounds["round_log_ratios"]) if isinstance(rounds, dict)
         else len(rounds))
    return Step(commit, c["verdict"], c.get("ratio"), c.get("ci_low"), c.get("ci_high"), c.get("confidence"), n,
                tuple(c.get("facts") or ()))
