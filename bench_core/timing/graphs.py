"""CUDA-graph mode: the step captured once and replayed, so its samples hold no launch cost; beside them the same
step eager, so that launch overhead per step is a figure of its own (eager event time minus graph event time).

A graph holds device work only. A step that synchronizes with the host inside (`.item()`, `.cpu()`, printing a
tensor, a shape that depends on data) cannot be captured: capture raises, and the scenario is refused naming
why. A step that does CPU work between its kernels, or changes a shape, is captured as it was at capture time;
that is caught by replaying the graph once and comparing its output with an eager call's before any sample is
taken. Refused too: a `setup` before each call (a replay of k steps has nowhere to run it).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from bench_core.core.errors import ScenarioError

GRAPH_REPLAYS = 10    # replays per sample (and eager calls per sample beside them): the window is then long enough
                      # for CUDA events' resolution while one replay is a few microseconds

EAGERLY = "time it eagerly (without --bench-graph or graph=True)"


@dataclass(frozen=True)
class Captured:
    replay: Callable[[], Any]
    output: str           # how the replay's output was checked, in words


def refuse(backend: Any, scenario: str, setup: Callable[[], Any] | None) -> None:
    """What graph mode refuses before anything runs: a device that is not CUDA, a setup before each call."""
    if backend.kind != "cuda":
        raise ScenarioError(scenario, f"graph mode captures a CUDA graph: it needs a CUDA device (--gpu); {EAGERLY} "
                                      f"on the CPU")
    if setup is not None:
        raise ScenarioError(scenario, f"graph mode replays {GRAPH_REPLAYS} steps per sample, with nowhere to run a "
                                      f"setup before each; copy new inputs into the step's own tensors inside it, or "
                                      f"{EAGERLY}")


def capture(backend: Any, scenario: str, fn: Callable[[], Any]) -> Captured:
    """`fn` captured as a CUDA graph on `backend`, its replay checked against eager calls; refusals name why."""
    try:
        replay, out = backend.capture(fn)
    except Exception as exc:   # whatever the step or CUDA raised while capturing
        raise ScenarioError(scenario, f"cannot be captured as a CUDA graph ({type(exc).__name__}: {exc}). A graph "
                                      f"holds device work only: a step that synchronizes with the host (.item(), "
                                      f".cpu(), printing a tensor, a shape that depends on data) cannot be replayed; "
                                      f"{EAGERLY}") from exc
    if out is None:
        return Captured(replay, "not compared: the step returns nothing")
    # eager, replay, eager: values are compared where the two eager calls agree (a step without state); a
    # training step or one drawing random numbers changes its output every call, and then only its shapes are
    before = _snapshot(fn())
    backend.synchronize()
    replay()
    backend.synchronize()
    got = _snapshot(out)
    want = fn()
    backend.synchronize()
    values = _differs(before, want, "output") is None
    diff = _differs(got, want, "output", values)
    if diff is not None:
        raise ScenarioError(scenario, f"its CUDA graph's replay differs from an eager call ({diff}): the graph froze "
                                      f"something the step does anew each call (CPU work, a shape that changes, new "
                                      f"input tensors); {EAGERLY}")
    return Captured(replay, "equal to an eager call's" if values else
                    "shapes equal to an eager call's; values not compared: the step's output changes from call to "
                    "call (state it updates, random numbers)")


def record(eager: Any, graph: Any, replays: int, output: str) -> dict:
    """What a result in graph mode carries beside its (graph) samples: the eager samples taken the same way and
    launch overhead per step, eager minus graph GPU event time (medians)."""
    e_gpu = [s.gpu_ms for s in eager.samples]
    g_gpu = [s.gpu_ms for s in graph.samples]
    known = all(v is not None for v in e_gpu + g_gpu)
    eager_ms = statistics.median(e_gpu) if known else None
    graph_ms = statistics.median(g_gpu) if known else None
    return {"replays_per_sample": replays, "output": output,
            "eager_host_ms": [s.host_ms for s in eager.samples], "eager_gpu_ms": e_gpu,
            "eager_gpu_median_ms": eager_ms, "graph_gpu_median_ms": graph_ms,
            "launch_overhead_ms": None if not known else eager_ms - graph_ms}


def _snapshot(value: Any) -> Any:
    """A copy of the replay's output: its tensors are the graph's own, rewritten by the next replay."""
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    clone = getattr(value, "clone", None)
    return clone() if callable(clone) else value


def _differs(got: Any, want: Any, where: str, values: bool = True) -> str | None:
    """Where `got` differs from `want` (structure, shapes and dtypes; values too with `values`), or None."""
    if isinstance(got, (list, tuple, dict)):
        keys = list(got) if isinstance(got, dict) else range(len(got))
        if type(got) is not type(want) or len(got) != len(want):
            return f"{where} has another structure"
        for k in keys:
            found = _differs(got[k], want[k], f"{where}[{k!r}]", values)
            if found:
                return found
        return None
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(got, torch.Tensor):
        if not isinstance(want, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return f"{where}: {tuple(got.shape)} {got.dtype} against {getattr(want, 'shape', type(want).__name__)}"
        if not values:
            return None
        same = (torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True) if got.is_floating_point()
                else torch.equal(got, want))
        return None if same else f"{where}: values differ"
    return None if not values or got == want else f"{where}: {got!r} against {want!r}"
