"""Statistics of one sample: pure functions over sequences of milliseconds, no I/O, no torch."""
from __future__ import annotations

import functools
import importlib
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


class _OnFirstUse:
    """A module imported when first used: scipy's own import inspects torch, and the statistics must import
    (and the file gate run) where torch is missing or blocked."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


_st = _OnFirstUse("scipy.stats")
_sp = _OnFirstUse("scipy.special")

# Resampled values held in memory at once by a bootstrap: millions of samples must not need gigabytes.
BOOTSTRAP_CELLS = 4_000_000


def _batch(n: int) -> int:
    return max(1, BOOTSTRAP_CELLS // max(n, 1))


@dataclass(frozen=True)
class Summary:
    n: int
    min: float
    median: float
    mean: float
    max: float
    stdev: float
    q1: float
    q3: float
    iqr: float
    cv: float | None          # stdev / mean; None when the mean is 0
    low_outliers: int         # below q1 - 1.5 IQR (Tukey)
    high_outliers: int        # above q3 + 1.5 IQR

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def per_second(amount: float, median_ms: float) -> float | None:
    """A rate at the median step (items, FLOPs, bytes per second); None at 0 ms, where there is no rate."""
    return amount / (median_ms / 1e3) if median_ms > 0 else None


def summarize(samples: Sequence[float]) -> Summary:
    """Summary figures of a sample; at least one point, every one finite."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("cannot summarize an empty sample")
    if not np.all(np.isfinite(x)):
        raise ValueError("sample holds NaN or infinite values")
    q1, med, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
    iqr = q3 - q1
    mean = float(x.mean())
    stdev = float(x.std(ddof=1)) if x.size > 1 else 0.0
    lo, hi = tukey_fences(q1, q3)
    return Summary(
        n=int(x.size),
        min=float(x.min()),
        median=med,
        mean=mean,
        max=float(x.max()),
        stdev=stdev,
        q1=q1,
        q3=q3,
        iqr=iqr,
        cv=(stdev / mean) if mean != 0 else None,
        low_outliers=int(np.sum(x < lo)),
        high_outliers=int(np.sum(x > hi)),
    )


def clusters(samples: Sequence[float], min_ratio: float = 1.5, min_share: float = 0.1
             ) -> tuple[tuple[float, int], tuple[float, int]] | None:
    """Two separate groups of samples, as ((median, count) low, (median, count) high), or None.

    The largest gap between sorted log samples splits them; it counts as two clusters when the medians are
    at least `min_ratio` apart, each side holds at least `min_share` of the samples, and the gap is wider
    than the spread inside both sides (so a long tail is not called a cluster)."""
    x = np.sort(np.asarray(samples, dtype=float))
    if x.size < 10 or x[0] <= 0:
        return None
    logs = np.log(x)
    gaps = np.diff(logs)
    least = max(2, math.ceil(min_share * x.size))
    candidates = range(least - 1, x.size - least)     # index i: split between i and i + 1
    if not len(candidates):
        return None
    i = max(candidates, key=lambda j: gaps[j])
    lo, hi = logs[: i + 1], logs[i + 1:]
    if gaps[i] <= max(np.ptp(lo), np.ptp(hi)) or math.exp(np.median(hi) - np.median(lo)) < min_ratio:
        return None
    return (float(np.median(x[: i + 1])), i + 1), (float(np.median(x[i + 1:])), int(x.size - i - 1))


def tukey_fences(q1: float, q3: float, k: float = 1.5) -> tuple[float, float]:
    iqr = q3 - q1
    return q1 - k * iqr, q3 + k * iqr


def bootstrap_median_ci(
    samples: Sequence[float], confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (scipy). A constant sample gives a zero-width interval."""
    x = np.asarray(samples, dtype=float)
    if x.size < 2:
        raise ValueError("a confidence interval needs at least 2 samples")
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = _st.bootstrap(
        (x,), np.median, confidence_level=confidence, n_resamples=n_resamples, batch=_batch(x.size),
        method="percentile", random_state=np.random.default_rng(seed), vectorized=True, axis=-1,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def median_log_se(samples: Sequence[float], n_resamples: int = 500, seed: int = 0) -> float:
    """Bootstrap standard error of log(median): the within-run uncertainty of one run's level."""
    x = np.asarray(samples, dtype=float)
    if x.size < 2 or np.all(x == x[0]) or np.any(x <= 0):
        return 0.0
    rng = np.random.default_rng(seed)
    meds = []
    for start in range(0, n_resamples, _batch(x.size)):
        idx = rng.integers(0, x.size, size=(min(_batch(x.size), n_resamples - start), x.size))
        meds.append(np.median(x[idx], axis=1))
    return float(np.std(np.log(np.concatenate(meds)), ddof=1))


def adjust_pvalues(pvalues: Sequence[float | None], method: str = "holm") -> list[float | None]:
    """Family-wise (holm, bonferroni) or false-discovery-rate (bh) adjustment; None entries are skipped."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    m = len(idx)
    if m == 0:
        return out
    ps = np.array([pvalues[i] for i in idx], dtype=float)
    if np.any(~np.isfinite(ps)) or np.any(ps < 0) or np.any(ps > 1):
        raise ValueError("p-values must lie in [0, 1]")
    order = np.argsort(ps, kind="stable")
    adj = np.empty(m)
    if method == "bonferroni":
        adj = np.minimum(ps * m, 1.0)
    elif method == "holm":
        running = 0.0
        for rank, j in enumerate(order):
            running = max(running, min(1.0, (m - rank) * ps[j]))
            adj[j] = running
    elif method == "bh":
        running = 1.0
        for rank in range(m - 1, -1, -1):
            j = order[rank]
            running = min(running, ps[j] * m / (rank + 1))
            adj[j] = running
    else:
        raise ValueError(f"unknown p-value adjustment {method!r}; use holm, bonferroni or bh")
    for k, i in enumerate(idx):
        out[i] = float(adj[k])
    return out


# -- tests and intervals the decisions use ------------------------------------------------------------
# The t and chi-square functions come from scipy.special, the functions scipy.stats calls for them (the same
# figures): importing scipy.stats took 0.53 s of a process-mode session whose parent decides nothing else with it.
def t_sf(x: float, df: float) -> float:
    """P(T > x) for Student's t with `df` degrees of freedom (df may be infinite: a normal)."""
    return float(_sp.stdtr(df, -x))


def sign_test(wins: int, n: int) -> float:
    """One-sided p of at least `wins` of `n` pairs going one way when each way is as likely as the other."""
    return 1.0 if wins <= 0 else float(_sp.bdtrc(wins - 1, n, 0.5))


def t_test(d: float, se: float, df: float) -> float:
    """One-sided p of a t statistic d/se in the direction observed (df may be infinite: a normal)."""
    return t_sf(abs(d) / se, df)


@functools.lru_cache(maxsize=4096)  # the gate asks for the same few levels and degrees of freedom again and again
def t_quantile(p: float, df: float) -> float:
    """The t quantile exceeded with probability p (df may be infinite)."""
    return float(-_sp.stdtrit(df, p))


def variance_ratio_sf(x: float, df: float, prior_df: float) -> float:
    """P(F > x) for a sample variance on `df` degrees of freedom over a prior variance worth `prior_df` (F's upper
    tail; an infinite prior_df: the chi-square's, the prior then known exactly)."""
    if math.isinf(prior_df):
        return float(_sp.gammaincc(df / 2.0, df * x / 2.0))
    return float(_sp.fdtrc(df, prior_df, x))


def t_interval(d: float, se: float, df: float, confidence: float) -> tuple[float, float]:
    """Two-sided interval of d at `confidence`."""
    q = float(_sp.stdtrit(df, 0.5 + confidence / 2.0))
    return d - q * se, d + q * se


@dataclass(frozen=True)
class VariancePrior:
    """A scaled inverse chi-square prior of a variance: worth `df` degrees of freedom at `variance`."""

    variance: float
    df: float              # math.inf: known exactly
    source: str            # how it was obtained, in words
    # The machine's slow processes (`slow_runs.SlowRuns`) where its runs show two levels; the variance is
    # then that of the runs judged fast
    slow: Any = None

    def moderate(self, s2: float, df: float) -> tuple[float, float]:
        """The posterior variance and its degrees of freedom (limma's moderated variance)."""
        if math.isinf(self.df):
            return self.variance, math.inf
        if df <= 0:
            return self.variance, self.df
        return (self.df * self.variance + df * s2) / (self.df + df), self.df + df


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y, by Newton's method from limma's starting point (Smyth 2004)."""
    x = 0.5 + 1.0 / y
    for _ in range(100):
        tri = float(_sp.polygamma(1, x))
        step = tri * (1.0 - tri / y) / float(_sp.polygamma(2, x))
        x += step
        if -step / x < 1e-10:
            break
    return x


def fit_variance_prior(variances: Sequence[float], dfs: Sequence[float]) -> VariancePrior | None:
    """Empirical-Bayes prior of many variances, each with its degrees of freedom (limma's fitFDist).

    Moments of log s^2: log s^2 = log sigma^2 + log(chi^2_d / d), whose mean and variance are digamma
    and trigamma of d/2; the spread of log s^2 beyond what the d's explain is the prior's trigamma(d0/2).
    None with fewer than 3 usable variances: too little to fit a spread.
    """
    pairs = [(float(v), float(d)) for v, d in zip(variances, dfs) if d > 0 and v > 0 and math.isfinite(v)]
    if len(pairs) < 3:
        return None
    s2 = np.array([v for v, _ in pairs])
    d = np.array([d for _, d in pairs])
    e = np.log(s2) - _sp.digamma(d / 2) + np.log(d / 2)
    mean = float(e.mean())
    excess = float(e.var(ddof=1) - np.mean(_sp.polygamma(1, d / 2)))
    # Never worth more than the evidence it was fitted from: limma takes the fitted prior as known, and an
    # overconfident prior makes unlucky baselines (docs/gate.md has what the cap is worth).
    cap = float(d.sum())
    where = f"fitted from {len(pairs)} run-to-run variances, {cap:g} degrees of freedom"
    d0 = cap if excess <= 0 else min(2.0 * _trigamma_inverse(excess), cap)   # excess <= 0: they agree beyond chance
    return VariancePrior(math.exp(mean + float(_sp.digamma(d0 / 2)) - math.log(d0 / 2)), d0, where)


def mann_whitney(candidate: Sequence[float], baseline: Sequence[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U p-value and Cliff's delta (P(cand > base) - P(cand < base))."""
    c, b = np.asarray(candidate, float), np.asarray(baseline, float)
    if np.all(c == c[0]) and np.all(b == c[0]):
        return 1.0, 0.0  # identical constant samples: no evidence of any change
    u = _st.mannwhitneyu(c, b, alternative="two-sided")
    return float(u.pvalue), float(2.0 * u.statistic / (c.size * b.size) - 1.0)


def mann_whitney_min_p(n1: int, n2: int) -> float:
    """Smallest two-sided p a Mann-Whitney test can reach with these sizes (complete separation).

    In log space: the binomial coefficient of two 300-sample runs does not fit a float.
    """
    log_comb = math.lgamma(n1 + n2 + 1) - math.lgamma(n1 + 1) - math.lgamma(n2 + 1)
    return min(1.0, math.exp(math.log(2.0) - log_comb))


@dataclass(frozen=True)
class PairedRatio:
    """The Hodges-Lehmann ratio of paired samples a/b, the interval that inverts the Wilcoxon signed-rank test,
    and that test's p-value."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int


def _signed_rank_p(r: np.ndarray) -> float:
    nonzero = r[r != 0]
    return float(_st.wilcoxon(nonzero).pvalue) if nonzero.size >= 6 else 1.0


def paired_ratio(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> PairedRatio:
    """a[i] and b[i] are one pair; every value > 0. Pure: same input, same figures.

    One test, one interval: the ratio is exp of the Hodges-Lehmann estimate of the paired log ratios (the
    median of their Walsh averages), and the interval holds the shifts the same Wilcoxon signed-rank test
    does not reject at 1 - confidence. So the interval excludes 1.0 exactly when p < 1 - confidence, which a
    bootstrap of the median did not promise (it excluded 1.0 at p = 0.037 against a 0.01 test)."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    if x.shape != y.shape or x.size < 6:
        raise ValueError("a paired ratio needs equal-length samples, at least 6 pairs")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("a paired ratio needs positive samples")
    r = np.log(x) - np.log(y)
    if np.all(r == r[0]):
        ratio = float(math.exp(r[0]))
        return PairedRatio(ratio, ratio, ratio, 0.0 if r[0] != 0 and x.size >= 20 else 1.0, int(x.size))
    i, j = np.triu_indices(r.size)
    walsh = np.sort((r[i] + r[j]) / 2.0)
    centre = float(np.median(walsh))
    level = 1.0 - confidence
    # The test's p changes only where a shift crosses a Walsh average: probe midway between neighbours (no zeros,
    # no ties made by the shift), and find by bisection where rejection stops on each side of the estimate.
    mids = (walsh[:-1] + walsh[1:]) / 2.0
    accepts = lambda k: _signed_rank_p(r - mids[k]) >= level
    inside = int(np.searchsorted(mids, centre))
    lo_k, hi_k = 0, min(inside, mids.size - 1)
    while lo_k < hi_k:                     # first probe left of the estimate that the test accepts
        mid = (lo_k + hi_k) // 2
        lo_k, hi_k = (lo_k, mid) if accepts(mid) else (mid + 1, hi_k)
    low = walsh[lo_k] if accepts(lo_k) else centre
    lo_k, hi_k = max(inside - 1, 0), mids.size - 1
    while lo_k < hi_k:                     # last probe right of the estimate that the test accepts
        mid = (lo_k + hi_k + 1) // 2
        lo_k, hi_k = (mid, hi_k) if accepts(mid) else (lo_k, mid - 1)
    high = walsh[lo_k + 1] if accepts(lo_k) else centre
    return PairedRatio(float(math.exp(centre)), float(math.exp(low)), float(math.exp(high)), _signed_rank_p(r),
                       int(x.size))


def chi2_quantile(p, df: float):
    """The chi-square distribution's quantile at p (an array or a number)."""
    return 2.0 * _sp.gammaincinv(df / 2.0, p)
