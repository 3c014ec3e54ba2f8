"""Change points in a scenario's history: where its run-level level moved, with the commit range, size and interval.
Pure: numbers in, change points out.

The method, written down (docs/history.md has its measured error rates). The values are the runs' mean log times,
oldest first. Binary segmentation: in a segment, every split leaving at least `min_size` runs on each side is
scored by the Mann-Whitney statistic of the runs after it against the runs before, standardized; the best split's
score is compared with the best score of `permutations` random orderings of the same segment. The permutation
test pays for having searched every split, and ranks make it indifferent to the slow runs a shared machine
throws in. A segment whose p-value is below `alpha` has a change point, placed at the split whose two sides sit
closest to their own medians (the standardized statistic leans towards the middle), and each side of it is
searched again the same way (E-divisive, as MongoDB's CI and Apache Otava run it, differs in its statistic, not
in this plan). Each
change point's size is the Hodges-Lehmann estimate of the shift (the median of all after-minus-before
differences), with its distribution-free interval, both as ratios of times. Where the change began is itself
uncertain when runs spread by several percent: each change point carries the range of runs its new level may
begin at (`first_low`..`first_high`, at the same confidence), from a residual bootstrap: the segment rebuilt
`replicates` times from each side's median plus residuals drawn from that side, and the split placed again in
each; the range spans the middle `confidence` of those splits (and always the split found). The commits of that
range are what a bisection then decides, commit by commit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class ChangePoint:
    index: int              # the first run of the new level
    ratio: float            # the new level over the old (Hodges-Lehmann, as a ratio of times)
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float          # the permutation test's, for this split within its segment
    before: int             # runs in the segment before it, and after it
    after: int
    first_low: int = -1     # the runs the new level may begin at, at `confidence` (-1: the index alone)
    first_high: int = -1

    def __post_init__(self):
        if self.first_low < 0:
            object.__setattr__(self, "first_low", self.index)
        if self.first_high < 0:
            object.__setattr__(self, "first_high", self.index)


def split_scores(ranks: np.ndarray, min_size: int) -> np.ndarray:
    """Standardized Mann-Whitney statistic of every split k (runs [k:] against [:k]), rows of `ranks` at once."""
    n = ranks.shape[-1]
    k = np.arange(min_size, n - min_size + 1)
    first = np.cumsum(ranks, axis=-1)[..., k - 1]           # rank sums of the runs before each split
    u = k * (n - k) + k * (k + 1) / 2 - first                # pairs where a later run is the larger
    sd = np.sqrt(k * (n - k) * (n + 1) / 12.0)
    return (u - k * (n - k) / 2.0) / sd


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)


def best_split(values: Sequence[float], *, min_size: int = 3, permutations: int = 999,
               rng: np.random.Generator | None = None) -> tuple[int, float] | None:
    """(index, p-value) of the segment's best split, or None when it is too short to split."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 2 * min_size:
        return None
    rng = rng or np.random.default_rng(0)
    ranks = _ranks(x)
    observed = np.abs(split_scores(ranks, min_size))
    best = int(np.argmax(observed))
    shuffled = np.array([rng.permutation(ranks) for _ in range(permutations)])
    null = np.abs(split_scores(shuffled, min_size)).max(axis=1)
    p = (1 + int(np.sum(null >= observed[best] - 1e-12))) / (permutations + 1)
    return best + min_size, p


def shift(before: Sequence[float], after: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate of after - before with its distribution-free interval (from the Mann-Whitney
    statistic's normal approximation), all in the values' units."""
    from scipy.stats import norm

    a, b = np.asarray(before, float), np.asarray(after, float)
    d = np.sort((b[:, None] - a[None, :]).ravel())
    m, n = a.size, b.size
    z = norm.ppf(0.5 + confidence / 2)
    k = int(math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12)))
    k = min(max(k, 0), d.size - 1)
    return float(np.median(d)), float(d[k]), float(d[d.size - 1 - k])


def _l1_costs(x: np.ndarray, min_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(splits, cost of each): the absolute deviations of each side from its own median, rows of `x` at once."""
    n = x.shape[-1]
    splits = np.arange(min_size, n - min_size + 1)
    cost = np.empty(x.shape[:-1] + (splits.size,))
    for j, k in enumerate(splits):
        a, b = x[..., :k], x[..., k:]
        cost[..., j] = (np.abs(a - np.median(a, axis=-1, keepdims=True)).sum(-1) +
                        np.abs(b - np.median(b, axis=-1, keepdims=True)).sum(-1))
    return splits, cost


def locate(values: Sequence[float], *, min_size: int = 3, confidence: float = 0.95, replicates: int = 500,
           rng: np.random.Generator | None = None) -> tuple[int, int, int]:
    """(split, first, last) of a segment the test found changed: where its change lies, and the range it may lie in.

    The split is the one whose two sides sit closest to their own medians (least absolute deviations): the test's
    standardized statistic, right for deciding whether there is a change, leans towards the segment's middle, so a
    clear step a run from the middle was placed a run off. The range is a residual bootstrap, see above."""
    x = np.asarray(values, dtype=float)
    rng = rng or np.random.default_rng(0)
    splits, cost = _l1_costs(x[None, :], min_size)
    k = int(splits[np.argmin(cost[0])])
    sims = np.empty((replicates, x.size))
    for part in (slice(0, k), slice(k, x.size)):
        level = np.median(x[part])
        sims[:, part] = level + rng.choice(x[part] - level, size=(replicates, x[part].size))
    splits, cost = _l1_costs(sims, min_size)
    found = splits[np.argmin(cost, axis=1)]
    tail = (1 - confidence) / 2
    low, high = np.quantile(found, tail, method="lower"), np.quantile(found, 1 - tail, method="higher")
    return k, min(int(low), k), max(int(high), k)


def change_points(values: Sequence[float], *, alpha: float = 0.01, min_size: int = 3, permutations: int = 999,
                  seed: int = 0, confidence: float = 0.95) -> list[ChangePoint]:
    """The change points of `values` (mean log times, oldest first), oldest first."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise ValueError("change points need finite values (mean log times)")
    rng = np.random.default_rng(seed)
    found: list[ChangePoint] = []
    segments = [(0, x.size)]
    while segments:
        lo, hi = segments.pop()
        split = best_split(x[lo:hi], min_size=min_size, permutations=permutations, rng=rng)
        if split is None or split[1] >= alpha:
            continue
        at, first, last = locate(x[lo:hi], min_size=min_size, confidence=confidence, rng=rng)
        k = lo + at
        est, low, high = shift(x[lo:k], x[k:hi], confidence)
        found.append(ChangePoint(k, math.exp(est), math.exp(low), math.exp(high), confidence, split[1],
                                 k - lo, hi - k, lo + first, lo + last))
        segments += [(lo, k), (k, hi)]
    return sorted(found, key=lambda c: c.index)
