"""Verdicts that explain themselves: when side by side (or A/B) calls a scenario slower or faster, profiler passes of
each side, alternated (after the measurement, never inside it), give each operator's self time per step, pass by
pass; `deciding.explained` names only the operators whose move they establish. A first hypothesis to test, not a
measurement: the profiler's own overhead is in these times, and the verdict stays the rounds'."""
from __future__ import annotations

from typing import Any, Callable, Mapping

CALLS = 1    # profiled calls of each side in a pass, after one unprofiled call: the passes are the samples, and
             # a profiled call of a training step costs several of its own (docs/lab/pytest-benchmark.md)
PASSES = 3   # passes of each side, alternated: an operator's difference is told from the profiler's noise by them


def op_times(fn: Callable[[], Any], setup: Callable[[], Any] | None = None, calls: int = CALLS,
             device: str = "cpu") -> dict[str, tuple[float, int]]:
    """Per operator: self time per step (ms; the device's own on CUDA) and calls per step, over `calls` calls."""
    import torch
    from torch.autograd import profiler

    def call():
        if setup is not None:
            setup()
        fn()
    call()
    # torch.autograd's profiler, not torch.profiler's wrapper: the wrapper asks `hasattr(torch, "_inductor")`, which
    # imports the compiler (most of a process's first pass: docs/side-by-side.md)
    with profiler.profile(use_cpu=True, use_device="cuda" if device == "cuda" else None, use_kineto=True) as prof:
        for _ in range(calls):
            call()
        if device == "cuda":
            torch.cuda.synchronize()
    totals = cpu_self_times(prof) if device != "cuda" else None
    if totals is None:
        totals = {e.key: (getattr(e, "self_device_time_total", 0) if device == "cuda" else e.self_cpu_time_total,
                          e.count) for e in prof.key_averages()}
    return {key: (us / calls / 1000.0, int(round(n / calls))) for key, (us, n) in totals.items()}


# events that key_averages() leaves out (torch.autograd.profiler_util._filter_name)
_UTILITY_EVENTS = frozenset({"[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                             "profiler::_record_function_enter_new", "profiler::_record_function_exit",
                             "aten::is_leaf", "aten::output_nr", "aten::_version"})


def cpu_self_times(prof) -> dict[str, tuple[float, int]] | None:
    """Per operator: (self CPU time in microseconds, events), what `prof.key_averages()` gives on the CPU, from the
    profiler's raw events. key_averages() builds a Python object per event first, which for a small training step's
    thousands of events costs several times the profiling itself, in each side's process (docs/lab/from-the-code.md).
    None where this torch keeps its raw events elsewhere (the caller then uses key_averages())."""
    try:
        from torch.autograd import DeviceType

        # torch.autograd's profiler holds them; torch.profiler's wraps one
        results = getattr(prof, "kineto_results", None) or prof.profiler.kineto_results
        events = results.events()
    except (AttributeError, ImportError, RuntimeError):
        return None
    counts: dict[str, int] = {}
    selfs: dict[str, float] = {}
    threads: dict[int, list[tuple[int, int, str]]] = {}
    for e in events:
        name = e.name()
        if name in _UTILITY_EVENTS or getattr(e, "is_hidden_event", lambda: False)():
            continue
        counts[name] = counts.get(name, 0) + 1
        selfs.setdefault(name, 0.0)
        # as torch: an event that ends on another thread, or is not the CPU's, has no self time and no parent
        if e.device_type() == DeviceType.CPU and not e.is_async() and e.start_thread_id() == e.end_thread_id():
            threads.setdefault(e.start_thread_id(), []).append((e.start_ns(), -e.end_ns(), name))
    def close(span: list) -> None:
        # torch merges an event into its parent where it is the parent's only child and has the parent's name (an
        # operator redispatching to itself): one call, not two. Its self time is the parent's already.
        if span[2] == 1 and span[3] == span[1]:
            counts[span[1]] -= 1

    for spans in threads.values():
        spans.sort()
        open_: list[list] = []   # [end, name, children, first child's name] of the events around the one at hand
        for start, neg_end, name in spans:
            end = -neg_end
            while open_ and (start >= open_[-1][0] or end > open_[-1][0]):
                close(open_.pop())
            selfs[name] += (end - start) / 1000.0
            if open_:   # a child's time is not its parent's own
                parent = open_[-1]
                selfs[parent[1]] -= (end - start) / 1000.0
                parent[2] += 1
                parent[3] = parent[3] or name
            open_.append([end, name, 0, None])
        while open_:
            close(open_.pop())
    return {name: (selfs[name], counts[name]) for name in counts}


def alternated(profile: Mapping[str, Callable[[], Any]], passes: int = PASSES) -> dict[str, list]:
    """Each side's profiler passes (`profile[side]()` one pass), taken in turn, the order flipped every time
    (baseline, candidate, candidate, baseline...), so that a drift of the machine lands on both sides alike."""
    out: dict[str, list] = {side: [] for side in profile}
    for i in range(passes):
        for side in (list(profile) if i % 2 == 0 else list(reversed(list(profile)))):
            out[side].append(profile[side]())
    return out
