import math

import pytest
from scipy import stats as st

from bench_core.deciding.comparison import GateConfig
from bench_core.deciding.estimate import estimate
from bench_core.deciding.gate import compare_runs, compare_sets, decide_family
from bench_core.deciding.verdicts import FASTER, INCOMPARABLE, INCONCLUSIVE, NEW, SLOWER, UNCHANGED
from helpers import ENV, meas, runs


def test_many_runs_of_the_same_level_are_unchanged():
    base = runs([10, 10.1, 9.9, 10.05, 9.95, 10, 10.02, 9.98], seed=1)
    cand = runs([10, 10.03, 9.97], seed=2)
    c = compare_runs("s", base, cand)
    assert c.verdict == UNCHANGED, c.reason
    assert c.ratio == pytest.approx(1.0, abs=0.01)
    assert c.ci_low < 1 < c.ci_high


def test_a_large_slowdown_is_slower_and_a_large_speedup_is_faster():
    base = runs([10, 10.1, 9.9, 10.05, 9.95], seed=1)
    assert compare_runs("s", base, runs([13.0, 13.1, 13.05], seed=3)).verdict == SLOWER
    assert compare_runs("s", base, runs([7.0, 7.1, 7.05], seed=3)).verdict == FASTER


def test_one_run_each_gets_an_honest_wide_interval_from_the_prior():
    # Two single runs cannot tell the run-to-run drift apart from a change: no false "unchanged".
    c = compare_runs("s", runs([10]), runs([10.3], seed=5))
    assert c.verdict == INCONCLUSIVE
    assert c.ci_high > 1.10 and "baseline runs" in c.reason


def test_p_value_is_the_t_test_of_the_model():
    base = [meas([10.0] * 5), meas([11.0] * 5), meas([10.5] * 5)]
    cand = [meas([12.0] * 5)]
    cfg = GateConfig(run_noise=0.05, prior_runs=4)
    c = compare_runs("s", base, cand, cfg)
    b = [math.log(10), math.log(11), math.log(10.5)]
    mean_b = sum(b) / 3
    ss = sum((v - mean_b) ** 2 for v in b)
    tau2 = (4 * math.log1p(0.05) ** 2 + ss) / (4 + 2)  # constant samples: no within-run error
    # the prior is only a guess (no history to fit one): both sides share the spread the baseline's runs inform
    se = math.sqrt(tau2 * (1 / 3 + 1))
    d = math.log(12) - mean_b
    assert c.ratio == pytest.approx(12 / math.exp(mean_b))
    assert c.df == 6 and c.pooled
    assert c.p_value == pytest.approx(st.t.sf(d / se, 6))  # one-sided, observed direction
    # a family of one decided at alpha=0.01 one-sided, split over the gate's 3 looks (3, 5 and 7 candidate
    # runs): the interval shown is the two-sided one at 1 - 2 x 0.01 / 3
    q = st.t.ppf(1 - 0.01 / 3, 6)
    assert c.looks == 3 and c.confidence == pytest.approx(1 - 0.02 / 3)
    assert (c.ci_low, c.ci_high) == pytest.approx((math.exp(d - q * se), math.exp(d + q * se)))


def test_significant_but_below_threshold_is_unchanged_and_threshold_is_per_scenario():
    base = runs([10.0] * 8, spread=0.001, seed=1)
    cand = runs([10.3] * 4, spread=0.001, seed=2)        # a real +3%
    cfg = GateConfig(run_noise=0.001)
    assert compare_runs("s", base, cand, cfg).verdict == UNCHANGED
    strict = runs([10.3] * 4, spread=0.001, seed=2, threshold=0.01)
    c = compare_runs("s", base, strict, cfg)
    assert c.verdict == SLOWER and c.threshold == 0.01


def test_environment_difference_is_incomparable_unless_allowed():
    other = dict(ENV, torch_major_minor="2.12", hostname="b")
    base = runs([10, 10], seed=1)
    cand = runs([10], seed=2, env=other)
    c = compare_runs("s", base, cand)
    assert c.verdict == INCOMPARABLE
    assert c.differences == {"torch_major_minor": ("2.13", "2.12")}   # hostname drift never counts
    assert "torch_major_minor" in c.reason
    assert compare_runs("s", base, cand, GateConfig(allow_env_mismatch=True)).verdict != INCOMPARABLE


def test_scenario_metadata_difference_is_incomparable():
    base = runs([10, 10], seed=1)
    cand = runs([10], seed=2, metadata={"dtype": "bfloat16"})
    c = compare_runs("s", base, cand)
    assert c.verdict == INCOMPARABLE and "metadata.dtype" in c.differences


def test_identical_constant_samples_are_unchanged_not_a_crash():
    base = [meas([5.0] * 10) for _ in range(6)]
    cand = [meas([5.0] * 10) for _ in range(3)]
    c = compare_runs("s", base, cand, GateConfig(run_noise=0.01))
    assert c.verdict == UNCHANGED and c.ratio == 1.0 and c.p_value == pytest.approx(0.5)  # one-sided at d=0


def test_zero_baseline_median_is_inconclusive():
    c = compare_runs("s", [meas([0.0, 0.0, 0.0])], [meas([1.0, 1.0, 1.0])])
    assert c.verdict == INCONCLUSIVE and "0 ms" in c.reason


def test_too_few_samples_to_reach_alpha_is_inconclusive():
    c = compare_runs("s", [meas([1.0, 1.1])], [meas([5.0, 5.1])])
    assert c.verdict == INCONCLUSIVE and "too few samples" in c.reason


def test_unequal_sample_sizes_work():
    base = runs([10] * 6, n=50, seed=1)
    cand = runs([15] * 3, n=7, seed=2)
    assert compare_runs("s", base, cand).verdict == SLOWER


def test_missing_scenario_on_either_side_is_reported_not_an_error():
    out = compare_sets({"a": runs([1, 1], name="a")}, {"b": runs([1], name="b")})
    # missing now: inconclusive (strict fails it); not in the baseline: new, said and never failed
    assert [(c.name, c.verdict) for c in out] == [("a", INCONCLUSIVE), ("b", NEW)]
    assert "current run" in out[0].reason and "baseline" in out[1].reason


def test_family_adjustment_can_turn_a_lone_regression_into_inconclusive():
    base = runs([10, 10.1, 9.9], seed=1)
    one_look = GateConfig(run_noise=0.02, min_runs=1, max_runs=1)   # a dedicated runner: one run decides
    c = compare_runs("s", base, runs([10.9], seed=2), one_look)
    assert c.verdict == SLOWER and 0.001 < c.p_value < 0.01
    (adj,) = decide_family([estimate("s", base, runs([10.9], seed=2), one_look)], one_look, family_size=50)
    assert adj.p_adjusted == pytest.approx(min(1, c.p_value * 50))
    assert adj.verdict != SLOWER
    # the interval shown is the one the adjusted verdict used: wider, and now covering 1
    assert adj.confidence == pytest.approx(1 - 2 * 0.01 / 50)
    assert adj.ci_low < 1 < adj.ci_high and c.ci_low > 1
    assert "bonferroni over 50 scenarios" in adj.adjustment


def test_a_file_decided_as_the_session_decides_gets_bonferroni_and_holm_only_when_asked():
    """#28: the CLI used Holm over every scenario, the session Bonferroni as each test ended; at the margin they
    gave two answers for one file. By default the CLI now takes the session's rule; `as_session=False` (the CLI's
    --adjust) takes every p-value at once."""
    one_look = GateConfig(run_noise=0.02, min_runs=1, max_runs=1)
    base = {n: runs([10, 10.1, 9.9], seed=i, name=n) for i, n in enumerate("abc")}
    new = {"a": runs([10.9], seed=7, name="a"), "b": runs([10.8], seed=8, name="b"), "c": runs([10], seed=9, name="c")}
    raw = {c.name: c.p_value for c in compare_sets(base, new, one_look, as_session=False)}
    session = {c.name: c for c in compare_sets(base, new, one_look)}
    holm = {c.name: c for c in compare_sets(base, new, one_look, as_session=False)}
    assert all(session[n].p_adjusted == pytest.approx(min(1.0, raw[n] * 3)) for n in raw)
    lowest = min(raw, key=raw.get)
    second = sorted(raw, key=raw.get)[1]
    assert holm[second].p_adjusted == pytest.approx(min(1.0, max(raw[lowest] * 3, raw[second] * 2)))
    assert "bonferroni over 3 scenarios (each decided as its test ends; holm needs every" in session["a"].adjustment
    assert "asked for" not in session["a"].adjustment and holm["a"].adjustment.startswith("holm over")
    (plain,) = decide_family([estimate("a", base["a"], new["a"], GateConfig(adjust="bonferroni"))],
                             GateConfig(adjust="bonferroni"), family_size=3)
    assert "bonferroni over 3 scenarios (each decided as its test ends)" in plain.adjustment


def test_gate_config_refuses_nonsense():
    with pytest.raises(ValueError):
        GateConfig(alpha=0)
    with pytest.raises(ValueError):
        GateConfig(adjust="sidak")
    with pytest.raises(ValueError):
        GateConfig(threshold=float("nan"))


def test_one_process_cannot_say_slower_but_fresh_processes_can():
    from bench_core.deciding.sequential import worth_replicating

    base = runs([10, 10.1, 9.9, 10.05, 9.95], seed=1)
    slow_process = runs([13.0], seed=3)
    first = compare_runs("s", base, slow_process)
    assert first.verdict == INCONCLUSIVE and "one slow process looks the same" in first.reason
    assert first.more_runs == 3 and worth_replicating(first, GateConfig())
    calm = runs([10.0, 10.05], seed=4)                     # the fresh processes disagree: no regression
    assert compare_runs("s", base, slow_process + calm).verdict != SLOWER
    real = runs([13.0, 13.05], seed=5)                     # they agree: a regression
    c = compare_runs("s", base, slow_process + real)
    assert c.verdict == SLOWER and c.candidate_runs == 3
    faster_looking = compare_runs("s", base, runs([7.0], seed=6))
    assert worth_replicating(faster_looking, GateConfig())       # a possible speedup is chased as a slowdown is
    assert not worth_replicating(c, GateConfig())                # nor decided ones


def test_each_side_keeps_its_own_spread_so_disagreeing_candidate_processes_widen_their_interval():
    import numpy as np

    from bench_core.deciding.estimate import estimate_logs, welch_df
    from bench_core.deciding.gate import decide_family
    from bench_core.core.stats import VariancePrior

    prior = VariancePrior(0.04 ** 2, 8, "fitted for the test")      # the machine: 4% run to run, worth 8 runs
    base = np.log([10.0, 10.02, 9.98, 10.01, 9.99, 10.0, 10.03, 9.97, 10.0, 10.01])   # ten runs that agree
    two_slow = np.log([11.6, 11.62, 10.0])       # two of three candidate processes 16% slow, one not
    agree = np.log([11.0, 11.02, 10.98])         # three that agree on +10%
    cfg = GateConfig()

    def decided(c_log):
        (c,) = decide_family([estimate_logs(base, c_log, cfg, prior, name="s")], cfg)
        return c
    mixed, real = decided(two_slow), decided(agree)
    vb = prior.moderate(float(np.var(base, ddof=1)), 9)[0]
    vc = prior.moderate(float(np.var(two_slow, ddof=1)), 2)[0]
    assert mixed.run_spread == pytest.approx(math.sqrt(vb)) and mixed.candidate_spread == pytest.approx(math.sqrt(vc))
    assert mixed.se == pytest.approx(math.sqrt(vb / 10 + vc / 3))
    assert mixed.df == pytest.approx(welch_df(vb / 10, 17, vc / 3, 10)) and mixed.spread_df == (17, 10)
    # +10.5% on average, but the candidate's own processes disagree by 16%: not called slower ...
    assert mixed.ratio > 1.09 and mixed.verdict != SLOWER
    # ... where pooling the two sides' spreads (the baseline's ten quiet runs dominate) would have called it
    pooled = estimate_logs(base, two_slow, cfg, prior, pooled=True, name="s")
    assert pooled.se < mixed.se and pooled.guard < mixed.guard
    (pooled,) = decide_family([pooled], cfg)
    assert pooled.verdict == SLOWER
    # and the verdict says why its interval is wide
    assert f"the candidate's runs spread {math.expm1(mixed.candidate_spread):.1%} against its baseline's" in mixed.reason
    # processes that agree on the change are called slower
    assert real.verdict == SLOWER and real.candidate_spread < mixed.candidate_spread
    # Welch-Satterthwaite: equal parts with equal df give twice the df; a known part adds none
    assert welch_df(1.0, 5, 1.0, 5) == pytest.approx(10) and welch_df(1.0, math.inf, 0.0, math.inf) == math.inf
    assert welch_df(1.0, 5, 1.0, math.inf) == pytest.approx(4 * 5)


def test_one_candidate_run_spreads_like_its_baseline_even_when_the_machines_prior_is_worth_almost_nothing():
    import numpy as np

    from bench_core.deciding.estimate import estimate_logs
    from bench_core.deciding.gate import decide_family
    from bench_core.deciding.sequential import possible_change
    from bench_core.core.stats import VariancePrior

    weak = VariancePrior(0.01 ** 2, 0.5, "fitted from scenarios of very different spreads")   # measured: 0.48 df
    base = np.log([10.0, 10.5, 9.6, 10.2, 9.9])
    cfg = GateConfig()
    (first,) = decide_family([estimate_logs(base, np.log([11.0]), cfg, weak, name="s")], cfg)
    # one run: the baseline's spread and df, so a first look can still chase a possible change
    assert first.pooled and first.candidate_spread == first.run_spread and first.spread_df[1] == first.spread_df[0]
    assert first.df > 4 and possible_change(first, cfg.chase_p)
    # three runs that disagree: each side its own spread; almost no df, an unbounded interval, but a verdict
    (three,) = decide_family([estimate_logs(base, np.log([11.0, 14.0, 9.0]), cfg, weak, name="s")], cfg)
    assert not three.pooled and three.df < 4 and three.verdict == INCONCLUSIVE and math.isfinite(three.ci_low)


def test_a_change_inside_the_guard_against_an_unlucky_baseline_is_not_declared():
    from bench_core.core.stats import VariancePrior

    known = VariancePrior(0.02 ** 2, math.inf, "known for the test")   # tau = 2%, exactly
    base = [meas([10.0] * 20) for _ in range(3)]
    cfg = GateConfig(threshold=0.01)
    # k = m = 3: the t-test needs d > 2.71 * 0.816 tau = 2.2 tau (alpha over 3 looks); the guard asks for
    # tau * (z(0.03 / 3) + z(0.005)) / sqrt(3) = 2.8 tau
    c = compare_runs("s", base, [meas([10.0 * math.exp(0.047)] * 20) for _ in range(3)], cfg, known)
    assert c.guard == pytest.approx(0.02 * (st.norm.isf(0.01) + st.norm.isf(0.005)) / math.sqrt(3))
    assert c.p_adjusted < 0.005 and c.verdict == INCONCLUSIVE and "unlucky baseline" in c.reason
    c = compare_runs("s", base, [meas([10.0 * math.exp(0.06)] * 20) for _ in range(3)], cfg, known)
    assert c.verdict == SLOWER


def test_unchanged_is_an_equivalence_test_at_the_decided_level():
    from bench_core.core.stats import VariancePrior

    base = [meas([10.0] * 20) for _ in range(5)]
    cand = [meas([10.2] * 20) for _ in range(3)]
    tight = compare_runs("s", base, cand, GateConfig(), VariancePrior(0.01 ** 2, math.inf, "quiet"))
    assert tight.verdict == UNCHANGED and tight.ci_high < 1.10
    loose = compare_runs("s", base, cand, GateConfig(), VariancePrior(0.05 ** 2, math.inf, "noisy"))
    assert loose.verdict == INCONCLUSIVE and loose.ci_high > 1.10
    assert loose.more_runs == 10 and "about 10 candidate runs in all would likely decide" in loose.reason
    # by the same model, 10 runs at this level are enough
    assert compare_runs("s", base, [meas([10.2] * 20) for _ in range(10)], GateConfig(),
                        VariancePrior(0.05 ** 2, math.inf, "noisy")).verdict == UNCHANGED
    noisier = compare_runs("s", base, cand, GateConfig(), VariancePrior(0.08 ** 2, math.inf, "noisier"))
    assert noisier.more_runs is None and "record more baseline runs" in noisier.reason


def test_the_prior_comes_from_the_baselines_history_and_gives_a_quiet_runner_its_power():
    from bench_core.deciding.estimate import noise_prior

    rng = __import__("numpy").random.default_rng(7)
    # a quiet runner: 8 scenarios x 6 runs with a 1% run-to-run spread
    history = {f"s{j}": runs(list(10 * (1 + 0.01 * rng.standard_normal(6))), seed=j, name=f"s{j}", spread=0.001)
               for j in range(8)}
    prior = noise_prior(history)
    assert prior is not None and 0.005 < math.sqrt(prior.variance) < 0.02 and "fitted from 8" in prior.source
    cand = runs([10.4, 10.45, 10.38], seed=30, name="s0", spread=0.001)     # +4%: inside the 10% fallback
    fitted = compare_runs("s0", history["s0"], cand, GateConfig(threshold=0.02), prior)
    fallback = compare_runs("s0", history["s0"], cand, GateConfig(threshold=0.02))
    assert fitted.verdict == SLOWER and fallback.verdict != SLOWER
    assert fitted.run_spread < fallback.run_spread and "fixed: 10%" in fallback.prior
    assert fitted.baseline_spread == pytest.approx(float(__import__("numpy").std(
        [math.log(m.summary.median) for m in history["s0"]], ddof=1)))
    assert noise_prior({"a": history["s0"], "b": history["s1"]}) is None   # too few to fit a spread


def test_a_rolling_window_compares_with_the_latest_runs():
    base = runs([20, 20, 20, 10, 10.1, 9.9, 10.05], seed=1)           # the old runs were on other code
    cand = runs([10, 10.02, 9.98], seed=2)
    assert compare_runs("s", base, cand, GateConfig(window=4)).baseline_runs == 4
    assert compare_runs("s", base, cand, GateConfig(window=4)).ratio == pytest.approx(1.0, abs=0.02)
    with pytest.raises(ValueError, match="window"):
        GateConfig(window=0)
    with pytest.raises(ValueError, match="min_runs"):
        GateConfig(min_runs=6, max_runs=5)
    assert GateConfig().looks == (3, 5, 7) and GateConfig(min_runs=1, max_runs=6).looks == (1, 3, 5, 6)
    assert GateConfig(min_runs=9).max_runs == 9 and GateConfig().max_runs == 7     # the budget follows min_runs


def test_pooling_refuses_other_scenarios():
    from bench_core import InvalidRecord

    a, b = runs([1.0], name="a")[0], runs([1.0], name="b")[0]
    with pytest.raises(InvalidRecord, match="same scenario"):
        a.pooled_with(b)
    assert a.pooled_with(a).repeats == 2 * a.repeats


def test_on_the_cpu_another_thread_count_or_processor_is_incomparable():
    from dataclasses import replace

    base = [replace(m, threads=1) for m in runs([10, 10.1, 9.9], seed=1)]
    c = compare_runs("s", base, [replace(m, threads=2) for m in runs([10.2], seed=2)])
    assert c.verdict == INCOMPARABLE and c.differences["threads"] == (1, 2)
    elsewhere = runs([10.2], seed=2, env=dict(ENV, cpu_model="another CPU", cpu_count=64))
    c = compare_runs("s", runs([10, 10.1, 9.9], seed=1), elsewhere)
    assert c.verdict == INCOMPARABLE and set(c.differences) == {"cpu_model", "cpu_count"}
    assert compare_runs("s", runs([10, 10.1, 9.9], seed=1), elsewhere,
                        GateConfig(allow_env_mismatch=True)).verdict != INCOMPARABLE


def test_the_comparison_table_says_shared_advice_once():
    from bench_core.output.comparison_tables import comparison_table

    out = comparison_table(compare_sets({"a": runs([10]), "b": runs([5])},
                                        {"a": runs([10.3], seed=5), "b": runs([5.1], seed=6)}), 0.01)
    assert out.count("record more baseline runs") == 1
    assert "to decide the inconclusive ones: record more baseline runs" in out
    assert "a: inconclusive: no significant change" in out and "b: inconclusive: no significant change" in out


def test_a_baseline_too_small_or_recorded_in_one_sitting_is_named():
    from bench_core.deciding.gate import baseline_warnings

    assert "holds 2 run(s)" in baseline_warnings("main", ["2026-12-01T10:00:00+00:00", "2026-12-01T18:00:00+00:00"])[0]
    same_hour = [f"2026-12-01T10:{m:02d}:00+00:00" for m in (0, 10, 20, 30)]
    (note,) = baseline_warnings("main", same_hour)
    assert "within 30 min" in note and "too uniform" in note
    spread_out = ["2026-12-01T10:00:00+00:00", "2026-12-01T16:00:00+00:00", "2026-12-02T09:00:00+00:00"]
    assert baseline_warnings("main", spread_out) == []


def test_the_table_shows_the_baselines_own_run_to_run_spread():
    from bench_core.output.comparison_tables import comparison_table

    base = runs([10, 10.5, 9.5, 10.2, 9.8], seed=1)
    c = compare_runs("s", base, runs([10.1, 10.0, 9.9], seed=2))
    spread = math.expm1(float(__import__("numpy").std([math.log(m.summary.median) for m in base], ddof=1)))
    assert c.baseline_spread is not None and f"5/3 ({spread:.1%})" in comparison_table([c], 0.01)


def test_the_gate_simulation_drives_the_gates_own_protocol():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "quality" / "gate_sim.py"
    spec = importlib.util.spec_from_file_location("gate_sim", path)
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    # seeded, so deterministic: a 30% slowdown at a quiet 3% spread is found from 3 runs; 1 run never says slower
    found = sim.cell((0.03, False, math.log(1.3), "3", 20, 5, 11, {}, 5, False))
    assert found["rate"] >= 0.9 and found["mean_runs"] == 3
    assert sim.cell((0.03, False, math.log(1.3), "1", 20, 5, 12, {}, 5, False))["rate"] == 0.0
    replicated = sim.cell((0.03, False, math.log(1.3), "replicate", 20, 5, 13, {}, 5, False))
    assert replicated["rate"] >= 0.9 and 3 <= replicated["mean_runs"] <= 5      # fresh processes were started
    unchanged = sim.cell((0.03, False, 0.0, "replicate", 10, 20, 14, {}, 5, False))
    assert unchanged["rate"] <= 0.01 and unchanged["mean_runs"] < 3              # most unchanged code is not chased
    # the ceiling: told which processes were slow, the gate sees only the others (and still counts them as runs)
    rng = __import__("numpy").random.default_rng(15)
    seen = sum(sim.draw(rng, 5, 0.03, True, told=True).size for _ in range(400))
    assert 0.75 * 2000 < seen < 0.85 * 2000      # 20% of processes are slow, and dropped
    told = sim.cell((0.03, True, math.log(1.3), "3", 20, 5, 16, {}, 10, True))
    assert told["rate"] >= 0.9 and told["mean_runs"] == 3


def test_one_fail_rule_and_one_tally_for_every_gate():
    from bench_core.deciding.comparison import Comparison, tally

    c = lambda verdict, **kw: Comparison("s", verdict, "", 0.05, **kw)
    assert [x.fails() for x in (c("slower"), c("incomparable"), c("unchanged", grown=("launches",)),
                                c("inconclusive", unusable=True))] == [True] * 4
    assert not c("faster").fails() and not c("inconclusive").fails() and c("inconclusive").fails(strict=True)
    assert tally([c("slower"), c("faster"), c("inconclusive"), c("new")]) == (
        "2 of 3 scenario(s) decided: 1 slower, 1 faster, 0 unchanged; 1 inconclusive, 0 incomparable", 2, 3)


def test_a_run_that_jumped_far_beyond_the_machines_spread_keeps_its_own_spread_and_calls_nothing():
    import numpy as np

    from bench_core.core.stats import VariancePrior
    from bench_core.deciding.estimate import estimate_logs
    from bench_core.deciding.slow_runs import SlowRuns

    # a fleet's prior: 2% run to run, fitted from thousands of scenarios (what a merged suite of 2,000 gives)
    strong = VariancePrior(0.02 ** 2, 3000, "fitted for the test")
    cfg = GateConfig(min_runs=1)

    def decided(b, c, prior=strong):
        (out,) = decide_family([estimate_logs(np.log(b), np.log(c), cfg, prior, name="s")], cfg)
        return out
    tight = [1.0, 1.01, 0.99]
    # one baseline run 1.5x among tight ones: before, the prior's 2% replaced its own spread and a plain run read
    # "faster" 0.87; now that side keeps its own spread, and the note says why nothing is decided
    jumped_base = decided([1.5, 1.0, 1.01], [1.0])
    assert jumped_base.verdict == INCONCLUSIVE and jumped_base.ratio < 0.9
    assert any("the baseline's runs spread far beyond this machine's usual" in n and "re-record the baseline" in n
               for n in jumped_base.notes)
    jumped_cand = decided(tight, [1.5, 1.0, 1.01])     # a candidate run that jumped, with two fresh ones that did not
    assert jumped_cand.verdict == INCONCLUSIVE
    assert any("the candidate's runs spread far" in n for n in jumped_cand.notes)
    # a real change every run agrees on is still called, and an ordinary scenario still borrows the machine's spread
    assert decided(tight, [1.5, 1.51, 1.49]).verdict == SLOWER
    ordinary = decided([1.0, 1.03, 0.98], [1.01, 0.99, 1.02])
    assert not ordinary.notes and ordinary.run_spread == pytest.approx(0.02, rel=0.01)
    # on a machine with slow processes, a run at its slow level is the model's to explain, not a jump
    for share, excess in ((0.05, 1.1), (0.03, 1.2)):     # a rare slow level too: its excess is the model's
        two = VariancePrior(0.02 ** 2, 3000, "fitted for the test", SlowRuns(share, math.log(excess), 900, 300))
        slow_run = decided([excess, 1.0, 1.01], [1.0], two)
        assert not slow_run.notes and slow_run.slow_runs is not None
    jump_on_two = decided([1.5, 1.0, 1.01], [1.0], two)   # beyond both levels: its own spread, one level
    assert jump_on_two.notes and jump_on_two.slow_runs is None and "a run beyond both levels" in jump_on_two.prior
    # an interval on a spread of one degree of freedom is said in three digits, not thirty
    one_df = decided(tight, [1.5, 1.0])
    assert "e+" in one_df.reason and len(one_df.reason) < 400, one_df.reason


def test_confirm_replicates_only_what_the_gate_would_call_but_for_its_minimum_of_runs():
    from bench_core.deciding.sequential import worth_replicating

    base = runs([10, 10.1, 9.9, 10.05, 9.95], seed=1)
    confirm = GateConfig(chase="confirm")
    would_be = compare_runs("s", base, runs([13.0], seed=3))
    assert would_be.pending == SLOWER and worth_replicating(would_be, confirm)
    assert compare_runs("s", base, runs([7.0], seed=6)).pending == FASTER
    # +15% from one run, in a family of 2,000: "possible" chases it at its own p, "confirm" only what looks changed
    # over the whole family
    (possible,) = decide_family([estimate("s", base, runs([11.5], seed=4))], family_size=2000)
    assert possible.pending is None and worth_replicating(possible, GateConfig())
    assert not worth_replicating(possible, confirm)
    from bench_core.deciding.gate import gate_advice
    assert "--bench-replicate possible --bench-max-runs 5" in gate_advice("main", chase="confirm")(5)
    # changed-looking, but only more baseline runs could decide it: no fresh process is spent on it, run after run
    baseline_bound = compare_runs("s", runs([10, 10.1], seed=1), runs([10.8] * 4, seed=2), confirm)
    assert baseline_bound.pending == SLOWER and baseline_bound.more_runs is None
    assert not worth_replicating(baseline_bound, confirm)
    decided = compare_runs("s", base, runs([13.0, 13.05, 12.95], seed=5))
    assert decided.verdict == SLOWER and decided.pending is None and not worth_replicating(decided, confirm)
    with pytest.raises(ValueError, match="chase must be one of possible, confirm"):
        GateConfig(chase="always")


def test_confirm_chases_a_change_that_only_the_machines_slow_processes_could_explain():
    """On a machine whose history shows 3% of runs 57% slow, one run 1.5x above its baseline, and three, may all
    have been slow: significant but for that chance, so fresh runs confirm it; the same jump among runs that
    did not jump is nothing to confirm."""
    import numpy as np

    from bench_core.core.stats import VariancePrior
    from bench_core.deciding.estimate import estimate_logs
    from bench_core.deciding.slow_runs import SlowRuns

    two = VariancePrior(0.02 ** 2, 3000, "fitted for the test", SlowRuns(0.03, math.log(1.57), 6000, 2000))
    cfg = GateConfig(chase="confirm")

    def decided(c, config=cfg):
        (out,) = decide_family([estimate_logs(np.log([1.0, 1.01, 0.99]), np.log(c), config, two, name="s")],
                               config, family_size=2000)
        return out
    for runs_ in ([1.5], [1.5, 1.51, 1.49]):
        c = decided(runs_)
        assert c.verdict == INCONCLUSIVE and c.pending == SLOWER and c.p_value > 2.0e-5, c.reason
    assert decided([1.5, 1.51, 1.49, 1.5, 1.5]).verdict == SLOWER        # five such runs are not all slow
    assert decided([1.5, 1.0, 1.01]).pending is None                    # one slow run among fast ones
    # where one run may decide, the verdict says what keeps it from doing so
    one = decided([1.5], GateConfig(chase="confirm", min_runs=1))
    assert one.verdict == INCONCLUSIVE and "may have been this machine's slow processes (3% of runs" in one.reason
