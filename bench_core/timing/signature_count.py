"""What a step does, counted exactly: one call of the step under a dispatch mode below autograd (so a backward's
operators count too), after the measurement and outside every timed window, like the FLOP count. The record is
`core.signature.Signature`."""
from __future__ import annotations

import sys
from typing import Any, Callable

from bench_core.core.signature import Signature

# Operators that read a computed value back to the host: on a GPU each waits for the device (a synchronization);
# on the CPU they are the same calls, counted the same way, so a CPU run already sees a sync a GPU run would pay for.
HOST_READS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique_dim",
              "aten._unique2", "aten.unique_consecutive", "aten.equal", "aten.is_nonzero"}
COPIES = {"aten.copy_", "aten._to_copy", "aten.clone"}


def _direction(src, dst) -> str:
    s, d = src.device.type, dst.device.type
    if s == d:
        return "same device"
    return "device to host" if d == "cpu" else ("host to device" if s == "cpu" else f"{s} to {d}")


def record(fn: Callable[[], Any], setup: Callable[[], Any] | None = None) -> Signature:
    """One call of `fn` (after `setup`, uncounted) under a recorder of everything it dispatches."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    ops: dict[str, int] = {}
    syncs: dict[str, int] = {}
    copies: dict[str, int] = {}
    copy_bytes: dict[str, int] = {}
    alloc = [0, 0]

    def tensors(x):
        return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]

    # plain calls first: under a dispatch mode torch.compile does not compile, and what a step does only once (an
    # optimizer creating its state on its first step) belongs to the cold start, not to every step
    compiled = _compiled(fn, setup)
    loaded = "torch._dynamo" in sys.modules   # after those calls: a step that compiles has loaded it by now

    class Recorder(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's __torch_dispatch__ so that the compiler never traces inside it, and the wrapper
            # imports torch._dynamo at its first call (a cost each side's server would pay: docs/side-by-side.md).
            # A process that has not loaded the compiler compiles nothing, so there is nothing to keep it out of.
            return loaded

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = str(func.overloadpacket)
            ops[name] = ops.get(name, 0) + 1
            ins = tensors((args, kwargs))
            out = func(*args, **kwargs)
            outs = tensors(out)
            if name in HOST_READS or (name in COPIES and ins and outs and outs[0].device.type == "cpu"
                                      and ins[-1].device.type != "cpu"):
                syncs[name] = syncs.get(name, 0) + 1
            if name in COPIES and ins and outs:
                src = ins[-1] if name == "aten.copy_" else ins[0]
                way = _direction(src, outs[0])
                copies[way] = copies.get(way, 0) + 1
                copy_bytes[way] = copy_bytes.get(way, 0) + src.nbytes
            held = {t.untyped_storage().data_ptr() for t in ins if t.untyped_storage().nbytes()}
            for t in outs:   # an output whose storage no input had: allocated by this operator
                storage = t.untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in held:
                    held.add(storage.data_ptr())
                    alloc[0] += 1
                    alloc[1] += storage.nbytes()
            return out

    if setup is not None:
        setup()
    with Recorder():
        fn()
    return Signature(ops, syncs, copies, copy_bytes, alloc[0], alloc[1], **compiled)


def _compiled(fn: Callable[[], Any], setup: Callable[[], Any] | None) -> dict:
    """One plain call, and where torch.compile ran in it, its own counters: the graphs and graph breaks of that call
    (their reasons by first line), and the compilations a second call needed (a recompilation per call). Empty for
    code dynamo never saw."""
    def call():
        if setup is not None:
            setup()
        fn()

    if sys.modules.get("torch._dynamo") is None:   # nothing was ever compiled in this process
        call()
        return {}
    from torch._dynamo.utils import counters, guard_failures

    counters.clear()
    call()
    frames = counters["frames"]["total"]
    if not frames:   # compiled before this call, if at all: the graphs it runs, from the profiler's regions
        return _warm_graphs(call)
    # dynamo counts a break's reason once per attempt to trace past it; each break leaves one resume function
    reasons = sorted({_reason(r) for r in counters["graph_break"] if str(r).strip()})
    breaks = int(sum(counters["resumes"].values()))
    graphs = int(counters["stats"]["unique_graphs"])
    seen = {code: len(failed) for code, failed in guard_failures.items()}
    call()
    guards = sorted({_guard(g) for code, failed in guard_failures.items() for g in failed[seen.get(code, 0):]})
    return {"graphs": graphs, "graph_breaks": breaks, "break_reasons": tuple(reasons),
            "recompiles": int(counters["frames"]["total"] - frames), "recompile_reasons": tuple(guards)}


def _warm_graphs(call: Callable[[], None]) -> dict:
    """A warm compiled step's graphs, counted as the compiled regions one call runs (a graph break added to the
    step is one region more); its breaks and their reasons were known only when it compiled: not observed."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    regions = sum(1 for e in prof.events() if e.name.startswith("Torch-Compiled Region"))
    return {"graphs": regions, "graph_breaks": None} if regions else {}


def _guard(text) -> str:
    """A failed guard in one line, without dynamo's frame and compile numbers: the guard and where it came from."""
    import re

    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return re.sub(r"\s+", " ", re.sub(r"^\d+/\d+: ", "", first)).strip()[:200]


def _reason(text) -> str:
    """A graph break's reason in one line: its title and dynamo's explanation (which names the culprit)."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    explained = next((ln.removeprefix("Explanation:").strip() for ln in lines[1:] if ln.startswith("Explanation:")), "")
    return (lines[0] + (f": {explained}" if explained else ""))[:200]


def instructions(fn: Callable[[], Any], setup: Callable[[], Any] | None, folder: str) -> int:
    """Host instructions of one call of `fn`, in a process running under valgrind's callgrind (started with
    --collect-atstart=no and its output files in `folder`, see `workflows.worker.callgrind_argv`): two calls to
    warm up (the first allocates and chooses kernels), then collection toggled on around one call and its counts
    dumped and read back, as torch.utils.benchmark's collect_callgrind counts."""
    import os
    from pathlib import Path

    import torch

    if not torch._C._valgrind_supported_platform():
        raise RuntimeError("this torch build cannot toggle callgrind's collection")

    def call():
        if setup is not None:
            setup()
        fn()
    call()
    call()
    if setup is not None:
        setup()
    # the collector paused, as it is around the timed samples: a collection that the counts of earlier
    # allocations happen to trigger inside the call would count the instructions of objects the step never made
    import gc

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        torch._C._valgrind_toggle()
        fn()
        torch._C._valgrind_toggle_and_dump_stats()
    finally:
        if was_enabled:
            gc.enable()
    dumps = sorted(Path(folder).glob(f"cg.{os.getpid()}.out.*"), key=lambda p: int(p.suffix.lstrip(".") or 0))
    if not dumps:
        raise RuntimeError(f"no callgrind output in {folder}: is this process running under valgrind?")
    text = dumps[-1].read_text(errors="replace")
    dumps[-1].unlink()
    totals = [line.split()[1] for line in text.splitlines() if line.startswith(("totals:", "summary:"))]
    if not totals:
        raise RuntimeError(f"callgrind's output {dumps[-1].name} has no totals line")
    return int(totals[-1])
