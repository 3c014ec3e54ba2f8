"""The regression decision: a candidate's runs against a baseline's runs, as a pure function; the estimate it
decides on (the model, its variance prior, the two-level model of slow processes, the guard) is `estimate`'s.

Processes, not samples. A slow process looks exactly like a regression from inside it, so "slower"
and "faster" need `min_runs` candidate runs, each a fresh process (in pytest the suite starts them,
up to `max_runs`; the CLI says how many more would decide). Deciding at several numbers of runs is
several looks at the data: alpha is split over the looks that can declare a change (Bonferroni), so
replicating until decisive keeps the promise.

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
from dataclasses import replace
from typing import Callable, Mapping, Optional, Sequence

from bench_core.core.records import Measurement
from bench_core.core.stats import VariancePrior, adjust_pvalues, t_interval, t_quantile
from bench_core.deciding.comparison import Comparison, GateConfig, level_text
from bench_core.deciding.estimate import estimate, guard_distance, noise_prior, welch_df
from bench_core.deciding.sequential import all_slow_chance
from bench_core.deciding.verdicts import FASTER, INCONCLUSIVE, SLOWER, UNCHANGED


def compare_runs(name: str, baseline: Sequence[Measurement], candidate: Sequence[Measurement],
                 config: GateConfig = GateConfig(), prior: VariancePrior | None = None) -> Comparison:
    """One scenario decided on its own (a family of one)."""
    return decide_family([estimate(name, baseline, candidate, config, prior)], config)[0]


Advice = Callable[[Optional[int]], str]   # what to do about an inconclusive verdict, given the candidate runs in
                                          # all that would likely decide (None: more would not)


def gate_advice(baseline: str | None = None, candidate: str = "pytest", chase: str = "possible") -> Advice:
    """The command that carries out more evidence for the stored gate: more candidate runs (in pytest: a larger
    budget of fresh processes, chased as possible changes; from files: more session files of this code; from a
    merged session of shards, "merged": more merged runs, which only `bench-core baseline add` stores), else more
    baseline runs."""
    name = baseline or "NAME"

    def advice(more: int | None) -> str:
        if candidate == "merged":   # shards store nothing alone (`--bench-save` is refused with --bench-shard)
            if more is not None:
                return (f"store {more} merged runs of this code as a baseline of its own (bench-core baseline add "
                        f"NEW MERGED.json, one merged run a file) and compare with it (bench-core compare {name} NEW)")
            return f"add merged runs of other days to the baseline (bench-core baseline add {name} MERGED.json)"
        if more is not None and candidate == "pytest":
            if chase != "possible":   # confirm chases only what looks changed over the family: not this
                return f"chase it in that many fresh processes (--bench-replicate possible --bench-max-runs {more})"
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


def _end(v: float) -> str:
    """An interval's end: three decimals, or three digits where a spread on one or two degrees of freedom put it
    out of that range."""
    return f"{v:.3f}" if 1e-3 <= v <= 1e3 else f"{v:.3g}"


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
        if d > max(q * se, math.log1p(c.threshold), guard_distance(vb, df_bm, k, vc, df_cm, m, config, c.looks)):
            return m  # a change
    return None


def unless_slow(c: Comparison) -> float | None:
    """A slower-looking two-level comparison's p without the chance that every candidate run was slow; None
    elsewhere."""
    chance = all_slow_chance(c)
    if c.verdict is not None or chance == 0.0:
        return None
    return max(c.p_value - chance, 1e-300)


def decide(c: Comparison, p_adjusted: float, config: GateConfig, adjustment: str, advice: Advice = ADD_RUNS,
           p_unless_slow: float | None = None) -> Comparison:
    """Turn one estimate's adjusted p-value into its verdict and interval (`p_unless_slow`: `unless_slow`'s p,
    adjusted alike). Pure: same input, same verdict."""
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
    # Significant but for the chance that every candidate run was one of the machine's slow processes, which only
    # more fresh processes can rule out (the chase leaves that chance out too: `sequential.possible_change`)
    but_slow = not sig and p_unless_slow is not None and p_unless_slow < alpha
    where = f"the {level_text(confidence)} interval [{_end(lo)}, {_end(hi)}]"
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
        verdict, why = direction, (f"significant (p_adj={p_adjusted:.2g} < {alpha:.2g}) and {change} beyond the "
                                   f"{thr:.0%} threshold")
    elif lo >= 1 / (1 + 2 * thr) and hi <= 1 + 2 * thr:
        lead = f"significant but {change} is inside the {thr:.0%} threshold" if sig else "no significant change"
        verdict, why = UNCHANGED, f"{lead}; {where} lies within +-{2 * thr:.0%}"
    elif (sig or but_slow) and beyond and c.candidate_runs < c.min_runs:
        verdict, why = INCONCLUSIVE, (f"looks {direction} ({change}, p_adj={p_adjusted if sig else p_unless_slow:.2g}) "
                                      f"from {c.candidate_runs} candidate run(s), but one slow process looks the same: "
                                      f"{c.min_runs} fresh runs decide it")
    elif but_slow and beyond:
        verdict, why = INCONCLUSIVE, (f"looks {direction} ({change}, p_adj={p_unless_slow:.2g} unless every run was "
                                      f"slow, {p_adjusted:.2g} in all) from {c.candidate_runs} candidate run(s), but "
                                      f"all of them may have been this machine's slow processes ({c.slow_share:.0%} "
                                      f"of runs){hint}: {todo}")
    elif sig and beyond:
        verdict, why = INCONCLUSIVE, (f"significant, but {change} is inside the guard against an unlucky baseline "
                                      f"(+-{math.expm1(c.guard):.1%}){hint}: {todo}")
    else:
        verdict, why = INCONCLUSIVE, (f"no significant change, but {where} is too wide to rule out a {2 * thr:.0%} "
                                      f"change{hint}: {todo}")
    if verdict != INCONCLUSIVE:
        more = None
    elif beyond and min(p_adjusted, p_unless_slow or 1.0) < config.chase_p:
        # past the threshold and changed-looking over the whole family: what `--bench-replicate confirm` measures
        # again (fresh runs rule out a run that jumped, or runs that were all slow)
        c = replace(c, pending=direction)
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
    at_once = family_size is not None and (family_size > len(estimates) or one_at_a_time)
    if at_once:
        adjusted = lambda values: [None if p is None else min(1.0, p * family_size) for p in values]  # noqa: E731
        why = "" if config.adjust == "bonferroni" else f"; {config.adjust} needs every scenario's p-value at once"
        how = f"bonferroni over {family_size} scenarios (each decided as its test ends{why})"
    else:
        adjusted = lambda values: adjust_pvalues(values, config.adjust)   # noqa: E731
        how = f"{config.adjust} over {n} scenario(s)" if n > 1 else "none (one scenario)"
    # the same adjustment of the p-values without the all-slow chance, where some differ from their own
    unless = [unless_slow(c) for c in estimates]
    fair = adjusted([u if u is not None else p for u, p in zip(unless, ps)]) if any(unless) else [None] * len(ps)
    return [c if a is None else decide(c, a, config, how, advice, f if u is not None else None)
            for c, a, u, f in zip(estimates, adjusted(ps), unless, fair)]


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
