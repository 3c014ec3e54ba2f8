"""Where the work runs: how to synchronize, how GPU time is taken, what memory can be observed.

The CUDA backend takes the `torch.cuda` module as an argument, so tests drive it with a fake
module (fake events, fake synchronize, fake memory statistics) and its logic is covered on the CPU.
"""
from __future__ import annotations

from typing import Any, Protocol

from bench_core.core.records import Memory


class Backend(Protocol):
    kind: str

    def synchronize(self) -> None: ...
    def event(self) -> Any | None: ...
    def record(self, event: Any) -> None: ...
    def elapsed_ms(self, start: Any, end: Any) -> float: ...
    def memory_begin(self) -> None: ...
    def memory_end(self) -> Memory: ...
    def gpu_state(self) -> Any | None: ...
    def clock_reading(self) -> Any | None: ...
    def default_sm_mhz(self) -> int | None: ...
    def cache_bytes(self) -> int | None: ...
    def buffer(self, nbytes: int) -> Any: ...
    def capture(self, fn: Any) -> tuple[Any, Any]: ...


class CpuBackend:
    """Work on the CPU finishes when the call returns: nothing to wait for, no GPU clock, no allocator stats."""

    kind = "cpu"

    def synchronize(self) -> None:
        return None

    def event(self) -> None:
        return None

    def record(self, event) -> None:
        return None

    def elapsed_ms(self, start, end) -> float:  # pragma: no cover - never called without events
        raise RuntimeError("the CPU backend has no events")

    def memory_begin(self) -> None:
        return None

    def memory_end(self) -> Memory:
        return Memory()  # not observed: all None

    def gpu_state(self) -> None:
        return None

    def clock_reading(self) -> None:
        return None

    def default_sm_mhz(self) -> None:
        return None

    def cache_bytes(self) -> None:
        return None   # not flushed here: the cache modes are the GPU's L2 (timing.cache)

    def buffer(self, nbytes: int):  # pragma: no cover - the cache modes refuse the CPU before asking
        raise RuntimeError("the CPU backend keeps no flush buffer")

    def capture(self, fn):  # pragma: no cover - graph mode refuses the CPU before asking
        raise RuntimeError("CUDA graphs need a CUDA device")


class CudaBackend:
    """CUDA timing through events on the current stream, memory from the caching allocator's statistics."""

    kind = "cuda"

    def __init__(self, cuda: Any = None, device: int | None = None, telemetry: Any = None,
                 alloc: Any = None):
        if cuda is None:
            import torch

            cuda = torch.cuda
        self.cuda = cuda
        self.device = device
        self.telemetry = telemetry      # a telemetry.Telemetry for this device, or None: not observed
        self._alloc = alloc             # nbytes -> a device buffer (zero_, sum); None: a torch tensor on the device
        self._start_stats: dict = {}

    def gpu_state(self):
        """The device's clocks, throttle reasons, temperature and power now (NVML), or None."""
        return None if self.telemetry is None else self.telemetry.state()

    def clock_reading(self):
        """The SM clock and its reasons now, read around each sample (NVML), or None."""
        return None if self.telemetry is None else self.telemetry.clocks()

    def default_sm_mhz(self) -> int | None:
        return None if self.telemetry is None else self.telemetry.default_sm_mhz()

    def _index(self) -> int:
        return self.cuda.current_device() if self.device is None else self.device

    def cache_bytes(self) -> int | None:
        """The device's L2 in bytes (what a cold sample must find flushed), or None where torch does not say."""
        size = getattr(self.cuda.get_device_properties(self._index()), "L2_cache_size", None)
        return int(size) if size else None

    def buffer(self, nbytes: int):
        """`nbytes` of device memory in 4-byte words: a float32 sum over it reads at memory speed, where a byte
        tensor's sum (promoted to int64) is bound by arithmetic and cannot tell L2 from HBM (docs/gpu.md)."""
        if self._alloc is not None:
            return self._alloc(nbytes)
        import torch

        return torch.zeros(nbytes // 4, dtype=torch.float32, device=f"cuda:{self._index()}")

    def capture(self, fn):
        """`fn` captured once as a CUDA graph: warmed up on a side stream first (as torch requires, so that lazy
        initialisation is not captured), then captured. Returns (replay, the captured call's output, whose
        tensors each replay rewrites). Whatever capture raises (a host sync inside the step) comes back raised."""
        cuda = self.cuda
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            for _ in range(3):
                fn()
        cuda.current_stream().wait_stream(side)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            out = fn()
        return graph.replay, out

    def synchronize(self) -> None:
        self.cuda.synchronize(self.device)

    def event(self):
        """A timing event, created but not recorded (torch creates the CUDA event at its first record)."""
        return self.cuda.Event(enable_timing=True)

    def record(self, event) -> None:
        # on this device's current stream, whatever device is current in the calling thread
        stream = self.cuda.current_stream(self.device)
        event.record(stream)
        self._events_recorded_on = stream

    def elapsed_ms(self, start, end) -> float:
        return float(start.elapsed_time(end))

    def memory_begin(self) -> None:
        # reset_peak_memory_stats sets the peak to what is allocated *now*, not to zero: the window's own
        # figure is the peak minus that starting allocation
        self.cuda.reset_peak_memory_stats(self.device)
        self._start_stats = dict(self.cuda.memory_stats(self.device))

    def memory_end(self) -> Memory:
        end = dict(self.cuda.memory_stats(self.device))

        def delta(key):
            if key not in end:
                return None  # this build does not report it: not observed
            return max(0, int(end[key]) - int(self._start_stats.get(key, 0)))

        def peak(key):
            return int(end[key]) if key in end else None

        start_alloc = self._start_stats.get("allocated_bytes.all.current")
        window = (None if "allocated_bytes.all.peak" not in end or start_alloc is None
                  else max(0, int(end["allocated_bytes.all.peak"]) - int(start_alloc)))
        return Memory(
            window_peak_bytes=window,
            peak_allocated_bytes=peak("allocated_bytes.all.peak"),
            peak_reserved_bytes=peak("reserved_bytes.all.peak"),
            device_allocs=delta("num_device_alloc"),
            alloc_retries=delta("num_alloc_retries"),
        )


def _telemetry(cuda: Any, device: int | None):
    """NVML telemetry for the torch device, found by its UUID (CUDA_VISIBLE_DEVICES renumbers devices, NVML
    does not), else by index; None without NVML (the optional `telemetry` extra) or with a fake `cuda`."""
    import os

    from bench_core.timing.telemetry import Telemetry, load_nvml

    if cuda is not None:
        return None
    nvml = load_nvml()
    if nvml is None:
        return None
    import torch

    index = torch.cuda.current_device() if device is None else device
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        t = Telemetry(nvml, index, os.getpid())
        t.handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return t
    except Exception:
        try:
            return Telemetry(nvml, index, os.getpid())
        except Exception:
            return None


def backend_for(device: str, cuda: Any = None) -> Backend:
    """'cpu', 'cuda' (the current device) or 'cuda:N' (device N: synchronized, timed and observed there)."""
    if device == "cpu":
        return CpuBackend()
    if device == "cuda":
        return CudaBackend(cuda, telemetry=_telemetry(cuda, None))
    if device.startswith("cuda:") and device[5:].isdigit():
        return CudaBackend(cuda, int(device[5:]), telemetry=_telemetry(cuda, int(device[5:])))
    raise ValueError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'")
