"""Cache state as part of the question: every sample starts with the GPU's L2 flushed ("cold"), or warm from the
sample before it ("hot", samples back to back as nvbench's batch mode takes them).

The flush writes a buffer twice the size of the device's L2 before each sample, and waits for it, so it lands
outside the timed window and no line of the step's data survives it. Whether it really leaves the cache cold
is a property of the device and driver, not of this code, so a session's first cold scenario checks it: a
probe whose working set fits in L2 is timed cold and hot, and a cold probe that is not slower says the flush
did not work here (triton's `do_bench` has been found measuring a warm cache while it meant a cold one).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench_core.core.errors import ScenarioError
from bench_core.timing.sampling import Clock, Sampler

CACHE_STATES = ("cold", "hot")
FLUSH_FACTOR = 2       # the flush writes twice the L2
PROBE_SHARE = 0.25     # the probe's working set, as a share of L2: hot, it is resident whole
PROBE_SAMPLES = 10     # cold and hot probe samples each, alternated
COLDER_BY = 0.05       # a cold probe less than 5% slower than a hot one: the flush did not leave the cache cold


def check_state(cache: str | None, scenario: str) -> str | None:
    if cache is not None and cache not in CACHE_STATES:
        raise ScenarioError(scenario, f"cache must be 'cold' or 'hot', got {cache!r}")
    return cache


class Flush:
    """Before a sample: write the flush buffer, then wait for it (so the write is not inside the window)."""

    def __init__(self, backend: Any, scenario: str):
        if backend.kind != "cuda":
            raise ScenarioError(scenario, "cache 'cold' flushes the GPU's L2 before each sample: it needs a CUDA "
                                          "device (--gpu); on the CPU leave the cache state unset")
        l2 = backend.cache_bytes()
        if not l2:
            raise ScenarioError(scenario, "cache 'cold' needs the device's L2 size, which torch does not report for "
                                          "this device; time it hot (--bench-cache hot)")
        self.backend, self.nbytes, self.count = backend, FLUSH_FACTOR * l2, 0
        self.buffer = backend.buffer(self.nbytes)

    def __call__(self) -> None:
        self.buffer.zero_()
        self.backend.synchronize()
        self.count += 1


@dataclass(frozen=True)
class CacheCheck:
    """The self-check's figures: medians of the probe's primary time (GPU event time on a GPU), cold and hot."""

    l2_bytes: int
    probe_bytes: int
    cold_ms: float
    hot_ms: float

    @property
    def colder(self) -> bool:
        return self.cold_ms >= self.hot_ms * (1 + COLDER_BY)

    def warning(self) -> str | None:
        if self.colder:
            return None
        return (f"cache self-check: a cold probe ({self.probe_bytes / 2**20:.0f} MiB, L2 {self.l2_bytes / 2**20:.0f} "
                f"MiB) took {self.cold_ms * 1e3:.1f} us against {self.hot_ms * 1e3:.1f} us hot, not {COLDER_BY:.0%} "
                f"slower: the flush did not leave the cache cold on this device or driver, so 'cold' results here "
                f"may be warm")

    def to_dict(self) -> dict:
        return {**self.__dict__, "colder": self.colder}


def self_check(backend: Any, clock: Clock | None = None, flush: Flush | None = None) -> CacheCheck:
    """Time an L2-resident probe cold (flushed before each sample, by `flush` where the scenario has one already)
    and hot (read again right after), alternated."""
    flush = flush or Flush(backend, "cache self-check")
    l2 = flush.nbytes // FLUSH_FACTOR
    probe = backend.buffer(int(PROBE_SHARE * l2))
    sampler = Sampler("cache self-check", backend, clock)
    sampler.sample(probe.sum, what="the probe's first read")
    cold, hot = [], []
    for _ in range(PROBE_SAMPLES):
        flush()
        cold.append(sampler.sample(probe.sum, what="a cold probe").primary_ms)
        hot.append(sampler.sample(probe.sum, what="a hot probe").primary_ms)
    return CacheCheck(l2, int(probe.nbytes), statistics.median(cold), statistics.median(hot))
