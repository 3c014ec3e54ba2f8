"""Cache state as part of the question: every sample starts with the GPU's L2 flushed ("cold"), or warm from the
sample before it ("hot", samples back to back as nvbench's batch mode takes them).

The flush writes a buffer twice the size of the device's L2 before each sample, and waits for it, so it lands
outside the timed window and no line of the step's data survives it. Whether it really leaves the cache cold
is a property of the device and driver, not of this code, so a session's first cold scenario checks it: a
probe whose working set fits in L2 is timed cold and hot, and a cold probe that is not slower says the flush
did not work here (triton's `do_bench` has been found measuring a warm cache while it meant a cold one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench_core.core.errors import ScenarioError
from bench_core.core.stats import sign_test
from bench_core.timing.sampling import Clock, Sampler

CACHE_STATES = ("cold", "hot")
FLUSH_FACTOR = 2       # the flush writes twice the L2
PROBE_SHARE = 0.5      # the probe's working set, as a share of L2: hot, it is resident whole; as large as that
#                        allows, because a read's fixed cost (launch, reduction passes) is most of a small probe's time
PROBE_WARMUP = 3       # reads before the check: a probe's first few samples are several times slower
PROBE_SAMPLES = 40     # cold-hot pairs, a cold sample then the same probe hot; a few milliseconds on a GPU
CHECK_ALPHA = 0.01     # colder: cold the slower in more pairs than chance gives at this level (28 of 40)


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
    """The self-check's figures: the probe's primary time (GPU event time on a GPU) in `samples` pairs, each a
    cold sample followed by the same probe hot; `cold_ms` and `hot_ms` are each side's fastest.

    Colder means the cold sample was the slower one in more pairs than chance allows (a sign test at
    CHECK_ALPHA), not that it was slower by some share. What tells L2 from HBM on a probe is a few microseconds
    (an H200's 30 MiB probe: about 1.5-7 us of 21-40), the rest is fixed cost, and launch gaps and host stalls move
    that by as much again from one sample, and one process, to the next (its SM clock held 1980 MHz throughout):
    a 5% threshold on medians of 10 called a working flush "not colder" in 1 of 3 processes there, and on the
    fastest of 20 in 1 of 6 (docs/gpu.md). Pairs
    cancel what drifts; a flush that misses leaves pairs that split about evenly, whatever the device's figures.
    With 40 pairs, a flush that makes cold the slower in 80% of pairs is found 96 times in 100."""

    l2_bytes: int
    probe_bytes: int
    cold_ms: float
    hot_ms: float
    samples: int
    colder_pairs: int

    def __post_init__(self):
        if not 0 <= self.colder_pairs <= self.samples or self.samples < 1:
            raise ValueError(f"a cache check of {self.samples} pairs cannot have {self.colder_pairs} colder ones")

    @property
    def p(self) -> float:
        return sign_test(self.colder_pairs, self.samples)

    @property
    def colder(self) -> bool:
        return self.p < CHECK_ALPHA

    def to_dict(self) -> dict:
        return {**self.__dict__, "p": self.p, "colder": self.colder}


def self_check(backend: Any, clock: Clock | None = None, flush: Flush | None = None) -> CacheCheck:
    """Time an L2-resident probe cold (flushed before each sample, by `flush` where the scenario has one already)
    and hot (read again right after), alternated."""
    flush = flush or Flush(backend, "cache self-check")
    l2 = flush.nbytes // FLUSH_FACTOR
    probe = backend.buffer(int(PROBE_SHARE * l2))
    sampler = Sampler("cache self-check", backend, clock)
    for _ in range(PROBE_WARMUP):
        sampler.sample(probe.sum, what="the probe's first reads")
    cold, hot = [], []
    for _ in range(PROBE_SAMPLES):
        flush()
        cold.append(sampler.sample(probe.sum, what="a cold probe").primary_ms)
        hot.append(sampler.sample(probe.sum, what="a hot probe").primary_ms)
    wins = sum(c > h for c, h in zip(cold, hot))   # a tie is not colder
    return CacheCheck(l2, int(probe.nbytes), min(cold), min(hot), PROBE_SAMPLES, wins)
