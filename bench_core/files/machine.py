"""The environment record every result carries, read off this machine: versions, devices, flags, git.

What the fields mean for comparability is `core.environment`; this module only reads them. torch is
imported when a record is taken, not before.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

from bench_core.core.version import __version__
from bench_core.files import git


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _gpu_fields(torch: Any) -> dict:
    """GPU identity; a field the runtime cannot tell stays None (not observed)."""
    out: dict[str, Any] = {}
    try:
        out["cudnn_version"] = torch.backends.cudnn.version()
    except Exception:
        pass
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        out.update(gpu_name=props.name, gpu_capability=f"{props.major}.{props.minor}",
                   gpu_memory_bytes=int(props.total_memory), gpu_sm_count=int(props.multi_processor_count))
    except Exception:
        pass
    out["gpu_driver"] = _nvidia_driver()
    return out


def fingerprint(device: str = "cpu", root: str | None = None, torch_module: Any = None) -> dict:
    """Describe the machine and software a result came from. Unobservable fields are None."""
    torch = torch_module
    if torch is None:
        import torch
    root = root or os.getcwd()
    env: dict[str, Any] = {
        "device": device,
        "bench_core_version": __version__,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "os": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_major_minor": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
        "torch_threads": torch.get_num_threads(),
        "cuda_version": getattr(torch.version, "cuda", None),
        "cudnn_version": None,
        "gpu_name": None,
        "gpu_capability": None,
        "gpu_memory_bytes": None,
        "gpu_sm_count": None,
        "gpu_driver": None,
        "allow_tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "allow_tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "git_commit": git.output(root, "rev-parse", "HEAD"),
        "git_dirty": None,
    }
    status = git.output(root, "status", "--porcelain", "--untracked-files=no")
    env["git_dirty"] = None if status is None else bool(status)
    if device == "cuda":
        env.update(_gpu_fields(torch))
    return env
