import pytest

from bench_core.core.environment import COMPARABILITY_FIELDS, differences
from bench_core.files.machine import fingerprint
from bench_core.files.pytest_benchmark import make_cuda_event_clock
from fakes import FakeClock, FakeGPU


def test_cuda_event_clock_gives_gpu_seconds_in_pytest_benchmarks_runner():
    clock = FakeClock()
    gpu = FakeGPU(clock)
    timer = make_cuda_event_clock(gpu)
    # pytest-benchmark's runner: start = timer(); fn(); end = timer(); duration = end - start
    start = timer()
    gpu.launch(work_ms=4.0, launch_ms=0.1)
    end = timer()
    assert clock.now < gpu.free_at          # the host has not waited yet...
    duration = end - start
    assert duration == pytest.approx(0.0041)  # ...the subtraction waits for the end event
    assert clock.now == gpu.free_at


def test_pytest_benchmark_runs_with_our_clock_by_dotted_name(pytester, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)   # this suite under -n: the inner run is not a worker
    pytester.makepyfile(test_pb="""
def test_sum(benchmark):
    assert benchmark.pedantic(sum, args=(range(100),), rounds=5, warmup_rounds=1, iterations=1) == 4950
""")
    # left to pytest-benchmark (bench_core adopts the fixture by default), the clocks serve its own timing
    res = pytester.runpytest("--benchmark-timer=bench_core.files.pytest_benchmark.cuda_sync_clock", "--benchmark-json=pb.json",
                             "--bench-pb-fixture", "leave")
    res.assert_outcomes(passed=1)
    import json

    doc = json.loads((pytester.path / "pb.json").read_text())
    assert doc["benchmarks"][0]["options"]["timer"] == "cuda_sync_clock"
    assert doc["benchmarks"][0]["stats"]["rounds"] == 5


def test_cuda_sync_clock_is_a_monotonic_seconds_clock_on_cpu():
    from bench_core.files.pytest_benchmark import cuda_sync_clock

    a = cuda_sync_clock()
    b = cuda_sync_clock()
    assert b >= a and isinstance(a, float)


def test_fingerprint_on_cpu_records_versions_and_flags_and_leaves_gpu_unobserved():
    import torch

    env = fingerprint("cpu")
    assert env["torch"] == torch.__version__
    assert env["torch_threads"] == torch.get_num_threads()
    for key in ("allow_tf32_matmul", "allow_tf32_cudnn", "deterministic_algorithms", "cudnn_benchmark"):
        assert isinstance(env[key], bool)
    assert env["gpu_name"] is None and env["gpu_driver"] is None   # not observed, not ""
    assert set(COMPARABILITY_FIELDS) <= set(env)


def test_fingerprint_records_git_commit_and_dirtiness(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "f").write_text("1")
    subprocess.run(["git", "add", "f"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=n", "commit", "-qm", "x"], cwd=tmp_path,
                   check=True)
    env = fingerprint("cpu", root=str(tmp_path))
    assert len(env["git_commit"]) == 40 and env["git_dirty"] is False
    (tmp_path / "f").write_text("2")
    assert fingerprint("cpu", root=str(tmp_path))["git_dirty"] is True


def test_fingerprint_outside_git_is_unobserved(tmp_path):
    env = fingerprint("cpu", root=str(tmp_path))
    assert env["git_commit"] is None and env["git_dirty"] is None


def test_differences_ignore_drifting_fields():
    a = {"device": "cuda", "gpu_name": "H200", "hostname": "x", "torch_major_minor": "2.13"}
    b = dict(a, hostname="y", gpu_name="A100")
    assert differences(a, b) == {"gpu_name": ("H200", "A100")}


def _fake_torch(name, sms, memory):
    from types import SimpleNamespace as NS

    props = NS(name=name, major=9, minor=0, total_memory=memory, multi_processor_count=sms)
    return NS(__version__="2.13.0+cu128", version=NS(cuda="12.8"), get_num_threads=lambda: 8,
              backends=NS(cuda=NS(matmul=NS(allow_tf32=False)),
                          cudnn=NS(allow_tf32=True, benchmark=False, deterministic=False, version=lambda: 91000)),
              are_deterministic_algorithms_enabled=lambda: False, get_float32_matmul_precision=lambda: "highest",
              cuda=NS(current_device=lambda: 0, get_device_properties=lambda i: props))


def test_two_slices_of_one_gpu_name_are_told_apart(tmp_path):
    # MIG slices share a name; SM count and memory say which one ran (issue 15)
    full = fingerprint("cuda", root=str(tmp_path), torch_module=_fake_torch("NVIDIA H200", 132, 141 << 30))
    slice_ = fingerprint("cuda", root=str(tmp_path), torch_module=_fake_torch("NVIDIA H200", 16, 18 << 30))
    assert full["gpu_sm_count"] == 132 and full["cuda_version"] == "12.8"
    assert set(differences(full, slice_)) == {"gpu_sm_count", "gpu_memory_bytes"}
