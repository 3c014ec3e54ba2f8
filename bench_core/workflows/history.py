"""A scenario's history across commits: its runs on one machine, oldest first, and the change points found in them
(`deciding.changepoints`), each with the commits on either side. Never across machines: each machine's history is
searched on its own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from bench_core.deciding.changepoints import ChangePoint, change_points
from bench_core.files.history import History, Point


@dataclass(frozen=True)
class Change:
    point: ChangePoint
    last_before: Point      # the last run at the old level
    first_after: Point      # the first run at the new level

    @property
    def commits(self) -> str:
        a, b = (p.commit[:12] if p.commit else "no commit" for p in (self.last_before, self.first_after))
        return f"{a}..{b}"


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
    return [Change(c, points[c.index - 1], points[c.index]) for c in found]
