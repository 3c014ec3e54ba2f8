"""Progress of long runs, in words: which scenario, how far, how long so far. Written between samples (never
inside a timed window) and at most every `every_s` seconds, so it costs nothing a measurement can see."""
from __future__ import annotations

import time
from typing import Callable


EVERY_S = 5.0


class Progress:
    def __init__(self, write: Callable[[str], None], every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.write, self.every_s, self.clock = write, EVERY_S if every_s is None else every_s, clock

    def scenario(self, name: str) -> Callable[[str, int, int], None]:
        """A callback for one scenario's loop: (what, done, total). The first line comes after every_s seconds:
        a short scenario says nothing."""
        start = last = self.clock()

        def tick(what: str, done: int, total: int) -> None:
            nonlocal last
            now = self.clock()
            if now - last >= self.every_s:
                last = now
                self.write(f"bench_core: {name}: {what} {done}/{total} ({now - start:.0f} s)")
        return tick

    def note(self, name: str, text: str) -> None:
        self.write(f"bench_core: {name}: {text}")
