"""The regression decision: a candidate's runs against a baseline's runs, as a pure function.

Model. On a shared machine the level of a whole run drifts (we measured ~5% run-to-run on the CPU)
far more than the median wobbles inside a run, so the unit of evidence is the run, not the sample.
Each run contributes log(median); the change is d = mean(candidate logs) - mean(baseline logs) and
ratio = exp(d). The run-to-run variance tau^2 is estimated from the runs on both sides, pooled with
a prior (`run_noise`, worth `prior_runs` runs of evidence) so a baseline of one run still gets an
honest, wide interval instead of a falsely narrow one; when the runs spread more than the prior, the
prior is dropped (see `run_variance`). A t-test on d gives p (one-sided, in the observed direction).

Two steps, each done once: `estimate` turns one scenario's runs into d, its standard error and p;
`decide_family` adjusts the p-values of the scenarios decided together and gives each its verdict
and the interval at the level that verdict was decided on (a one-sided test at alpha' is the
two-sided interval at 1 - 2 alpha'), so the printed interval never contradicts the verdict.

Verdicts:
  slower / faster   significant after the family adjustment AND the ratio beyond the noise threshold
  unchanged         not significant and the 95% interval inside +-2x the threshold, or significant
                    but smaller than the threshold
  inconclusive      too little data or too much noise to tell
  incomparable      the environments or the scenarios differ (what differs is listed)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from .environment import differences
from .records import Measurement
from .scenario import Scenario, thaw
from .stats import adjust_pvalues, mann_whitney, mann_whitney_min_p, median_log_se, t_interval, t_test

SLOWER, FASTER, UNCHANGED, INCONCLUSIVE, INCOMPARABLE = (
    "slower", "faster", "unchanged", "inconclusive", "incomparable",
)


@dataclass(frozen=True)
class GateConfig:
    alpha: float = 0.01            # family-wise significance level
    threshold: float = 0.05        # default noise threshold; a scenario may set its own
    # Prior run-to-run spread of run medians. Measured on the shared 2-core CPU machine this project is
    # built on: 6% to 13% between separate processes (benchmarks/gate_quality.py). A quieter runner
    # should measure its own and pass it (--bench-run-noise).
    run_noise: float = 0.10
    prior_runs: float = 2.0        # how many runs of evidence the prior is worth
    adjust: str = "holm"           # holm | bonferroni | bh
    allow_env_mismatch: bool = False
    confirm_repeats: int = 2       # on "slower", measure this many more times and decide on all samples

    def __post_init__(self):
        for name, lo, hi in (("alpha", 0, 0.5), ("threshold", 0, 1), ("run_noise", 0, 1)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not lo < v < hi:
                if not (name == "threshold" and v == 0):
                    raise ValueError(f"gate setting {name} must lie in ({lo}, {hi}), got {v!r}")
        if not self.prior_runs > 0:
            raise ValueError("gate setting prior_runs must be > 0")
        if self.adjust not in ("holm", "bonferroni", "bh"):
            raise ValueError(f"gate setting adjust must be holm, bonferroni or bh, got {self.adjust!r}")


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
    df: float | None = None
    se: float | None = None
    adjustment: str | None = None          # how p was adjusted for the family, in words
    method: str | None = None              # what the runs are: stored-baseline runs, or side-by-side rounds
    unusable: bool = False                 # the input can never give a decision (too few samples, a 0 ms median)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["differences"] = {k: list(v) for k, v in self.differences.items()}
        return d


def scenario_differences(base: Scenario, cand: Scenario) -> dict:
    """Where two scenario records disagree about what is measured: {field: (base, cand)}."""
    diffs = {}
    if base.name != cand.name:
        diffs["name"] = (base.name, cand.name)
    if base.window != cand.window:
        diffs["window"] = (list(base.window), list(cand.window))
    bm, cm = thaw(base.metadata), thaw(cand.metadata)
    for key in sorted(set(bm) | set(cm)):
        if bm.get(key) != cm.get(key):
            diffs[f"metadata.{key}"] = (bm.get(key), cm.get(key))
    return diffs


def _measurement_differences(base: Measurement, cand: Measurement) -> dict:
    # On the CPU the thread count changes what is measured (and on a loaded machine, by 10x and more)
    attrs = ("device", "mode", "timer") + (("threads",) if "cpu" in (base.device, cand.device) else ())
    diffs = {attr: (getattr(base, attr), getattr(cand, attr)) for attr in attrs
             if getattr(base, attr) != getattr(cand, attr)}
    diffs.update(scenario_differences(base.scenario, cand.scenario))
    return diffs


def compare_runs(name: str, baseline: Sequence[Measurement], candidate: Sequence[Measurement],
                 config: GateConfig = GateConfig()) -> Comparison:
    """One scenario decided on its own (a family of one)."""
    return decide_family([estimate(name, baseline, candidate, config)], config)[0]


def estimate(
    name: str,
    baseline: Sequence[Measurement],
    candidate: Sequence[Measurement],
    config: GateConfig = GateConfig(),
) -> Comparison:
    """One scenario's change, standard error and unadjusted p; undecided unless it cannot be decided."""
    if not baseline or not candidate:
        side = "baseline" if not baseline else "current run"
        return Comparison(name, INCONCLUSIVE, f"scenario missing from the {side}", config.threshold)
    scen_thr = candidate[-1].scenario.noise_threshold
    thr = config.threshold if scen_thr is None else scen_thr
    cand_ref = candidate[-1]
    diffs = {}
    for b in baseline:
        diffs.update(differences(b.environment, cand_ref.environment))
        diffs.update(_measurement_differences(b, cand_ref))
    common = dict(name=name, threshold=thr, baseline_runs=len(baseline), candidate_runs=len(candidate),
                  timer=cand_ref.timer, differences=diffs)
    if diffs and not config.allow_env_mismatch:
        what = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diffs.items())
        return Comparison(verdict=INCOMPARABLE, reason=f"differs: {what}", **common)

    b_meds = np.array([m.summary.median for m in baseline])
    c_meds = np.array([m.summary.median for m in candidate])
    b_pool = np.concatenate([m.primary_ms for m in baseline])
    c_pool = np.concatenate([m.primary_ms for m in candidate])
    common.update(baseline_median=float(np.median(b_pool)), candidate_median=float(np.median(c_pool)))
    if np.any(b_meds <= 0) or np.any(c_meds <= 0):
        return Comparison(verdict=INCONCLUSIVE, unusable=True,
                          reason="a run median is 0 ms (below the timer's resolution): a ratio has no meaning",
                          **common)

    mw_p, effect = mann_whitney(c_pool, b_pool)
    common.update(mw_p_value=mw_p, effect=effect)
    if mann_whitney_min_p(len(b_pool), len(c_pool)) > config.alpha:
        return Comparison(verdict=INCONCLUSIVE, unusable=True,
                          reason=f"too few samples ({len(b_pool)} vs {len(c_pool)}) to ever reach p < {config.alpha}",
                          **common)

    b_log, c_log = np.log(b_meds), np.log(c_meds)
    k, m = len(b_log), len(c_log)
    within = np.mean([median_log_se(x.primary_ms) ** 2 for x in (*baseline, *candidate)])
    ss = float(np.sum((b_log - b_log.mean()) ** 2) + np.sum((c_log - c_log.mean()) ** 2))
    df_data = (k - 1) + (m - 1)
    tau2, df = run_variance(ss, df_data, math.log1p(config.run_noise) ** 2 + within, config.prior_runs)
    se = math.sqrt(tau2 * (1.0 / k + 1.0 / m))
    d = float(c_log.mean() - b_log.mean())
    # One-sided in the direction observed: a false "slower" (or a false "faster") happens at most
    # alpha of the time, which is the error a CI gate cares about.
    return Comparison(verdict=None, reason="", ratio=math.exp(d), p_value=t_test(d, se, df), df=df, se=se, **common)


def run_variance(ss: float, df_data: int, prior_var: float, prior_runs: float) -> tuple[float, float]:
    """Run-to-run variance of log run medians, and its degrees of freedom.

    Never narrower than the data say: when the runs spread more than the prior, the prior is
    dropped and the plain t-test on the runs is used (a prior that is too small would otherwise
    turn the machine's drift into false alarms). When the runs spread less, they are pooled with
    the prior, so a handful of runs that happened to agree cannot make the interval falsely narrow.
    """
    if df_data <= 0:
        return prior_var, prior_runs
    s2 = ss / df_data
    if s2 >= prior_var:
        return s2, float(df_data)
    return (prior_runs * prior_var + ss) / (prior_runs + df_data), prior_runs + df_data


ADD_RUNS = "add baseline runs (--bench-save NAME --bench-append) or repeats"


def decide(c: Comparison, p_adjusted: float, alpha: float, adjustment: str, advice: str = ADD_RUNS) -> Comparison:
    """Turn one estimate's adjusted p-value into its verdict and interval. Pure: same input, same verdict."""
    if c.verdict is not None:
        return c
    # The per-test level the adjustment used: p < alpha' exactly when p_adjusted < alpha.
    alpha_used = alpha * c.p_value / p_adjusted if p_adjusted > 0 and c.p_value > 0 else alpha
    confidence = 1.0 - 2.0 * alpha_used
    d = math.log(c.ratio)
    lo, hi = (math.exp(v) for v in t_interval(d, c.se, c.df, confidence))
    c = replace(c, ci_low=lo, ci_high=hi, confidence=confidence, p_adjusted=p_adjusted, adjustment=adjustment)
    thr = c.threshold
    sig = p_adjusted < alpha
    if sig and c.ratio > 1 + thr:
        verdict, why = SLOWER, f"significant (p_adj={p_adjusted:.2g} < {alpha}) and {c.ratio - 1:+.1%} beyond the {thr:.0%} threshold"
    elif sig and c.ratio < 1 / (1 + thr):
        verdict, why = FASTER, f"significant (p_adj={p_adjusted:.2g} < {alpha}) and {c.ratio - 1:+.1%} beyond the {thr:.0%} threshold"
    elif sig:
        verdict, why = UNCHANGED, f"significant but {c.ratio - 1:+.1%} is inside the {thr:.0%} threshold"
    elif lo >= 1 / (1 + 2 * thr) and hi <= 1 + 2 * thr:
        verdict, why = UNCHANGED, f"no significant change; the {confidence:.1%} interval lies within +-{2 * thr:.0%}"
    else:
        verdict, why = INCONCLUSIVE, (
            f"no significant change, but the {confidence:.1%} interval [{lo:.3f}, {hi:.3f}] is too wide to rule out "
            f"a {2 * thr:.0%} change: {advice}"
        )
    return replace(c, verdict=verdict, reason=why)


def confirm(first: Comparison, pooled: Comparison) -> Comparison:
    """A "slower" verdict stands only if it survives fresh samples.

    Slow episodes on a shared machine last a fraction of a second to seconds; a regression does not
    go away. `pooled` compares the first samples together with confirmation samples taken right
    after; the final verdict is slower only if both say so.
    """
    if first.verdict != SLOWER:
        return first
    if pooled.verdict == SLOWER:
        return replace(pooled, reason=f"confirmed with fresh samples: {pooled.reason}")
    return replace(pooled, reason=f"first samples looked {first.ratio - 1:+.1%} slower, not confirmed by fresh "
                                  f"samples: {pooled.reason}")


def decide_family(estimates: Sequence[Comparison], config: GateConfig = GateConfig(),
                  family_size: int | None = None, advice: str = ADD_RUNS) -> list[Comparison]:
    """The one decision: adjust the p-values of scenarios compared together, then decide each once.

    `family_size` larger than the list means the decision is taken before the rest of the family
    exists (pytest decides each scenario as soon as it has run). Holm's and Benjamini-Hochberg's
    steps need every p-value, so the adjustment is then Bonferroni over `family_size`: Holm's own
    first, most demanding step, which never under-corrects.
    """
    ps = [c.p_value if c.verdict is None else None for c in estimates]
    n = sum(p is not None for p in ps)
    if family_size is not None and family_size > len(estimates):
        adj = [None if p is None else min(1.0, p * family_size) for p in ps]
        how = f"bonferroni over {family_size} scenarios (decided one at a time; {config.adjust} asked for)"
    else:
        adj = adjust_pvalues(ps, config.adjust)
        how = f"{config.adjust} over {n} scenario(s)" if n > 1 else "none (one scenario)"
    return [c if a is None else decide(c, a, config.alpha, how, advice) for c, a in zip(estimates, adj)]


def compare_sets(
    baseline: Mapping[str, Sequence[Measurement]],
    candidate: Mapping[str, Sequence[Measurement]],
    config: GateConfig = GateConfig(),
) -> list[Comparison]:
    """Every scenario on either side, compared and decided as one family."""
    names = list(dict.fromkeys([*baseline.keys(), *candidate.keys()]))
    return decide_family([estimate(n, baseline.get(n, ()), candidate.get(n, ()), config) for n in names], config)
