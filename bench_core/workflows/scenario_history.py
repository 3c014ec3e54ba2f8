"""A scenario's history across commits: its runs on one machine, oldest first, and the change points found in them
(`deciding.changepoints`), each with the commits on either side. Never across machines: each machine's history is
searched on its own."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bench_core.deciding.changepoints import ChangePoint, change_points
from bench_core.files.history import History, Point


@dataclass(frozen=True)
class Change:
    point: ChangePoint
    last_before: Point      # the last run sure to be at the old level (before the range the change may lie in)
    first_after: Point      # the first run sure to be at the new level (the range's last)

    @property
    def commits(self) -> str:
        """The commits the change may have come in, as git writes a range (after the first, up to the second)."""
        a, b = (p.commit[:12] if p.commit else "no commit" for p in (self.last_before, self.first_after))
        return f"{a}..{b}"

    @property
    def runs(self) -> str:
        """Where the new level begins: the run found, and the range it may lie in where that is wider."""
        p = self.point
        found = f"run {p.index + 1}"
        if p.first_low == p.first_high:
            return found
        return f"{found} (runs {p.first_low + 1}-{p.first_high + 1} at {p.confidence:.0%})"

    def bisect(self, scenario: str) -> str | None:
        """The command that decides the range commit by commit, where both ends have commits."""
        a, b = self.last_before.commit, self.first_after.commit
        return None if not a or not b or a == b else f"bench-core bisect {a[:12]} {b[:12]} -k {scenario}"


@dataclass(frozen=True)
class MachineHistory:
    machine: str
    points: tuple[Point, ...]
    changes: tuple[Change, ...]


def scenario_history(h: History, scenario: str, *, machine: str | None = None, branch: str | None = None,
                     alpha: float = 0.01, min_size: int = 3) -> list[MachineHistory]:
    """`scenario`'s runs per machine (only `machine`, where given; only `branch`'s runs, where given), each with its
    change points."""
    points = h.series(scenario, machine=machine, branch=branch)
    out = []
    for key in dict.fromkeys(p.machine for p in points):
        mine = tuple(p for p in points if p.machine == key)
        out.append(MachineHistory(key, mine, tuple(changes_in(mine, alpha=alpha, min_size=min_size))))
    return out


def changes_in(points: Sequence[Point], *, alpha: float = 0.01, min_size: int = 3) -> list[Change]:
    found = change_points([p.mean_log for p in points], alpha=alpha, min_size=min_size)
    return [Change(c, points[c.first_low - 1], points[c.first_high]) for c in found]


def report_page(h: History, results_dir: Path | None, commit_url: str | None, generated: str) -> str:
    """The history's page (`output.html`): every scenario per machine, its latest run's samples (read from the
    session file it came from, where that file is still there), and the latest comparison table of `results_dir`."""
    from bench_core.files import storage
    from bench_core.output import html

    sections = []
    latest = _latest_with_comparisons(results_dir)
    if latest is not None:
        path, comparisons = latest
        sections.append((f"latest comparison ({path.name})", html.comparison_rows(comparisons)))
    for name, _, _ in h.scenarios():
        for mh in scenario_history(h, name):
            samples = None
            source = h.source_of(mh.points[-1].run_id)
            if source and Path(source).exists():
                try:
                    _, results = storage.load_session(Path(source))
                    samples = next((m.primary_ms for m in results if m.name == name), None)
                except Exception:  # noqa: BLE001 - a moved or damaged file: the page shows the history without it
                    samples = None
            sections.append(html.scenario_section(name, mh.machine, mh, samples, commit_url))
    if not sections:
        sections.append(("nothing yet", "<p class='note'>the history holds no run</p>"))
    return html.page("bench_core history", sections, generated)


def _latest_with_comparisons(results_dir: Path | None):
    from bench_core.core.errors import StorageError
    from bench_core.files.storage import session_doc

    if results_dir is None or not results_dir.is_dir():
        return None
    for path in sorted(results_dir.glob("session-*.json"), reverse=True):
        try:
            doc = session_doc(path)
        except (OSError, StorageError):
            continue
        if doc.get("comparisons"):
            return path, doc["comparisons"]
    return None


def commit_url(root: Path) -> str | None:
    """A link pattern for commits ({sha}) where the repository's origin is on GitHub; None elsewhere."""
    import re

    from bench_core.files import git

    url = git.output(root, "remote", "get-url", "origin") or ""
    m = re.match(r"(?:https://github\.com/|git@github\.com:)([^/]+/[^/]+?)(?:\.git)?$", url)
    return f"https://github.com/{m.group(1)}/commit/{{sha}}" if m else None
