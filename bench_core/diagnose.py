"""Diagnose mode: one profiler pass per scenario, after its measurement and never inside it.

Profiled timings never enter results or baselines. The trace is scanned for sensitive strings and
redacted (or refused) before it is written, under a new name, and analysed into hypotheses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import storage
from .errors import BenchError
from .redact import describe, redact
from .trace_analysis import STAGE_PREFIX, Hypothesis, TraceFacts, analyze

_ACTIVE = {"on": False}


class stage:
    """Label a stage of a step (`with stage("forward"): ...`) for the profiler pass. Outside that pass
    it only checks a flag, so measurements stay profiler-free."""

    __slots__ = ("name", "_rf")

    def __init__(self, name: str):
        self.name = name
        self._rf = None

    def __enter__(self):
        if _ACTIVE["on"]:
            import torch

            self._rf = torch.profiler.record_function(f"{STAGE_PREFIX}{self.name}")
            self._rf.__enter__()
        return self

    def __exit__(self, *exc):
        if self._rf is not None:
            rf, self._rf = self._rf, None
            rf.__exit__(*exc)
        return False


@dataclass(frozen=True)
class ProfileConfig:
    folder: Path
    device: str = "cpu"
    wait: int = 1
    warmup: int = 1
    active: int = 3
    record_shapes: bool = False      # each option adds cost and changes what is measured: off by default
    profile_memory: bool = False
    with_stack: bool = False
    tensorboard: bool = False
    refuse_sensitive: bool = False   # refuse to write a trace that needed redaction, instead of redacting


@dataclass(frozen=True)
class ProfileResult:
    scenario: str
    trace_path: Path | None
    redaction: str
    table: str
    facts: TraceFacts
    hypotheses: tuple[Hypothesis, ...] = field(default_factory=tuple)
    refused: bool = False


def check_cuda_profiling(supported: Callable[[], Any] | None = None) -> None:
    import torch

    acts = (supported or torch.profiler.supported_activities)()
    if torch.profiler.ProfilerActivity.CUDA not in acts:
        raise BenchError("--gpu profiling was asked for, but this torch build cannot collect CUDA activity; "
                         "refusing to present a CPU-only trace as a GPU analysis")


def profile(scenario: str, fn: Callable[[], Any], cfg: ProfileConfig, setup: Callable[[], Any] | None = None) -> ProfileResult:
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile, schedule

    acts = [ProfilerActivity.CPU]
    if cfg.device == "cuda":
        check_cuda_profiling()
        acts.append(ProfilerActivity.CUDA)
    steps = cfg.wait + cfg.warmup + cfg.active
    _ACTIVE["on"] = True
    try:
        with tprofile(activities=acts, schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active),
                      record_shapes=cfg.record_shapes, profile_memory=cfg.profile_memory,
                      with_stack=cfg.with_stack) as prof:
            for _ in range(steps):
                if setup is not None:
                    setup()
                fn()
                prof.step()
        if cfg.device == "cuda":
            torch.cuda.synchronize()
    finally:
        _ACTIVE["on"] = False
    sort = "self_cuda_time_total" if cfg.device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=15)
    if cfg.profile_memory:
        table += "\n" + prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=10)
    doc = storage.profiler_json(prof.export_chrome_trace)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    facts, rows = analyze(events)
    clean, found = redact(doc)
    table, _ = redact(table, found)
    shown = tuple(Hypothesis(**d) for d in redact([r.to_dict() for r in rows], found)[0])
    if found and cfg.refuse_sensitive:
        return ProfileResult(scenario, None, describe(found) + " (refused: no trace written)", table, facts, shown,
                             refused=True)
    path = storage.write_trace(cfg.folder, scenario, clean, tensorboard=cfg.tensorboard)
    return ProfileResult(scenario, path, describe(found), table, facts, shown)
