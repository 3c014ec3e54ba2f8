"""The tables people read: within 120 columns by default, every column on request."""
import pytest

from bench_core.deciding.gate import compare_sets
from bench_core.output.comparison_tables import comparison_table
from bench_core.output.fitting import WIDTH
from bench_core.output.tables import session_table
from helpers import runs


def _widest(text):
    return max(len(line) for line in text.splitlines())


def test_the_results_table_fits_120_columns_and_says_what_it_folded_or_left_out():
    results = [runs([10.0 + 5 * i], name=f"a_rather_long_scenario_name_{i}_for_the_width_check", seed=i)[0]
               for i in range(3)]
    wide = session_table(results, wide=True)
    assert _widest(wide) > WIDTH and "device" in wide.splitlines()[0]
    narrow = session_table(results)
    assert _widest(narrow) <= WIDTH
    assert "every row: device: cpu, threads: -, timer: host, mode: per_call" in narrow   # one value: said once, under it
    head = narrow.splitlines()[0]
    assert "median ms" in head and "max ms" in head                      # the figures stay in the table
    assert f"{results[2].summary.median:.3f}" in narrow
    for name in (r.name for r in results):
        assert name in narrow


def test_the_comparison_table_fits_keeps_the_verdict_and_wraps_its_notes():
    names = [f"scenario_with_a_long_descriptive_name_{i}" for i in range(2)]
    comps = compare_sets({n: runs([10, 10.2, 9.8], name=n, seed=i) for i, n in enumerate(names)},
                         {n: runs([10.1], name=n, seed=9 + i) for i, n in enumerate(names)})
    narrow = comparison_table(comps, 0.01)
    assert _widest(narrow) <= WIDTH
    assert "verdict" in narrow.splitlines()[0] and "ratio" in narrow.splitlines()[0]
    assert "\n  " in narrow                                          # a long note continues, indented
    wide = comparison_table(comps, 0.01, wide=True)
    assert _widest(wide) > WIDTH and "p (adj)" in wide.splitlines()[0]


def test_a_ratio_far_below_one_keeps_three_significant_digits():
    """A 54x speedup reads 0.0188, not 0.019 (2-3% lost to rounding where the ratio is what the reader checks)."""
    from dataclasses import replace

    from bench_core.output.comparison_tables import comparison_row

    (c,) = compare_sets({"s": runs([10, 10.2, 9.8], name="s")}, {"s": runs([0.2], name="s", seed=3)})
    assert comparison_row(replace(c, ratio=0.018765))[3] == "0.0188"
    assert comparison_row(replace(c, ratio=52.4937))[3] == "52.494"


def test_a_distribution_plot_shows_every_group_with_its_samples():
    pytest.importorskip("matplotlib")
    from bench_core.output.plots import figure, png

    groups = [("this run", (2.0, 2.1, 2.05)), ("baseline run 0", (1.0, 1.1)), ("baseline run 1", (1.05, 1.0, 1.2))]
    fig = figure("alpha: host time", groups)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["this run (n=3)", "baseline run 0 (n=2)",
                                                            "baseline run 1 (n=3)"]
    points = sorted(float(x) for c in ax.collections for x, _ in c.get_offsets())
    assert points == sorted(v for _, g in groups for v in g)             # every sample, none invented
    assert ax.get_title() == "alpha: host time" and ax.get_xlabel() == "time per call (ms)"
    data = png("alpha", groups)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_session_writes_one_plot_per_scenario_with_its_baseline_runs(tmp_path):
    pytest.importorskip("matplotlib")
    from bench_core.session import BenchSession, SessionConfig
    from fakes import FakeClock, work
    from helpers import ENV
    from bench_core import Scenario

    def session(**kw):
        return BenchSession(SessionConfig(results_dir=None, baselines_dir=tmp_path / "bl", repeats=5, warmup=0,
                                          **kw), ENV)
    for i in range(2):
        s = session(save="main", append=i > 0)
        clock = FakeClock()
        s.run(Scenario("alpha", ("forward",)), work(clock, 1.0, 2.0 + i), clock=clock)
        s.finish()
    s = session(compare="main", plots=tmp_path / "plots")
    clock = FakeClock()
    s.run(Scenario("alpha", ("forward",)), work(clock, 1.0, 2.5), clock=clock)
    assert s.plot_groups()[0][2] == [("this run", (2.5,) * 5), ("baseline run 0", (2.0,) * 5),
                                     ("baseline run 1", (3.0,) * 5)]
    lines, failures = s.finish()
    assert failures == [] and "1 distribution plot(s) written" in " ".join(lines)
    (plot,) = (tmp_path / "plots").glob("alpha*.png")
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_asking_for_plots_without_matplotlib_stops_at_once_and_says_how_to_get_it(pytester, monkeypatch):
    import bench_core.output.plots

    monkeypatch.setattr(bench_core.output.plots, "available", lambda: False)
    pytester.makepyfile(test_x="def test_x(bench):\n    pass\n")
    res = pytester.runpytest("--bench-plots", "plots")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--bench-plots: plots need matplotlib, an optional extra: pip install -e*"])
    assert '".[plots]"' in res.stderr.str()


def test_the_resource_summary_states_what_was_measured_and_what_was_not():
    from dataclasses import replace

    from bench_core import Scenario
    from bench_core.core.records import Memory
    from bench_core.output.tables import resource_table

    (copy,) = runs([4.0], name="h2d", spread=0.0)
    copy = replace(copy, scenario=Scenario("h2d", ("transfer",), {"shapes": {"bytes": 64_000_000}}), items=None,
                   memory=Memory(peak_allocated_bytes=3 * 2 ** 30, window_peak_bytes=2 ** 20))
    (step,) = runs([10.0], name="train", spread=0.0)
    step = replace(step, items=32)
    text = resource_table([copy, step], {"gpu_name": "NVIDIA H200"}, {"train": 0.25})
    flat = " ".join(text.split())
    assert "h2d 3.0 GiB 1.0 MiB - 16.00 GB/s n/o" in flat                 # 64 MB in 4 ms
    assert "train n/o n/o 3,200/s n/o 25%" in flat                          # not observed, never zero
    assert "measured on this machine (NVIDIA H200)" in flat and "rented server" in flat


def test_samples_in_two_clusters_or_widely_spread_get_a_warning_on_their_row_with_the_likely_cause():
    import numpy as np

    from bench_core.core.stats import clusters
    from helpers import meas

    rng = np.random.default_rng(0)
    split = list(13 * (1 + 0.03 * rng.standard_normal(16))) + list(376 * (1 + 0.05 * rng.standard_normal(4)))
    (lo, n_lo), (hi, n_hi) = clusters(split)
    assert (n_lo, n_hi) == (16, 4) and 12 < lo < 14 and 350 < hi < 400
    assert clusters(list(np.exp(rng.standard_normal(40)))) is None        # a long tail is not two clusters
    assert clusters(list(10 * (1 + 0.02 * rng.standard_normal(30)))) is None
    wide_spread = list(10 * np.exp(0.4 * rng.standard_normal(30)))
    text = " ".join(session_table([meas(split, name="oversubscribed"), meas(wide_spread, name="busy"),
                                   meas(list(10 * (1 + 0.01 * rng.standard_normal(20))), name="calm")]).split())
    assert "oversubscribed (!)" in text and "busy (!)" in text and "calm (!)" not in text
    assert "oversubscribed (!): samples fall into two clusters, 16 around" in text and "--bench-threads 1" in text
    assert "busy (!): samples vary widely (CV" in text


def test_the_default_keeps_torchs_threads_as_the_program_runs_a_count_sets_them_and_nonsense_is_refused():
    import pytest as _pytest

    from bench_core.shells.configs import threads as _threads

    assert _threads(None, "cpu") is None and _threads(None, "cuda") is None
    assert _threads("auto", "cpu") is None and _threads("4", "cpu") == 4
    with _pytest.raises(ValueError, match="positive count or 'auto'"):
        _threads("0", "cpu")


def test_every_table_fits_120_columns_even_when_its_text_is_long():
    """#28: the distributed table ran to 175-200 characters under its own 'left out to fit 120 columns', and the
    A/B table to 127: when dropping columns is not enough, the widest text column wraps."""
    from bench_core.output.fitting import fit

    rows = [["ddp_train_step[mlp]", "2 gloo", "1.384", "identical; reference ok (3 steps) " * 3],
            ["a comparison whose name alone is " + "very " * 12 + "long", "-", "0", "FAIL"]]
    text = fit(["scenario", "ranks", "step ms", "replicas"], rows, droppable=("ranks",))
    assert max(map(len, text.splitlines())) <= 120 and "reference ok" in text and "left out to fit" in text
    assert "very long" in " ".join(text.split())


def test_an_ab_table_fits_120_columns():
    from bench_core.workflows.ab import ABResult

    r = ABResult("inconclusive", "p=0.18, interval [0.931, 1.219]: too wide to rule out a change beyond 1% (faster or "
                 "slower needs p < 0.01 and the whole interval beyond it); 12 rounds of fresh instances", 1.044, 0.931,
                 1.219, 0.18, (1.0,) * 6, (0.9,) * 6)
    assert max(map(len, r.table().splitlines())) <= 120


def test_an_interval_level_never_reads_100_percent():
    """#28: an interval printed as '(100.0%)' hid its real level."""
    from bench_core.deciding.comparison import level_text

    assert [level_text(c) for c in (0.997, 0.9996, 0.999994, 1 - 1e-9)] == ["99.7%", "99.96%", "99.999%", "1 - 1e-09"]


def test_a_wide_spread_says_its_cause_is_not_known_and_names_the_steps_threads_only_above_one():
    """#48: samples of a 35 us step stalled at 16 ms in a process of two torch threads on a quiet machine, where the
    warning said "likely a busy machine": a cause is named only where the run shows it, here none is."""
    from bench_core.output.tables import sample_shape

    spread = [1.0, 1.1, 0.9, 2.5, 1.0, 3.0, 0.8, 1.2]
    for threads, own in ((1, False), (2, True), (None, True)):
        text = sample_shape(spread, threads)
        assert text.startswith("samples vary widely") and "why is not known from this run" in text
        assert "likely" not in text and ("--bench-threads 1" in text) == own
