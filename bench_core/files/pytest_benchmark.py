"""Clocks for existing pytest-benchmark suites, and export of our results in its JSON format.

Use with calibration off, since calibration from launch times is wrong for asynchronous work:
    pytest --benchmark-timer=bench_core.files.pytest_benchmark.cuda_sync_clock --benchmark-calibration-precision=1 ...
or, better, `benchmark.pedantic(fn, rounds=R, warmup_rounds=W, iterations=1)`, which never calibrates.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from bench_core.core.records import Measurement
from bench_core.core.scenario import thaw
from bench_core.files.storage import scenario_doc
from bench_core.core.stats import summarize, tukey_fences


def cuda_sync_clock() -> float:
    """Seconds from a host clock read after waiting for all queued GPU work: end-to-end time."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


class _EventStamp:
    """A point on the GPU timeline. `end - start` waits for `end` and gives GPU seconds between them."""

    __slots__ = ("event",)

    def __init__(self, event):
        self.event = event

    def __sub__(self, other: "_EventStamp") -> float:
        self.event.synchronize()
        return other.event.elapsed_time(self.event) / 1e3


def make_cuda_event_clock(cuda: Any = None):
    """A pytest-benchmark timer giving GPU time from CUDA events (`cuda` injectable for tests)."""

    def clock() -> _EventStamp:
        mod = cuda
        if mod is None:
            import torch

            mod = torch.cuda
        ev = mod.Event(enable_timing=True)
        ev.record()
        return _EventStamp(ev)

    clock.__name__ = "cuda_event_clock"
    return clock


cuda_event_clock = make_cuda_event_clock()


def to_pytest_benchmark(results: Sequence[Measurement], environment: Mapping[str, Any], created: str) -> dict:
    """Our session in pytest-benchmark's JSON layout (seconds), so its `compare` and other readers work."""
    benches = []
    for m in results:
        secs = [v / 1e3 for v in m.primary_ms]
        s = summarize(secs)
        q1, q3 = s.q1, s.q3
        lo, hi = tukey_fences(q1, q3)
        meta = thaw(m.scenario.metadata)
        params = meta.get("params")
        benches.append({
            "group": meta.get("group"),
            "name": m.name,
            "fullname": meta.get("test", m.name),
            "params": params,
            "param": m.name[m.name.index("[") + 1:-1] if params and m.name.endswith("]") and "[" in m.name else None,
            "extra_info": {**meta.get("extra_info", {}), "bench_core": {"scenario": scenario_doc(m.scenario), "device": m.device, "timer": m.timer,
                                          "mode": m.mode, "block_size": m.block_size,
                                          "cold_start_ms": dict(m.cold_start.__dict__)}},
            "options": {"disable_gc": True, "timer": m.timer, "min_rounds": m.repeats, "max_time": None,
                        "min_time": None, "warmup": m.warmup},
            "stats": {
                "min": s.min, "max": s.max, "mean": s.mean, "stddev": s.stdev, "rounds": s.n,
                "median": s.median, "iqr": s.iqr, "q1": q1, "q3": q3,
                "iqr_outliers": s.low_outliers + s.high_outliers,
                "stddev_outliers": sum(1 for v in secs if abs(v - s.mean) > s.stdev),
                "outliers": f"{sum(1 for v in secs if abs(v - s.mean) > s.stdev)};{s.low_outliers + s.high_outliers}",
                "ld15iqr": min(v for v in secs if v >= lo), "hd15iqr": max(v for v in secs if v <= hi),
                "ops": (1.0 / s.mean) if s.mean > 0 else 0.0, "total": sum(secs),
                "data": secs, "iterations": m.block_size,
            },
        })
    return {
        "machine_info": {"node": environment.get("hostname"), "processor": environment.get("cpu_model"),
                         "python_version": environment.get("python"), "cpu": {"count": environment.get("cpu_count")},
                         "bench_core_environment": dict(environment)},
        "commit_info": {"id": environment.get("git_commit"), "dirty": environment.get("git_dirty")},
        "benchmarks": benches,
        "datetime": created,
        "version": "5.1.0",
    }
