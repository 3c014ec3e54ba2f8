import gc
import re

import pytest
import torch

from bench_core import Scenario, ScenarioError, measure
from bench_core.timing.backends import CudaBackend, backend_for
from fakes import FakeClock, FakeGPU, work


def test_cpu_samples_are_exact_per_call_times_and_cold_start_is_kept_apart():
    clock = FakeClock()
    fn = work(clock, 100.0, 7.0, 7.0, 7.0, 2.0)  # first call slow, warmup 3 calls, then 2 ms
    m = measure(fn, scenario="s", warmup=3, repeats=5, clock=clock, items=4)
    assert m.cold_start.first_call_ms == 100.0
    assert m.host_ms == (2.0,) * 5          # neither cold start nor warmup leaks into the samples
    assert fn.calls["n"] == 1 + 3 + 5
    assert m.gpu_ms is None and m.timer == "host"
    assert m.throughput == pytest.approx(4 / 0.002)
    assert not m.memory.observed             # not observed on the CPU, never 0
    assert m.memory.peak_allocated_bytes is None


def test_setup_runs_before_every_call_and_stays_outside_the_window():
    clock = FakeClock()
    seen = []

    def setup():
        seen.append("setup")
        clock.advance_ms(50)

    def fn():
        seen.append("call")
        clock.advance_ms(1)

    m = measure(fn, scenario="s", warmup=1, repeats=3, setup=setup, clock=clock)
    assert m.host_ms == (1.0, 1.0, 1.0)
    assert seen == ["setup", "call"] * 5


def test_load_is_timed_once_as_cold_start_and_not_in_samples():
    clock = FakeClock()
    m = measure(work(clock, 3.0, 1.0), scenario="s", warmup=0, repeats=2, clock=clock,
                load=lambda: clock.advance_ms(40))
    assert m.cold_start.load_ms == 40.0
    assert m.cold_start.first_call_ms == 3.0
    assert m.host_ms == (1.0, 1.0)


def test_gc_is_off_inside_the_timed_window_only():
    clock = FakeClock()
    states = []

    def fn():
        states.append(gc.isenabled())
        clock.advance_ms(1)

    assert gc.isenabled()
    measure(fn, scenario="s", warmup=1, repeats=3, clock=clock)
    assert states == [True, True, False, False, False]  # cold, warmup, then the 3 samples
    assert gc.isenabled()


def test_a_measurements_freeze_is_undone_after_it_and_a_freeze_it_found_is_kept(monkeypatch):
    from bench_core.timing import sampling

    gc.unfreeze()   # this suite freezes before each test (conftest); here, first, a process that froze nothing
    monkeypatch.setattr(sampling, "_kept_frozen", False)
    try:
        with sampling.gc_frozen():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0
        gc.freeze()   # a process that froze its objects itself keeps them frozen
        outer = gc.get_freeze_count()
        with sampling.gc_frozen():
            pass
        assert outer > 0 and gc.get_freeze_count() >= outer
    finally:
        gc.freeze()


def test_a_freeze_kept_for_good_is_known_without_counting_the_frozen_objects(monkeypatch):
    from bench_core.timing import sampling

    monkeypatch.setattr(sampling, "_kept_frozen", False)
    sampling.keep_frozen()   # a pre-forking server's freeze

    def walk():
        raise AssertionError("the frozen objects were counted")

    monkeypatch.setattr(gc, "get_freeze_count", walk)
    with sampling.gc_frozen():
        pass
    monkeypatch.undo()
    assert gc.get_freeze_count() > 0   # kept after the measurement


def test_cuda_per_call_gives_gpu_time_from_events_and_end_to_end_from_host():
    clock = FakeClock()
    gpu = FakeGPU(clock)

    def fn():
        gpu.launch(work_ms=2.0, launch_ms=0.5)   # host returns after 0.5 ms, GPU busy 2 ms after that

    m = measure(fn, scenario="k", device="cuda", warmup=1, repeats=4, clock=clock, backend=CudaBackend(gpu))
    assert m.timer == "cuda_event"
    assert m.gpu_ms == pytest.approx((2.5,) * 4)   # from the start event to the kernel's end
    assert m.host_ms == pytest.approx((2.5,) * 4)  # host read after the sync: waits for the GPU
    assert m.summary.median == pytest.approx(2.5)
    # one sync before and one after each timed call (and for the cold start), one when the events are first
    # recorded: none inside the call
    assert gpu.syncs == 2 * (1 + 4) + 1


def test_cuda_event_time_spans_host_gaps_before_the_kernel_on_an_idle_stream():
    clock = FakeClock()
    gpu = FakeGPU(clock)

    def fn():
        clock.advance_ms(3.0)           # Python overhead before the launch
        gpu.launch(work_ms=1.0, launch_ms=0.0)

    m = measure(fn, scenario="k", device="cuda", warmup=0, repeats=3, clock=clock, backend=CudaBackend(gpu))
    # events are recorded on the stream: the start event fires at once, so GPU time includes the
    # 3 ms gap before the kernel; the end-to-end host figure matches it here.
    assert m.gpu_ms == pytest.approx((4.0,) * 3)
    assert m.host_ms == pytest.approx((4.0,) * 3)


def test_block_mode_keeps_overlap_between_steps_and_syncs_once_per_block():
    clock = FakeClock()
    gpu = FakeGPU(clock)

    def fn():
        gpu.launch(work_ms=1.0, launch_ms=3.0)  # host-bound: 3 ms to launch 1 ms of GPU work

    per_call = measure(fn, scenario="k", device="cuda", warmup=0, repeats=3, clock=clock,
                       backend=CudaBackend(gpu))
    syncs_before = gpu.syncs
    block = measure(fn, scenario="k", device="cuda", warmup=0, repeats=3, mode="block", block_size=4,
                    clock=clock, backend=CudaBackend(gpu))
    assert per_call.host_ms == pytest.approx((4.0,) * 3)          # 3 ms launch + 1 ms waiting for the GPU
    assert block.host_ms == pytest.approx(((4 * 3.0 + 1.0) / 4,) * 3)  # GPU work hides behind the next launch
    assert block.mode == "block" and block.block_size == 4
    assert gpu.syncs - syncs_before == 2 * (1 + 3) + 1           # per block, not per call (+1: the events' first record)


def test_cuda_memory_figures_come_from_the_allocator_over_the_window():
    clock = FakeClock()
    gpu = FakeGPU(clock)
    gpu.allocate(10_000)                # resident weights, allocated before the window
    gpu.stats["num_device_alloc"] = 10  # allocations before the window do not count

    def fn():                           # each call's output is freed before the next
        gpu.allocate(1024)
        gpu.launch(1.0)
        gpu.free(1024)

    m = measure(fn, scenario="k", device="cuda", warmup=0, repeats=3, clock=clock, backend=CudaBackend(gpu))
    # the peak reset is to what is allocated now (issue 15): the window's own figure leaves the weights out
    assert m.memory.window_peak_bytes == 1024
    assert m.memory.peak_allocated_bytes == 11_024          # the absolute figure, kept beside it, named
    assert m.memory.peak_reserved_bytes == 22_048
    assert m.memory.device_allocs == 3         # only the three timed calls
    assert m.memory.alloc_retries == 0
    assert gpu.peak_resets == 1


def test_a_scenario_that_keeps_its_outputs_shows_memory_growing_with_the_repeats():
    clock = FakeClock()
    gpu = FakeGPU(clock)

    def keeps():
        gpu.allocate(1024)                  # never freed: a list of outputs kept by the benchmark
        gpu.launch(1.0)

    m = measure(keeps, scenario="k", device="cuda", warmup=0, repeats=3, clock=clock, backend=CudaBackend(gpu))
    assert m.memory.window_peak_bytes == 3 * 1024


def test_cuda_memory_key_missing_from_this_build_is_not_observed():
    clock = FakeClock()
    gpu = FakeGPU(clock)
    del gpu.stats["num_alloc_retries"]
    m = measure(lambda: gpu.launch(1.0), scenario="k", device="cuda", warmup=0, repeats=2, clock=clock,
                backend=CudaBackend(gpu))
    assert m.memory.alloc_retries is None
    assert m.memory.device_allocs == 0


@pytest.mark.parametrize("kwargs, needle", [
    (dict(warmup=-1), "warmup must be an integer >= 0"),
    (dict(repeats=1), "repeats must be an integer >= 2"),
    (dict(repeats=2.5), "repeats must be an integer >= 2"),
    (dict(items=0), "items must be a positive integer"),
    (dict(mode="block", block_size=1), "block mode needs block_size >= 2"),
    (dict(mode="sideways"), "mode must be"),
    (dict(setup=3), "setup must be callable"),
])
def test_bad_arguments_name_the_scenario_and_the_problem(kwargs, needle):
    with pytest.raises(ScenarioError) as err:
        measure(lambda: None, scenario="named", **kwargs)
    assert "'named'" in str(err.value) and needle in str(err.value)


def test_non_callable_is_refused_with_the_scenario_name():
    with pytest.raises(ScenarioError, match=r"scenario 'x': the function to measure must be callable, got int"):
        measure(42, scenario="x")


def test_a_raising_callable_says_which_call_failed():
    clock = FakeClock()
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        clock.advance_ms(1)
        if calls["n"] == 4:
            raise RuntimeError("boom")

    with pytest.raises(ScenarioError) as err:
        measure(fn, scenario=Scenario("s", ("forward",)), warmup=1, repeats=5, clock=clock)
    assert "scenario 's': sample 1 raised RuntimeError: boom" == str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError)


def test_a_negative_sample_is_refused():
    clock = FakeClock()

    def fn():
        clock.advance_ms(-1)  # a clock that runs backwards must not produce a number

    with pytest.raises(ScenarioError, match="cannot be negative"):
        measure(fn, scenario="back", warmup=0, repeats=2, clock=clock)


def test_backend_must_match_device():
    with pytest.raises(ScenarioError, match="does not match device"):
        measure(lambda: None, scenario="s", device="cpu", backend=CudaBackend(FakeGPU(FakeClock())))


def test_threads_are_fixed_and_recorded():
    import torch

    before = torch.get_num_threads()
    try:
        m = measure(lambda: None, scenario="s", repeats=2, threads=1)
        assert m.threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_real_clock_smoke_on_cpu():
    import torch

    a = torch.randn(32, 32)
    m = measure(lambda: a @ a, scenario="mm", warmup=1, repeats=3)
    assert len(m.host_ms) == 3 and all(v > 0 for v in m.host_ms)


@pytest.mark.parametrize("value, where", [
    (float("nan"), "result = nan"),
    ({"loss": torch.tensor(float("inf"))}, "result['loss'] holds NaN or infinity"),
    ((torch.ones(2), torch.tensor([1.0, float("nan")])), "result[1] holds NaN or infinity"),
])
def test_a_step_that_returns_nan_or_inf_fails_its_scenario(value, where):
    clock = FakeClock()
    with pytest.raises(ScenarioError, match=re.escape(where)):
        measure(lambda: value, scenario="broken", clock=clock, warmup=0, repeats=3)


def test_finite_and_non_numeric_results_pass():
    clock = FakeClock()
    for value in (1.0, torch.ones(3), {"x": torch.arange(3)}, "text", None):
        measure(lambda: value, clock=clock, warmup=0, repeats=2)


def test_event_creation_never_lands_inside_a_measured_interval():
    # torch creates a CUDA event at its first record (issue 15); a fresh end event per sample put that creation
    # between the kernel and the end stamp, lengthening every short kernel's GPU time
    clock = FakeClock()
    gpu = FakeGPU(clock)
    gpu.event_create_ms = 0.5

    def short():
        gpu.launch(work_ms=0.01, launch_ms=0.02)

    m = measure(short, scenario="k", device="cuda", warmup=0, repeats=5, clock=clock, backend=CudaBackend(gpu))
    assert m.gpu_ms == pytest.approx((0.03,) * 5)
    assert gpu.events_made == 2                  # one pair, reused by every sample



def test_an_asynchronous_kernel_error_fails_the_sample_it_surfaced_in():
    clock = FakeClock()
    gpu = FakeGPU(clock)
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        gpu.launch(1.0, error="CUDA error: an illegal memory access" if calls["n"] == 4 else None)

    with pytest.raises(ScenarioError, match="sample 1 raised RuntimeError: CUDA error: an illegal memory"):
        measure(fn, scenario="k", device="cuda", warmup=1, repeats=5, clock=clock, backend=CudaBackend(gpu))


def test_gpu_time_is_read_only_after_the_end_event_completed_and_at_its_resolution():
    clock = FakeClock()
    gpu = FakeGPU(clock)
    start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
    start.record()
    gpu.launch(work_ms=1.23456)
    end.record()
    with pytest.raises(RuntimeError, match="not ready"):      # what CUDA says before completion
        start.elapsed_time(end)
    m = measure(lambda: gpu.launch(work_ms=1.23456, launch_ms=0), scenario="k", device="cuda", warmup=0,
                repeats=2, clock=clock, backend=CudaBackend(gpu))
    assert m.gpu_ms == pytest.approx((1.2345,) * 2)          # synchronized first; 0.5 us resolution


def test_work_on_another_device_is_synchronized_and_timed_there():
    clock = FakeClock()
    gpu = FakeGPU(clock)
    seen = []
    gpu.synchronize = (lambda real: lambda device=None: seen.append(device) or real(device))(gpu.synchronize)
    backend = backend_for("cuda:1", gpu)
    m = measure(lambda: gpu.launch(1.0), scenario="k", device="cuda:1", warmup=0, repeats=2, clock=clock,
                backend=backend)
    assert set(seen) == {1} and backend._events_recorded_on == ("stream", 1)
    assert m.device == "cuda" and m.scenario.metadata["device"] == "cuda:1"
    with pytest.raises(ValueError, match="cuda:N"):
        backend_for("gpu1")


def test_block_mode_is_what_tells_a_non_blocking_pinned_copy_from_a_blocking_one():
    # issue 15: in per-call mode every sample ends with a synchronize, so both copies measure the same
    def per_sample(pinned_non_blocking, mode):
        clock = FakeClock()
        gpu = FakeGPU(clock)

        def copy():   # 8 MiB at 10 GB/s: 0.84 ms of DMA after 0.2 ms of host launch
            gpu.copy_to_device(8 << 20, pinned=pinned_non_blocking, non_blocking=pinned_non_blocking)
        kw = dict(mode="block", block_size=8) if mode == "block" else {}
        return measure(copy, scenario="k", device="cuda", warmup=0, repeats=3, clock=clock,
                       backend=CudaBackend(gpu), **kw).host_summary.median

    assert per_sample(True, "per_call") == pytest.approx(per_sample(False, "per_call"))   # indistinguishable
    assert per_sample(True, "block") < 0.9 * per_sample(False, "block")  # queued copies hide the launches


def test_progress_is_said_between_samples_at_most_every_interval():
    from bench_core.output.progress import Progress
    from fakes import FakeClock, work

    lines, now = [], [0.0]
    progress = Progress(lines.append, every_s=5.0, clock=lambda: now[0])
    tick = progress.scenario("alpha")
    for i in range(1, 13):
        now[0] = i * 1.0
        tick("samples", i, 12)
    assert lines == ["bench_core: alpha: samples 5/12 (5 s)", "bench_core: alpha: samples 10/12 (10 s)"]
    # measure() calls it after each warmup call and each sample, outside the timed window
    seen = []
    clock = FakeClock()
    m = measure(work(clock, 3.0, 2.0), warmup=2, repeats=4, clock=clock,
                progress=lambda what, done, total: seen.append((what, done, total)))
    assert seen == [("warmup", 1, 2), ("warmup", 2, 2)] + [("samples", i, 4) for i in range(1, 5)]
    assert m.host_ms == (2.0,) * 4                     # the callback cost nothing the samples can see
