"""The gate's settings (`GateConfig`) and its record of one scenario's comparison (`Comparison`), with a
confidence level in words: what the estimate fills, the decision completes, and every workflow, file and table
reads, whichever method (stored baseline, side by side, rounds) produced it.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from bench_core.deciding.sequential import planned_looks
from bench_core.deciding.verdicts import FASTER, INCOMPARABLE, INCONCLUSIVE, NEW, SLOWER, UNCHANGED

DEFAULT_MAX_RUNS = 7


CHASES = ("possible", "confirm")


@dataclass(frozen=True)
class GateConfig:
    alpha: float = 0.01            # family-wise significance level, per direction
    threshold: float = 0.05        # default noise threshold; a scenario may set its own
    # The fallback prior of the run-to-run spread, used only when the baseline holds too few scenarios
    # with repeated runs to fit one: a shared CPU runner's spread between processes (docs/gate.md).
    run_noise: float = 0.10
    prior_runs: float = 2.0        # how many runs of evidence the fallback prior is worth
    adjust: str = "holm"           # holm | bonferroni | bh
    allow_env_mismatch: bool = False
    min_runs: int = 3              # candidate runs (fresh processes) before "slower" or "faster" can be said
    max_runs: int | None = None    # the replication budget, candidate runs at most (None: 7, or min_runs if more)
    guard_rate: float = 0.03       # no baseline should give false alarms more often than this ...
    guard_baselines: float = 0.005  # ... except this share of baselines (what that costs in power: docs/gate.md)
    window: int | None = None      # compare with the latest N baseline runs (the prior still uses them all)
    # Replicate a possible change whose one-sided p is below this: loose on purpose, it only decides
    # whether to spend processes, never what is said (docs/gate.md weighs it against a stricter rule)
    chase_p: float = 0.2
    # Which possible changes fresh processes are spent on: "possible" (every one chase_p allows, for power) or
    # "confirm" (only those past the threshold whose p adjusted over the family is under chase_p: for families of
    # thousands, where chasing every possible change would cost hundreds of processes a run)
    chase: str = "possible"

    def __post_init__(self):
        for name, lo, hi in (("alpha", 0, 0.5), ("threshold", 0, 1), ("run_noise", 0, 1), ("guard_rate", 0, 0.5),
                             ("guard_baselines", 0, 0.5), ("chase_p", 0, 1)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not lo < v < hi:
                if not (name == "threshold" and v == 0):
                    raise ValueError(f"gate setting {name} must lie in ({lo}, {hi}), got {v!r}")
        if not self.prior_runs > 0:
            raise ValueError("gate setting prior_runs must be > 0")
        if self.chase not in CHASES:
            raise ValueError(f"gate setting chase must be one of {', '.join(CHASES)}, got {self.chase!r}")
        if self.adjust not in ("holm", "bonferroni", "bh"):
            raise ValueError(f"gate setting adjust must be holm, bonferroni or bh, got {self.adjust!r}")
        if self.max_runs is None:  # asking for more runs than the default budget raises the budget with it
            object.__setattr__(self, "max_runs", max(self.min_runs, DEFAULT_MAX_RUNS))
        if not 1 <= self.min_runs <= self.max_runs:
            raise ValueError(f"gate settings need 1 <= min_runs <= max_runs, got {self.min_runs} and {self.max_runs}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"gate setting window must be at least 1 run, got {self.window}")

    @property
    def looks(self) -> tuple[int, ...]:
        """The numbers of candidate runs at which a change may be declared: min_runs, then every second
        run up to max_runs (each look spends alpha / len(looks))."""
        return planned_looks(self.min_runs, self.max_runs, 2)


def level_text(confidence: float) -> str:
    """A confidence level in as many digits as it takes not to read 100%: 99.7%, 99.96%, 99.999%."""
    for digits in range(1, 7):
        text = f"{confidence:.{digits}%}"
        if not text.startswith("100"):
            return text
    return f"1 - {1 - confidence:.1g}"


@dataclass(frozen=True)
class Comparison:
    """One scenario's comparison. `verdict` is None on an estimate not decided yet (see `decide_family`)."""

    name: str
    verdict: str | None
    reason: str
    threshold: float
    baseline_median: float | None = None
    candidate_median: float | None = None
    ratio: float | None = None
    ci_low: float | None = None            # interval of the ratio at `confidence`
    ci_high: float | None = None
    confidence: float | None = None        # 1 - 2 alpha': the level the verdict was decided at
    p_value: float | None = None           # run-level t-test, one-sided in the observed direction, unadjusted
    p_adjusted: float | None = None
    mw_p_value: float | None = None        # Mann-Whitney U on pooled samples (within-run evidence only)
    effect: float | None = None            # Cliff's delta: P(cand > base) - P(cand < base)
    baseline_runs: int = 0
    candidate_runs: int = 0
    timer: str | None = None
    differences: Mapping = field(default_factory=dict)
    df: float | None = None                # of the t interval (None: the two-level model's interval is its posterior's)
    se: float | None = None
    adjustment: str | None = None          # how p was adjusted for the family, in words
    method: str | None = None              # what the runs are: stored-baseline runs, or side-by-side rounds
    unusable: bool = False                 # the input can never give a decision (too few samples, a 0 ms median)
    looks: int = 1                         # alpha is split over this many looks at the data
    looks_at: str | None = None            # where those looks fall, in words ("at 3, 5 candidate runs")
    min_runs: int = 1                      # candidate runs needed before a change is declared
    guard: float | None = None             # log distance a change must exceed: an unlucky baseline's reach
    run_spread: float | None = None        # the baseline side's run-to-run spread the test used (sd of log run
    #                                        medians, moderated toward the prior)
    candidate_spread: float | None = None  # the candidate side's, moderated the same way
    spread_df: tuple[float, float] | None = None   # the degrees of freedom of those two
    pooled: bool = False                   # one spread for both sides (the prior was only a guess, or one
    #                                        candidate run had no spread of its own)
    baseline_spread: float | None = None   # the baseline's own measured run-to-run spread, same units
    prior: str | None = None               # where the variance prior came from, in words
    more_runs: int | None = None           # inconclusive: candidate runs in all that would likely decide
    pending: str | None = None             # inconclusive, past the threshold, adjusted p (less the chance that all
    #                                        runs were slow) under chase_p: what `--bench-replicate confirm` chases
    notes: tuple[str, ...] = ()            # what weakens this comparison without changing its arithmetic
    achieved_flops: tuple[float, float] | None = None   # FLOP/s, baseline and current, where both were counted
    slow_runs: tuple[float, float] | None = None   # two-level model: how many runs of each side were likely slow
    slow_share: float | None = None        # two-level model: the machine's share of slow processes
    facts: tuple[str, ...] = ()            # how the two steps' work signatures differ, exactly, per step
    grown: tuple[str, ...] = ()            # counters that must not grow (--bench-no-growth) and grew: fails
    moved: tuple[str, ...] = ()            # a slower/faster verdict's profiler pass: operators whose time moved
    # two-level model: the posterior of the change, which gives the interval once the level is decided; not stored
    posterior: Any = field(default=None, repr=False, compare=False)

    def fails(self, strict: bool = False) -> bool:
        """Slower, incomparable, grown, or input that can never be decided: never green by accident. Strict: a
        comparison that decided nothing fails as well. The one fail rule of every gate (pytest's and the CLI's)."""
        return self.verdict in (SLOWER, INCOMPARABLE) or self.unusable or bool(self.grown) or (
            strict and self.verdict == INCONCLUSIVE)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        del d["posterior"]
        # JSON has no infinity: degrees of freedom that are infinite (a spread known exactly) are written as null
        finite = lambda v: v if v is None or math.isfinite(v) else None
        d["df"] = finite(self.df)
        if self.spread_df is not None:
            d["spread_df"] = [finite(v) for v in self.spread_df]
        d["differences"] = {k: list(v) for k, v in self.differences.items()}
        return d


def tally(comparisons) -> tuple[str, int, int]:
    """Every gate's count of what it decided, in words ("2 of 3 scenario(s) decided: 1 slower, ..."), with how
    many were decided and how many compared (new ones are not)."""
    n = Counter(c.verdict for c in comparisons)
    decided = n[SLOWER] + n[FASTER] + n[UNCHANGED]
    compared = len(comparisons) - n[NEW]
    return (f"{decided} of {compared} scenario(s) decided: {n[SLOWER]} slower, {n[FASTER]} faster, "
            f"{n[UNCHANGED]} unchanged; {n[INCONCLUSIVE]} inconclusive, {n[INCOMPARABLE]} incomparable",
            decided, compared)
