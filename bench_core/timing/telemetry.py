"""What the GPU itself was doing around a timed window, from NVML (`pip install -e .[telemetry]`, which brings
`nvidia-ml-py`): SM and memory clocks, the reasons the clocks were held down (thermal or power throttling among
them), temperature, power and the other processes on the device. Read just before and just after the window,
never inside it. Without the package, a driver or a GPU every figure is None: not observed, never zero.

Takes the NVML module as an argument, so tests drive it with a fake on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# NVML's clock event (throttle) reason bits, named as nvidia-smi names them
REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THERMAL = {"sw_thermal_slowdown", "hw_thermal_slowdown"}
POWER = {"sw_power_cap", "hw_power_brake_slowdown", "hw_slowdown"}
CLOCK_DRIFT = 0.02   # SM clocks that move more than this across a window are not locked


@dataclass(frozen=True)
class GpuState:
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    reasons: tuple[str, ...] | None = None      # why clocks are held down now; None: not observed
    other_processes: int | None = None          # compute processes on the device besides this one

    def to_dict(self) -> dict:
        return {**self.__dict__, "reasons": None if self.reasons is None else list(self.reasons)}


def load_nvml() -> Any | None:
    """The initialised NVML module, or None where it cannot be had (no package, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


class Telemetry:
    def __init__(self, nvml: Any, index: int, own_pid: int):
        self.nvml, self.own_pid = nvml, own_pid
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def _read(self, fn: str, *args):
        try:
            return getattr(self.nvml, fn)(self.handle, *args)
        except Exception:   # a field this GPU or driver does not report: not observed
            return None

    def state(self) -> GpuState:
        n = self.nvml
        mask = self._read("nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None:
            mask = self._read("nvmlDeviceGetCurrentClocksThrottleReasons")   # older name of the same query
        procs = self._read("nvmlDeviceGetComputeRunningProcesses")
        power = self._read("nvmlDeviceGetPowerUsage")
        return GpuState(
            sm_clock_mhz=self._read("nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM),
            mem_clock_mhz=self._read("nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM),
            max_sm_clock_mhz=self._read("nvmlDeviceGetMaxClockInfo", n.NVML_CLOCK_SM),
            temperature_c=self._read("nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU),
            power_w=None if power is None else power / 1000.0,
            reasons=None if mask is None else tuple(name for bit, name in REASONS.items() if mask & bit),
            other_processes=None if procs is None else sum(1 for p in procs if p.pid != self.own_pid),
        )


def window_record(before: GpuState, after: GpuState) -> dict:
    """The states around one timed window and what they flag, for a result record."""
    return {"before": before.to_dict(), "after": after.to_dict(), "flags": flags(before, after)}


def flags(before: GpuState, after: GpuState) -> list[str]:
    """Throttling seen at either edge of the window, unlocked clocks, other processes: each in words."""
    out = []
    seen = set(before.reasons or ()) | set(after.reasons or ())
    if seen & THERMAL:
        out.append(f"thermal throttling ({', '.join(sorted(seen & THERMAL))})")
    if seen & POWER:
        out.append(f"power throttling ({', '.join(sorted(seen & POWER))})")
    a, b = before.sm_clock_mhz, after.sm_clock_mhz
    if a and b and abs(b - a) / a > CLOCK_DRIFT:
        out.append(f"clocks not locked: SM clock {a} -> {b} MHz across the window "
                   f"(lock them: sudo nvidia-smi --lock-gpu-clocks=<MHz>)")
    others = max(before.other_processes or 0, after.other_processes or 0)
    if others:
        out.append(f"{others} other process(es) on the GPU")
    return out
