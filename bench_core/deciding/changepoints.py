"""Change points in a scenario's history: where its run-level level moved, with the commit range, size and interval.
Pure: numbers in, change points out.

The method, written down (docs/history.md has its measured error rates). The values are the runs' mean log times,
oldest first. Binary segmentation: in a segment, every split leaving at least `min_size` runs on each side is
scored by the Mann-Whitney statistic of the runs after it against the runs before, standardized; the best split's
score is compared with the best score of `permutations` random orderings of the same segment. The permutation
test pays for having searched every split, and ranks make it indifferent to the slow runs a shared machine
throws in. A split whose p-value is below `alpha` is a change point, and each side of it is searched again the
same way (E-divisive, as MongoDB's CI and Apache Otava run it, differs in its statistic, not in this plan). Each
change point's size is the Hodges-Lehmann estimate of the shift (the median of all after-minus-before
differences), with its distribution-free interval, both as ratios of times.
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


def _scores(ranks: np.ndarray, min_size: int) -> np.ndarray:
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
    observed = np.abs(_scores(ranks, min_size))
    best = int(np.argmax(observed))
    shuffled = np.array([rng.permutation(ranks) for _ in range(permutations)])
    null = np.abs(_scores(shuffled, min_size)).max(axis=1)
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
        k = lo + split[0]
        est, low, high = shift(x[lo:k], x[k:hi], confidence)
        found.append(ChangePoint(k, math.exp(est), math.exp(low), math.exp(high), confidence, split[1],
                                 k - lo, hi - k))
        segments += [(lo, k), (k, hi)]
    return sorted(found, key=lambda c: c.index)
