"""A *series*, the timing sequence of one step: a cold first call kept apart, untimed warmup, timed samples
(`measure` takes one in one process; a distributed rank takes one behind its barrier, its local step beside).
torch.compile's own clock says what of the cold start was tracing and compiling. Pure apart from calling the
step and the sampler."""
from __future__ import annotations

import random
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

from bench_core.timing.sampling import Sample, Sampler, gc_paused


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
