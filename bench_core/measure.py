"""The measuring loop: cold start, warmup, timed samples. Profiler-free, no syncs inside a timed call."""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import Any, Callable, Mapping

from .backends import Backend, backend_for
from .errors import InvalidRecord, ScenarioError
from .records import ColdStart, Measurement
from .scenario import Scenario

Clock = Callable[[], int]  # nanoseconds, monotonic

MIN_REPEATS = 2


@contextmanager
def _gc_off():
    # A collection landing inside one sample adds milliseconds to it alone: keep it out of the window.
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _set_threads(threads: int | None) -> int | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return threads
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def _timed(fn: Callable[[], Any], calls: int, backend: Backend, clock: Clock) -> tuple[float, float | None]:
    """Time `calls` back-to-back calls: one sync before, events around, one sync after."""
    backend.synchronize()  # earlier work must not leak into this window
    start_ev = backend.event()
    t0 = clock()
    for _ in range(calls):
        fn()
    end_ev = backend.event()
    backend.synchronize()
    t1 = clock()
    host = (t1 - t0) / 1e6 / calls
    gpu = backend.elapsed_ms(start_ev, end_ev) / calls if start_ev is not None else None
    return host, gpu


def measure(
    fn: Callable[[], Any],
    *,
    scenario: Scenario | str | None = None,
    device: str = "cpu",
    warmup: int = 3,
    repeats: int = 20,
    setup: Callable[[], Any] | None = None,
    load: Callable[[], Any] | None = None,
    items: int | None = None,
    mode: str = "per_call",
    block_size: int = 1,
    threads: int | None = None,
    environment: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
    backend: Backend | None = None,
) -> Measurement:
    """Time a zero-argument callable and return its raw samples as a `Measurement`.

    Order of events: `load` (timed once, kept as cold start `load_ms`), then the first call after
    `setup` (the cold start), then `warmup` untimed calls, then `repeats` timed samples. `setup`
    runs untimed before every call (per_call mode) or before every block (block mode).
    In block mode each sample times `block_size` back-to-back calls with one synchronization at the
    end, so overlap between consecutive steps is kept; the per-call figure is the block divided by k.
    """
    if scenario is None:
        scenario = Scenario(getattr(fn, "__qualname__", "anonymous"), ("compute",))
    elif isinstance(scenario, str):
        scenario = Scenario(scenario, ("compute",))
    name = scenario.name
    if not callable(fn):
        raise ScenarioError(name, f"the function to measure must be callable, got {type(fn).__name__}")
    if setup is not None and not callable(setup):
        raise ScenarioError(name, f"setup must be callable or None, got {type(setup).__name__}")
    if load is not None and not callable(load):
        raise ScenarioError(name, f"load must be callable or None, got {type(load).__name__}")
    for label, value, low in (("warmup", warmup, 0), ("repeats", repeats, MIN_REPEATS)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ScenarioError(name, f"{label} must be an integer >= {low}, got {value!r}")
    if mode not in ("per_call", "block"):
        raise ScenarioError(name, f"mode must be 'per_call' or 'block', got {mode!r}")
    if mode == "per_call":
        block_size = 1
    elif isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ScenarioError(name, f"block mode needs block_size >= 2, got {block_size!r}")
    if items is not None and (isinstance(items, bool) or not isinstance(items, int) or items < 1):
        raise ScenarioError(name, f"items must be a positive integer, got {items!r}")

    backend = backend or backend_for(device)
    if backend.kind != device:
        raise ScenarioError(name, f"backend {backend.kind!r} does not match device {device!r}")
    clock = clock or time.perf_counter_ns
    used_threads = _set_threads(threads)

    def stage(label: str, f: Callable[[], Any]):
        try:
            return f()
        except ScenarioError:
            raise
        except Exception as exc:  # the user's code failed: say where, keep the cause chained
            raise ScenarioError(name, f"{label} raised {type(exc).__name__}: {exc}") from exc

    load_ms = None
    if load is not None:
        t0 = clock()
        stage("load", load)
        backend.synchronize()
        load_ms = (clock() - t0) / 1e6

    if setup is not None:
        stage("setup before the first call", setup)
    first_host, first_gpu = stage("the first call (cold start)", lambda: _timed(fn, 1, backend, clock))

    for i in range(warmup):
        if setup is not None:
            stage(f"setup before warmup call {i}", setup)
        stage(f"warmup call {i}", fn)

    host, gpu = [], []
    with _gc_off():
        backend.memory_begin()
        for i in range(repeats):
            if setup is not None:
                stage(f"setup before sample {i}", setup)
            h, g = stage(f"sample {i}", lambda: _timed(fn, block_size, backend, clock))
            host.append(h)
            gpu.append(g)
        memory = backend.memory_end()

    try:
        return Measurement(
            scenario=scenario,
            device=device,
            mode=mode,
            block_size=block_size,
            warmup=warmup,
            repeats=repeats,
            host_ms=tuple(host),
            gpu_ms=tuple(gpu) if backend.kind == "cuda" else None,
            cold_start=ColdStart(first_host, first_gpu, load_ms),
            items=items,
            threads=used_threads,
            memory=memory,
            environment=environment or {},
        )
    except InvalidRecord as exc:
        raise ScenarioError(name, str(exc)) from exc
