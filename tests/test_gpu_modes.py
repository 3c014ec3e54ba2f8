"""GPU timing modes on the CPU, against fakes that model the hardware's rules (tests/fakes.py): an L2 whose state a
flush resets, CUDA-graph capture (launches recorded, a host sync refused, a replay one launch), per-sample clock
readings and throttle bits from NVML."""
import json
import random

import pytest

from bench_core.workflows import measured
from bench_core import Scenario, measure
from bench_core.core.errors import ScenarioError
from bench_core.deciding.gate import compare_runs
from bench_core.files import storage
from bench_core.output.tables import gpu_timing_lines, hypotheses_table, session_table
from bench_core.timing import cache as caching
from bench_core.timing.backends import CudaBackend
from bench_core.timing.graphs import GRAPH_REPLAYS, _differs
from bench_core.timing.telemetry import Telemetry
from bench_core.workflows.diagnose.trace_analysis import facts
from fakes import FakeBuffer, FakeClock, FakeGPU, FakeNVML

MB = 2**20


def _gpu(nvml=None):
    clock = FakeClock()
    gpu = FakeGPU(clock)
    telemetry = None if nvml is None else Telemetry(nvml, 0, own_pid=100)
    return clock, gpu, CudaBackend(gpu, telemetry=telemetry, alloc=gpu.buffer)


def _reader(gpu, nbytes=8 * MB):
    data = gpu.buffer(nbytes)
    return lambda: data.sum()


def _measure(clock, backend, fn, **kw):
    kw = {"warmup": 2, "repeats": 6, **kw}
    return measure(fn, scenario=kw.pop("scenario", Scenario("step", ("compute",))), device="cuda", clock=clock,
                   backend=backend, **kw)


# -- cache state -------------------------------------------------------------------------------------------
def test_cold_samples_find_their_data_flushed_and_the_flush_stays_outside_the_window():
    clock, gpu, backend = _gpu()
    read = _reader(gpu)
    hot = _measure(clock, backend, read, cache="hot")
    cold = _measure(clock, backend, read, cache="cold")
    launch = 0.01      # the fake's launch latency, inside the events as on a real GPU
    hbm_ms, l2_ms = 8 * MB / (gpu.hbm_gb_s * 1e6), 8 * MB / (gpu.l2_gb_s * 1e6)
    # each cold sample is exactly one read from memory: the flush's own write (100 MiB, 0.035 ms) is not in it
    assert all(g == pytest.approx(launch + hbm_ms, abs=6e-4) for g in cold.gpu_ms)
    assert all(g == pytest.approx(launch + l2_ms, abs=6e-4) for g in hot.gpu_ms)
    assert cold.scenario.metadata["cache"] == "cold" and hot.scenario.metadata["cache"] == "hot"
    assert cold.gpu_timing["cache"]["flush_bytes"] == 2 * gpu.l2_bytes
    assert hot.gpu_timing["cache"]["flush_bytes"] is None
    # the modes are part of the question: a cold result does not compare with a hot one
    assert compare_runs("step", [hot], [cold]).verdict == "incomparable"


def test_the_self_check_sees_a_working_flush_and_says_when_the_flush_left_the_cache_warm():
    clock, gpu, _ = _gpu()
    sizes = []
    backend = CudaBackend(gpu, alloc=lambda n: sizes.append(n) or gpu.buffer(n))
    m = _measure(clock, backend, _reader(gpu), cache="cold", cache_check=True)
    assert sizes.count(2 * gpu.l2_bytes) == 1     # the check flushes with the scenario's own buffer
    check = m.gpu_timing["cache"]["check"]
    probe = int(caching.PROBE_SHARE * gpu.l2_bytes)
    assert check["colder"] and check["probe_bytes"] == probe
    assert check["cold_ms"] == pytest.approx(0.01 + probe / (gpu.hbm_gb_s * 1e6), abs=6e-4)
    assert check["hot_ms"] == pytest.approx(0.01 + probe / (gpu.l2_gb_s * 1e6), abs=6e-4)
    assert not any("NOT colder" in line for line in gpu_timing_lines([m]))
    assert any("the fastest of 40 cold-hot pairs; cold the slower in 40" in line for line in gpu_timing_lines([m]))

    clock, gpu, _ = _gpu()
    broken = CudaBackend(gpu, alloc=lambda n: _Bypassing(gpu, n) if n == 2 * gpu.l2_bytes else gpu.buffer(n))
    m = _measure(clock, broken, _reader(gpu), cache="cold", cache_check=True)
    assert not m.gpu_timing["cache"]["check"]["colder"]
    assert any("NOT colder" in line and "'cold' may be warm" in line for line in gpu_timing_lines([m]))


def test_the_self_check_finds_a_working_flush_through_noise_larger_than_what_it_looks_for():
    """An H200's proportions (docs/gpu.md, measured 2026-12-04): 60 MiB of L2, a float32 sum's fixed cost about
    13 us beside a 10 us launch gap, HBM at about 4 TB/s and L2 at about 7 TB/s for such a read, so a probe half the
    L2 is about 3.4 us slower cold; and samples that move by 0-1.5 us, one in seven by 5-15 us more."""
    def check(seed, flush_works=True):
        clock, gpu, _ = _gpu()
        gpu.l2_bytes, gpu.hbm_gb_s, gpu.l2_gb_s, gpu.read_fixed_ms = 60 * MB, 4000.0, 7100.0, 0.013
        rng = random.Random(seed)
        gpu.read_jitter = lambda: rng.uniform(0.005, 0.015) if rng.random() < 1 / 7 else rng.uniform(0, 0.0015)
        backend = CudaBackend(gpu, alloc=lambda n: (FakeBuffer if flush_works or n != 2 * gpu.l2_bytes
                                                    else _Bypassing)(gpu, n))
        return caching.self_check(backend, clock, caching.Flush(backend, "s"))

    working = [check(seed) for seed in range(20)]
    assert all(f.colder for f in working)
    missing = [check(seed, flush_works=False) for seed in range(20)]
    assert not any(f.colder for f in missing)
    assert working[0].to_dict()["samples"] == caching.PROBE_SAMPLES == 40
    with pytest.raises(ValueError, match="40 pairs cannot have 41"):
        caching.CacheCheck(1, 1, 1.0, 1.0, 40, 41)


class _Bypassing(FakeBuffer):
    """A driver whose flush writes go around L2: nothing is evicted."""

    def zero_(self):
        self.gpu.launch(self.nbytes / (self.gpu.hbm_gb_s * 1e6))
        return self


def test_a_cold_cache_needs_a_gpu_and_its_l2_size():
    with pytest.raises(ScenarioError, match="needs a CUDA device"):
        measure(lambda: None, scenario="s", cache="cold", repeats=2, warmup=0)
    clock, gpu, backend = _gpu()
    gpu.l2_bytes = 0      # torch reports no L2 for this device
    with pytest.raises(ScenarioError, match="L2 size"):
        _measure(clock, backend, lambda: None, cache="cold")
    with pytest.raises(ScenarioError, match="cache must be 'cold' or 'hot'"):
        _measure(clock, backend, lambda: None, cache="warm")
    with pytest.raises(Exception, match="cache must be 'cold', 'hot' or None"):
        Scenario("s", ("compute",), cache="lukewarm")


def test_a_scenarios_modes_are_recorded_not_applied_on_the_cpu_and_refused_where_not_taken(tmp_path):
    from bench_core.session import BenchSession, SessionConfig
    from bench_core.shells.configs import session_config

    s = BenchSession(SessionConfig(results_dir=None), {})
    m = measured.measure(s, Scenario("s", ("compute",), cache="cold", graph=True), lambda: None, warmup=0, repeats=2)
    assert m.scenario.metadata["gpu_modes"] == "not applied on the CPU: cache cold, graph"
    assert m.gpu_timing is None
    assert "s: GPU timing modes not applied on the CPU: cache cold, graph" in " ".join(session_table([m]).split())

    def values(**given):
        from bench_core.shells import options as opt

        given = {opt.OUT: "out", opt.BASELINES: "baselines", opt.REFS: "references", opt.TIMEOUT: 600.0,
                 opt.NNODES: 1, opt.NODE_RANK: 0, **given}
        return lambda flag: given.get(flag, None if opt.BY_FLAG[flag].type else False)
    with pytest.raises(ValueError, match="add --gpu"):
        session_config(values(**{"--bench-cache": "cold"}), tmp_path, "cpu")
    with pytest.raises(ValueError, match="side by side"):
        session_config(values(**{"--bench-graph": True, "--bench-against": "HEAD~1"}), tmp_path, "cuda")
    gpu_session = BenchSession(SessionConfig(device="cuda", results_dir=None, cache="hot"), {})
    with pytest.raises(ScenarioError, match="A/B decision does not apply the GPU timing modes"):
        gpu_session.ab("ab", lambda: None, lambda: None)


def test_only_the_sessions_first_cold_scenario_runs_the_self_check():
    from bench_core.session import BenchSession, SessionConfig

    clock, gpu, backend = _gpu()
    s = BenchSession(SessionConfig(device="cuda", results_dir=None), {})
    read = _reader(gpu)
    hot = measured.measure(s, Scenario("a", ("compute",), cache="hot"), read, warmup=0, repeats=2, clock=clock, backend=backend)
    first = measured.measure(s, Scenario("b", ("compute",), cache="cold"), read, warmup=0, repeats=2, clock=clock,
                      backend=backend)
    second = measured.measure(s, Scenario("c", ("compute",), cache="cold"), read, warmup=0, repeats=2, clock=clock,
                       backend=backend)
    assert "check" not in hot.gpu_timing["cache"] and "check" in first.gpu_timing["cache"]
    assert "check" not in second.gpu_timing["cache"]


# -- CUDA graphs -------------------------------------------------------------------------------------------
def _launch_bound(gpu, kernels=20, work_ms=0.001):
    def step():
        for _ in range(kernels):
            gpu.launch(work_ms, launch_ms=0.01)
        return kernels
    return step


def test_a_graph_replays_the_step_and_launch_overhead_is_eager_minus_graph():
    clock, gpu, backend = _gpu()
    m = _measure(clock, backend, _launch_bound(gpu), graph=True)
    g = m.gpu_timing["graph"]
    assert m.mode == "block" and m.block_size == GRAPH_REPLAYS == g["replays_per_sample"]
    # eager: the GPU waits on 20 launches of 0.01 ms; a replay is one launch of 0.01 ms for 20 x 0.001 ms of work
    assert g["eager_gpu_median_ms"] == pytest.approx(0.2, abs=0.002)
    assert m.gpu_summary.median == pytest.approx(0.02, abs=0.002) == g["graph_gpu_median_ms"]
    assert g["launch_overhead_ms"] == pytest.approx(g["eager_gpu_median_ms"] - g["graph_gpu_median_ms"])
    assert len(g["eager_gpu_ms"]) == 6 and g["output"] == "equal to an eager call's"
    assert m.scenario.metadata["cuda_graph"] is True
    line = next(x for x in gpu_timing_lines([m]) if "CUDA graph" in x)
    assert "launch overhead" in line and "eager minus graph" in line


def test_what_a_graph_cannot_hold_is_refused_naming_why():
    clock, gpu, backend = _gpu()

    def syncs():
        gpu.launch(0.01)
        gpu.synchronize()   # .item(): a host sync inside the step
    with pytest.raises(ScenarioError, match="cannot be captured as a CUDA graph.*not permitted when stream is capturing"):
        _measure(clock, backend, syncs, graph=True)
    with pytest.raises(ScenarioError, match="nowhere to run a setup"):
        _measure(clock, backend, _launch_bound(gpu), graph=True, setup=lambda: None)
    with pytest.raises(ScenarioError, match="needs a CUDA device"):
        measure(lambda: None, scenario="s", graph=True, repeats=2, warmup=0)
    grown = []

    def growing():   # its output's shape changes call by call: a graph would freeze the first
        gpu.launch(0.01)
        grown.append(0)
        return list(grown)
    with pytest.raises(ScenarioError, match="replay differs from an eager call.*another structure"):
        _measure(clock, backend, growing, graph=True)


def test_replay_output_checks_values_only_where_the_step_repeats_itself():
    torch = pytest.importorskip("torch")
    a = torch.ones(3)
    assert _differs(a, a.clone(), "output") is None
    assert "values differ" in _differs(a, a + 1, "output")
    assert _differs(a, a + 1, "output", values=False) is None   # a training step: shapes only
    assert "(3,)" in _differs(a, torch.ones(4), "output", values=False)
    clock, gpu, backend = _gpu()
    count = {"n": 0}

    def counting():   # returns something new every call, eager or replayed: values cannot be compared
        gpu.launch(0.01)
        count["n"] += 1
        return count["n"]
    m = _measure(clock, backend, counting, graph=True)
    assert m.gpu_timing["graph"]["output"].startswith("shapes equal to an eager call's; values not compared")


# -- clocks per sample -------------------------------------------------------------------------------------
def _clocked(nvml, throttled_samples, repeats=8):
    clock, gpu, backend = _gpu(nvml)
    calls = {"n": 0}

    def step():   # the clock falls during some samples: read at the window's end it shows, and at the next's start
        calls["n"] += 1
        gpu.launch(1.0)
        sample = calls["n"] - 4         # the cold start and 2 warmup calls come first
        nvml.sm = 1200 if sample in throttled_samples else 1980
    return _measure(clock, backend, step, repeats=repeats), nvml


def test_samples_taken_throttled_are_set_aside_and_the_decision_uses_the_others():
    m, nvml = _clocked(FakeNVML(), {2, 5})
    c = m.gpu_timing["clocks"]
    # judged by the clock at each sample's end: the next sample began with it still down, and that is not held
    # against it (an idle GPU lowers its clock between samples too)
    assert sorted(c["flagged"]) == ["2", "5"] and "below 75% of the default 1755 MHz" in c["flagged"]["2"]
    assert c["decided_on"] == "unthrottled" and len(m.host_ms) == 6 and len(c["set_aside"]) == 2
    assert m.throttle_mark is None
    assert c["sm_mhz"][2] == 1200 and c["sm_mhz"][3] == 1980 and c["steady"] is False and c["locked"] is False
    back = storage.measurement_from_doc(json.loads(json.dumps(storage.measurement_doc(m))))
    assert back.gpu_timing["clocks"]["set_aside"] == c["set_aside"] and back.repeats == 8
    assert any("2 of 8 samples taken while the GPU was throttled" in x for x in gpu_timing_lines([m]))


def test_too_few_unthrottled_samples_mark_the_scenario_and_its_comparison():
    m, _ = _clocked(FakeNVML(), {0, 1, 2, 3, 4})
    assert m.gpu_timing["clocks"]["decided_on"] == "all" and len(m.host_ms) == 8
    assert "5 of 8 samples taken while the GPU was throttled" in m.throttle_mark
    assert any("(marked)" in x for x in gpu_timing_lines([m]))
    from dataclasses import replace

    calm = replace(m, gpu_timing=None)
    c = compare_runs("step", [calm, calm, calm], [m])
    assert any("throttled" in n and "too few others" in n for n in c.notes)


def test_reasons_count_as_throttling_and_locked_clocks_are_reported_as_such():
    nvml = FakeNVML()
    nvml.reasons = 0x2 | 0x20            # applications clocks setting (locked) and software thermal slowdown
    m, _ = _clocked(nvml, set())
    c = m.gpu_timing["clocks"]
    assert c["locked"] is True and c["decided_on"] == "all"
    assert "sw_thermal_slowdown" in c["flagged"]["0"]
    nvml = FakeNVML()
    nvml.reasons = 0x2 | 0x4             # locked, and at the software power cap with the clock where it should be
    m, nvml = _clocked(nvml, set())
    assert m.gpu_timing["clocks"]["flagged"] == {} and "locked" in gpu_timing_lines([m])[-1]
    assert "not locked" not in gpu_timing_lines([m])[-1]


def test_a_sample_costs_four_nvml_queries_all_outside_the_window():
    nvml = FakeNVML()
    clock, gpu, backend = _gpu(nvml)
    before = nvml.calls
    m = _measure(clock, backend, lambda: gpu.launch(1.0), warmup=0, repeats=5)
    samples = 5 + 1                  # and the cold start
    window_reads = 2 * 7             # the telemetry window's two full readings (7 queries each)
    assert nvml.calls - before == 4 * samples + window_reads + 1   # and the default clock, once
    assert all(g == pytest.approx(1.01) for g in m.gpu_ms)   # the kernel and its launch: no NVML time inside


def test_without_nvml_there_are_no_clock_readings_not_zeros():
    clock, gpu, backend = _gpu()
    m = _measure(clock, backend, lambda: gpu.launch(1.0))
    assert m.gpu_timing is None and "SM clock" not in session_table([m])


# -- kernel time -------------------------------------------------------------------------------------------
def test_kernel_time_is_the_sum_of_kernel_durations_beside_event_and_end_to_end_time():
    clock, gpu, backend = _gpu()
    m = _measure(clock, backend, lambda: gpu.launch(0.5))
    ev = [{"ph": "X", "name": "ProfilerStep#0", "cat": "user_annotation", "ts": 0, "dur": 900},
          {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 1000, "dur": 900},
          {"ph": "X", "name": "k1", "cat": "kernel", "ts": 100, "dur": 200},
          {"ph": "X", "name": "k2", "cat": "kernel", "ts": 150, "dur": 200},   # overlaps k1: summed, not merged
          {"ph": "X", "name": "k1", "cat": "kernel", "ts": 1100, "dur": 200},
          {"ph": "X", "name": "cp", "cat": "gpu_memcpy", "ts": 1400, "dur": 100}]
    f = facts(ev)
    assert f.kernel_us == pytest.approx(300.0) and f.gpu_busy_us == pytest.approx(275.0)
    head = hypotheses_table([], f, measured=m).splitlines()[1]
    assert "kernel time 300 us" in head and "event time 510 us" in head and "end-to-end 510 us" in head
    assert facts([ev[0], ev[1]]).kernel_us is None


def test_the_gpu_check_on_a_machine_without_one_fails_each_step_it_ran_and_packs_what_it_saw(tmp_path):
    """scripts/gpu_check.sh as a lent machine that returns only a few files runs it (GPU_CHECK_PACK=1), here on the
    CPU with a budget of 16 s: each step it runs fails (no GPU), those it has no time for are skipped and say so, and
    $OUT holds the summary and one archive of the logs."""
    import os
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_PACK": "1", "GPU_CHECK_BUDGET_S": "16",
           "GPU_DECISIONS_BUDGET_S": "30",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0, done.stdout
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "summary.txt"]
    lines = (out / "summary.txt").read_text().splitlines()
    assert len(lines) == 15 and lines[0].startswith("environment") and lines[-1].startswith("decisions")
    # no step passes without a GPU; what the budget no longer covered is skipped, and said
    assert not any(" rc=0 " in line for line in lines)
    assert all("budget is spent" in line for line in lines if "rc=skip" in line)
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"summary.txt", "environment.log"} <= names
