"""The tables people read: within 120 columns by default, every column on request."""
from bench_core.compare import compare_sets
from bench_core.report import WIDTH, comparison_table, session_table
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
    assert "every row: device: cpu, timer: host, mode: per_call" in narrow   # one value: said once, under it
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
