"""One scenario's *series*, the timing sequence of one step: a cold first call kept apart, untimed warmup, timed
samples, taken with the one sample loop (`series`; a distributed rank takes one behind its barrier, its local step
beside), and `measure`, which checks the request, applies the GPU timing modes and returns the `Measurement`.
torch.compile's own clock says what of the cold start was tracing and compiling."""
from __future__ import annotations

import random
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from bench_core.timing.backends import Backend, backend_for
from bench_core.core.errors import InvalidRecord, ScenarioError
from bench_core.core.records import ColdStart, Measurement
from bench_core.timing.sampling import Clock, Sample, Sampler, gc_paused, set_threads
from bench_core.core.scenario import Scenario

MIN_REPEATS = 2


@dataclass(frozen=True)
class Beside:
    """A second step timed beside each sample of a series, in a random order with it (a rank's step with its
    gradient sync off): `prepare()` runs untimed before it and returns what undoes it, run untimed after."""

    fn: Callable[[], Any]
    prepare: Callable[[], Callable[[], Any]]


@dataclass(frozen=True)
class Series:
    cold: Sample
    samples: tuple[Sample, ...]
    beside: tuple[Sample, ...] = ()
    cold_compile: tuple[float | None, float | None] = (None, None)   # (tracing_ms, compiling_ms), see below


def compile_clock() -> dict[str, int] | None:
    """torch.compile's own running totals of its phases (ns), where torch._dynamo is loaded; None where not."""
    utils = sys.modules.get("torch._dynamo.utils")
    totals = getattr(utils, "cumulative_time_spent_ns", None)
    return None if totals is None else dict(totals)


def compile_split(before: dict[str, int] | None) -> tuple[float | None, float | None]:
    """(tracing_ms, compiling_ms) that torch.compile spent since `before` (`compile_clock()`): dynamo's frame
    compilation less the backend's, and the backend's (inductor's code generation and compilation). (None, None)
    where nothing was compiled, or torch._dynamo was not there to say: not observed, never zero."""
    after = compile_clock()
    if after is None:
        return None, None
    before = before or {}
    total = after.get("entire_frame_compile", 0) - before.get("entire_frame_compile", 0)
    backend = after.get("backend_compile", 0) - before.get("backend_compile", 0)
    if total <= 0:
        return None, None
    return max(total - backend, 0) / 1e6, backend / 1e6


def series(sampler: Sampler, fn: Callable[[], Any], *, warmup: int, repeats: int,
           setup: Callable[[], Any] | None = None, block_size: int = 1, beside: Beside | None = None,
           order: random.Random | None = None, window: Callable[[], Any] = nullcontext,
           progress: Callable[[str, int, int], None] | None = None,
           phase: Callable[[str], Any] | None = None) -> Series:
    """The series: `setup` (untimed, before every call), the first call timed as the cold start, `warmup`
    calls untimed, then `repeats` samples of `block_size` calls each, inside `window()` (a context around the
    samples alone: the memory window, a sampler's own bookkeeping) with the collector paused. With `beside`,
    each sample is paired with one of the second step, the two in an order `order` shuffles. `phase(name)` is
    told where the series is (cold start, warmup, samples); `progress(what, done, total)` how far it is."""
    def prepared(what: str) -> None:
        if setup is not None:
            sampler.call(f"setup before {what}", setup)

    phase = phase or (lambda name: None)
    phase("cold start")
    prepared("the first call")
    before = compile_clock()
    cold = sampler.sample(fn, what="the first call (cold start)")
    cold_compile = compile_split(before)
    phase("warmup")
    for i in range(warmup):
        prepared(f"warmup call {i}")
        sampler.warm(fn, f"warmup call {i}")
        if progress is not None:
            progress("warmup", i + 1, warmup)
    samples: list[Sample] = []
    besides: list[Sample] = []
    phase("samples")
    with gc_paused(), window():
        for i in range(repeats):
            kinds = ["step", "beside"] if beside is not None else ["step"]
            if order is not None:
                order.shuffle(kinds)
            for kind in kinds:
                if kind == "step":
                    prepared(f"sample {i}")
                    samples.append(sampler.sample(fn, block_size, what=f"sample {i}"))
                else:
                    undo = sampler.call(f"preparing beside sample {i}", beside.prepare)
                    besides.append(sampler.sample(beside.fn, what=f"beside sample {i}"))
                    sampler.call(f"undoing beside sample {i}", undo)
            if progress is not None:
                progress("samples", i + 1, repeats)
    return Series(cold, tuple(samples), tuple(besides), cold_compile)


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
    cache: str | None = None,
    graph: bool = False,
    cache_check: bool = False,
) -> Measurement:
    """Time a zero-argument callable and return its raw samples as a `Measurement`.

    Order of events: `load` (timed once, kept as cold start `load_ms`), then the first call after
    `setup` (the cold start), then `warmup` untimed calls, then `repeats` timed samples. `setup`
    runs untimed before every call (per_call mode) or before every block (block mode).
    In block mode each sample times `block_size` back-to-back calls with one synchronization at the
    end, so overlap between consecutive steps is kept; the per-call figure is the block divided by k.
    `progress(what, done, total)` is called between calls and samples, never inside a timed window.
    GPU modes (CUDA only; `timing.cache`, `timing.graphs`): `cache` "cold" flushes L2 before every sample, "hot"
    takes them back to back, and `cache_check` first checks that a flush leaves the cache cold here; `graph`
    times the step captured as a CUDA graph, k replays per sample, beside the same k calls eagerly. Where NVML
    reads the SM clock around each sample, samples taken throttled are set aside (`telemetry.per_sample`).
    """
    scenario = _scenario_of(fn, scenario)
    block_size = _check(scenario.name, fn, setup, load, warmup, repeats, mode, block_size, items)
    backend = backend or backend_for(device)
    kind = device.split(":")[0]           # "cuda:1" is a CUDA measurement, on device 1
    if backend.kind != kind:
        raise ScenarioError(scenario.name, f"backend {backend.kind!r} does not match device {device!r}")
    if device != kind:
        scenario = scenario.with_metadata(device=device)
    modes = _GpuModes(backend, scenario.name, cache, graph, setup, clock, cache_check)
    scenario = modes.scenario(scenario)
    sampler = Sampler(scenario.name, backend, clock, before_sample=modes.flush)
    used_threads = set_threads(threads)

    load_ms = sampler.elapsed_ms(load, "load") if load is not None else None
    window = _Window(backend)
    k = modes.replays(mode, block_size)
    taken = series(sampler, fn, warmup=warmup, repeats=repeats, setup=setup, block_size=k or block_size,
                   window=nullcontext if graph else lambda: window, progress=progress)
    if graph:
        taken = modes.graph_series(sampler, fn, taken, k, repeats, window=lambda: window, progress=progress)
        mode, block_size = "block", k
    cold, samples, gpu_timing = modes.decided_on(taken)

    try:
        return Measurement(
            scenario=scenario,
            device=kind,
            mode=mode,
            block_size=block_size,
            warmup=warmup,
            repeats=repeats,
            host_ms=tuple(x.host_ms for x in samples),
            gpu_timing=gpu_timing,
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


class _GpuModes:
    """The GPU modes of one measurement: the cache state and its flush, graph capture, clocks per sample."""

    def __init__(self, backend: Backend, name: str, cache: str | None, graph: bool, setup, clock, check: bool):
        from bench_core.timing import cache as caching

        self.backend, self.name, self.cache, self.graph = backend, name, cache, graph
        self.record: dict[str, Any] = {}
        caching.check_state(cache, name)
        if graph:
            from bench_core.timing.graphs import refuse

            refuse(backend, name, setup)
        self.flush = caching.Flush(backend, name) if cache == "cold" else None
        if cache is not None:
            self.record["cache"] = {"state": cache, "flush_bytes": None if self.flush is None else self.flush.nbytes}
        if check and self.flush is not None:
            found = caching.self_check(backend, clock, self.flush)
            self.record["cache"]["check"] = found.to_dict()

    def scenario(self, scenario: Scenario) -> Scenario:
        """The modes are part of the question: two results compare only when they were taken the same way."""
        extra = {**({"cache": self.cache} if self.cache else {}), **({"cuda_graph": True} if self.graph else {})}
        return scenario.with_metadata(**extra) if extra else scenario

    def replays(self, mode: str, block_size: int) -> int | None:
        """Graph mode's calls per sample (the block's, else GRAPH_REPLAYS), for the eager samples and the replays."""
        if not self.graph:
            return None
        from bench_core.timing.graphs import GRAPH_REPLAYS

        return block_size if mode == "block" else GRAPH_REPLAYS

    def graph_series(self, sampler: Sampler, fn, eager, k: int, repeats: int, **kw):
        """After the eager samples: capture, check the replay, and take the replayed samples (the result's)."""
        from dataclasses import replace

        from bench_core.timing import graphs

        got = graphs.capture(self.backend, self.name, fn)
        replayed = series(sampler, got.replay, warmup=1, repeats=repeats, block_size=k, **kw)
        self.record["graph"] = graphs.record(eager, replayed, k, got.output)
        return replace(replayed, cold=eager.cold, cold_compile=eager.cold_compile)

    def decided_on(self, taken):
        """(cold start, the samples decisions use, the result's gpu_timing record): samples taken while the GPU
        was throttled are set aside, raw, where enough others remain."""
        from bench_core.timing.telemetry import per_sample

        samples = list(taken.samples)
        readings = [x.clocks for x in samples]
        found = per_sample(readings, self.backend.default_sm_mhz()) if any(r is not None for r in readings) else None
        if found is not None:
            kept, clocks = found
            used = set(kept)
            clocks["set_aside"] = [[x.host_ms, x.gpu_ms] for i, x in enumerate(samples) if i not in used]
            self.record["clocks"] = clocks
            samples = [samples[i] for i in kept]
        return taken.cold, samples, self.record or None


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
