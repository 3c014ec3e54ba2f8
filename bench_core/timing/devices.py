"""Is a CUDA device really there? One place to ask, so tests can answer it with a fake."""
from __future__ import annotations


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:
        return False
