import math

import numpy as np
import pytest
from scipy import stats as st

from bench_core.files import storage
from bench_core import ColdStart, InvalidRecord, Measurement, Memory, Scenario
from bench_core.core.stats import adjust_pvalues, bootstrap_median_ci, summarize


def make(samples, name="s", **kw):
    kw.setdefault("device", "cpu")
    return Measurement(Scenario(name, ("compute",)), mode="per_call", block_size=1, warmup=0,
                       repeats=len(samples), host_ms=tuple(samples), cold_start=ColdStart(1.0), **kw)


def test_summary_matches_numpy_and_counts_tukey_outliers():
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 100.0]
    s = summarize(x)
    assert s.n == 9 and s.min == 1.0 and s.max == 100.0
    assert s.median == 5.0
    assert s.q1 == 3.0 and s.q3 == 7.0 and s.iqr == 4.0   # numpy's linear percentiles
    assert s.mean == pytest.approx(np.mean(x))
    assert s.stdev == pytest.approx(np.std(x, ddof=1))
    assert s.cv == pytest.approx(np.std(x, ddof=1) / np.mean(x))
    assert (s.low_outliers, s.high_outliers) == (0, 1)   # 100 > 7 + 1.5*4


def test_summary_refuses_empty_and_nan():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_bootstrap_ci_brackets_the_median_and_is_zero_width_for_constants():
    rng = np.random.default_rng(1)
    x = rng.normal(10, 1, 200)
    lo, hi = bootstrap_median_ci(x)
    assert lo < np.median(x) < hi and hi - lo < 1.0
    assert bootstrap_median_ci([3.0, 3.0, 3.0]) == (3.0, 3.0)


def test_holm_and_bonferroni_hand_computed():
    p = [0.01, 0.04, 0.03, None, 0.005]
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> monotone 0.06
    assert adjust_pvalues(p, "holm") == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    assert adjust_pvalues(p, "bonferroni") == pytest.approx([0.04, 0.16, 0.12, None, 0.02])


def test_bh_matches_scipy():
    p = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205]
    assert adjust_pvalues(p, "bh") == pytest.approx(list(st.false_discovery_control(p)))


def test_t_and_chi2_figures_are_scipy_stats_own_without_importing_it():
    import subprocess
    import sys

    from bench_core.core.stats import chi2_quantile, t_interval, t_quantile, t_sf, t_test

    for df in (1, 2.5, 11, 35, math.inf):
        for x in (-3.0, 0.0, 0.7, 2.5, 12.0):
            assert t_sf(x, df) == pytest.approx(st.t.sf(x, df), rel=1e-12)
        assert t_test(-0.02, 0.01, df) == pytest.approx(st.t.sf(2.0, df), rel=1e-12)   # the direction observed
        for p in (1e-6, 0.0025, 0.05, 0.4):
            assert t_quantile(p, df) == pytest.approx(st.t.isf(p, df), rel=1e-12)
        lo, hi = t_interval(0.1, 0.02, df, 0.99)
        assert hi - 0.1 == pytest.approx(0.02 * st.t.ppf(0.995, df), rel=1e-12) and 0.1 - lo == pytest.approx(hi - 0.1)
    np.testing.assert_allclose(chi2_quantile(np.array([0.001, 0.5, 0.999]), 4.5),
                               st.chi2.ppf([0.001, 0.5, 0.999], 4.5), rtol=1e-12)
    # a process-mode parent decides with these and nothing else of scipy.stats, whose import took 0.53 s here
    code = ("import sys; from bench_core.deciding.rounds import over_rounds; o = over_rounds([0.01, 0.03, 0.02]); "
            "o.p_one_sided(); o.interval(0.99); print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_adjust_refuses_bad_method_and_values():
    with pytest.raises(ValueError, match="unknown"):
        adjust_pvalues([0.1], "sidak")
    with pytest.raises(ValueError):
        adjust_pvalues([1.5], "holm")


@pytest.mark.parametrize("bad, needle", [
    ([1.0, float("nan")], "must be finite"),
    ([1.0, float("inf")], "must be finite"),
    ([1.0, -0.5], "cannot be negative"),
    ([1.0, "x"], "not a number"),
    ([1.0], "at least 2 samples"),
])
def test_measurement_refuses_impossible_samples(bad, needle):
    with pytest.raises(InvalidRecord, match=needle):
        make(bad)


def test_measurement_refuses_gpu_time_on_cpu_and_length_mismatch():
    with pytest.raises(InvalidRecord, match="no GPU time"):
        make([1.0, 2.0], gpu_ms=(1.0, 2.0))
    with pytest.raises(InvalidRecord, match="differ in length"):
        make([1.0, 2.0], device="cuda", gpu_ms=(1.0,))


def test_measurement_is_immutable_and_round_trips():
    m = make([1.0, 2.0, 3.0], items=4, environment={"device": "cpu"})
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        m.device = "cuda"
    back = storage.measurement_from_doc(storage.measurement_doc(m, with_environment=True))
    assert back == m
    assert back.summary.median == 2.0 and back.throughput == pytest.approx(4 / 0.002)


def test_primary_figure_is_gpu_time_when_present():
    m = make([5.0, 5.0], device="cuda", gpu_ms=(1.0, 3.0))
    assert m.timer == "cuda_event" and m.summary.median == 2.0 and m.host_summary.median == 5.0


def test_memory_refuses_negative_and_reports_unobserved():
    with pytest.raises(InvalidRecord):
        Memory(peak_allocated_bytes=-1)
    assert not Memory().observed and Memory(device_allocs=0).observed


@pytest.mark.parametrize("kw, needle", [
    (dict(name="", window=("forward",)), "non-empty"),
    (dict(name="a", window=()), "at least one stage"),
    (dict(name="a", window=("forwards",)), "unknown stage"),
    (dict(name="a", window=("model_load", "request")), "never inside a request"),
    (dict(name="a", window=("forward",), noise_threshold=1.5), "noise_threshold"),
    (dict(name="a", window=("forward",), noise_threshold=math.nan), "noise_threshold"),
])
def test_scenario_validates_its_boundaries(kw, needle):
    with pytest.raises(InvalidRecord, match=needle):
        Scenario(**kw)


def test_scenario_metadata_is_frozen_and_round_trips():
    s = Scenario("a", ["forward", "backward"], {"shapes": {"x": [2, 3]}, "dtype": "float32"})
    with pytest.raises(TypeError):
        s.metadata["dtype"] = "float16"
    assert s.window == ("forward", "backward")
    assert storage.scenario_from_doc(storage.scenario_doc(s)) == s
    assert storage.scenario_doc(s.with_metadata(device="cuda"))["metadata"]["device"] == "cuda"


def test_writing_a_result_runs_no_bootstrap(monkeypatch):
    # derived figures are computed when shown, not on every write
    import bench_core.core.stats

    def boom(*a, **k):
        raise AssertionError("a bootstrap ran while serializing")

    monkeypatch.setattr(bench_core.core.stats._st, "bootstrap", boom)
    d = storage.measurement_doc(make([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]))
    assert d["summary"]["median"] == 4.0 and "median_ci95" not in d["summary"]


def test_big_legal_inputs_neither_overflow_nor_exhaust_memory(monkeypatch):
    from bench_core.core import stats

    assert stats.mann_whitney_min_p(3000, 3000) == 0.0          # 2 / C(6000, 3000) underflows, no OverflowError
    assert stats.mann_whitney_min_p(2, 2) == pytest.approx(2 / 6)
    monkeypatch.setattr(stats, "BOOTSTRAP_CELLS", 10_000)       # a small cap, to see the batching work
    x = np.random.default_rng(0).lognormal(0, 0.05, 5_000)
    se = stats.median_log_se(x, n_resamples=200)
    assert 0 < se < 0.01
    lo, hi = stats.bootstrap_median_ci(x, n_resamples=200)
    assert lo < np.median(x) < hi


def test_the_variance_prior_recovers_a_known_prior_and_is_never_worth_more_than_its_data():
    import numpy as np

    from bench_core.core.stats import fit_variance_prior

    rng = np.random.default_rng(0)
    # limma's model: sigma^2 ~ s0^2 d0 / chi^2_d0, s^2 ~ sigma^2 chi^2_4 / 4, with s0^2 = 0.01 and d0 = 8
    sigma2 = 8 * 0.01 / rng.chisquare(8, 20000)
    prior = fit_variance_prior(sigma2 * rng.chisquare(4, 20000) / 4, [4] * 20000)
    assert prior.variance == pytest.approx(0.01, rel=0.03) and prior.df == pytest.approx(8, rel=0.1)
    # variances that agree better than chance: limma would call the prior known; here it is worth 3 x 4 df
    agree = fit_variance_prior([0.01, 0.0101, 0.0099], [4, 4, 4])
    assert agree.df == 12 and "12 degrees of freedom" in agree.source
    assert fit_variance_prior([0.01, 0.02], [4, 4]) is None                  # too few to fit a spread
    assert fit_variance_prior([0.01, 0.0, 0.02, float("nan")], [4, 4, 4, 4]) is None   # only usable ones count
    # moderation pools: 4 df of the scenario's own with the prior's
    assert agree.moderate(0.04, 4) == pytest.approx(((12 * agree.variance + 4 * 0.04) / 16, 16))


def test_the_paired_interval_inverts_the_signed_rank_test_so_they_never_disagree():
    import numpy as np
    from scipy import stats as st

    from bench_core.core.stats import paired_ratio

    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(8, 40))
        b = 1 + 0.1 * rng.random(n)
        a = b * np.exp(rng.normal(0.03 * rng.standard_normal(), 0.05, n))
        pr = paired_ratio(a, b, 0.99)
        assert (pr.ci_low > 1 or pr.ci_high < 1) == (pr.p_value < 0.01)
        assert pr.ci_low <= pr.ratio <= pr.ci_high
        r = np.log(a) - np.log(b)
        walsh = [(r[i] + r[j]) / 2 for i in range(n) for j in range(i, n)]
        assert pr.ratio == pytest.approx(np.exp(np.median(walsh)))         # Hodges-Lehmann
        assert pr.p_value == pytest.approx(st.wilcoxon(r).pvalue)
