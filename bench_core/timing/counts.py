"""How many calls, and how large: the defaults, the smoke run's sizes (`--bench-quick`) and a scenario's size
for its device, in one place for every workflow."""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_WARMUP, DEFAULT_REPEATS = 3, 20


@dataclass(frozen=True)
class Quick:
    """A smoke run's counts: enough to exercise every path, never enough to decide much."""

    warmup: int = 1            # a series: untimed calls after the cold start
    repeats: int = 5           # a series: timed samples
    rounds: int = 3            # rounds of fresh instances (side by side, A/B with rounds, distributed A/B)
    pairs: int = 2             # alternated pairs per round
    worker_pairs: int = 3      # side by side in worker processes: pairs of processes
    ab_warmup: int = 1         # a plain A/B
    ab_repeats: int = 10


QUICK = Quick()


def pick_size(device: str, quick: bool, cpu, gpu, smallest=None):
    """Small on the CPU, realistic on the GPU, `smallest` in a smoke run (where given)."""
    if quick and smallest is not None:
        return smallest
    return gpu if device == "cuda" else cpu


class Sizing:
    """What a benchmark asks of its `bench` before it runs: the device and the size for it."""

    def __init__(self, device: str, quick: bool):
        self.device = device
        self.quick = quick

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def size(self, cpu, gpu, quick=None):
        """Pick a size: small on the CPU, realistic on the GPU, smallest in --bench-quick."""
        return pick_size(self.device, self.quick, cpu, gpu, quick)
