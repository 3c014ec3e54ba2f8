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


def orphaned_workers() -> list[int]:
    """bench_core worker processes whose parent (named on their command line) is gone: leaks, whoever made them.
    Workers of other live sessions on the machine are not counted."""
    import os
    import subprocess

    out = subprocess.run(["pgrep", "-af", "bench_core.workflows.worker --parent"], capture_output=True, text=True).stdout
    orphans = []
    for line in out.splitlines():
        pid, *args = line.split()
        parent = int(args[args.index("--parent") + 1]) if "--parent" in args else None
        if parent is not None and not os.path.exists(f"/proc/{parent}"):
            orphans.append(int(pid))
    return orphans
