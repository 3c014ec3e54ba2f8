"""How much work a step does, counted (not timed): floating-point operations per operator and per module, with
torch's FLOP counter (`torch.utils.flop_counter.FlopCounterMode`), and the operators it has no formula for,
named as not counted (never as zero). Counting runs the step once more, after its measurement, outside every
timed window and profiler-free.

With a time, a count gives the achieved FLOP/s; with a peak, the share of it the step reached. Peaks come from
`PEAKS` (dense, no sparsity; per GPU model and dtype, with the source), from the user, or on the CPU from one
large matmul timed here (`cpu_peak`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# Dense peak TFLOP/s from the vendors' data sheets (no structured sparsity).
# Source: NVIDIA H100 and H200 Tensor Core GPU data sheets (SXM); NVIDIA A100 data sheet (SXM).
PEAKS = {
    ("H100", "bfloat16"): 989.0, ("H100", "float16"): 989.0, ("H100", "float32"): 67.0, ("H100", "tf32"): 494.5,
    ("H200", "bfloat16"): 989.0, ("H200", "float16"): 989.0, ("H200", "float32"): 67.0, ("H200", "tf32"): 494.5,
    ("A100", "bfloat16"): 312.0, ("A100", "float16"): 312.0, ("A100", "float32"): 19.5, ("A100", "tf32"): 156.0,
}
# Memory bandwidth, TB/s, same sources (H100 SXM HBM3, H200 HBM3e, A100 80GB SXM HBM2e).
BANDWIDTH = {"H100": 3.35, "H200": 4.8, "A100": 2.039}


@dataclass(frozen=True)
class WorkCount:
    flops: int                                   # counted operators only; see `not_counted`
    bytes: int | None = None                     # tensor bytes the operators read and wrote (see `count`)
    by_operator: Mapping[str, int] = field(default_factory=dict)
    by_module: Mapping[str, int] = field(default_factory=dict)
    not_counted: Mapping[str, int] = field(default_factory=dict)   # operator -> calls, no FLOP formula in torch

    def to_dict(self) -> dict:
        return {"flops": self.flops, "bytes": self.bytes, "by_operator": dict(self.by_operator),
                "by_module": dict(self.by_module), "not_counted": dict(self.not_counted)}


# Operators that move no data: views and metadata. Their tensors' bytes are not traffic.
NO_TRAFFIC = {"aten.view", "aten._unsafe_view", "aten.t", "aten.transpose", "aten.expand", "aten.detach",
              "aten.reshape", "aten.permute", "aten.unsqueeze", "aten.squeeze", "aten.as_strided", "aten.slice",
              "aten.select", "aten.alias", "aten.lift_fresh", "aten.is_same_size", "aten.split", "aten.unbind",
              "aten.empty", "aten.new_empty", "aten.empty_like", "aten._local_scalar_dense", "aten.flatten"}


# Operators that are not arithmetic to count: the views above, allocations, copies, and composites whose work
# reaches the counter as the matmuls and convolutions they call. The rest without a formula is "not counted".
NOT_WORK = NO_TRAFFIC | {
    "aten.zeros", "aten.ones", "aten.full", "aten.copy_", "aten._to_copy", "aten.clone", "aten.new_zeros",
    "aten.ones_like", "aten.zeros_like", "aten.cat", "aten.stack", "aten.fill_", "aten.zero_", "aten.randn",
    "aten.rand", "aten.normal_", "aten.uniform_", "aten.full_like", "aten.to", "aten.contiguous",
    "aten.linear", "aten.matmul", "aten.einsum", "aten.conv1d", "aten.conv2d", "aten.conv3d"}


def count(fn: Callable[[], Any], setup: Callable[[], Any] | None = None) -> WorkCount:
    """One call of `fn` (after `setup`) under torch's FLOP counter and a recorder of every operator it runs.

    Bytes: for every operator that moves data, the sizes of the tensors it takes and returns. An estimate of
    memory traffic with no cache in between (an upper bound for data a cache keeps; an in-place result counts
    as read and written); with the FLOPs it places the step as compute- or memory-bound."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    counted = {str(op) for op in flop_registry}
    calls: dict[str, int] = {}
    moved = [0]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            calls[name] = calls.get(name, 0) + 1
            out = func(*args, **(kwargs or {}))
            if name not in NO_TRAFFIC:
                moved[0] += sum(t.nbytes for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor))
            return out

    if setup is not None:
        setup()
    counter = FlopCounterMode(display=False)
    with counter, Recorder():
        fn()
    by_module = {str(k): int(sum(v.values())) for k, v in counter.get_flop_counts().items() if k != "Global"}
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    not_counted = {op: n for op, n in sorted(calls.items())
                   if op not in counted and op not in NOT_WORK and not op.startswith("profiler.")}
    return WorkCount(int(counter.get_total_flops()), moved[0], by_op, by_module, not_counted)


def known_peak(gpu_name: str | None, dtype: str | None) -> float | None:
    """Dense peak TFLOP/s of a known GPU model for a dtype, or None."""
    if not gpu_name or not dtype:
        return None
    for (model, dt), tflops in PEAKS.items():
        if model in gpu_name and dt == dtype:
            return tflops
    return None


def known_bandwidth(gpu_name: str | None) -> float | None:
    """Memory bandwidth in bytes/s of a known GPU model, or None."""
    for model, tbs in BANDWIDTH.items():
        if gpu_name and model in gpu_name:
            return tbs * 1e12
    return None


def cpu_bandwidth(megabytes: int = 64, repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> float:
    """Bytes/s of the best of a few copies of a buffer far larger than the caches (read once, written once)."""
    import torch

    src = torch.empty(megabytes * 2 ** 20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)   # the first copy pays for the pages
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        dst.copy_(src)
        best = min(best, clock() - start)
    return 2.0 * src.nbytes / best if best > 0 else float("nan")


def bound(flops: int, moved: int | None, peak: float | None, bandwidth: float | None) -> str | None:
    """'compute' or 'memory': which roof the step's arithmetic intensity sits under (the roofline's ridge is
    peak / bandwidth FLOP per byte); None when a figure is missing."""
    if not flops or not moved or not peak or not bandwidth:
        return None
    return "compute" if flops / moved >= peak / bandwidth else "memory"


def cpu_peak(size: int = 1024, repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of the best of a few float32 matmuls of size x size on the CPU: the machine's practical peak."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)   # the first call pays for allocation and thread start-up
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        torch.mm(a, b)
        best = min(best, clock() - start)
    return 2.0 * size ** 3 / best if best > 0 else float("nan")


def leading_operator(work: Mapping[str, Any]) -> tuple[str, int] | None:
    """(operator, FLOPs) of the counted operator with the most FLOPs, or None when none was counted."""
    return max((work.get("by_operator") or {}).items(), key=lambda kv: kv[1], default=None)


def bandwidth_for(m, environment: Mapping[str, Any]) -> float | None:
    """Memory bandwidth, bytes/s, for a result's roofline: a known GPU's, or the CPU's measured copy rate."""
    if m.device == "cuda":
        return known_bandwidth(environment.get("gpu_name"))
    return environment.get("cpu_bandwidth_bytes_per_s")


def peak_flops_for(m, environment: Mapping[str, Any], peak_tflops: float | None = None) -> float | None:
    """The peak FLOP/s a result's utilization is a share of: the user's (`peak_tflops`), a known GPU's for
    the scenario's dtype, or on the CPU (float32) the matmul peak measured in this session."""
    if peak_tflops is not None:
        return peak_tflops * 1e12
    dtype = m.scenario.metadata.get("dtype")
    if m.device == "cuda":
        t = known_peak(environment.get("gpu_name"), dtype)
        return None if t is None else t * 1e12
    return environment.get("cpu_peak_flops") if dtype in (None, "float32") else None
