"""The regression decision: a candidate's runs against a baseline's runs, as a pure function.

Model. On a shared machine the level of a whole run (one process) drifts far more than the median
wobbles inside a run, so the unit of evidence is the run, not the sample. Each run contributes
log(median); the change is d = mean(candidate logs) - mean(baseline logs) and ratio = exp(d).

Variance from the machine. The run-to-run variance of each side (the baseline's runs, the candidate's
runs) is moderated the way limma moderates gene variances: that side's own variance is pooled with a
prior fitted (`noise_prior`) from the run-to-run variances of every scenario in the baseline's whole
history, prior degrees of freedom included; the two sides combine as in Welch's test. A quiet runner
gets the power its quietness allows; a noisy one stays honest; runs that happened to agree cannot make
an interval falsely narrow, and candidate processes that disagree (some of them slow) widen their own.
Only a baseline too small to fit a prior falls back to a fixed one (`run_noise`, worth `prior_runs` runs).

Slow processes as a second level. Where the history shows some processes running a fixed excess slower
(two levels clearly apart, `slow_runs.fit_slow_runs`), the prior carries that share and excess, and each
side's fast level is estimated from the two-level model instead (`slow_runs.difference`): a slow process
then neither hides a regression inside an inflated spread nor passes for one. The p-value, the interval
and the guard come from the posterior of the difference of the two sides' fast levels.

Processes, not samples. A slow process looks exactly like a regression from inside it, so "slower"
and "faster" need `min_runs` candidate runs, each a fresh process (in pytest the suite starts them,
up to `max_runs`; the CLI says how many more would decide). Deciding at several numbers of runs is
several looks at the data: alpha is split over the looks that can declare a change (Bonferroni), so
replicating until decisive keeps the promise.

Baselines that cannot be unlucky. A baseline is recorded once and reused, so averaged error rates are
not enough: a baseline whose mean came out low raises the false alarms of every later comparison.
A change must also clear a guard, the distance by which a baseline's mean is off with probability
at most `guard_baselines` plus the candidate's own noise at `guard_rate`, sized so that about
`guard_baselines` of baselines give false alarms above `guard_rate` (docs/gate.md has how close it gets, as
quality/gate_sim.py measures it).

Two steps, each done once: `estimate` turns one scenario's runs into d, its standard error, p and
guard; `decide_family` adjusts the p-values of the scenarios decided together and gives each its
verdict and the interval at the level that verdict was decided on (a one-sided test at alpha' is
the two-sided interval at 1 - 2 alpha'), so the printed interval never contradicts the verdict.

Error promises, per direction: a false "slower" at most alpha over the family, and a false "faster"
at most alpha (each one-sided at alpha); "unchanged" is an equivalence test at the same adjusted
level: the interval lies inside +-2x the threshold.

Verdicts:
  slower / faster   significant after the family and look adjustment, beyond the noise threshold and
                    the guard, from at least `min_runs` candidate runs
  unchanged         the interval at the decided level lies inside +-2x the threshold
  inconclusive      too little data or too much noise to tell (`more_runs` says how many would help)
  incomparable      the environments or the scenarios differ (what differs is listed)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from bench_core.core.environment import differences
from bench_core.core.records import Measurement, throttled
from bench_core.core.scenario import INFORMATIONAL, Scenario, thaw
from bench_core.deciding.sequential import planned_looks
from bench_core.deciding.slow_runs import Difference, difference, fit_slow_runs
from bench_core.deciding.verdicts import FASTER, INCOMPARABLE, INCONCLUSIVE, NEW, SLOWER, UNCHANGED
from bench_core.core.stats import (VariancePrior, adjust_pvalues, fit_variance_prior, mann_whitney, mann_whitney_min_p, median_log_se,
                    t_interval, t_quantile, t_test)



DEFAULT_MAX_RUNS = 7


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

    def __post_init__(self):
        for name, lo, hi in (("alpha", 0, 0.5), ("threshold", 0, 1), ("run_noise", 0, 1), ("guard_rate", 0, 0.5),
                             ("guard_baselines", 0, 0.5), ("chase_p", 0, 1)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not lo < v < hi:
                if not (name == "threshold" and v == 0):
                    raise ValueError(f"gate setting {name} must lie in ({lo}, {hi}), got {v!r}")
        if not self.prior_runs > 0:
            raise ValueError("gate setting prior_runs must be > 0")
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
    notes: tuple[str, ...] = ()            # what weakens this comparison without changing its arithmetic
    achieved_flops: tuple[float, float] | None = None   # FLOP/s, baseline and current, where both were counted
    slow_runs: tuple[float, float] | None = None   # two-level model: how many runs of each side were likely slow
    slow_share: float | None = None        # two-level model: the machine's share of slow processes
    facts: tuple[str, ...] = ()            # how the two steps' work signatures differ, exactly, per step
    grown: tuple[str, ...] = ()            # counters that must not grow (--bench-no-growth) and grew: fails
    moved: tuple[str, ...] = ()            # a slower/faster verdict's profiler pass: operators whose time moved
    # two-level model: the posterior of the change, which gives the interval once the level is decided; not stored
    posterior: Any = field(default=None, repr=False, compare=False)

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


def scenario_differences(base: Scenario, cand: Scenario) -> dict:
    """Where two scenario records disagree about what is measured: {field: (base, cand)}."""
    diffs = {}
    if base.name != cand.name:
        diffs["name"] = (base.name, cand.name)
    if base.window != cand.window:
        diffs["window"] = (list(base.window), list(cand.window))
    bm, cm = thaw(base.metadata), thaw(cand.metadata)
    for key in sorted((set(bm) | set(cm)) - set(INFORMATIONAL)):
        if bm.get(key) != cm.get(key):
            diffs[f"metadata.{key}"] = (bm.get(key), cm.get(key))
    return diffs


def _measurement_differences(base: Measurement, cand: Measurement) -> dict:
    # On the CPU the thread count changes what is measured (most of all on a loaded machine: docs/running.md)
    attrs = ("device", "mode", "timer") + (("threads",) if "cpu" in (base.device, cand.device) else ())
    diffs = {attr: (getattr(base, attr), getattr(cand, attr)) for attr in attrs
             if getattr(base, attr) != getattr(cand, attr)}
    diffs.update(scenario_differences(base.scenario, cand.scenario))
    return diffs


def compare_runs(name: str, baseline: Sequence[Measurement], candidate: Sequence[Measurement],
                 config: GateConfig = GateConfig(), prior: VariancePrior | None = None) -> Comparison:
    """One scenario decided on its own (a family of one)."""
    return decide_family([estimate(name, baseline, candidate, config, prior)], config)[0]


def log_medians(runs: Sequence[Measurement]) -> np.ndarray:
    return np.log([m.summary.median for m in runs])


def noise_prior(history: Mapping[str, Sequence[Measurement]]) -> VariancePrior | None:
    """The run-to-run variance prior of a machine, fitted from every scenario of a baseline's history
    (each scenario's runs give one variance with runs - 1 degrees of freedom). None when too few
    scenarios have repeated runs: the gate then uses its fixed fallback."""
    return prior_from_logs([log_medians(runs) for runs in history.values()
                            if runs and min(m.summary.median for m in runs) > 0])


def estimate(
    name: str,
    baseline: Sequence[Measurement],
    candidate: Sequence[Measurement],
    config: GateConfig = GateConfig(),
    prior: VariancePrior | None = None,
) -> Comparison:
    """One scenario's change, standard error, unadjusted p and guard; undecided unless it cannot be decided.

    `baseline` is every run the baseline holds for the scenario; `config.window` keeps the latest.
    `prior` is `noise_prior` of the baseline's history (None: the fixed fallback)."""
    if not baseline and candidate:
        return Comparison(name, NEW, "not in the baseline: nothing to compare with (a new scenario, or a renamed one)",
                          config.threshold)
    if not candidate:
        return Comparison(name, INCONCLUSIVE, "scenario missing from the current run", config.threshold)
    if config.window is not None:
        baseline = list(baseline)[-config.window:]
    scen_thr = candidate[-1].scenario.noise_threshold
    thr = config.threshold if scen_thr is None else scen_thr
    cand_ref = candidate[-1]
    diffs = {}
    for b in baseline:
        diffs.update(differences(b.environment, cand_ref.environment))
        diffs.update(_measurement_differences(b, cand_ref))
    common = dict(name=name, threshold=thr, baseline_runs=len(baseline), candidate_runs=len(candidate),
                  timer=cand_ref.timer, differences=diffs, looks=len(config.looks), min_runs=config.min_runs)
    if diffs and not config.allow_env_mismatch:
        what = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diffs.items())
        if "malloc" in diffs:   # a choice of the command line, not of the machine: say which one
            what += " (take both with the same --bench-malloc, pinned by default, or re-save the baseline)"
        return Comparison(verdict=INCOMPARABLE, reason=f"differs: {what}", **common)

    b_pool = np.concatenate([m.primary_ms for m in baseline])
    c_pool = np.concatenate([m.primary_ms for m in candidate])
    common.update(baseline_median=float(np.median(b_pool)), candidate_median=float(np.median(c_pool)))
    if min(m.summary.median for m in (*baseline, *candidate)) <= 0:
        return Comparison(verdict=INCONCLUSIVE, unusable=True,
                          reason="a run median is 0 ms (below the timer's resolution): a ratio has no meaning",
                          **common)

    mw_p, effect = mann_whitney(c_pool, b_pool)
    common.update(mw_p_value=mw_p, effect=effect)
    if mann_whitney_min_p(len(b_pool), len(c_pool)) > config.alpha:
        return Comparison(verdict=INCONCLUSIVE, unusable=True,
                          reason=f"too few samples ({len(b_pool)} vs {len(c_pool)}) to ever reach p < {config.alpha}",
                          **common)

    # Different counted work is a different program: maybe the point of the change, maybe a bug; said, not judged
    counts = {side: {m.work["flops"] for m in runs if m.work is not None}
              for side, runs in (("baseline", baseline), ("current", candidate))}
    if counts["baseline"] and counts["current"] and counts["baseline"] != counts["current"]:
        common["notes"] = common.get("notes", ()) + (
            f"counted FLOPs differ: baseline {sorted(counts['baseline'])} -> current {sorted(counts['current'])} "
            f"per step: the two do different work",)
    rates = [[r for r in (m.flops_per_s for m in runs) if r is not None] for runs in (baseline, candidate)]
    if all(rates):   # achieved FLOP/s per side: the median over runs that were counted
        common["achieved_flops"] = (float(np.median(rates[0])), float(np.median(rates[1])))
    # A throttled GPU looks exactly like slower code: the comparison says so beside its verdict
    hot = [f"{side} run {i}: {flag}" for side, runs in (("baseline", baseline), ("current", candidate))
           for i, m in enumerate(runs) for flag in [*throttled(m.telemetry), *[m.throttle_mark] * bool(m.throttle_mark)]]
    if hot:
        common["notes"] = common.get("notes", ()) + (
            f"the GPU was throttled during a timed window ({'; '.join(hot)}): a change may be the GPU's, not the code's",)
    fallback = prior is None
    if fallback:  # the fixed fallback also carries the runs' own within-run error
        within = np.mean([median_log_se(x.primary_ms) ** 2 for x in (*baseline, *candidate)])
        prior = VariancePrior(math.log1p(config.run_noise) ** 2 + within, config.prior_runs,
                              f"fixed: {config.run_noise:.0%} run-to-run, worth {config.prior_runs:g} runs")
    return estimate_logs(log_medians(baseline), log_medians(candidate), config, prior, pooled=fallback, **common)


def estimate_logs(b_log: np.ndarray, c_log: np.ndarray, config: GateConfig, prior: VariancePrior,
                  pooled: bool = False, **common) -> Comparison:
    """The model itself, on the runs' log medians: what `estimate` computes once its input is checked
    (and what the gate's simulation drives directly). `pooled`: both sides share one spread, for a
    prior that is only a guess (no history to fit one), where this scenario's baseline runs are all
    that is known of the machine. `common` fills the record's other fields."""
    k, m = len(b_log), len(c_log)
    common = {"name": "", "threshold": config.threshold, "baseline_runs": k, "candidate_runs": m,
              "looks": len(config.looks), "min_runs": config.min_runs,
              "looks_at": f"at {', '.join(map(str, config.looks))} candidate runs",
              "baseline_spread": float(np.std(b_log, ddof=1)) if k > 1 else None, **common}
    if prior.slow is not None:
        post = difference(b_log, c_log, prior)
        if post is not None:
            return _estimate_two_levels(post, config, prior, **common)
        # runs orders of magnitude apart: not the two levels the model knows; one level, widened by them
        prior = replace(prior, slow=None, source=f"{prior.source}; one level here: runs too far apart for two")
    # One candidate run has no spread of its own: it is taken to spread like this scenario's baseline.
    # Given only the machine's prior, a prior fitted from scenarios of very different spreads may be worth
    # under one degree of freedom, and the first look could never chase.
    pooled = pooled or m == 1
    # Each side's spread from its own runs, each moderated toward the machine's prior (Welch, not a pooled
    # variance): a candidate whose processes disagree (two of three slow) widens its own interval. Pooled,
    # such a candidate borrows the quietness of a baseline whose runs all happened to be fast (docs/gate.md).
    if pooled:
        ss = float(np.sum((b_log - b_log.mean()) ** 2) + np.sum((c_log - c_log.mean()) ** 2))
        vb, df_b = prior.moderate(ss / (k + m - 2) if k + m > 2 else 0.0, k + m - 2)
        vc, df_c = vb, df_b
    else:
        vb, df_b = prior.moderate(float(np.var(b_log, ddof=1)) if k > 1 else 0.0, k - 1)
        vc, df_c = prior.moderate(float(np.var(c_log, ddof=1)) if m > 1 else 0.0, m - 1)
    se = math.sqrt(vb / k + vc / m)
    df = df_b if pooled else welch_df(vb / k, df_b, vc / m, df_c)
    guard = _guard(vb, df_b, k, vc, df_c, m, config, len(config.looks))
    d = float(c_log.mean() - b_log.mean())
    return Comparison(verdict=None, reason="", ratio=math.exp(d), p_value=t_test(d, se, df), df=df, se=se,
                      guard=guard, run_spread=math.sqrt(vb), candidate_spread=math.sqrt(vc),
                      spread_df=(df_b, df_c), pooled=pooled, prior=prior.source, **common)


def _estimate_two_levels(post: Difference, config: GateConfig, prior: VariancePrior, **common) -> Comparison:
    """`estimate_logs` where the machine's runs show two levels: each side's fast level from the posterior
    of the two-level model, the change their difference. The p-value is the posterior chance of the other
    sign; the guard, as for one level, how far the baseline's level may be off (guard_baselines) plus how far
    the candidate's may stray (guard_rate over the looks), read from each side's posterior on the side a
    false alarm would need."""
    b, c = post.baseline, post.candidate
    k, m, looks = common["baseline_runs"], common["candidate_runs"], common["looks"]
    d = post.quantile(0.5)
    below = post.below(0.0)
    gb, gc = config.guard_baselines, config.guard_rate / looks
    if d > 0:   # a false "slower": the baseline's level came out low, the candidate's high
        p, guard = below, (b.quantile(1 - gb) - b.median) + (c.median - c.quantile(gc))
    else:
        p, guard = 1.0 - below, (b.median - b.quantile(gb)) + (c.quantile(1 - gc) - c.median)
    # The spreads and their df serve the projection of how many runs would decide (`_runs_to_decide`), which
    # reads the fast levels as one-level means: optimistic by the slow share, so it chases a little more
    return Comparison(verdict=None, reason="", ratio=math.exp(d), p_value=max(p, 1e-300), df=None, se=post.sd,
                      guard=guard, run_spread=b.spread, candidate_spread=c.spread,
                      spread_df=(prior.df + k - 1, prior.df + m - 1),
                      pooled=False, prior=prior.source, slow_runs=(b.slow_runs, c.slow_runs),
                      slow_share=prior.slow.share, posterior=post, **common)


def _guard(vb: float, df_b: float, k: int, vc: float, df_c: float, m: int, config: GateConfig, looks: int) -> float:
    """How far a baseline's mean of k runs may be off (beaten by only guard_baselines of baselines), plus how
    far the candidate's own mean of m runs strays at guard_rate split over the looks: each side's variance
    of one run and its degrees of freedom."""
    return (math.sqrt(vb / k) * t_quantile(config.guard_baselines, df_b)
            + math.sqrt(vc / m) * t_quantile(config.guard_rate / looks, df_c))


def welch_df(v1: float, df1: float, v2: float, df2: float) -> float:
    """Welch-Satterthwaite degrees of freedom of v1 + v2, two variances of means with their own df
    (infinite df: known exactly)."""
    parts = sum(v * v / d for v, d in ((v1, df1), (v2, df2)) if math.isfinite(d))
    return (v1 + v2) ** 2 / parts if parts > 0 else math.inf


def prior_from_logs(history: Sequence[Sequence[float]]) -> VariancePrior | None:
    """`noise_prior` on log run medians, one sequence per scenario: two levels where the history shows
    slow processes clearly apart (`slow_runs.fit_slow_runs`), else one."""
    two = fit_slow_runs(history)
    if two is not None:
        return two
    pairs = [(float(np.var(x, ddof=1)), len(x) - 1) for x in map(np.asarray, history) if len(x) >= 2]
    return fit_variance_prior([v for v, _ in pairs], [d for _, d in pairs])


Advice = Callable[[Optional[int]], str]   # what to do about an inconclusive verdict, given the candidate runs in
                                          # all that would likely decide (None: more would not)


def gate_advice(baseline: str | None = None, candidate: str = "pytest") -> Advice:
    """The command that carries out more evidence for the stored gate: more candidate runs (in pytest: a larger
    budget of fresh processes; from files: more session files of this code), else more baseline runs."""
    name = baseline or "NAME"

    def advice(more: int | None) -> str:
        if more is not None and candidate == "pytest":
            return f"allow that many fresh processes (--bench-max-runs {more})"
        if more is not None:
            return (f"store {more} runs of this code as a baseline of its own (pytest --bench-save NEW, then "
                    f"--bench-append) and compare with it (bench-core compare {name} NEW)")
        return f"record more baseline runs, on other days (--bench-save {name} --bench-append)"
    return advice


ADD_RUNS = gate_advice()


def _tenth_below(df: float) -> float:
    """Degrees of freedom floored to a tenth (a slightly larger quantile), so cached quantiles are reused."""
    return df if math.isinf(df) else math.floor(10 * df) / 10


def _runs_to_decide(c: Comparison, alpha_used: float, config: GateConfig) -> int | None:
    """Candidate runs in all that would likely decide, were the change and both sides' spreads to stay
    as they are; None when no number of candidate runs would (the baseline's own uncertainty is the limit)."""
    if c.guard is None or c.run_spread is None or c.candidate_spread is None or c.spread_df is None:
        return None
    d, k = abs(math.log(c.ratio)), c.baseline_runs
    vb, vc = c.run_spread ** 2, c.candidate_spread ** 2
    df_b, df_c = c.spread_df
    for m in range(max(c.candidate_runs + 1, c.min_runs), 101):
        more = m - c.candidate_runs     # each added run adds a degree of freedom to the spread it informs
        df_bm, df_cm = (df_b + more, df_c + more) if c.pooled else (df_b, df_c + more)
        se = math.sqrt(vb / k + vc / m)
        q = t_quantile(alpha_used, df_bm if c.pooled else _tenth_below(welch_df(vb / k, df_b, vc / m, df_cm)))
        if d + q * se < math.log1p(2 * c.threshold):
            return m  # unchanged
        if d > max(q * se, math.log1p(c.threshold), _guard(vb, df_bm, k, vc, df_cm, m, config, c.looks)):
            return m  # a change
    return None


def decide(c: Comparison, p_adjusted: float, config: GateConfig, adjustment: str, advice: Advice = ADD_RUNS
           ) -> Comparison:
    """Turn one estimate's adjusted p-value into its verdict and interval. Pure: same input, same verdict."""
    if c.verdict is not None:
        return c
    alpha = config.alpha / c.looks
    # The per-test level the adjustment used: p < alpha' exactly when p_adjusted < alpha.
    alpha_used = alpha * c.p_value / p_adjusted if p_adjusted > 0 and c.p_value > 0 else alpha
    confidence = 1.0 - 2.0 * alpha_used
    d = math.log(c.ratio)
    if c.posterior is not None:
        ends = (c.posterior.quantile(alpha_used), c.posterior.quantile(1.0 - alpha_used))
    else:
        ends = t_interval(d, c.se, c.df, confidence)
    # An interval too wide to hold in a float (a spread with almost no degrees of freedom) is unbounded
    lo, hi = (math.exp(min(v, 700.0)) for v in ends)
    if c.looks > 1:
        adjustment += f"; alpha split over {c.looks} looks" + (f" ({c.looks_at})" if c.looks_at else "")
    c = replace(c, ci_low=lo, ci_high=hi, confidence=confidence, p_adjusted=p_adjusted, adjustment=adjustment)
    thr = c.threshold
    change = f"{c.ratio - 1:+.1%}"
    sig = p_adjusted < alpha
    beyond = c.ratio > 1 + thr or c.ratio < 1 / (1 + thr)
    direction = SLOWER if d > 0 else FASTER
    where = f"the {level_text(confidence)} interval [{lo:.3f}, {hi:.3f}]"
    more = _runs_to_decide(c, alpha_used, config)
    hint = "" if c.guard is None else (
        f" (about {more} candidate runs in all would likely decide)" if more is not None else
        " (more candidate runs alone would not decide)")
    todo = advice(more)
    if _disagreeing(c):   # say why the interval is wide, where the candidate's own processes made it so
        hint = (f"; the candidate's runs spread {math.expm1(c.candidate_spread):.1%} against its baseline's "
                f"{math.expm1(c.run_spread):.1%}, so some of its processes may have run slow{hint}")
    elif c.slow_runs is not None and c.slow_runs[1] >= 0.5:   # the two-level model counted them
        hint = (f"; {c.slow_runs[1]:.1f} of the candidate's {c.candidate_runs} run(s) look like this machine's slow "
                f"processes{hint}")
    if sig and beyond and (c.guard is None or abs(d) > c.guard) and c.candidate_runs >= c.min_runs:
        verdict, why = direction, f"significant (p_adj={p_adjusted:.2g} < {alpha:.2g}) and {change} beyond the {thr:.0%} threshold"
    elif lo >= 1 / (1 + 2 * thr) and hi <= 1 + 2 * thr:
        lead = f"significant but {change} is inside the {thr:.0%} threshold" if sig else "no significant change"
        verdict, why = UNCHANGED, f"{lead}; {where} lies within +-{2 * thr:.0%}"
    elif sig and beyond and c.candidate_runs < c.min_runs:
        verdict, why = INCONCLUSIVE, (f"looks {direction} ({change}, p_adj={p_adjusted:.2g}) from {c.candidate_runs} "
                                      f"candidate run(s), but one slow process looks the same: {c.min_runs} fresh "
                                      f"runs decide it")
    elif sig and beyond:
        verdict, why = INCONCLUSIVE, (f"significant, but {change} is inside the guard against an unlucky baseline "
                                      f"(+-{math.expm1(c.guard):.1%}){hint}: {todo}")
    else:
        verdict, why = INCONCLUSIVE, (f"no significant change, but {where} is too wide to rule out a {2 * thr:.0%} "
                                      f"change{hint}: {todo}")
    if verdict != INCONCLUSIVE:
        more = None
    return replace(c, verdict=verdict, reason=why, more_runs=more)


def _disagreeing(c: Comparison) -> bool:
    """The candidate's own runs spread well beyond its baseline's (half as much again)."""
    return (not c.pooled and c.candidate_spread is not None and c.run_spread is not None
            and c.candidate_spread > 1.5 * c.run_spread)


def decide_family(estimates: Sequence[Comparison], config: GateConfig = GateConfig(),
                  family_size: int | None = None, advice: Advice = ADD_RUNS, one_at_a_time: bool = False
                  ) -> list[Comparison]:
    """The one decision: adjust the p-values of scenarios compared together, then decide each once.

    `family_size` larger than the list means the decision is taken before the rest of the family
    exists (pytest decides each scenario as soon as it has run). Holm's and Benjamini-Hochberg's
    steps need every p-value, so the adjustment is then Bonferroni over `family_size`: Holm's own
    first, most demanding step, which never under-corrects. `one_at_a_time` asks for that same rule
    with every estimate at hand (the CLI deciding a session's file gives the session's own answer).
    """
    ps = [c.p_value if c.verdict is None else None for c in estimates]
    n = sum(p is not None for p in ps)
    if family_size is not None and (family_size > len(estimates) or one_at_a_time):
        adj = [None if p is None else min(1.0, p * family_size) for p in ps]
        why = "" if config.adjust == "bonferroni" else f"; {config.adjust} needs every scenario's p-value at once"
        how = f"bonferroni over {family_size} scenarios (each decided as its test ends{why})"
    else:
        adj = adjust_pvalues(ps, config.adjust)
        how = f"{config.adjust} over {n} scenario(s)" if n > 1 else "none (one scenario)"
    return [c if a is None else decide(c, a, config, how, advice) for c, a in zip(estimates, adj)]


SLOW_MACHINE_RUNS = 10   # baseline runs that give the two-level model its power (docs/gate.md)


def baseline_warnings(name: str, created: Sequence[str | None], uniform_within_s: float = 3600.0,
                      prior: VariancePrior | None = None) -> list[str]:
    """What makes a baseline hard to trust, in words: too few runs to measure its spread, runs all
    recorded in one sitting, whose spread misses the drift of a machine over hours and days, or too few
    runs to tell a machine's slow processes from a change (`prior`: the one fitted from the baseline)."""
    import datetime as dt

    out = []
    if prior is not None and prior.slow is not None and len(created) < SLOW_MACHINE_RUNS:
        out.append(f"baseline {name!r}: this machine's runs show slow processes ({prior.slow.source}); with "
                   f"{len(created)} baseline runs the gate may miss a real slowdown (simulated: +10% found in about "
                   f"half of cases from 5 runs, 9 in 10 from {SLOW_MACHINE_RUNS}); record {SLOW_MACHINE_RUNS} runs "
                   f"(--bench-save {name} --bench-append)")
    if len(created) < 3:
        out.append(f"baseline {name!r} holds {len(created)} run(s): its run-to-run spread is assumed, not measured; "
                   f"record at least 3 runs in separate sessions, at different times (--bench-save {name} "
                   f"--bench-append)")
    stamps = []
    for c in created:
        try:
            stamps.append(dt.datetime.fromisoformat(str(c)))
        except ValueError:
            pass
    if len(stamps) >= 2 and len(stamps) == len(created):
        span = (max(stamps) - min(stamps)).total_seconds()
        if span < uniform_within_s:
            out.append(f"baseline {name!r}: its {len(created)} runs were recorded within {span / 60:.0f} min, so "
                       f"their spread misses how this machine drifts over hours and days and may be too uniform "
                       f"to trust; add runs recorded at other times")
    return out


def compare_sets(
    baseline: Mapping[str, Sequence[Measurement]],
    candidate: Mapping[str, Sequence[Measurement]],
    config: GateConfig = GateConfig(),
    as_session: bool = True,
    advice: Advice = gate_advice(candidate="files"),
) -> list[Comparison]:
    """Every scenario on either side, compared and decided; the variance prior is fitted from the whole
    baseline. `as_session`: decided as the pytest gate decides them (each as its test ends, Bonferroni over
    the baseline's scenarios), so a session's file gets the session's own verdicts; otherwise as one family
    with `config.adjust`, every p-value at hand."""
    names = list(dict.fromkeys([*baseline.keys(), *candidate.keys()]))
    prior = noise_prior(baseline)
    ests = [estimate(n, baseline.get(n, ()), candidate.get(n, ()), config, prior) for n in names]
    if as_session:
        return decide_family(ests, config, family_size=len(baseline), one_at_a_time=True, advice=advice)
    return decide_family(ests, config, advice=advice)
