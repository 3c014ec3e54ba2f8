"""GPU telemetry from NVML around the timed window, driven by a fake NVML and the fake GPU on the CPU."""
import json

from bench_core import Scenario, measure
from bench_core.files import storage
from bench_core.timing.backends import CudaBackend, CpuBackend
from bench_core.deciding.gate import compare_runs
from bench_core.deciding.verdicts import SLOWER
from bench_core.output.tables import session_table
from bench_core.timing.telemetry import Telemetry, flags, GpuState
from fakes import FakeClock, FakeGPU, FakeNVML
from helpers import runs


def _measure_on_fake_gpu(nvml, during=None):
    clock = FakeClock()
    gpu = FakeGPU(clock)
    backend = CudaBackend(gpu, telemetry=Telemetry(nvml, 0, own_pid=100))

    calls = []

    def step():
        gpu.launch(2.0)
        calls.append(1)
        if during is not None and len(calls) == 3:   # cold start and warmup done: inside the timed window
            during()
    return measure(step, scenario=Scenario("k", ("forward",)), device="cuda", warmup=1, repeats=4,
                   clock=clock, backend=backend)


def test_the_window_is_read_before_and_after_and_kept_in_the_result():
    nvml = FakeNVML()
    m = _measure_on_fake_gpu(nvml)
    t = m.telemetry
    assert t["before"]["sm_clock_mhz"] == 1980 and t["after"]["power_w"] == 300.0 and t["flags"] == ()
    doc = json.loads(json.dumps(storage.measurement_doc(m)))
    assert storage.measurement_from_doc(doc).telemetry["after"]["temperature_c"] == 45


def test_throttling_during_the_window_is_flagged_and_marks_the_comparison():
    nvml = FakeNVML()

    def heat():
        nvml.reasons, nvml.sm, nvml.temp = 0x40, 1410, 88   # hardware thermal slowdown, clocks pulled down
    m = _measure_on_fake_gpu(nvml, during=heat)
    assert any(f.startswith("thermal throttling (hw_thermal_slowdown)") for f in m.telemetry["flags"])
    assert any("clocks not locked: SM clock 1980 -> 1410 MHz" in f for f in m.telemetry["flags"])
    assert "k: the GPU during its window: thermal throttling" in " ".join(session_table([m]).split())
    base = runs([1.0, 1.0, 1.0], spread=0.001)
    cand = [runs([1.5], spread=0.001, seed=s)[0] for s in range(3)]
    from dataclasses import replace
    cand[1] = replace(cand[1], telemetry=m.telemetry)
    c = compare_runs("s", base, cand)
    assert c.verdict == SLOWER and "GPU was throttled" in c.notes[0] and "current run 1" in c.notes[0]


def test_other_processes_and_power_caps_are_named_and_missing_fields_are_not_observed():
    nvml = FakeNVML()
    nvml.pids, nvml.reasons, nvml.power_mw, nvml.temp = [100, 4242], 0x4, None, None
    state = Telemetry(nvml, 0, own_pid=100).state()
    assert state.other_processes == 1 and state.power_w is None and state.temperature_c is None
    assert flags(state, state) == ["power throttling (sw_power_cap)", "1 other process(es) on the GPU"]
    assert flags(GpuState(), GpuState()) == []                      # nothing observed: nothing claimed


def test_without_nvml_there_is_no_telemetry_never_zeros():
    m = measure(lambda: None, warmup=0, repeats=2, backend=CpuBackend())
    assert m.telemetry is None
    clock = FakeClock()
    gpu = FakeGPU(clock)
    m = measure(lambda: gpu.launch(0.01, 1.0), device="cuda", warmup=0, repeats=2, clock=clock,
                backend=CudaBackend(gpu))
    assert m.telemetry is None and "telemetry" not in storage.measurement_doc(m)
