"""Verdicts that explain themselves: when side by side calls a scenario slower or faster, one profiler pass of each
side (after the measurement, never inside it) says which operators' time moved most, with their calls per step.
A first hypothesis to test, not a measurement: the profiler's own overhead is in these times, and the verdict
stays the rounds'."""
from __future__ import annotations

from typing import Any, Callable, Mapping

CALLS = 5   # profiled calls of each side, after one unprofiled call


def start_profiler() -> None:
    """One profiler pass over a tiny step: a process's first pass is slow (most of a second, docs/side-by-side.md),
    later ones in it, or in a child forked from it after this, are not."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.zeros(1).add_(1)


def op_times(fn: Callable[[], Any], setup: Callable[[], Any] | None = None, calls: int = CALLS,
             device: str = "cpu") -> dict[str, tuple[float, int]]:
    """Per operator: self time per step (ms; the device's own on CUDA) and calls per step, over `calls` calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def call():
        if setup is not None:
            setup()
        fn()
    call()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(calls):
            call()
        if device == "cuda":
            torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) if device == "cuda" else e.self_cpu_time_total
        out[e.key] = (us / calls / 1000.0, int(round(e.count / calls)))
    return out


def moved(base: Mapping[str, tuple[float, int]], cand: Mapping[str, tuple[float, int]], top: int = 5,
          floor_ms: float = 0.01) -> list[str]:
    """The operators whose self time per step moved most between the two sides, in words, largest first."""
    rows = []
    for op in set(base) | set(cand):
        (bt, bn), (ct, cn) = base.get(op, (0.0, 0)), cand.get(op, (0.0, 0))
        if abs(ct - bt) >= floor_ms:
            rows.append((abs(ct - bt), f"{op} {ct - bt:+.3g} ms per step ({bt:.3g} -> {ct:.3g} ms; calls {bn} -> {cn})"))
    return [text for _, text in sorted(rows, reverse=True)[:top]]

