"""`measure`: one scenario's cold start, warmup and timed samples, taken with the one sample loop."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from bench_core.timing.backends import Backend, backend_for
from bench_core.core.errors import InvalidRecord, ScenarioError
from bench_core.core.records import ColdStart, Measurement
from bench_core.timing.protocol import series
from bench_core.timing.sampling import Clock, Sampler, set_threads
from bench_core.core.scenario import Scenario

MIN_REPEATS = 2


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
    progress: Callable[[str, int, int], None] | None = None,
) -> Measurement:
    """Time a zero-argument callable and return its raw samples as a `Measurement`.

    Order of events: `load` (timed once, kept as cold start `load_ms`), then the first call after
    `setup` (the cold start), then `warmup` untimed calls, then `repeats` timed samples. `setup`
    runs untimed before every call (per_call mode) or before every block (block mode).
    In block mode each sample times `block_size` back-to-back calls with one synchronization at the
    end, so overlap between consecutive steps is kept; the per-call figure is the block divided by k.
    `progress(what, done, total)` is called between calls and samples, never inside a timed window.
    """
    scenario = _scenario_of(fn, scenario)
    block_size = _check(scenario.name, fn, setup, load, warmup, repeats, mode, block_size, items)
    backend = backend or backend_for(device)
    kind = device.split(":")[0]           # "cuda:1" is a CUDA measurement, on device 1
    if backend.kind != kind:
        raise ScenarioError(scenario.name, f"backend {backend.kind!r} does not match device {device!r}")
    if device != kind:
        scenario = scenario.with_metadata(device=device)
    sampler = Sampler(scenario.name, backend, clock)
    used_threads = set_threads(threads)

    load_ms = sampler.elapsed_ms(load, "load") if load is not None else None
    window = _Window(backend)
    taken = series(sampler, fn, warmup=warmup, repeats=repeats, setup=setup, block_size=block_size,
                   window=lambda: window, progress=progress)
    cold, samples = taken.cold, taken.samples

    try:
        return Measurement(
            scenario=scenario,
            device=kind,
            mode=mode,
            block_size=block_size,
            warmup=warmup,
            repeats=repeats,
            host_ms=tuple(x.host_ms for x in samples),
            gpu_ms=tuple(x.gpu_ms for x in samples) if backend.kind == "cuda" else None,
            cold_start=ColdStart(cold.host_ms, cold.gpu_ms, load_ms, *taken.cold_compile),
            items=items,
            threads=used_threads,
            memory=window.memory,
            environment=environment or {},
            telemetry=window.telemetry,
        )
    except InvalidRecord as exc:
        raise ScenarioError(scenario.name, str(exc)) from exc


class _Window:
    """The samples' window: the device's memory over it, and the GPU's state read just outside it."""

    def __init__(self, backend: Backend):
        self.backend, self.memory, self.telemetry = backend, None, None

    def __enter__(self) -> "_Window":
        self.gpu_before = self.backend.gpu_state()     # clocks and throttling, read outside the window
        self.backend.memory_begin()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            return
        self.memory = self.backend.memory_end()
        gpu_after = self.backend.gpu_state()
        if self.gpu_before is not None and gpu_after is not None:
            from bench_core.timing.telemetry import window_record

            self.telemetry = window_record(self.gpu_before, gpu_after)


def _scenario_of(fn: Callable[[], Any], scenario: Scenario | str | None) -> Scenario:
    if scenario is None:
        return Scenario(getattr(fn, "__qualname__", "anonymous"), ("compute",))
    return Scenario(scenario, ("compute",)) if isinstance(scenario, str) else scenario


def _check(name: str, fn, setup, load, warmup, repeats, mode: str, block_size, items) -> int:
    """Every argument of `measure` checked before anything runs; returns the block size (1 per call)."""
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
    if items is not None and (isinstance(items, bool) or not isinstance(items, int) or items < 1):
        raise ScenarioError(name, f"items must be a positive integer, got {items!r}")
    if mode == "per_call":
        return 1
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ScenarioError(name, f"block mode needs block_size >= 2, got {block_size!r}")
    return block_size
