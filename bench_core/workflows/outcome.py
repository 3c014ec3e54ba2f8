"""What one scenario came to: the typed record its workflow returns and the session keeps whole
(`session.Ledger.record`), the one way a measurement, a decision or a side-by-side record reaches the reports."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from bench_core.core.records import Measurement
from bench_core.deciding.comparison import Comparison


@dataclass(frozen=True)
class NotCounted:
    """Something asked of a scenario that could not be done (a count, a profiler pass): said under the tables,
    never an error."""

    scenario: str
    what: str                   # "FLOPs not counted", "no profiler pass", ...
    why: str = ""
    side: str | None = None     # side by side: which side's process

    def said(self) -> str:
        return f"{self.scenario}{f' ({self.side})' if self.side else ''}: {self.what}" + (
            f": {self.why}" if self.why else "")


@dataclass(frozen=True)
class SideBySide:
    """One scenario decided side by side: its comparison, the rounds it ran, and each side's proof of its code."""

    scenario: str
    comparison: Comparison
    rounds: Mapping[str, Any]   # `timing.protocol.Rounds.to_dict()`
    code: Mapping[str, Any]

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "comparison": self.comparison.to_dict(), "method": self.comparison.method,
                "rounds": dict(self.rounds), "code": dict(self.code)}


@dataclass(frozen=True)
class Outcome:
    """One scenario's outcome: what was measured here, what it was decided against, and what could not be
    compared. `comparison` is a stored gate's decision, or side by side's when `side_by_side` holds its record;
    `not_compared` says why a scenario measured here was not compared with the other side (`new`: that side never
    had it, which no option fails); `decision` is an A/B's (`workflows.ab.ABResult`)."""

    scenario: str
    result: Measurement | None = None
    comparison: Comparison | None = None
    replicas: tuple[Measurement, ...] = ()      # the stored gate's fresh-process runs
    side_by_side: SideBySide | None = None
    not_compared: str | None = None
    new: bool = False
    decision: Any = None

    def __post_init__(self):
        if self.side_by_side is not None and self.side_by_side.comparison is not self.comparison:
            raise ValueError(f"{self.scenario}: a side-by-side record holds the outcome's own comparison")
        if self.new and self.not_compared is None:
            raise ValueError(f"{self.scenario}: a scenario new to this tree says why it was not compared")

    @classmethod
    def side_by_side_of(cls, result: Measurement, comparison: Comparison, rounds: Mapping[str, Any],
                        code: Mapping[str, Any] | None) -> "Outcome":
        return cls(result.name, result, comparison,
                   side_by_side=SideBySide(comparison.name, comparison, dict(rounds), dict(code or {})))

    def alone(self, why: str, new: bool = False) -> "Outcome":
        """This outcome of a scenario measured on one side only, saying why it was not compared."""
        return replace(self, not_compared=why, new=new)
