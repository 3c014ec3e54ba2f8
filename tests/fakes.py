"""Deterministic stand-ins for the clock and for torch.cuda, so timing logic is tested exactly."""
from __future__ import annotations

import os
from collections import OrderedDict
from contextlib import contextmanager
from types import SimpleNamespace

MS = 1_000_000  # ns


class FakeClock:
    """A host clock that only moves when told to."""

    def __init__(self, start_ns: int = 1_000 * MS):
        self.now = start_ns
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += int(round(ms * MS))


SHARED_CLOCK = FakeClock()  # one clock for both revisions of a side-by-side test (this module is shared)


def work_on_shared_clock(ms: float):
    """A step that takes about `ms` on the shared fake clock: +-2% of deterministic jitter per call, so
    rounds differ as they do on a real machine (the jitter runs on across instances; a process forked from this one
    starts it at a phase of its own, as a fresh process would)."""
    def fn():
        if os.getpid() != _JITTER["pid"]:
            _JITTER.update(pid=os.getpid(), n=os.getpid() % 11)
        _JITTER["n"] += 1
        SHARED_CLOCK.advance_ms(ms * (1 + 0.02 * (((_JITTER["n"] * 7919) % 11) - 5) / 5))
    return fn


_JITTER = {"n": 0, "pid": os.getpid()}


class FakeGPU:
    """A one-stream GPU: launches queue work, events mark the stream, synchronize waits for it.

    `host` is the FakeClock; launching costs host time `launch_ms` and queues `work_ms` of GPU time.
    """

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.free_at = clock.now      # when the GPU finishes everything queued so far
        self.syncs = 0
        self.stats = {"allocated_bytes.all.current": 0, "allocated_bytes.all.peak": 0,
                      "reserved_bytes.all.current": 0, "reserved_bytes.all.peak": 0,
                      "num_device_alloc": 0, "num_alloc_retries": 0}
        self.peak_resets = 0
        self.events_made = 0
        self.event_create_ms = 0.05
        self.event_resolution_ms = 0.0005
        self.current = 0                 # the current device
        self.pending_error = None        # a kernel's error, surfacing at the next synchronize
        self.capturing = None            # the FakeGraph being captured, if any
        self.graph_launch_ms = 0.01      # host time to launch a whole graph, however many kernels it holds
        # L2: what is resident, least recently used first; reading bytes that are not resident costs HBM time
        self.l2_bytes, self.l2_gb_s, self.hbm_gb_s = 50 * 2**20, 8000.0, 3000.0
        self.l2: OrderedDict[int, int] = OrderedDict()
        self.read_fixed_ms = 0.0         # a reduction's own cost beside its bytes (ramp, passes); tens of us on an H200
        self.read_jitter = None          # () -> ms added to a read: clocks and stalls that move from sample to sample
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing, "timing events must be created with enable_timing=True"
                self.t = None
                gpu.events_made += 1

            def record(self, stream=None):
                if self.t is None:   # as torch does: the CUDA event is created at its first record, on the host
                    gpu.clock.advance_ms(gpu.event_create_ms)
                self.stream = stream if stream is not None else gpu.current_stream(gpu.current)
                gpu.free_at = max(gpu.free_at, gpu.clock.now)
                self.t = gpu.free_at

            def synchronize(self):
                gpu.clock.now = max(gpu.clock.now, self.t)

            def elapsed_time(self, other):
                assert self.t is not None and other.t is not None, "event never recorded"
                if gpu.clock.now < other.t:  # as CUDA: the end event has not completed yet
                    raise RuntimeError("CUDA error: device not ready")
                # events resolve about half a microsecond
                return round((other.t - self.t) / MS / gpu.event_resolution_ms) * gpu.event_resolution_ms

        self.Event = Event

    # the torch.cuda surface the backend uses
    def synchronize(self, device=None):
        if self.capturing is not None:   # as CUDA: a host sync is not permitted while a stream captures
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.syncs += 1
        self.clock.now = max(self.clock.now, self.free_at)
        if self.pending_error is not None:   # asynchronous errors show up here, not at the launch
            err, self.pending_error = self.pending_error, None
            raise RuntimeError(err)

    def current_stream(self, device=None):
        return FakeStream(("stream", self.current if device is None else device))

    def Stream(self, device=None):
        return FakeStream(("side stream", self.current if device is None else device))

    @contextmanager
    def stream(self, s):
        yield s     # one queue in this fake: a side stream's work runs in order with the rest

    def CUDAGraph(self):
        return FakeGraph(self)

    @contextmanager
    def graph(self, g, stream=None):
        """Capture: launches are recorded into `g`, not run; a host sync inside raises (as CUDA's does)."""
        self.capturing = g
        try:
            yield
        finally:
            self.capturing = None

    def get_device_properties(self, device=None):
        return SimpleNamespace(name="Fake GPU", L2_cache_size=self.l2_bytes)

    def current_device(self):
        return self.current

    def reset_peak_memory_stats(self, device=None):
        # as the caching allocator does: a peak is reset to what is allocated now, not to zero
        self.peak_resets += 1
        self.stats["allocated_bytes.all.peak"] = self.stats["allocated_bytes.all.current"]
        self.stats["reserved_bytes.all.peak"] = self.stats["reserved_bytes.all.current"]

    def memory_stats(self, device=None):
        return dict(self.stats)

    # what a fake kernel does
    def launch(self, work_ms: float, launch_ms: float = 0.01, error: str | None = None) -> None:
        if self.capturing is not None:   # captured: the kernel becomes a node of the graph, nothing runs
            self.capturing.nodes.append(work_ms)
            return
        self.clock.advance_ms(launch_ms)
        start = max(self.clock.now, self.free_at)
        self.free_at = start + int(round(work_ms * MS))
        if error is not None:
            self.pending_error = error

    def copy_to_device(self, nbytes: int, pinned: bool, non_blocking: bool, gb_per_s: float = 10.0,
                       launch_ms: float = 0.2) -> None:
        """A host-to-device copy: from pinned memory with non_blocking it is queued and the host goes on;
        otherwise (pageable memory, or blocking) the host waits until it is done."""
        self.launch(work_ms=nbytes / (gb_per_s * 1e6), launch_ms=launch_ms)
        if not (pinned and non_blocking):
            self.clock.now = max(self.clock.now, self.free_at)

    def allocate(self, nbytes: int) -> None:
        """A tensor of `nbytes` that lives until `free(nbytes)`; the cache reserves twice what it hands out."""
        st = self.stats
        st["num_device_alloc"] += 1
        st["allocated_bytes.all.current"] += nbytes
        st["reserved_bytes.all.current"] = max(st["reserved_bytes.all.current"], 2 * st["allocated_bytes.all.current"])
        st["allocated_bytes.all.peak"] = max(st["allocated_bytes.all.peak"], st["allocated_bytes.all.current"])
        st["reserved_bytes.all.peak"] = max(st["reserved_bytes.all.peak"], st["reserved_bytes.all.current"])

    def free(self, nbytes: int) -> None:
        self.stats["allocated_bytes.all.current"] -= nbytes   # the cache keeps what it reserved


    def read_ms(self, key: int, nbytes: int) -> float:
        """GPU time to read (or write) `nbytes` of buffer `key`: the resident part at L2 speed, the rest at HBM
        speed; the buffer is then resident (its last `l2_bytes` at most), evicting the least recently used."""
        resident = self.l2.pop(key, 0)
        ms = (resident / (self.l2_gb_s * 1e6)) + ((nbytes - resident) / (self.hbm_gb_s * 1e6))
        self.l2[key] = min(nbytes, self.l2_bytes)
        while sum(self.l2.values()) > self.l2_bytes:
            oldest = next(iter(self.l2))
            over = sum(self.l2.values()) - self.l2_bytes
            if self.l2[oldest] > over:
                self.l2[oldest] -= over
            else:
                del self.l2[oldest]
        return ms

    def buffer(self, nbytes: int) -> "FakeBuffer":
        return FakeBuffer(self, nbytes)


class FakeStream(tuple):
    """A stream handle that compares as ("stream", device), with the one method capture needs."""

    def wait_stream(self, other) -> None:
        return None


class FakeGraph:
    """A captured graph: its kernels' GPU times; a replay launches them all for one launch's host cost."""

    def __init__(self, gpu: "FakeGPU"):
        self.gpu, self.nodes = gpu, []
        self.replays = 0

    def replay(self) -> None:
        gpu = self.gpu
        self.replays += 1
        gpu.clock.advance_ms(gpu.graph_launch_ms)
        start = max(gpu.clock.now, gpu.free_at)
        gpu.free_at = start + int(round(sum(self.nodes) * MS))


class FakeBuffer:
    """A device buffer whose reads and writes go through the fake L2 (`FakeGPU.read_ms`)."""

    _keys = iter(range(1, 1 << 30))

    def __init__(self, gpu: "FakeGPU", nbytes: int):
        self.gpu, self.nbytes, self.key = gpu, nbytes, next(self._keys)

    def zero_(self) -> "FakeBuffer":
        self.gpu.launch(self.gpu.read_ms(self.key, self.nbytes))
        return self

    def sum(self) -> int:
        gpu = self.gpu
        jitter = gpu.read_jitter() if gpu.read_jitter else 0.0
        gpu.launch(gpu.read_fixed_ms + gpu.read_ms(self.key, self.nbytes) + jitter)
        return 0


def work(clock: FakeClock, *ms: float):
    """A callable whose i-th call takes ms[i] (the last value repeats)."""
    calls = {"n": 0}

    def fn():
        i = calls["n"]
        calls["n"] += 1
        clock.advance_ms(ms[min(i, len(ms) - 1)])

    fn.calls = calls
    return fn


class FakeNVML:
    """The few NVML calls telemetry makes, with values a test sets. A field set to None raises, as NVML does for
    a query the GPU or driver does not support."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    class _Proc:
        def __init__(self, pid):
            self.pid = pid

    def __init__(self):
        self.sm, self.mem, self.max_sm, self.temp, self.power_mw, self.reasons = 1980, 2619, 1980, 45, 300_000, 0
        self.default_sm = 1755          # the default applications clock: what nvbench's 75% rule is a share of
        self.calls = 0                  # NVML queries made, to check what a sample costs
        self.pids: list[int] = []

    def _get(self, v):
        self.calls += 1
        if v is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return v

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._get(self.sm if kind == self.NVML_CLOCK_SM else self.mem)

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return self._get(self.max_sm)

    def nvmlDeviceGetDefaultApplicationsClock(self, h, kind):
        return self._get(self.default_sm)

    def nvmlDeviceGetTemperature(self, h, kind):
        return self._get(self.temp)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get(self.power_mw)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._get(self.reasons)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [self._Proc(p) for p in self._get(self.pids)]
