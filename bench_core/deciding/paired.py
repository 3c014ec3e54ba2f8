"""The paired decision of an A/B: from samples taken in pairs (the same index, the same moment), whether the
candidate is faster or slower than the baseline by more than a minimum effect. Pure."""
from __future__ import annotations

from dataclasses import dataclass

from bench_core.core.stats import paired_ratio
from bench_core.deciding.verdicts import FASTER, INCONCLUSIVE, SLOWER, UNCHANGED


@dataclass(frozen=True)
class PairedDecision:
    verdict: str
    reason: str
    speedup: float | None = None      # baseline time / candidate time (>1: candidate faster)
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None


def paired_decision(base_ms, cand_ms, alpha: float = 0.01, min_effect: float = 0.01) -> PairedDecision:
    """The verdict from paired samples (same index = same pair). The interval is at 1 - alpha, the level
    of the two-sided test the verdict is decided at, so the interval shown never contradicts the verdict."""
    if len(base_ms) != len(cand_ms) or len(base_ms) < 6:
        raise ValueError("paired decision needs equal-length samples, at least 6 pairs")
    if min(base_ms) <= 0 or min(cand_ms) <= 0:
        return PairedDecision(INCONCLUSIVE, "a sample is 0 ms (below the timer's resolution): no ratio")
    est = paired_ratio(base_ms, cand_ms, 1.0 - alpha)
    return speed_verdict(est.ratio, est.ci_low, est.ci_high, est.p_value, alpha, min_effect)


def speed_verdict(sp: float, lo: float, hi: float, p: float, alpha: float, min_effect: float) -> PairedDecision:
    """Faster / slower only when significant *and* the whole interval of the speedup is beyond min_effect;
    unchanged when the whole interval lies within it; inconclusive otherwise."""
    if p < alpha and lo > 1 + min_effect:
        return PairedDecision(FASTER, f"significant (p={p:.2g} < {alpha:.2g}) and the whole interval beyond "
                                      f"+{min_effect:.0%}", sp, lo, hi, p)
    if p < alpha and hi < 1 / (1 + min_effect):
        return PairedDecision(SLOWER, f"significant (p={p:.2g} < {alpha:.2g}) and the whole interval beyond "
                                      f"-{min_effect:.0%}", sp, lo, hi, p)
    if lo >= 1 / (1 + min_effect) and hi <= 1 + min_effect:
        return PairedDecision(UNCHANGED, f"the whole interval [{lo:.3f}, {hi:.3f}] lies within {min_effect:.0%}", sp, lo,
                              hi, p)
    return PairedDecision(INCONCLUSIVE, f"p={p:.2g}, interval [{lo:.3f}, {hi:.3f}]: too wide to rule out a change "
                                        f"beyond {min_effect:.0%} (faster or slower needs p < {alpha:.2g} and the whole "
                                        f"interval beyond it)", sp, lo, hi, p)
