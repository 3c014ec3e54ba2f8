"""The two-level model of a machine's runs: slow processes fitted from history and kept apart in the gate."""
import json
import math

import numpy as np
import pytest
from scipy import stats as st

from bench_core.deciding.comparison import GateConfig
from bench_core.deciding.estimate import estimate_logs, prior_from_logs
from bench_core.deciding.gate import decide_family
from bench_core.deciding.verdicts import INCONCLUSIVE, SLOWER
from bench_core.deciding.slow_runs import SlowRuns, difference, fit_slow_runs, level_posterior
from bench_core.core.stats import VariancePrior

EXCESS = math.log(1.16)


def history(seed: int, spread: float = 0.03, slow: bool = True, scenarios: int = 9, runs: int = 10):
    """Log run medians of a machine where 20% of processes are 16% slow (gate_sim.py's model)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(scenarios):
        x = math.log(10.0 + s) + rng.normal(0.0, spread, runs)
        if slow:
            x = x + (rng.random(runs) < 0.2) * EXCESS
        out.append(x)
    return out


def decided(base, cand, prior, cfg=GateConfig()):
    (c,) = decide_family([estimate_logs(np.asarray(base), np.asarray(cand), cfg, prior, name="s")], cfg)
    return c


def test_a_history_with_slow_processes_apart_is_fitted_as_two_levels():
    prior = fit_slow_runs(history(1))
    assert prior is not None and prior.slow is not None
    assert 0.1 < prior.slow.share < 0.3 and math.log(1.12) < prior.slow.excess < math.log(1.20)
    # the spread is that of the fast runs, not inflated by the slow ones
    assert 0.02 < math.sqrt(prior.variance) < 0.04
    assert "of the runs judged fast" in prior.source and "slow, fitted from 90 runs of 9 scenarios" in prior.source
    assert prior_from_logs(history(1)) == prior      # what the gate fits from a baseline's history


def test_one_level_or_levels_too_close_to_tell_apart_stay_one_level():
    assert fit_slow_runs(history(2, slow=False)) is None
    # at an 8% spread a 16% excess is under 2 spreads: a slow run and a real change look alike
    assert fit_slow_runs(history(3, spread=0.08)) is None
    assert fit_slow_runs(history(1)[:2]) is None                      # too few scenarios
    assert fit_slow_runs([x[:2] for x in history(1)]) is None         # too few runs to tell which stand apart
    one = prior_from_logs(history(2, slow=False))
    assert one is not None and one.slow is None                        # the gate keeps its one-level prior


def test_levels_in_one_scenario_only_are_its_own_not_a_machines_slow_processes():
    """A memory-bound chain whose processes sit at several levels (glibc left alone), beside tight scenarios: the
    fit's slow runs all belong to it. Lent to the machine, its excess made a mid-level run read as a fast level 13%
    below the baseline's (a false "faster" of identical code, docs/gate.md)."""
    rng = np.random.default_rng(5)
    tight = [math.log(10.0 + s) + rng.normal(0.0, 0.003, 5) for s in range(3)]
    levels = math.log(3.0) + rng.normal(0.0, 0.03, 5) + np.array([0.0, 0.0, 1.1, 1.15, 1.2])
    assert fit_slow_runs(tight + [levels]) is None
    one = prior_from_logs(tight + [levels])
    assert one is not None and one.slow is None
    # the same levels in two scenarios are a machine's slow processes
    again = math.log(7.0) + rng.normal(0.0, 0.03, 5) + np.array([1.1, 0.0, 0.0, 1.15, 0.0])
    two = fit_slow_runs(tight[:2] + [levels, again])
    assert two is not None and two.slow is not None


def test_slow_runs_refuses_a_majority_or_a_negative_excess():
    with pytest.raises(ValueError, match="minority"):
        SlowRuns(0.6, EXCESS, 10, 3)
    with pytest.raises(ValueError, match="positive"):
        SlowRuns(0.2, -0.1, 10, 3)


def test_a_sides_fast_level_sets_its_slow_runs_apart():
    slow = SlowRuns(0.2, EXCESS, 90, 9)
    prior = VariancePrior(0.03 ** 2, math.inf, "known for the test", slow)
    fast = [0.0, 0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01]
    post = level_posterior(tuple(fast + [EXCESS, EXCESS + 0.01]), prior)
    # the two slow runs do not pull the level up: it is the fast runs' mean
    assert post.median == pytest.approx(np.mean(fast), abs=0.003)
    assert post.slow_runs == pytest.approx(2.0, abs=0.1) and post.spread == pytest.approx(0.03)
    # one run alone keeps the chance that it was slow: about the share of the posterior lies an excess below it
    one = level_posterior((0.0,), prior)
    assert one.quantile(0.5) == pytest.approx(0.0, abs=0.01)
    # a candidate run at 0 against a baseline run at EXCESS: four readings (each run fast or slow), each a
    # normal difference of two levels with sd 0.03 * sqrt(2), weighted by the shares
    apart = difference(np.array([EXCESS]), np.array([0.0]), prior)
    readings = {-EXCESS: 0.8 * 0.8 + 0.2 * 0.2, 0.0: 0.2 * 0.8, -2 * EXCESS: 0.8 * 0.2}
    want = sum(w * st.norm.cdf(-EXCESS / 2, centre, 0.03 * math.sqrt(2)) for centre, w in readings.items())
    assert apart.below(-EXCESS / 2) == pytest.approx(want, abs=0.003)


def test_a_slow_candidate_process_is_not_a_regression_but_a_real_one_is_slower():
    prior = fit_slow_runs(history(1))
    base = history(1)[0]
    level = float(np.mean(base[base - base.min() < EXCESS / 2]))
    # unchanged code, one of three candidate processes slow: the normal model's mean is +5%, not a change here
    unchanged = decided(base, [level, level + 0.01, level + EXCESS], prior)
    assert unchanged.verdict != SLOWER and unchanged.slow_runs[1] == pytest.approx(1.0, abs=0.2)
    # all three slow: +16% that the machine's slow processes explain (0.2^3 of the time), not declared at 3 runs
    all_slow = decided(base, [level + EXCESS + e for e in (0.0, 0.01, -0.01)], prior)
    assert all_slow.verdict != SLOWER and all_slow.p_value > GateConfig().alpha / len(GateConfig().looks)
    # a real +10% in five processes, one of them also slow: slower
    ten = math.log(1.10)
    real = decided(base, [level + ten + e for e in (0.0, 0.01, -0.01, 0.005)] + [level + ten + EXCESS], prior)
    assert real.verdict == SLOWER and real.ratio == pytest.approx(1.10, abs=0.02)
    # the printed interval is the posterior's at the decided level, and agrees with the verdict
    assert 1.0 < real.ci_low < real.ratio < real.ci_high
    assert real.ci_low == pytest.approx(math.exp(real.posterior.quantile((1 - real.confidence) / 2)), rel=1e-9)
    # the posterior is not stored; the counts of slow runs are, in a record the files' JSON writer takes (a
    # session that could not store its comparison exited 1 in a real run)
    stored = real.to_dict()
    assert "posterior" not in stored and stored["slow_runs"][1] == pytest.approx(1.0, abs=0.2)
    assert real.df is None and json.loads(json.dumps(stored, allow_nan=False))["slow_share"] == real.slow_share
    known = decided(base, [level + ten] * 3, VariancePrior(0.03 ** 2, math.inf, "known exactly"))
    assert math.isinf(known.df) and json.loads(json.dumps(known.to_dict(), allow_nan=False))["df"] is None


def test_the_guard_reads_each_side_on_the_side_a_false_alarm_needs():
    prior = fit_slow_runs(history(1))
    base = history(1)[0]
    cfg = GateConfig()
    c = decided(base, base[:3] + 0.3, prior, cfg)   # far slower: only the guard's arithmetic matters here
    post = c.posterior
    gb, gc = cfg.guard_baselines, cfg.guard_rate / len(cfg.looks)
    lb, lc = post.baseline, post.candidate   # each side's level
    want = (lb.quantile(1 - gb) - lb.median) + (lc.median - lc.quantile(gc))
    assert c.guard == pytest.approx(want) and c.verdict == SLOWER
    faster = decided(base, base[:3] - 0.3, prior, cfg)
    post = faster.posterior
    lb, lc = post.baseline, post.candidate   # each side's level
    want = (lb.median - lb.quantile(gb)) + (lc.quantile(1 - gc) - lc.median)
    assert faster.guard == pytest.approx(want) and faster.verdict == "faster"


def test_one_candidate_run_on_a_two_level_machine_is_chased_not_decided():
    from bench_core.deciding.sequential import possible_change

    prior = fit_slow_runs(history(1))
    base = history(1)[0]
    level = float(np.mean(base[base - base.min() < EXCESS / 2]))
    first = decided(base, [level + math.log(1.06)], prior)     # one run 6% slower
    # its p holds the chance that the one run was slow (the machine's share), which only more runs rule out:
    # the chase leaves that chance out
    assert first.verdict == INCONCLUSIVE and first.p_value > GateConfig().chase_p
    assert first.p_value - first.slow_share < GateConfig().chase_p and possible_change(first, GateConfig().chase_p)


def test_runs_orders_of_magnitude_apart_fall_back_to_one_level():
    prior = VariancePrior(1e-14, math.inf, "all but no spread", SlowRuns(0.2, EXCESS, 90, 9))
    c = decided(np.log([10.0, 10.0, 10.0]), np.log([10.0, 1e8, 10.0]), prior)
    assert c.slow_runs is None and c.posterior is None and "one level here" in c.prior
    assert c.verdict is not None


def test_a_baseline_too_short_for_a_machine_with_slow_processes_is_named():
    from bench_core.deciding.gate import baseline_warnings

    days = [f"2026-12-0{d}T10:00:00+00:00" for d in range(1, 6)]        # 5 runs on 5 days: nothing else to say
    assert baseline_warnings("main", days, prior=prior_from_logs(history(2, slow=False))) == []
    (note,) = baseline_warnings("main", days, prior=fit_slow_runs(history(1)))
    assert "show slow processes" in note and "record 10 runs" in note and "with 5 baseline runs" in note
    ten = days + [f"2026-12-1{d}T10:00:00+00:00" for d in range(5)]
    assert baseline_warnings("main", ten, prior=fit_slow_runs(history(1))) == []


def test_two_large_level_grids_convolve_by_fft_as_they_do_directly():
    """Runs far apart make level grids of tens of thousands of points, whose direct convolution took most of a
    second per decision; past `DIRECT_MAX` it is an FFT's, which must agree with the direct one to round-off and
    never hold a negative probability."""
    from bench_core.deciding.slow_runs import DIRECT_MAX, _convolved

    rng = np.random.default_rng(5)
    grid = np.linspace(-8, 8, 3000)
    a = np.exp(-0.5 * (grid - 1.0) ** 2) * (1 + 0.1 * rng.random(grid.size))
    b = np.exp(-0.5 * ((grid[:2500] + 2.0) / 0.3) ** 2)
    assert a.size * b.size > DIRECT_MAX
    fft, direct = _convolved(a, b), np.convolve(a, b)
    assert fft.shape == direct.shape and fft.min() >= 0.0
    assert np.max(np.abs(fft - direct)) < 1e-12 * direct.max()
    assert np.array_equal(_convolved(a[:100], b[:100]), np.convolve(a[:100], b[:100]))   # small: exact
