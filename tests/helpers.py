"""Builders for measurements with chosen samples, for tests of the pure stages."""
from __future__ import annotations

import numpy as np

from bench_core import ColdStart, Measurement, Scenario

ENV = {"device": "cpu", "gpu_name": None, "torch_major_minor": "2.13", "cuda_version": None,
       "allow_tf32_matmul": False, "allow_tf32_cudnn": True, "deterministic_algorithms": False,
       "hostname": "a"}


def meas(samples, name="s", env=None, metadata=None, threshold=None, device="cpu", gpu=None):
    return Measurement(Scenario(name, ("compute",), metadata or {"dtype": "float32"}, noise_threshold=threshold),
                       device=device, mode="per_call", block_size=1, warmup=0, repeats=len(samples),
                       host_ms=tuple(float(v) for v in samples), gpu_ms=gpu, cold_start=ColdStart(1.0),
                       environment=env or ENV)


def runs(levels, n=30, spread=0.01, seed=0, name="s", **kw):
    """One measurement per level: n samples around that level with relative spread."""
    rng = np.random.default_rng(seed)
    return [meas(level * (1 + spread * rng.standard_normal(n)), name=name, **kw) for level in levels]


class FreshProcesses:
    """A stand-in for the gate's fresh processes (`workflows.replicas.Replica`): `measure` hands the counts to
    `replicate(warmup, repeats)`, a fake process's measurement."""

    def __init__(self, replicate):
        self.replicate = replicate

    def measure(self, name, environment, warmup, repeats, timeout_s):
        return self.replicate(warmup, repeats)


def orphaned_workers() -> list[int]:
    """bench_core side servers (`--bench-serve`) and their forked round processes whose parent is gone (adopted by
    init or a subreaper): leaks, whoever made them. Servers of other live sessions on the machine are not counted."""
    import subprocess

    out = subprocess.run(["pgrep", "-f", "--", "--bench-serve="], capture_output=True, text=True).stdout
    orphans = []
    for pid in (int(p) for p in out.split()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                parent = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue   # gone meanwhile
        if ppid == 1 or ("pytest" not in parent and "python" not in parent):
            orphans.append(pid)
    return orphans
