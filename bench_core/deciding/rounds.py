"""The one rounds decision: rounds of fresh instances, each giving the median log ratio (candidate / baseline)
of its alternated pairs, are the unit of evidence; the change is their mean, with a t interval over rounds, so
the bias each set of allocations carries lands inside the interval instead of inside the answer.

Two callers read it in their own terms: side by side with a revision (`estimate_rounds`: a `Comparison`
for the gate's `decide_family`, threshold and family adjustment included) and A/B with rounds
(`rounds_decision`: a paired decision on the speedup). Pure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from bench_core.core.stats import t_interval, t_test
from bench_core.deciding.comparison import Comparison
from bench_core.deciding.paired import PairedDecision, speed_verdict
from bench_core.deciding.verdicts import INCOMPARABLE, INCONCLUSIVE

SAME_RATIO = "every round gave the same ratio: the timer cannot resolve"


@dataclass(frozen=True)
class OverRounds:
    """The mean over rounds of log(candidate / baseline), with its standard error and degrees of freedom."""

    log_ratio: float
    se: float | None     # None: every round gave the same ratio (a timer too coarse to see any spread)
    df: int

    def p_one_sided(self) -> float:
        return t_test(self.log_ratio, self.se, self.df)

    def interval(self, confidence: float) -> tuple[float, float]:
        return t_interval(self.log_ratio, self.se, self.df, confidence)


def over_rounds(logs: Sequence[float]) -> OverRounds:
    n = len(logs)
    d = sum(logs) / n
    sd = math.sqrt(sum((v - d) ** 2 for v in logs) / (n - 1))
    return OverRounds(d, None if sd == 0.0 else sd / math.sqrt(n), n - 1)


def estimate_rounds(name: str, rounds: Any, threshold: float, *, timer: str,
                    differences: Mapping[str, Any] | None = None, looks: Sequence[int] = ()) -> Comparison:
    """The change (candidate / baseline time) with its standard error and p, undecided: hand it to
    `gate.decide_family`. A zero or non-finite sample makes the comparison inconclusive. `looks`: the
    numbers of rounds at which a sequential run may decide (alpha is split over them).

    `rounds` is one `timing.protocol.Rounds`; its units of evidence are its rounds, or, where pairs of processes
    each served several rounds and keep a bias of their own (`Rounds.units`), those pairs (the mean of each
    pair's rounds)."""
    base_all = [v for r in rounds.primary("baseline") for v in r]
    cand_all = [v for r in rounds.primary("candidate") for v in r]
    flat = base_all + cand_all
    n = len(set(rounds.units)) if rounds.units else len(rounds.baseline)
    common = dict(name=name, threshold=threshold, baseline_runs=n, candidate_runs=n, timer=timer,
                  differences=dict(differences or {}), looks=max(1, len(looks)),
                  looks_at=f"at {', '.join(map(str, looks))} rounds" if len(looks) > 1 else None,
                  baseline_median=float(np.median(base_all)) if base_all else None,
                  candidate_median=float(np.median(cand_all)) if cand_all else None)
    if differences:
        what = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in differences.items())
        return Comparison(verdict=INCOMPARABLE, reason=f"the two sides measure different things: {what}", **common)
    if not flat or min(flat) <= 0 or not all(math.isfinite(v) for v in flat):
        return Comparison(verdict=INCONCLUSIVE,
                          reason="a sample is 0 ms or not finite (below the timer's resolution?): no ratio", **common)
    est = over_rounds(rounds.unit_log_ratios)
    if est.se is None:
        return Comparison(verdict=INCONCLUSIVE, reason=f"{SAME_RATIO} this scenario's spread",
                          ratio=math.exp(est.log_ratio), **common)
    return Comparison(verdict=None, reason="", ratio=math.exp(est.log_ratio), p_value=est.p_one_sided(),
                      df=float(est.df), se=est.se, **common)


def rounds_decision(logs: Sequence[float], alpha: float, min_effect: float) -> PairedDecision:
    """The A/B verdict from per-round log(candidate / baseline). The speedup is exp(-mean), its interval (at
    1 - alpha, the level the two-sided test decides at) and p (two-sided) from the t-test over rounds."""
    est = over_rounds(logs)
    if est.se is None:
        return PairedDecision(INCONCLUSIVE, f"{SAME_RATIO} the spread", math.exp(-est.log_ratio))
    p = min(1.0, 2 * est.p_one_sided())
    lo, hi = est.interval(1.0 - alpha)
    v = speed_verdict(math.exp(-est.log_ratio), math.exp(-hi), math.exp(-lo), p, alpha, min_effect)
    return replace(v, reason=f"{v.reason}; {len(logs)} rounds of fresh instances")
