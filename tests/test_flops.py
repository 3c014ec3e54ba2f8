"""Counted work: FLOPs equal to the hand-computed formulas, "not counted" named, utilization from a fake clock."""
import pytest
import torch

from bench_core import Scenario, measure
from bench_core.deciding.gate import compare_runs
from bench_core.timing.flops import count, cpu_peak, known_peak
from bench_core.output.tables import work_table
from fakes import FakeClock, work
from helpers import runs


def test_a_matmul_and_a_conv_count_what_the_formulas_say():
    a, b = torch.randn(32, 48), torch.randn(48, 16)
    assert count(lambda: a @ b).flops == 2 * 32 * 48 * 16
    conv = torch.nn.Conv2d(3, 8, kernel_size=3, padding=1)
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        w = count(lambda: conv(x))
    # 2 * N * C_out * H_out * W_out * C_in * kh * kw
    assert w.flops == 2 * 2 * 8 * 10 * 10 * 3 * 3 * 3 and w.by_module == {"Conv2d": w.flops}


def test_bytes_moved_are_the_tensors_each_operator_reads_and_writes_and_views_move_nothing():
    a, b = torch.randn(32, 48), torch.randn(48, 16)
    assert count(lambda: a @ b).bytes == (32 * 48 + 48 * 16 + 32 * 16) * 4
    x = torch.randn(1000)
    assert count(lambda: x * 2 + 1).bytes == 2 * (1000 + 1000) * 4          # two ops, each reads and writes x's size
    assert count(lambda: x.view(10, 100).t()).bytes == 0                       # views move no data


def test_an_mlp_training_step_counts_forward_and_backward_and_names_what_has_no_formula():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 64)

    def step():
        opt.zero_grad()
        model(x).logsumexp(1).mean().backward()
        opt.step()
    w = count(step)
    fwd = 2 * 8 * 64 * 32 + 2 * 8 * 32 * 10
    bwd = 2 * (2 * 8 * 32 * 10) + 2 * 8 * 64 * 32   # layer 2: weight and input grads; layer 1: weight grad only
    assert w.flops == fwd + bwd and w.by_operator == {"aten.addmm": fwd, "aten.mm": bwd}
    assert {"aten.relu", "aten.threshold_backward", "aten.logsumexp"} <= set(w.not_counted)   # named, not zero
    assert "aten.linear" not in w.not_counted          # a composite: its matmul is what got counted


def test_achieved_rate_and_utilization_from_a_fake_clock_and_a_given_peak():
    clock = FakeClock()
    m = measure(work(clock, 1.0, 2.0), scenario=Scenario("k", ("forward",)), warmup=0, repeats=3, clock=clock)
    from dataclasses import replace

    m = replace(m, work={"flops": 4_000_000_000, "by_operator": {"aten.mm": 4_000_000_000}, "by_module": {},
                         "not_counted": {"aten.relu": 1}})
    assert m.flops_per_s == pytest.approx(2e12)                 # 4 GFLOP in 2 ms
    text = " ".join(work_table([m], lambda _: 4e12).split())
    assert "k 4 GFLOP 2 TFLOP/s 50.0% of 4 TFLOP/s - aten.mm 100%" in text          # no bytes: no intensity
    moved = replace(m, work={**m.work, "bytes": 8_000_000_000})
    assert "50.0% of 4 TFLOP/s 0.5 aten.mm 100%" in " ".join(work_table([moved], lambda _: 4e12).split())
    assert "k: not counted (no FLOP formula in torch): aten.relu x1" in text
    none = replace(m, work={"flops": 0, "not_counted": {"aten.add": 20}})
    assert "k none counted" in " ".join(work_table([none], lambda _: 4e12).split())   # never "0 FLOP/s"


def test_known_peaks_and_the_cpus_measured_one():
    assert known_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989.0 and known_peak("Some GPU", "bfloat16") is None
    ticks = iter([0.0, 0.5] * 5)
    assert cpu_peak(size=64, repeats=5, clock=lambda: next(ticks)) == pytest.approx(2 * 64 ** 3 / 0.5)


def test_a_candidate_doing_different_work_is_flagged_beside_its_verdict():
    from dataclasses import replace

    base = [replace(m, work={"flops": 1000}) for m in runs([10, 10.1, 9.9])]
    cand = [replace(m, work={"flops": 1500}) for m in runs([10, 10.05, 9.95], seed=3)]
    c = compare_runs("s", base, cand)
    assert any("counted FLOPs differ: baseline [1000] -> current [1500]" in n for n in c.notes)
    assert not compare_runs("s", base, [replace(m, work={"flops": 1000}) for m in cand]).notes


def test_a_step_the_counter_cannot_run_is_not_counted_and_says_why_without_failing_the_scenario(tmp_path):
    from bench_core.session import BenchSession, SessionConfig
    from helpers import ENV

    s = BenchSession(SessionConfig(results_dir=None, repeats=3, warmup=0, count_flops=True), ENV)
    calls = []

    def step():   # fine while timed; raises on the extra, counted call
        calls.append(1)
        if len(calls) > 4:
            raise RuntimeError("only four calls allowed")
    m, _ = s.run(Scenario("fragile", ("forward",)), step)
    assert m.work is None and s.errors == ()
    text = " ".join(dict(s.summary_sections())["bench_core work and utilization (counted FLOPs)"].split())
    assert "fragile not counted" in text and "fragile: FLOPs not counted: RuntimeError: only four calls allowed" in text


def test_the_roof_a_step_sits_under_and_the_cpus_measured_bandwidth():
    from bench_core.timing.flops import bound, cpu_bandwidth, known_bandwidth

    # ridge = 1e12 FLOP/s / 1e11 B/s = 10 FLOP/byte
    assert bound(100, 5, 1e12, 1e11) == "compute" and bound(100, 50, 1e12, 1e11) == "memory"
    assert bound(100, None, 1e12, 1e11) is None and bound(100, 5, None, 1e11) is None   # missing: no claim
    assert known_bandwidth("NVIDIA H200") == 4.8e12 and known_bandwidth(None) is None
    ticks = iter([0.0, 0.01] * 5)
    assert cpu_bandwidth(megabytes=1, clock=lambda: next(ticks)) == pytest.approx(2 * 2 ** 20 / 0.01)
    from dataclasses import replace

    clock = FakeClock()
    m = measure(work(clock, 1.0, 2.0), scenario=Scenario("k", ("forward",)), warmup=0, repeats=3, clock=clock)
    m = replace(m, work={"flops": 4_000_000_000, "bytes": 8_000_000_000, "by_operator": {"aten.mm": 4_000_000_000}})
    text = " ".join(work_table([m], lambda _: 4e12, bandwidth_of=lambda _: 1e12).split())
    assert "0.5 (memory-bound)" in text                      # 0.5 FLOP/byte under a ridge of 4


def test_through_the_session_a_gated_candidate_doing_different_work_is_flagged_with_its_achieved_rates(tmp_path):
    # the work is counted before the gate decides: counted after it, the gate never saw the candidate's count
    from bench_core.session import BenchSession, SessionConfig
    from helpers import ENV

    def session(**kw):
        return BenchSession(SessionConfig(results_dir=None, baselines_dir=tmp_path, repeats=5, warmup=0,
                                          count_flops=True, **kw), ENV)

    def step(n, clock):
        a = torch.randn(n, n)
        return lambda: (a @ a, clock.advance_ms(2.0))

    for i in range(3):
        s, clock = session(save="main", append=i > 0), FakeClock()
        s.run(Scenario("mm", ("compute",)), step(16, clock), clock=clock)
        s.finish()
    s, clock = session(compare="main", markdown=tmp_path / "summary.md"), FakeClock()
    _, c = s.run(Scenario("mm", ("compute",)), step(32, clock), clock=clock)
    assert any(f"baseline [{2 * 16 ** 3}] -> current [{2 * 32 ** 3}]" in n for n in c.notes)
    assert c.achieved_flops == pytest.approx((2 * 16 ** 3 / 2e-3, 2 * 32 ** 3 / 2e-3))
    from bench_core.output.comparison_tables import comparison_table

    text = " ".join(comparison_table([c], 0.01, wide=True).split())
    assert "mm: achieved 4.1 MFLOP/s -> 32.8 MFLOP/s (+700.0%; counted FLOPs over the median step)" in text
    s.finish()
    md = (tmp_path / "summary.md").read_text()    # the Markdown report says the same beside the verdict
    assert "- mm: achieved 4.1 MFLOP/s -> 32.8 MFLOP/s (+700.0%" in md and "counted FLOPs differ" in md


def test_roofline_rules_name_a_step_far_below_the_roof_it_sits_under():
    from bench_core.workflows.diagnose.trace_analysis import roofline_hypotheses

    peak, bw = 1e12, 1e11                     # ridge at 10 FLOP/byte
    mm = {"flops": 2e9, "bytes": 1e7, "by_operator": {"aten.mm": 1.8e9, "aten.add": 2e8}}   # 200 FLOP/byte
    (h,) = roofline_hypotheses(mm, 0.02, peak, bw)                      # 1e11 FLOP/s: 10% of peak
    assert h.rule == "below_compute_peak" and "at 10% of the 1 TFLOP/s peak" in h.observation
    assert "aten.mm does 90% of the FLOPs" in h.observation and "aten.mm alone" in h.next_check
    assert roofline_hypotheses(mm, 0.0025, peak, bw) == []               # 80% of peak: nothing to say
    ew = {"flops": 1e6, "bytes": 1e8, "by_operator": {}}                 # 0.01 FLOP/byte: memory-bound
    (h,) = roofline_hypotheses(ew, 0.1, peak, bw)                       # 1e9 B/s: 1% of bandwidth
    assert h.rule == "below_bandwidth" and "moving 1% of the 100 GB/s" in h.observation
    assert roofline_hypotheses(ew, 0.002, peak, bw) == []                # 50% of bandwidth
    (none,) = roofline_hypotheses({"flops": 0, "bytes": 1e8}, 0.1, None, bw)   # nothing counted: bytes alone
    assert none.rule == "below_bandwidth" and "no FLOPs counted, only bytes moved" in none.observation
    assert roofline_hypotheses(ew, 0.1, None, None) == roofline_hypotheses({"flops": 0}, 0.1, peak, bw) == []


def test_the_operator_with_most_flops_below_its_peak_is_named_from_the_profilers_figures():
    from types import SimpleNamespace as NS

    from bench_core.workflows.diagnose.profile import operator_below_peak

    avg = [NS(key="aten::mm", flops=4e9, count=3, cpu_time_total=20_000.0, device_time_total=1000.0),
           NS(key="aten::mul", flops=8e9, count=3, cpu_time_total=1e6, device_time_total=1e6),   # judged
           NS(key="aten::add", flops=1e6, count=3, cpu_time_total=5.0, device_time_total=1.0),   # by bytes
           NS(key="aten::relu", flops=0, count=3, cpu_time_total=50.0, device_time_total=1.0)]
    (h,) = operator_below_peak(avg, "cpu", 1e12)       # 4e9 FLOP in 20 ms: 0.2 TFLOP/s, 20% of peak
    assert h.rule == "op_below_peak" and h.observation.startswith("aten::mm, the operator with the most FLOPs")
    assert "reaches 0.2 TFLOP/s: 20.0% of the 1 TFLOP/s peak" in h.observation
    assert operator_below_peak(avg, "cuda", 1e12) == []          # on the device: 4 TFLOP/s, beyond the peak given
    assert operator_below_peak(avg, "cpu", None) == [] and operator_below_peak(avg[1:], "cpu", 1e12) == []


def test_an_ab_counts_both_sides_once_and_says_when_they_do_different_work():
    from bench_core.output.comparison_tables import decisions_table
    from bench_core.session import BenchSession, SessionConfig
    from helpers import ENV

    s = BenchSession(SessionConfig(results_dir=None, count_flops=True), ENV)
    clock = FakeClock()
    a16, a32 = torch.randn(16, 16), torch.randn(32, 32)
    res = s.ab("mm", lambda: (a16 @ a16, clock.advance_ms(1.0)), lambda: (a32 @ a32, clock.advance_ms(2.0)),
               repeats=6, warmup=0, clock=clock)
    assert dict(res.flops) == {"baseline": 2 * 16 ** 3, "candidate": 2 * 32 ** 3}
    assert res.to_dict()["flops"] == {"baseline": 8192, "candidate": 65536}
    text = " ".join(decisions_table(s.decisions, wide=True).split())
    assert "mm: achieved 8.19 MFLOP/s -> 32.8 MFLOP/s" in text
    assert "mm: warning: counted FLOPs differ: baseline 8192 -> candidate 65536 per step" in text
    plain = BenchSession(SessionConfig(results_dir=None), ENV).ab("mm", lambda: clock.advance_ms(1.0),
                                                                    lambda: clock.advance_ms(1.0), repeats=6,
                                                                    warmup=0, clock=clock)
    assert dict(plain.flops) == {}                                 # not asked for: not counted, never zero


def test_a_rate_at_zero_ms_is_not_observed_never_a_division_by_zero():
    from types import SimpleNamespace as NS

    from bench_core.output.comparison_tables import work_lines
    from bench_core.core.stats import per_second

    assert per_second(10, 0.0) is None and per_second(10, 2.0) == 5000.0
    r = NS(flops={"baseline": 8, "candidate": 8}, baseline_ms=(0.0, 0.0), candidate_ms=(2.0, 2.0))
    assert work_lines("z", r) == ["z: achieved n/o -> 4 kFLOP/s (counted FLOPs over the median step)"]
