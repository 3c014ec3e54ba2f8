"""One scenario's change estimated from a candidate's runs against a baseline's runs: the change, its standard
error, its unadjusted p-value and the guard it must clear (`estimate`, on measurements; `estimate_logs`, the model
itself, on log run medians). The verdict is the decision's (`gate.decide_family`).

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

Baselines that cannot be unlucky. A baseline is recorded once and reused, so averaged error rates are
not enough: a baseline whose mean came out low raises the false alarms of every later comparison.
A change must also clear a guard, the distance by which a baseline's mean is off with probability
at most `guard_baselines` plus the candidate's own noise at `guard_rate`, sized so that about
`guard_baselines` of baselines give false alarms above `guard_rate` (docs/gate.md has how close it gets, as
quality/gate_sim.py measures it).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from bench_core.core.environment import differences
from bench_core.core.records import Measurement, throttled
from bench_core.core.scenario import INFORMATIONAL, Scenario, thaw
from bench_core.core.stats import (VariancePrior, fit_variance_prior, mann_whitney, mann_whitney_min_p, median_log_se,
                                   t_quantile, t_test, variance_ratio_sf)
from bench_core.deciding.comparison import Comparison, GateConfig
from bench_core.deciding.slow_runs import Difference, difference, fit_slow_runs
from bench_core.deciding.verdicts import INCOMPARABLE, INCONCLUSIVE, NEW


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
            what += " (take both with the same --bench-malloc, as-is by default, or re-save the baseline)"
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
           for i, m in enumerate(runs)
           for flag in [*throttled(m.telemetry), *[m.throttle_mark] * bool(m.throttle_mark)]]
    if hot:
        common["notes"] = common.get("notes", ()) + (
            f"the GPU was throttled during a timed window ({'; '.join(hot)}): a change may be the GPU's, "
            f"not the code's",)
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
    wild = [side for side, x in (("baseline", b_log), ("candidate", c_log)) if _beyond_machine(x, prior)]
    if wild:
        spread = lambda x: f"{math.expm1(float(np.std(x, ddof=1))):.1%}" if x.size > 1 else "-"   # noqa: E731
        whose = "both sides'" if len(wild) == 2 else f"the {wild[0]}'s"
        common["notes"] = common.get("notes", ()) + (
            f"{whose} runs spread far beyond this machine's usual run-to-run spread (baseline {spread(b_log)}, "
            f"candidate {spread(c_log)}; a run may have jumped): decided on this scenario's own spread, not the "
            f"machine's" + ("; re-record the baseline to decide it" if "baseline" in wild else ""),)
        if prior.slow is not None:
            prior = replace(prior, slow=None, source=f"{prior.source}; one level here: a run beyond both levels")
    elif prior.slow is not None:
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
    # A side whose own runs spread far beyond the machine's prior keeps its own spread, unshrunk (limma's robust
    # variant): a run that jumped 1.5x among tight runs is not the machine's usual noise, and a prior worth
    # thousands of degrees of freedom would otherwise hide it and call a change (docs/gate.md)
    def moderated(s2: float, df: int, own: bool) -> tuple[float, float]:
        return (s2, df) if own else prior.moderate(s2, df)
    if pooled:
        ss = float(np.sum((b_log - b_log.mean()) ** 2) + np.sum((c_log - c_log.mean()) ** 2))
        vb, df_b = moderated(ss / (k + m - 2) if k + m > 2 else 0.0, k + m - 2, bool(wild))
        vc, df_c = vb, df_b
    else:
        vb, df_b = moderated(float(np.var(b_log, ddof=1)) if k > 1 else 0.0, k - 1, "baseline" in wild)
        vc, df_c = moderated(float(np.var(c_log, ddof=1)) if m > 1 else 0.0, m - 1, "candidate" in wild)
    se = math.sqrt(vb / k + vc / m)
    df = df_b if pooled else welch_df(vb / k, df_b, vc / m, df_c)
    guard = guard_distance(vb, df_b, k, vc, df_c, m, config, len(config.looks))
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
    # The spreads and their df serve the projection of how many runs would decide (in `gate`), which
    # reads the fast levels as one-level means: optimistic by the slow share, so it chases a little more
    return Comparison(verdict=None, reason="", ratio=math.exp(d), p_value=max(p, 1e-300), df=None, se=post.sd,
                      guard=guard, run_spread=b.spread, candidate_spread=c.spread,
                      spread_df=(prior.df + k - 1, prior.df + m - 1),
                      pooled=False, prior=prior.source, slow_runs=(b.slow_runs, c.slow_runs),
                      slow_share=prior.slow.share, posterior=post, **common)


WILD_P = 1e-3   # a side's runs spreading this unlikely under the machine's prior are not its usual noise


def _beyond_machine(x: np.ndarray, prior: VariancePrior) -> bool:
    """A side's runs (log medians) spreading further than the machine's prior makes likelier than WILD_P (F's upper
    tail against the prior's variance). On a machine with slow processes, a run at the slow level is the two-level
    model's to explain: the excess is taken off every run nearer that level than the fast one first."""
    if x.size < 2:
        return False
    if prior.slow is not None:
        x = np.where(x - x.min() > prior.slow.excess / 2, x - prior.slow.excess, x)
    s2 = float(np.var(x, ddof=1))
    return s2 > 0 and variance_ratio_sf(s2 / prior.variance, x.size - 1, prior.df) < WILD_P


def guard_distance(vb: float, df_b: float, k: int, vc: float, df_c: float, m: int, config: GateConfig,
                   looks: int) -> float:
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
