"""The one timed-sample loop every caller uses: `measure`, the interleaved A/B, and any future worker.

A sample is: synchronize, record a start event, read the host clock, make `calls` back-to-back calls,
record an end event, synchronize, read the host clock. Nothing synchronizes inside the calls, so the
program under measurement is the one the user wrote. Everything the user's code raises comes back
as a ScenarioError that names the scenario and what was being done.
"""
from __future__ import annotations

import gc
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from bench_core.timing.backends import Backend
from bench_core.core.errors import ScenarioError

Clock = Callable[[], int]  # nanoseconds, monotonic


@dataclass(frozen=True)
class Sample:
    """One timed sample, per call: host end-to-end time, and GPU time where the backend has events."""

    host_ms: float
    gpu_ms: float | None = None
    clocks: tuple[Any, Any] | None = None   # the GPU's clock readings just before and after (None: not observed)

    @property
    def primary_ms(self) -> float:
        """The figure decisions use: GPU time when there is one, else host time."""
        return self.gpu_ms if self.gpu_ms is not None else self.host_ms


@contextmanager
def gc_paused() -> Iterator[None]:
    """Garbage collection off for the timed samples: a collection landing in one sample adds
    milliseconds to it alone. Collected once before, restored after."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_kept_frozen = False   # this process froze what exists for good (`keep_frozen`), or a freeze was found: sticky


def keep_frozen() -> None:
    """Freeze every object that exists for the rest of this process: what a pre-forking server made
    before its children, what a test session's earlier tests left. Not collected first: in a forked
    child a full collection writes to every page it walks. Said here rather than asked of
    `gc.get_freeze_count()`, which walks every frozen object (tens of milliseconds once torch is
    imported) and was asked before every rounds loop."""
    global _kept_frozen
    gc.freeze()
    _kept_frozen = True


@contextmanager
def gc_frozen() -> Iterator[None]:
    """Collect once, then freeze every object that exists: later collections (one per round of fresh
    instances) traverse only what was made since, so they cost microseconds instead of the ~80 ms a
    full collection can take once torch is imported. A freeze that was there before (`keep_frozen`'s,
    or one this process made itself) is kept: `gc.unfreeze()` cannot tell its objects from ours, and
    undoing it would make every later measurement of that process pay a full collection again, so what
    this freeze added stays frozen with it. A freeze found once is remembered, so the count, a walk over
    every frozen object, is asked only while nothing is frozen, when it is cheap."""
    global _kept_frozen
    if not _kept_frozen and gc.get_freeze_count() > 0:
        _kept_frozen = True
    found = _kept_frozen
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not found:
            gc.unfreeze()


@contextmanager
def time_limit(seconds: float | None, scenario: str) -> Iterator[None]:
    """Fail a scenario that runs longer than `seconds` (None or 0: no limit), naming it.

    A SIGALRM timer, as pytest-timeout's signal method: it interrupts Python code (a loop, a sleep, a
    queue that never answers); a single native call that never returns is interrupted when it does.
    Only the main thread can take signals; elsewhere the scenario runs without a limit.
    """
    import signal
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expired(signum, frame):
        raise ScenarioError(scenario, f"ran past its time limit of {seconds:g} s and was stopped "
                                      f"(--bench-timeout sets the limit; 0 turns it off)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_OWN_THREADS: list[int] = []   # torch's thread count before bench_core first set it, for `restore_threads`


def set_threads(threads: int | None) -> int | None:
    """Fix torch's CPU thread count when asked; return the count in force either way."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return threads
    if threads is not None:
        if not _OWN_THREADS:
            _OWN_THREADS.append(torch.get_num_threads())
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def own_threads(threads: int | None) -> int | None:
    """The count to measure with: `threads` where asked, else torch's own as it was before bench_core changed it
    (a side's server holds one thread until a round forks; its rounds run the program as it runs)."""
    return threads if threads is not None else (_OWN_THREADS[0] if _OWN_THREADS else None)


def restore_threads() -> None:
    """torch's thread count as it was before `set_threads` first changed it: a session that set it leaves the
    process as it found it (a later session in this process measures the program as it runs)."""
    if _OWN_THREADS:
        import torch

        torch.set_num_threads(_OWN_THREADS.pop())


def shared_cpus(rng, threads: int | None, allowed: set[int] | None = None, busy: Mapping[int, float] | None = None,
                last: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
    """The CPUs that both processes of one round are held to: `threads` of the CPUs this process may use (`allowed`,
    default: its own affinity), drawn with `rng`; None where that would be all of them (nothing to hold) or the
    system cannot say.

    Why: a process that waits on a pipe wakes on the CPU it last ran on, so two sides in two processes each keep a
    CPU of their own for a round. A CPU slowed for seconds (its host's other guests, the interrupts it handles) is
    then one side's bias, not noise both sides share, as it is when both sides take turns on one thread. Held to
    the same CPUs, drawn afresh each round, that bias falls on both sides of a round alike.

    Which: given `busy` (per CPU, the share of the last round it was busy, `busy_shares`) and the CPUs the last
    round held (`last`), the draw is from the CPUs the last round left free (busy under `FREE_BELOW`), topped up
    with `last`'s, then the least busy. A CPU that other work keeps busy is left alone, as the system's scheduler
    leaves it to a plain run; held to a random CPU, half of the rounds beside a busy process ran at half speed. The
    last round's CPUs are busy with the round itself, so they are not told apart: they are kept where no other CPU
    is free."""
    if allowed is None:
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):   # not Linux: the processes are left where the system puts them
            return None
    want = len(allowed) if threads is None else threads
    if want >= len(allowed):
        return None
    if busy is None or last is None:
        return tuple(sorted(rng.sample(sorted(allowed), want)))
    free = [c for c in sorted(allowed) if c not in last and busy.get(c, 1.0) < FREE_BELOW]
    held = [c for c in sorted(last) if c in allowed]
    rest = sorted((c for c in allowed if c not in free and c not in held), key=lambda c: busy.get(c, 1.0))
    chosen = rng.sample(free, min(want, len(free)))
    chosen += rng.sample(held, min(want - len(chosen), len(held)))
    chosen += rest[:want - len(chosen)]
    return tuple(sorted(chosen))


FREE_BELOW = 0.5   # a CPU busy for under half of the last round counts as free: the round's own parent, its builds
                   # and ends take a part of a short step's round, a process that keeps a CPU busy takes all of it


def cpu_ticks(text: str | None = None) -> dict[int, tuple[int, int]] | None:
    """Per CPU, (busy, all) clock ticks since boot, from Linux's /proc/stat (`text`, default read): busy counts
    user, nice, system, irq, softirq and steal (time the hypervisor gave another guest). None where unreadable."""
    if text is None:
        try:
            with open("/proc/stat") as f:
                text = f.read()
        except OSError:
            return None
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 8:
            user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
            busy = user + nice + system + irq + softirq + steal
            out[int(name[3:])] = (busy, busy + idle + iowait)
    return out or None


def busy_shares(before: Mapping[int, tuple[int, int]] | None, after: Mapping[int, tuple[int, int]] | None):
    """Per CPU, the share of the ticks between two `cpu_ticks` readings it was busy; None where either is missing or
    no tick passed (a round shorter than a tick says nothing)."""
    if not before or not after:
        return None
    out = {}
    for cpu, (busy, total) in after.items():
        if cpu in before and total > before[cpu][1]:
            out[cpu] = (busy - before[cpu][0]) / (total - before[cpu][1])
    return out or None


def node_cpus() -> list[set[int]] | None:
    """The CPUs of each memory (NUMA) node, from Linux's sysfs; None where it cannot be read."""
    root = "/sys/devices/system/node"
    try:
        names = [n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()]
        nodes = []
        for name in sorted(names):
            with open(f"{root}/{name}/cpulist") as f:
                nodes.append(cpu_list(f.read()))
    except (OSError, ValueError):
        return None
    return nodes or None


def cpu_list(text: str) -> set[int]:
    """Linux's CPU list format ("0-3,8,10-11") as a set; ValueError where it is not one."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def build_cpus(cpus, allowed: set[int] | None = None, nodes: list[set[int]] | None = None):
    """Where a round's process builds its instance before it is held to `cpus` for its samples: every CPU it may
    use (`allowed`, default its own affinity) on the memory nodes of `cpus` (`nodes`, default read off the system),
    so that the two sides' processes build at once, and their memory is placed on the nodes they will run on (a
    page goes to the node of the CPU that first touches it). `cpus` itself where the nodes cannot be told; None
    where `cpus` is None."""
    if cpus is None:
        return None
    nodes = node_cpus() if nodes is None else nodes
    if allowed is None:
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            return tuple(cpus)
    held = set(cpus)
    near = set().union(*(n for n in nodes or () if n & held)) & set(allowed)
    if not nodes or not held <= near:
        return tuple(cpus)
    return tuple(sorted(near))


def hold_to(cpus) -> None:
    """This process, its threads and those it starts from now on, on `cpus` only; nothing where `cpus` is None."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        return
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, set(cpus))
        except ProcessLookupError:   # a thread that ended meanwhile
            pass


# The host clock a sampler reads unless it is given one. Looked up when each sampler is made, so a test can put a
# fake clock under code that cannot pass one (a pytest-benchmark test's `benchmark(fn)` takes no clock).
HOST_CLOCK: Clock = time.perf_counter_ns


class Sampler:
    """Takes samples of callables on one backend with one clock, for one named scenario."""

    def __init__(self, scenario: str, backend: Backend, clock: Clock | None = None,
                 before_sample: Callable[[], Any] | None = None):
        self.scenario = scenario
        self.backend = backend
        self.clock = clock or HOST_CLOCK
        self.before_sample = before_sample   # outside every window, before it: a distributed rank's barrier
        self._events = None

    def _event_pair(self):
        """One start/end pair for every sample, each recorded once before the first: a CUDA event is
        created at its first record, and that creation must not land inside a measured interval."""
        if self._events is None:
            start, end = self.backend.event(), self.backend.event()
            if start is not None:
                self.backend.record(start)
                self.backend.record(end)
                self.backend.synchronize()
            self._events = (start, end)
        return self._events

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run user code untimed; a failure names the scenario and `what` (cause chained)."""
        try:
            return fn()
        except ScenarioError:
            raise
        except Exception as exc:
            raise ScenarioError(self.scenario, f"{what} raised {type(exc).__name__}: {exc}") from exc

    def sample(self, fn: Callable[[], Any], calls: int = 1, what: str = "a sample") -> Sample:
        """Time `calls` back-to-back calls of `fn`; the figures are per call."""
        if self.before_sample is not None:
            self.before_sample()
        return self.call(what, lambda: self._timed(fn, calls, what))

    def warm(self, fn: Callable[[], Any], what: str) -> Any:
        """An untimed call of the step, after `before_sample` as a timed one would be (a rank's barrier)."""
        if self.before_sample is not None:
            self.before_sample()
        return self.call(what, fn)

    def elapsed_ms(self, fn: Callable[[], Any], what: str) -> float:
        """Host time of one untimed-window step such as `load`, after its device work has finished."""
        t0 = self.clock()
        self.call(what, fn)
        self.backend.synchronize()
        return (self.clock() - t0) / 1e6

    def _timed(self, fn: Callable[[], Any], calls: int, what: str) -> Sample:
        backend, clock = self.backend, self.clock
        start_ev, end_ev = self._event_pair()
        backend.synchronize()  # earlier work must not leak into this window
        before = backend.clock_reading()    # outside the window: the device is idle, no event recorded yet
        backend.record(start_ev)
        t0 = clock()
        for _ in range(calls):
            out = fn()
        backend.record(end_ev)
        backend.synchronize()
        t1 = clock()
        after = backend.clock_reading()
        gpu = backend.elapsed_ms(start_ev, end_ev) / calls if start_ev is not None else None
        bad = non_finite(out)  # after the window: a step that computes NaN must not pass as fast
        if bad is not None:
            raise ScenarioError(self.scenario, f"{what} returned a non-finite value ({bad}): the step is broken, "
                                               f"so its timing means nothing")
        return Sample((t1 - t0) / 1e6 / calls, gpu, None if before is None or after is None else (before, after))


def non_finite(value: Any, where: str = "result") -> str | None:
    """Where a returned number or tensor (or one inside a mapping or sequence) is NaN or infinite."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} = {value}"
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            return None
        if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()) and value.numel():
            return None if bool(torch.isfinite(value).all()) else f"{where} holds NaN or infinity"
        return None
    for k, v in items:
        found = non_finite(v, f"{where}[{k!r}]")
        if found:
            return found
    return None
