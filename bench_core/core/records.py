"""Immutable result records. They check their values when built, so nothing downstream has to.

Their files are written and read by `files/storage.py`, which owns their JSON formats."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from bench_core.core.errors import InvalidRecord
from bench_core.core.scenario import Scenario, freeze
from bench_core.core.stats import Summary, per_second, summarize

MODES = ("per_call", "block")
MAX_MS = 1e9   # a sample (or a cold start) longer than 11.6 days is not a timing: a damaged or forged file
DEVICES = ("cpu", "cuda")


def _check_ms(values: Sequence[float], what: str, scenario: str) -> tuple[float, ...]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidRecord(f"scenario {scenario!r}: {what}[{i}] is {v!r}, not a number")
        if not math.isfinite(v):
            raise InvalidRecord(f"scenario {scenario!r}: {what}[{i}] is {v}; a timing must be finite")
        if v < 0:
            raise InvalidRecord(f"scenario {scenario!r}: {what}[{i}] is {v} ms; a timing cannot be negative")
        if v > MAX_MS:
            raise InvalidRecord(f"scenario {scenario!r}: {what}[{i}] is {v:g} ms; no timing is that long (over "
                                f"{MAX_MS:g} ms, 11.6 days)")
        out.append(float(v))
    return tuple(out)


def _opt_ms(v: float | None, what: str, scenario: str) -> float | None:
    return None if v is None else _check_ms([v], what, scenario)[0]


@dataclass(frozen=True)
class Memory:
    """Device memory over the timed window. None means not observed (e.g. on the CPU), never 0."""

    peak_allocated_bytes: int | None = None    # absolute: every resident tensor (weights, inputs...) included
    peak_reserved_bytes: int | None = None     # absolute: the cache's high-water mark, whatever ran before
    window_peak_bytes: int | None = None       # the timed window's own figure: peak allocated minus allocated at its start
    device_allocs: int | None = None      # cudaMalloc calls made by the caching allocator in the window
    alloc_retries: int | None = None      # times the allocator freed its cache and retried

    def __post_init__(self):
        for k, v in self.__dict__.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidRecord(f"memory figure {k} must be a non-negative integer or None, got {v!r}")

    @property
    def observed(self) -> bool:
        return any(v is not None for v in self.__dict__.values())

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ColdStart:
    """The first observation, kept apart: never averaged into the steady state."""

    first_call_ms: float                 # host, end-to-end, of the first call after setup
    first_call_gpu_ms: float | None = None
    load_ms: float | None = None         # a separate `load` step (model construction, state load, move)
    tracing_ms: float | None = None      # torch.compile inside the first call: dynamo's tracing (and guards)
    compiling_ms: float | None = None    # ... and its backend's compilation (inductor); None: nothing compiled


@dataclass(frozen=True)
class Measurement:
    """Raw per-call samples of one scenario on one device, plus everything needed to interpret them.

    `host_ms` is end-to-end time per call from a host clock read after synchronizing; `gpu_ms` is
    GPU time per call from CUDA events (None on the CPU). In "block" mode each sample is a block of
    `block_size` back-to-back calls with one synchronization at the end, divided by `block_size`.
    """

    scenario: Scenario
    device: str
    mode: str
    block_size: int
    warmup: int
    repeats: int
    host_ms: tuple[float, ...]
    cold_start: ColdStart
    gpu_ms: tuple[float, ...] | None = None
    items: int | None = None
    threads: int | None = None
    memory: Memory = field(default_factory=Memory)
    environment: Mapping[str, Any] = field(default_factory=dict)
    # the GPU's own state around the window (`telemetry.window_record`); None: not observed
    telemetry: Mapping[str, Any] | None = None
    # the step's counted work (`flops.WorkCount.to_dict`), counted once after the window; None: not counted
    work: Mapping[str, Any] | None = None
    # a distributed scenario's every rank (`ranks.RankSamples`); host_ms and gpu_ms then hold the maximum over
    # ranks of each step, the step's real cost. None: one process
    ranks: Any = None
    # what one step does, counted exactly once after the window (`signature.Signature`); None: not counted
    signature: Any = None
    # one profiler pass after the window, per operator: (self ms per step, calls per step), so that a later
    # verdict against this result can say where the time moved; None: not taken
    op_times: Mapping[str, tuple[float, int]] | None = None
    # how a GPU result was taken (`timing.measuring._GpuModes`): "cache" (its state, the flush, the session's
    # self-check), "graph" (replays per sample, the eager samples beside them, launch overhead) and "clocks" (the
    # SM clock per sample, the samples taken throttled: set aside raw in "set_aside", or all decided on). None: none
    gpu_timing: Mapping[str, Any] | None = None

    def __post_init__(self):
        name = self.scenario.name if isinstance(self.scenario, Scenario) else "?"
        set_aside = self._check_gpu_timing(name)
        if self.ranks is not None:
            from bench_core.core.ranks import RankSamples, max_over_ranks

            if not isinstance(self.ranks, RankSamples):
                raise InvalidRecord(f"scenario {name!r}: ranks must be a RankSamples record")
            if tuple(self.host_ms) != max_over_ranks(self.ranks.host_ms):
                raise InvalidRecord(f"scenario {name!r}: host_ms must be the maximum over ranks of each step")
        if self.telemetry is not None:
            if not isinstance(self.telemetry, Mapping) or not {"before", "after", "flags"} <= set(self.telemetry):
                raise InvalidRecord(f"scenario {name!r}: telemetry must hold before, after and flags")
            object.__setattr__(self, "telemetry", MappingProxyType(
                {**self.telemetry, "flags": tuple(self.telemetry["flags"])}))
        if self.work is not None:
            flops = self.work.get("flops") if isinstance(self.work, Mapping) else None
            if isinstance(flops, bool) or not isinstance(flops, int) or flops < 0:
                raise InvalidRecord(f"scenario {name!r}: work must hold a non-negative integer count of flops")
            object.__setattr__(self, "work", MappingProxyType(dict(self.work)))
        if self.op_times is not None:
            try:
                ops = {str(k): (float(v[0]), int(v[1])) for k, v in self.op_times.items()}
            except (AttributeError, TypeError, ValueError, IndexError):
                raise InvalidRecord(f"scenario {name!r}: op_times must map operators to [ms, calls]") from None
            object.__setattr__(self, "op_times", MappingProxyType(ops))
        if self.signature is not None:
            from bench_core.core.signature import Signature

            if not isinstance(self.signature, Signature):
                raise InvalidRecord(f"scenario {name!r}: signature must be a Signature record")
        if not isinstance(self.scenario, Scenario):
            raise InvalidRecord("measurement needs a Scenario record")
        if self.device not in DEVICES:
            raise InvalidRecord(f"scenario {name!r}: device must be one of {DEVICES}, got {self.device!r}")
        if self.mode not in MODES:
            raise InvalidRecord(f"scenario {name!r}: mode must be one of {MODES}, got {self.mode!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise InvalidRecord(f"scenario {name!r}: block_size must be >= 1")
        if self.mode == "per_call" and self.block_size != 1:
            raise InvalidRecord(f"scenario {name!r}: per_call mode has block_size 1")
        host = _check_ms(self.host_ms, "host_ms", name)
        if len(host) < 2:
            raise InvalidRecord(f"scenario {name!r}: a measurement needs at least 2 samples, got {len(host)}")
        if len(host) + set_aside != self.repeats:
            aside = f" and {set_aside} set aside" if set_aside else ""
            raise InvalidRecord(f"scenario {name!r}: {len(host)} samples{aside} but repeats={self.repeats}")
        object.__setattr__(self, "host_ms", host)
        if self.gpu_ms is not None:
            gpu = _check_ms(self.gpu_ms, "gpu_ms", name)
            if len(gpu) != len(host):
                raise InvalidRecord(f"scenario {name!r}: gpu_ms and host_ms differ in length")
            object.__setattr__(self, "gpu_ms", gpu)
        if self.device == "cpu" and self.gpu_ms is not None:
            raise InvalidRecord(f"scenario {name!r}: a CPU measurement has no GPU time")
        _opt_ms(self.cold_start.first_call_ms, "cold_start.first_call_ms", name)
        _opt_ms(self.cold_start.first_call_gpu_ms, "cold_start.first_call_gpu_ms", name)
        _opt_ms(self.cold_start.load_ms, "cold_start.load_ms", name)
        if self.items is not None and (isinstance(self.items, bool) or not isinstance(self.items, int) or self.items < 1):
            raise InvalidRecord(f"scenario {name!r}: items must be a positive integer, got {self.items!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise InvalidRecord(f"scenario {name!r}: warmup must be >= 0")
        object.__setattr__(self, "environment", MappingProxyType(dict(self.environment)))

    def _check_gpu_timing(self, name: str) -> int:
        """Validates `gpu_timing` (frozen); returns how many samples its clocks set aside."""
        if self.gpu_timing is None:
            return 0
        if not isinstance(self.gpu_timing, Mapping) or not set(self.gpu_timing) <= {"cache", "graph", "clocks"}:
            raise InvalidRecord(f"scenario {name!r}: gpu_timing must be an object of cache, graph and clocks")
        clocks = self.gpu_timing.get("clocks") or {}
        aside = clocks.get("set_aside", [])
        if not isinstance(aside, (list, tuple)) or any(not isinstance(x, (list, tuple)) or len(x) != 2 for x in aside):
            raise InvalidRecord(f"scenario {name!r}: gpu_timing.clocks.set_aside must list [host_ms, gpu_ms] pairs")
        object.__setattr__(self, "gpu_timing", freeze(dict(self.gpu_timing)))
        return len(aside)

    # -- derived figures -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def throttle_mark(self) -> str | None:
        """Why this result's decision rests on samples taken while the GPU was throttled (too few others to set
        them aside), or None."""
        c = (self.gpu_timing or {}).get("clocks")
        if not c or c["decided_on"] != "all" or not c["flagged"]:
            return None
        return (f"{len(c['flagged'])} of {len(c['sm_mhz'])} samples taken while the GPU was throttled, too few others "
                f"to set them aside")

    @property
    def timer(self) -> str:
        """The figure the gate compares: GPU time when there is one, else host end-to-end time."""
        return "cuda_event" if self.gpu_ms is not None else "host"

    @property
    def primary_ms(self) -> tuple[float, ...]:
        return self.gpu_ms if self.gpu_ms is not None else self.host_ms

    @property
    def summary(self) -> Summary:
        return summarize(self.primary_ms)

    @property
    def host_summary(self) -> Summary:
        return summarize(self.host_ms)

    @property
    def gpu_summary(self) -> Summary | None:
        return summarize(self.gpu_ms) if self.gpu_ms is not None else None

    @property
    def throughput(self) -> float | None:
        """Items per second at the median of the primary figure; None without `items` or at 0 ms."""
        if self.items is None:
            return None
        return per_second(self.items, self.summary.median)

    @property
    def flops_per_s(self) -> float | None:
        """Achieved FLOP/s at the median of the primary figure; None when not counted or at 0 ms."""
        return None if self.work is None else per_second(self.work["flops"], self.summary.median)

    def pooled_with(self, *others: "Measurement") -> "Measurement":
        """One measurement holding this one's samples and the others' (same scenario, device, mode)."""
        for o in others:
            if (o.scenario, o.device, o.mode, o.block_size) != (self.scenario, self.device, self.mode, self.block_size):
                raise InvalidRecord(f"scenario {self.name!r}: only measurements of the same scenario can be pooled")
        host = self.host_ms + tuple(v for o in others for v in o.host_ms)
        gpu = None if self.gpu_ms is None else self.gpu_ms + tuple(v for o in others for v in o.gpu_ms)
        # pooled samples are no longer any rank's steps, nor one measurement's with its samples set aside
        return replace(self, host_ms=host, gpu_ms=gpu, repeats=len(host), ranks=None, gpu_timing=None)


THROTTLED = ("thermal throttling", "power throttling")   # the flags timing.telemetry writes


def throttled(record: Mapping[str, Any] | None) -> list[str]:
    """The throttling flags of a result's telemetry (empty when none, or not observed)."""
    return [f for f in (record or {}).get("flags", []) if f.startswith(THROTTLED)]
