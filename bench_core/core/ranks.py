"""Figures over the ranks of a distributed step: pure functions and the record that holds every rank's samples.

A distributed step costs what its slowest rank costs, so the figure the gate compares is the maximum over
ranks of each step, the steps aligned by index (every rank runs the same steps in the same order, and a
barrier outside the window starts each one together). Per rank we keep every sample, so the straggler and
the exposed communication are recomputed from the file, never stored as conclusions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from bench_core.core.errors import InvalidRecord
from bench_core.core.stats import paired_ratio, summarize

STRAGGLER_EXCESS = 0.05   # a rank whose whole interval is this much slower than the others, significantly, is named
STRAGGLER_ALPHA = 0.01


def _per_rank(values: Any, world: int, n: int | None, what: str) -> tuple[tuple[float, ...], ...]:
    """Rows of samples, one per rank, checked: `n` each (None: as many as rank 0's), finite, not negative."""
    rows = tuple(tuple(float(v) for v in row) for row in values)
    if len(rows) != world:
        raise InvalidRecord(f"{what} has {len(rows)} ranks, the world has {world}")
    n = len(rows[0]) if n is None else n
    for r, row in enumerate(rows):
        if len(row) != n:
            raise InvalidRecord(f"{what}: rank {r} has {len(row)} samples, rank 0 has {n}; steps are aligned by index")
        if any(not math.isfinite(v) or v < 0 for v in row):
            raise InvalidRecord(f"{what}: rank {r} holds a negative or non-finite timing")
    return rows


@dataclass(frozen=True)
class RankSamples:
    """Every rank's samples of one distributed scenario, aligned by step index.

    `host_ms[r][i]` is rank r's end-to-end time of step i (host clock after synchronizing), `gpu_ms` its GPU
    time from CUDA events (None on the CPU). `local_*` are the same step with gradient synchronisation off,
    interleaved with the real one (None: not measured). `replicas_max_abs_diff` is the largest difference of
    any parameter from rank 0's after the steps (None: not checked); `reference` the check against a
    single-process run of the same steps (None: none was given).
    """

    world_size: int
    nnodes: int
    backend: str
    host_ms: tuple[tuple[float, ...], ...]
    gpu_ms: tuple[tuple[float, ...], ...] | None = None
    local_host_ms: tuple[tuple[float, ...], ...] | None = None
    local_gpu_ms: tuple[tuple[float, ...], ...] | None = None
    cold_ms: tuple[float, ...] = ()
    hosts: tuple[str, ...] = ()
    nodes: tuple[int, ...] = ()        # each rank's node, as the hosts' command lines number them (--bench-node-rank)
    replicas_max_abs_diff: float | None = None
    reference: Mapping[str, Any] | None = None
    # the same step at world size 1 (primary figure), launched beside it for the scaling figure; None: not run
    one_rank_ms: tuple[float, ...] | None = None

    def __post_init__(self):
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise InvalidRecord(f"world_size must be a positive integer, got {self.world_size!r}")
        if not isinstance(self.nnodes, int) or not 1 <= self.nnodes <= self.world_size:
            raise InvalidRecord(f"nnodes must be between 1 and the world size, got {self.nnodes!r}")
        w = self.world_size
        host = _per_rank(self.host_ms, w, None, "host_ms")
        n = len(host[0])
        object.__setattr__(self, "host_ms", host)
        for name in ("gpu_ms", "local_host_ms", "local_gpu_ms"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _per_rank(value, w, n, name))
        if self.local_gpu_ms is not None and self.local_host_ms is None:
            raise InvalidRecord("local_gpu_ms needs local_host_ms")
        cold = tuple(float(v) for v in self.cold_ms)
        if cold and len(cold) != w:
            raise InvalidRecord(f"cold_ms has {len(cold)} ranks, the world has {w}")
        object.__setattr__(self, "cold_ms", cold)
        object.__setattr__(self, "hosts", tuple(str(h) for h in self.hosts))
        object.__setattr__(self, "nodes", tuple(int(k) for k in self.nodes))
        if self.nodes and len(self.nodes) != w:
            raise InvalidRecord(f"nodes has {len(self.nodes)} ranks, the world has {w}")
        if self.one_rank_ms is not None:
            object.__setattr__(self, "one_rank_ms", _per_rank([self.one_rank_ms], 1, None, "one_rank_ms")[0])
        d = self.replicas_max_abs_diff
        if d is not None and (not isinstance(d, (int, float)) or not d >= 0):
            raise InvalidRecord(f"replicas_max_abs_diff must be >= 0 or None, got {d!r}")

    def where(self, rank: int) -> str:
        """Where rank `rank` ran, in words, across hosts ("" on one host): its host and node."""
        if self.nnodes < 2:
            return ""
        host = f" on host {self.hosts[rank]}" if self.hosts else ""
        node = f" (node {self.nodes[rank]})" if self.nodes else ""
        return host + node

    @property
    def primary(self) -> tuple[tuple[float, ...], ...]:
        """Per rank, the figure decisions use: GPU time where there is one, else host time."""
        return self.gpu_ms if self.gpu_ms is not None else self.host_ms

    @property
    def local_primary(self) -> tuple[tuple[float, ...], ...] | None:
        return self.local_gpu_ms if self.local_gpu_ms is not None else self.local_host_ms

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("world_size", "nnodes", "backend", "replicas_max_abs_diff")}
        for k in ("host_ms", "gpu_ms", "local_host_ms", "local_gpu_ms"):
            v = getattr(self, k)
            d[k] = None if v is None else [list(row) for row in v]
        d.update(cold_ms=list(self.cold_ms), hosts=list(self.hosts), nodes=list(self.nodes),
                 one_rank_ms=None if self.one_rank_ms is None else list(self.one_rank_ms),
                 reference=None if self.reference is None else dict(self.reference))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RankSamples":
        return cls(world_size=d["world_size"], nnodes=d.get("nnodes", 1), backend=d["backend"], host_ms=d["host_ms"],
                   gpu_ms=d.get("gpu_ms"), local_host_ms=d.get("local_host_ms"), local_gpu_ms=d.get("local_gpu_ms"),
                   cold_ms=d.get("cold_ms") or (), hosts=d.get("hosts") or (), nodes=d.get("nodes") or (),
                   replicas_max_abs_diff=d.get("replicas_max_abs_diff"), reference=d.get("reference"),
                   one_rank_ms=d.get("one_rank_ms"))


def max_over_ranks(per_rank: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Step i's cost: the slowest rank's time for step i."""
    return tuple(float(v) for v in np.max(np.asarray(per_rank, dtype=float), axis=0))


@dataclass(frozen=True)
class Straggler:
    rank: int
    median_ms: float
    others_ms: float          # the median over steps of the other ranks' median at each step
    excess: float             # its time over the others', paired by step (Hodges-Lehmann) - 1
    ci_low: float             # the excess's 95% interval
    ci_high: float
    p_value: float            # Wilcoxon signed-rank over steps, times the world size (the rank was picked as the slowest)
    named: bool               # p < STRAGGLER_ALPHA and the whole interval at or beyond +STRAGGLER_EXCESS
    figure: str               # which samples: "local step" (no waiting for peers) or "step"


def straggler(samples: RankSamples) -> Straggler | None:
    """The rank with the highest median and its excess over the others; None with one rank or too few steps.

    Every rank runs step i at the same time, so the slowest rank is compared step by step with the median of the
    others at that step: whatever the machine did at that moment cancels. It was picked as the slowest of
    `world_size`, so its p is multiplied by that (Bonferroni); it is named when that p is below STRAGGLER_ALPHA
    and its whole interval is at least STRAGGLER_EXCESS slower (as a change must clear a noise threshold). In a
    synchronised step a fast rank waits inside the collective for the slow one, so both report nearly the slow
    time; the step with synchronisation off has no waiting, so it shows each rank's own pace and is used where it
    was measured. On a shared CPU one process can keep a bias of several percent for its whole life: a rank named
    in one launch and not the next is such a process, not a slow host."""
    if samples.world_size < 2:
        return None
    local = samples.local_primary
    rows, figure = (local, "local step") if local is not None else (samples.primary, "step")
    x = np.asarray(rows, dtype=float)
    if x.shape[1] < 6 or np.any(x <= 0):
        return None
    medians = np.median(x, axis=1)
    top = int(np.argmax(medians))
    others = np.median(np.delete(x, top, axis=0), axis=0)
    r = paired_ratio(x[top], others)
    p = min(1.0, r.p_value * samples.world_size)
    excess = r.ratio - 1
    return Straggler(top, float(medians[top]), float(np.median(others)), excess, r.ci_low - 1, r.ci_high - 1, p,
                     r.ci_low - 1 >= STRAGGLER_EXCESS and p < STRAGGLER_ALPHA, figure)


@dataclass(frozen=True)
class Exposure:
    """Communication the step does not hide: the step against the same step with gradient sync off, per pair."""

    step_ms: float             # median of the step's max over ranks
    local_ms: float            # median of the local step's max over ranks
    ratio: float               # step / local, Hodges-Lehmann over pairs, with its 95% interval
    ci_low: float
    ci_high: float
    p_value: float

    @property
    def exposed_ms(self) -> float:
        """The time the step loses to communication: step time times (1 - 1/ratio)."""
        return self.step_ms * (1 - 1 / self.ratio)

    @property
    def share(self) -> float:
        return 1 - 1 / self.ratio

    @property
    def interval_ms(self) -> tuple[float, float]:
        return self.step_ms * (1 - 1 / self.ci_low), self.step_ms * (1 - 1 / self.ci_high)


def exposure(samples: RankSamples) -> Exposure | None:
    """None when the local step was not measured, or too few pairs for an interval."""
    local = samples.local_primary
    if local is None or len(local[0]) < 6:
        return None
    step, off = max_over_ranks(samples.primary), max_over_ranks(local)
    if min(step) <= 0 or min(off) <= 0:
        return None
    r = paired_ratio(step, off)
    return Exposure(float(np.median(step)), float(np.median(off)), r.ratio, r.ci_low, r.ci_high, r.p_value)


def rank_rows(samples: RankSamples) -> list[tuple[int, str, float, float, float | None]]:
    """Per rank: (rank, host, median, IQR, local-step median or None) of the primary figure."""
    local = samples.local_primary
    out = []
    for r, row in enumerate(samples.primary):
        s = summarize(row)
        host = samples.hosts[r] if r < len(samples.hosts) else ""
        out.append((r, host, s.median, s.iqr, None if local is None else float(np.median(local[r]))))
    return out


def scaling_efficiency(samples: RankSamples) -> float | None:
    """Weak scaling (the same batch per rank): the median step at 1 rank over the median step (max over ranks) at
    N. 1.0 is perfect; throughput at N is N x efficiency x throughput at 1. None when the 1-rank run was not made
    or a median is 0."""
    if samples.one_rank_ms is None:
        return None
    one, n = float(np.median(samples.one_rank_ms)), float(np.median(max_over_ranks(samples.primary)))
    return one / n if one > 0 and n > 0 else None


def problems(samples: RankSamples) -> list[str]:
    """What makes the distributed step wrong, not slow: replicas that differ, a reference that does not match."""
    out = []
    d = samples.replicas_max_abs_diff
    if d is not None and d > 0:
        out.append(f"the ranks' parameters differ after the steps (largest difference from rank 0: {d:.3g}); "
                   f"data-parallel replicas must stay identical")
    ref = samples.reference
    if ref is not None and not ref.get("ok"):
        why = ref.get("problem") or (f"largest difference {ref.get('max_abs_diff'):.3g} beyond rtol {ref.get('rtol')}"
                                     f", atol {ref.get('atol')}")
        out.append(f"after {ref.get('steps')} steps the parameters do not match a single-process run of the same "
                   f"steps ({why})")
    return out
