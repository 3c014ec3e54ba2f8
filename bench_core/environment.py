"""The environment fingerprint every result carries, and which parts of it decide comparability."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any, Mapping

from . import __version__

# Fields whose difference makes two results measure different things. Everything else (hostname,
# clock readings, free memory, git commit) is recorded for the reader but never blocks a comparison.
COMPARABILITY_FIELDS = (
    "device",
    "gpu_name",
    "gpu_sm_count",        # two MIG slices share a GPU name; their SM counts and memory differ
    "gpu_memory_bytes",
    "gpu_driver",
    "torch_major_minor",
    "cuda_version",        # the CUDA torch was built with; the driver's is gpu_driver
    "allow_tf32_matmul",
    "allow_tf32_cudnn",
    "deterministic_algorithms",
)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git(root: str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


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
        "git_commit": _git(root, "rev-parse", "HEAD"),
        "git_dirty": None,
    }
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    env["git_dirty"] = None if status is None else bool(status)
    if device == "cuda":
        env.update(_gpu_fields(torch))
    return env


# On the CPU the processor itself is the device: another model or core count is another machine.
CPU_COMPARABILITY_FIELDS = ("cpu_model", "cpu_count")


def differences(a: Mapping[str, Any], b: Mapping[str, Any], fields=None) -> dict:
    """The comparability fields where a and b disagree, as {field: (a, b)}."""
    if fields is None:
        fields = COMPARABILITY_FIELDS + (CPU_COMPARABILITY_FIELDS if "cpu" in (a.get("device"), b.get("device")) else ())
    return {f: (a.get(f), b.get(f)) for f in fields if a.get(f) != b.get(f)}
