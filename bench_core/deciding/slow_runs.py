"""Slow processes as a second level: the two-component model of a machine's runs, as pure functions.

On a shared machine some processes run slow for their whole life (an unlucky core, a noisy neighbour,
a cold allocation): a run's log median is its scenario's fast level plus noise, plus a fixed excess
for a share of the processes. A normal model can only widen its spread to cover those runs, and then
a real slowdown hides inside a spread that the slow excess inflated (docs/gate.md). Where the machine's history
shows the two levels clearly apart, this model keeps them apart instead:

    log median = level + N(0, spread^2) + excess * [the process was slow],  P(slow) = share

`fit_slow_runs` fits share and excess from every scenario of a baseline's history (each scenario its
own level) by expectation-maximization, and says None unless the two levels are clearly there: a fit
that beats one level by a wide likelihood margin, a minority of slow runs, an excess at least
`SEPARATION` spreads wide (below that, a run cannot be told slow from a change, and the normal model
is the honest one), and slow runs in more than one scenario (a machine's, not one scenario's own levels).
The spread prior is then fitted from the runs judged fast only.

`level_posterior` is one side's fast level given its runs: a flat prior on the level and the spread
from the machine's prior. Were share, excess and spread known, the flat-prior posterior of a location
would be its exact frequentist answer given the runs' pattern (Pitman); they are estimated, so the
error rates are measured (docs/gate.md). A side whose runs all look alike keeps the chance
that all of them were slow. `difference` is the posterior of candidate level minus baseline level, whose tail is the
gate's p-value and whose quantiles are its interval and guard.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bench_core.core.stats import VariancePrior, chi2_quantile, fit_variance_prior

SEPARATION = 4.0            # excess / spread below this: a slow run and a real change cannot be told apart
MIN_LIKELIHOOD_GAIN = 12.0  # log-likelihood a second level must add: more than one-level histories reach (docs/gate.md)
MAX_SHARE = 0.45            # a larger "slow" share is one level split in two
MAX_GRID = 200_000          # level grid points a side may use (x 12 spread points x runs, in memory)
SPREAD_POINTS = 12          # equal-probability points of the spread prior


@dataclass(frozen=True)
class SlowRuns:
    """A machine's slow processes: their share of all runs and their excess (log units) over the fast level."""

    share: float
    excess: float
    runs: int              # runs the fit saw
    scenarios: int

    def __post_init__(self):
        if not 0 < self.share < 0.5:
            raise ValueError(f"a slow share must lie in (0, 0.5): slow runs are the minority; got {self.share!r}")
        if not self.excess > 0 or not math.isfinite(self.excess):
            raise ValueError(f"a slow excess must be positive and finite, got {self.excess!r}")

    @property
    def source(self) -> str:
        return (f"{self.share:.0%} of runs {math.expm1(self.excess):+.0%} slow, fitted from {self.runs} runs of "
                f"{self.scenarios} scenarios")


_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _two_logs(res: np.ndarray, spread, share: float, excess: float) -> tuple[np.ndarray, np.ndarray]:
    """Log densities of residuals from the fast level: a fast run's and a slow one's, each with its share."""
    base = -_HALF_LOG_2PI - np.log(spread)
    fast = math.log1p(-share) + base - 0.5 * (res / spread) ** 2
    slow = math.log(share) + base - 0.5 * ((res - excess) / spread) ** 2
    return fast, slow


def _mixture_loglik(res: np.ndarray, spread, share: float, excess: float) -> np.ndarray:
    """Log density of residuals from the fast level, per residual."""
    return np.logaddexp(*_two_logs(res, spread, share, excess))


@dataclass(frozen=True)
class TwoLevelFit:
    """What expectation-maximization found: the levels' parameters, each run's chance of having been slow
    (in the order of the scenarios' runs) and the log-likelihood gained over one level."""

    share: float
    excess: float
    spread: float
    slow_chance: np.ndarray
    gain: float


def fit_two_levels(xs: Sequence[np.ndarray], iterations: int = 200) -> TwoLevelFit | None:
    """The best two-level fit of scenarios' log run medians, each scenario its own fast level and one spread
    for all; None where no start keeps the slow level above the fast one."""
    n = sum(x.size for x in xs)
    which = np.concatenate([np.full(x.size, i) for i, x in enumerate(xs)])
    x = np.concatenate(xs)
    sizes = np.bincount(which).astype(float)
    one_level = x - np.array([v.mean() for v in xs])[which]
    spread1 = math.sqrt(max(float(np.mean(one_level ** 2)), 1e-300))
    ll_one = -float(np.sum(0.5 * (one_level / spread1) ** 2)) - n * (math.log(spread1) + _HALF_LOG_2PI)   # one normal
    robust = 1.4826 * float(np.median(np.abs(x - np.array([np.median(v) for v in xs])[which]))) or spread1
    best = None
    for times in (3.0, 5.0, 8.0):    # a few starts: EM finds the nearest optimum
        share, excess, spread = 0.15, times * robust, robust
        level = np.array([np.median(v) for v in xs]) - share * excess
        for _ in range(iterations):
            fast, slow = _two_logs(x - level[which], spread, share, excess)
            r = np.exp(slow - np.logaddexp(fast, slow))
            level = np.bincount(which, x - r * excess) / sizes
            res = x - level[which]
            share = float(np.clip(r.mean(), 1e-4, 0.5 - 1e-4))
            excess = float(np.sum(r * res) / max(r.sum(), 1e-12))
            spread = math.sqrt(max(float(np.sum((1 - r) * res ** 2 + r * (res - excess) ** 2)) / n, 1e-300))
            if excess <= 0:
                break
        if excess > 0:
            ll = float(np.sum(_mixture_loglik(x - level[which], spread, share, excess)))
            if best is None or ll > best.gain + ll_one:
                best = TwoLevelFit(share, excess, spread, r, ll - ll_one)
    return best


def fit_slow_runs(history: Sequence[Sequence[float]]) -> VariancePrior | None:
    """The spread prior of a machine whose runs show two levels, with the levels attached (`.slow`);
    None when its history does not clearly show them. `history`: one sequence of log run medians per
    scenario; scenarios with fewer than 3 runs say too little about which runs stand apart."""
    xs = [np.asarray(x, float) for x in history if len(x) >= 3]
    n = sum(x.size for x in xs)
    if len(xs) < 3 or n < 15:
        return None
    fit = fit_two_levels(xs)
    if (fit is None or fit.gain < MIN_LIKELIHOOD_GAIN or fit.excess < SEPARATION * fit.spread
            or fit.share * n < 3 or not 0.01 < fit.share < MAX_SHARE):
        return None
    chance = np.split(fit.slow_chance, np.cumsum([x.size for x in xs])[:-1])
    # Slow runs in one scenario only are that scenario's own levels (a chain of allocations whose processes sit
    # at several levels), not a machine's slow processes: its excess would be lent to every other scenario, and
    # a scenario with more than two levels read as two (docs/gate.md, "At the default malloc")
    if sum(bool(np.any(r >= 0.5)) for r in chance) < 2:
        return None
    # The spread prior from the runs judged fast, each scenario's own variance (limma, as for one level)
    fast_sets = [x[r < 0.5] for x, r in zip(xs, chance)]
    pairs = [(float(np.var(v, ddof=1)), v.size - 1) for v in fast_sets if v.size >= 2]
    prior = fit_variance_prior([v for v, _ in pairs], [d for _, d in pairs])
    if prior is None:
        return None
    slow = SlowRuns(fit.share, fit.excess, n, len(xs))
    return VariancePrior(prior.variance, prior.df, f"{prior.source}, of the runs judged fast; {slow.source}", slow)


@dataclass(frozen=True)
class LevelPosterior:
    """One side's fast level on a grid: `start + step * i` holds probability `p[i]`, given `runs` (log medians)."""

    runs: tuple[float, ...]
    start: float
    step: float
    p: np.ndarray
    spread: float          # posterior mean of the spread (root of the mean variance)
    slow_runs: float       # expected number of this side's runs that were slow

    def quantile(self, q: float) -> float:
        return _grid_quantile(self.start, self.step, self.p, q)

    @property
    def median(self) -> float:
        return self.quantile(0.5)


def _grid_quantile(start: float, step: float, p: np.ndarray, q: float) -> float:
    cdf = np.cumsum(p)
    i = int(np.searchsorted(cdf, q * cdf[-1]))
    return start + step * min(i, p.size - 1)


@functools.lru_cache(maxsize=64)
def _spread_points(prior: VariancePrior) -> np.ndarray:
    """Equal-probability points of the prior's spread (scaled inverse chi-square); its value if known exactly."""
    if math.isinf(prior.df):
        return np.array([math.sqrt(prior.variance)])
    u = 1.0 - (np.arange(SPREAD_POINTS) + 0.5) / SPREAD_POINTS
    return np.sqrt(prior.df * prior.variance / chi2_quantile(u, prior.df))


def grid_step(prior: VariancePrior) -> float:
    """One step of every level grid under this prior: fine against the narrowest spread it allows (and
    against the excess, should that spread be all but zero)."""
    return max(float(_spread_points(prior).min()) / 40.0, prior.slow.excess / 2000.0)


def _level_range(runs: np.ndarray, prior: VariancePrior) -> tuple[float, float]:
    """Where a side's fast level can lie: from all its runs slow to all fast, with room for the widest spread."""
    wide = 6.0 * float(_spread_points(prior).max())
    return float(np.min(runs)) - prior.slow.excess - wide, float(np.max(runs)) + wide


def grid_points(x: np.ndarray, prior: VariancePrior) -> int:
    """How many points a side's level grid needs: runs far apart (one 1000x off) need very many."""
    lo, hi = _level_range(x, prior)
    return int((hi - lo) / grid_step(prior)) + 2


@functools.lru_cache(maxsize=256)   # a baseline is judged against many candidates (and looks) in a row
def level_posterior(x: tuple[float, ...], prior: VariancePrior) -> LevelPosterior:
    """The posterior of one side's fast level given its runs `x` (log medians): a flat prior on the level,
    the spread averaged over the prior's points, each run fast or slow as the machine's share says. The
    grid covers `_level_range` on multiples of `grid_step`, so two sides' grids line up."""
    slow, runs = prior.slow, np.asarray(x, float)
    sig, step = _spread_points(prior), grid_step(prior)
    lo, hi = _level_range(runs, prior)
    first = math.floor(lo / step)
    grid = step * np.arange(first, math.ceil(hi / step) + 1)
    fast, slow_ll = _two_logs(runs[:, None, None] - grid[None, None, :], sig[None, :, None], slow.share, slow.excess)
    each = np.logaddexp(fast, slow_ll)                          # run x spread point x level
    ll = each.sum(axis=0)
    w = np.exp(ll - ll.max())                                   # spread point x level
    w /= w.sum()
    spread = math.sqrt(float(np.sum(w.sum(axis=1) * sig ** 2)))
    slow_runs = float(np.sum(np.exp(slow_ll - each) * w[None, :, :]))   # each run's chance of having been slow
    return LevelPosterior(x, step * first, step, w.sum(axis=0), spread, slow_runs)


@dataclass(frozen=True)
class Difference:
    """The posterior of candidate level minus baseline level (log units) and each side's own."""

    baseline: LevelPosterior
    candidate: LevelPosterior
    start: float
    p: np.ndarray

    def quantile(self, q: float) -> float:
        return _grid_quantile(self.start, self.baseline.step, self.p, q)

    def below(self, value: float) -> float:
        """Posterior probability that the difference is at most `value`."""
        i = int(math.floor((value - self.start) / self.baseline.step))
        return float(np.clip(self.p[:max(i + 1, 0)].sum(), 0.0, 1.0))

    @property
    def sd(self) -> float:
        d = self.start + self.baseline.step * np.arange(self.p.size)
        mean = float(np.sum(self.p * d))
        return math.sqrt(max(float(np.sum(self.p * (d - mean) ** 2)), 0.0))


def difference(b_log: np.ndarray, c_log: np.ndarray, prior: VariancePrior) -> Difference | None:
    """Both sides' level posteriors and the posterior of their difference; None where a side's runs lie
    too far apart for a grid of `MAX_GRID` points."""
    if max(grid_points(b_log, prior), grid_points(c_log, prior)) > MAX_GRID:
        return None
    b = level_posterior(tuple(map(float, b_log)), prior)
    c = level_posterior(tuple(map(float, c_log)), prior)
    # candidate level - baseline level: the first point pairs the lowest candidate with the highest baseline
    p = _convolved(c.p, b.p[::-1])
    return Difference(b, c, c.start - (b.start + b.step * (b.p.size - 1)), p / p.sum())


DIRECT_MAX = 4_000_000   # products of two grids' sizes convolved directly; beyond, by FFT (a direct one of two
                         # 70,000-point grids takes most of a second, and a gate decides many scenarios)


def _convolved(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The convolution of two probability grids: exact where small; else by FFT, whose round-off (about 1e-16 of
    the largest point, a few negative) is clipped, so only a tail probability under about 1e-12 is noise."""
    if a.size * b.size <= DIRECT_MAX:
        return np.convolve(a, b)
    from scipy.signal import fftconvolve

    return np.clip(fftconvolve(a, b), 0.0, None)
