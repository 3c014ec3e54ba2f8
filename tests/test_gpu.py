"""Checks that need a real CUDA device: run with `pytest tests --gpu` (scripts/gpu_check.sh).

Without --gpu they are skipped; their logic is covered on the CPU by the fakes in the other tests.
"""
import json

import pytest
import torch

from bench_core import StartingState, measure
from bench_core.files.machine import fingerprint

pytestmark = pytest.mark.gpu


def test_events_and_synchronized_host_time_on_a_real_gpu():
    a = torch.randn(2048, 2048, device="cuda")
    m = measure(lambda: a @ a, scenario="mm", device="cuda", warmup=3, repeats=10)
    assert m.timer == "cuda_event" and len(m.gpu_ms) == 10
    assert all(g > 0 for g in m.gpu_ms)
    # the host figure waits for the GPU, so it can't be much below the GPU time
    assert m.host_summary.median >= 0.9 * m.gpu_summary.median
    assert m.memory.peak_allocated_bytes is not None and m.memory.device_allocs is not None


def test_block_mode_on_a_real_gpu():
    a = torch.randn(512, 512, device="cuda")
    m = measure(lambda: a @ a, scenario="mm", device="cuda", warmup=3, repeats=5, mode="block", block_size=10)
    assert m.mode == "block" and all(v > 0 for v in m.gpu_ms)


def test_fingerprint_sees_the_gpu():
    env = fingerprint("cuda")
    assert env["gpu_name"] and env["gpu_capability"] and env["gpu_memory_bytes"] > 0
    assert env["cuda_version"]


def test_cuda_event_clock_with_pytest_benchmark_runner():
    from bench_core.files.pytest_benchmark import cuda_event_clock

    a = torch.randn(1024, 1024, device="cuda")
    start = cuda_event_clock()
    a @ a
    end = cuda_event_clock()
    assert (end - start) > 0


def test_state_restores_cuda_rng_and_moves_devices(tmp_path):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    state = StartingState.capture(model, opt, [torch.randn(4, 8)])
    path = state.save(tmp_path / "s.pt")
    moved = StartingState.load(path, map_location="cuda")
    assert moved.hash == state.hash
    model.cuda()
    opt = torch.optim.AdamW(model.parameters())
    b1 = moved.restore(model, opt)
    r1 = torch.rand(3, device="cuda")
    model(b1[0]).sum().backward()
    opt.step()   # a non-capturable AdamW wants its `step` on the CPU: restore must leave it there
    moved.restore(model, opt)
    r2 = torch.rand(3, device="cuda")
    assert torch.equal(r1, r2) and b1[0].is_cuda


def test_profiler_collects_cuda_activity(tmp_path):
    from bench_core.workflows.diagnose.profile import ProfileConfig, profile

    a = torch.randn(1024, 1024, device="cuda")
    res = profile("mm", lambda: a @ a, ProfileConfig(folder=tmp_path, device="cuda"))
    assert res.facts.gpu_observed and res.facts.gpu_busy_us > 0
    json.loads(res.trace_path.read_text())


def test_graph_mode_and_a_cold_cache_on_a_real_gpu():
    x = torch.randn(256, device="cuda")

    def small():
        z = x
        for _ in range(16):
            z = z * 1.0001 + 0.0001
        return z
    m = measure(small, scenario="small", device="cuda", warmup=2, repeats=5, graph=True, cache="cold",
                cache_check=True)
    g = m.gpu_timing["graph"]
    assert g["output"] == "equal to an eager call's" and len(g["eager_gpu_ms"]) == 5
    assert m.gpu_timing["cache"]["flush_bytes"] >= 2 * 2**20
    # the flush works on this device, and the self-check's probe is one that can show it (a byte-wise probe could not)
    assert m.gpu_timing["cache"]["check"]["colder"], m.gpu_timing["cache"]["check"]
    assert m.scenario.metadata["cache"] == "cold" and m.scenario.metadata["cuda_graph"] is True
