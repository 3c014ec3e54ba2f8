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
THROTTLE_SHARE = 0.75   # a sample whose SM clock fell below this share of the default clock was throttled (nvbench's)
LOCKED = "applications_clocks_setting"   # the reason bit NVML sets while clocks are held at a set value


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


@dataclass(frozen=True)
class ClockReading:
    """The two figures read around every sample (two NVML queries, outside the window): the SM clock and why
    clocks are held down."""

    sm_mhz: int | None = None
    reasons: tuple[str, ...] | None = None


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

    def _reasons(self) -> tuple[str, ...] | None:
        mask = self._read("nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None:
            mask = self._read("nvmlDeviceGetCurrentClocksThrottleReasons")   # older name of the same query
        return None if mask is None else tuple(name for bit, name in REASONS.items() if mask & bit)

    def clocks(self) -> ClockReading:
        return ClockReading(self._read("nvmlDeviceGetClockInfo", self.nvml.NVML_CLOCK_SM), self._reasons())

    def default_sm_mhz(self) -> int | None:
        """The SM clock the device runs at by default (its default applications clock), else its maximum."""
        return (self._read("nvmlDeviceGetDefaultApplicationsClock", self.nvml.NVML_CLOCK_SM)
                or self._read("nvmlDeviceGetMaxClockInfo", self.nvml.NVML_CLOCK_SM))

    def state(self) -> GpuState:
        n = self.nvml
        procs = self._read("nvmlDeviceGetComputeRunningProcesses")
        power = self._read("nvmlDeviceGetPowerUsage")
        return GpuState(
            sm_clock_mhz=self._read("nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM),
            mem_clock_mhz=self._read("nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM),
            max_sm_clock_mhz=self._read("nvmlDeviceGetMaxClockInfo", n.NVML_CLOCK_SM),
            temperature_c=self._read("nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU),
            power_w=None if power is None else power / 1000.0,
            reasons=self._reasons(),
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


# reasons that set a sample aside whatever its clock: thermal limits and the hardware's own slowdowns. The software
# power cap is left to the clock rule: a busy GPU sits at its cap most of the time, a few percent below its clock
SEVERE = THERMAL | {"hw_slowdown", "hw_power_brake_slowdown"}


def throttled(before: ClockReading, after: ClockReading, default_mhz: int | None,
              share: float = THROTTLE_SHARE) -> str | None:
    """Why one sample was taken throttled, in words, or None: a thermal or hardware slowdown reason at either edge,
    or the SM clock at the sample's end below `share` of the default. The end, because the reading before a sample
    finds the device idle for a moment, and an idle GPU lowers its clock."""
    seen = (set(before.reasons or ()) | set(after.reasons or ())) & SEVERE
    if seen:
        return f"throttled ({', '.join(sorted(seen))})"
    if default_mhz and after.sm_mhz is not None and after.sm_mhz < share * default_mhz:
        return f"SM clock {after.sm_mhz} MHz, below {share:.0%} of the default {default_mhz} MHz"
    return None


def per_sample(readings, default_mhz: int | None, share: float = THROTTLE_SHARE,
               min_kept: int = 2) -> tuple[list[int], dict] | None:
    """Which samples to decide on, from each sample's (before, after) clock readings: the unthrottled ones where at
    least `min_kept` and half of them remain, else all (the record then says the scenario is marked). Returns (kept
    indices, the record a result carries), or None where no sample was read (not observed)."""
    if not readings or any(r is None for r in readings):
        return None
    flagged = {i: why for i, (b, a) in enumerate(readings)
               if (why := throttled(b, a, default_mhz, share)) is not None}
    n = len(readings)
    enough = n - len(flagged) >= max(min_kept, (n + 1) // 2)
    kept = [i for i in range(n) if i not in flagged] if enough else list(range(n))
    sm = [a.sm_mhz for _, a in readings]
    seen = [x for x in sm if x is not None]
    reasons = [set(b.reasons or ()) | set(a.reasons or ()) for b, a in readings]
    return kept, {
        "default_sm_mhz": default_mhz, "share": share, "sm_mhz": sm,
        "flagged": {str(i): why for i, why in flagged.items()},
        "decided_on": "unthrottled" if enough else "all",
        # locked: NVML says clocks are held at a set value in every reading; steady: they did not move
        "locked": all(LOCKED in r for r in reasons) if all(b.reasons is not None for b, _ in readings) else None,
        "steady": bool(seen) and (max(seen) - min(seen)) <= CLOCK_DRIFT * max(seen),
    }
