"""Diagnose mode: one profiler pass per scenario, after its measurement and never inside it.

Profiled timings never enter results or baselines. The trace is scanned for sensitive strings and
redacted (or refused) before it is written, under a new name, and analysed into hypotheses.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from bench_core.files import artifacts
from bench_core.core.errors import BenchError
from bench_core.core.redact import describe, redact
from bench_core.workflows.diagnose.trace_analysis import STAGE_PREFIX, Hypothesis, TraceFacts, analyze

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
    with_flops: bool = False         # the profiler's own FLOP estimates (matmuls, 2D convolutions)
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


def operator_table(averages, kind: str, found, rows: int = 15) -> str:
    """The profiler's per-operator averages as a table, by self device time on CUDA, self CPU time on the CPU,
    or self CPU memory. Built here rather than by torch's `table()`, which shortens names first: a secret
    cut in half no longer looks like one, and would be shown. Names are redacted, then shortened."""
    from tabulate import tabulate

    key = {"cuda": "self_device_time_total", "memory": "self_cpu_memory_usage",
           "flops": "flops"}.get(kind, "self_cpu_time_total")
    total_cpu = sum(getattr(a, "self_cpu_time_total", 0.0) for a in averages) or 1.0
    out = []
    for a in sorted(averages, key=lambda a: getattr(a, key, 0) or 0, reverse=True)[:rows]:
        label = redact(a.key, found)[0]
        label = label if len(label) <= 60 else label[:57] + "..."
        row = [label, f"{a.self_cpu_time_total / total_cpu:.1%}", f"{a.self_cpu_time_total:.1f}",
               f"{a.cpu_time_total:.1f}", a.count]
        if kind == "cuda":
            row += [f"{a.self_device_time_total:.1f}", f"{a.device_time_total:.1f}"]
        if kind == "memory":
            row += [f"{a.self_cpu_memory_usage / 1024:.1f}"]
        if kind == "flops":   # the profiler's estimate, over every profiled call; "-" where it has none
            flops = getattr(a, "flops", 0) or 0
            row += [f"{flops / 1e6:.3g}" if flops else "-",
                    f"{flops / (a.cpu_time_total * 1e3):.3g}" if flops and a.cpu_time_total else "-"]
        out.append(row)
    if kind == "flops":
        out = [r for r in out if r[-2] != "-"] or [["(no operator with a FLOP estimate)", "", "", "", "", "", ""]]
    headers = ["operator", "self CPU %", "self CPU us", "CPU total us", "calls"]
    headers += {"cuda": ["self device us", "device total us"], "memory": ["self CPU KiB"],
                "flops": ["MFLOP (estimate)", "GFLOP/s of CPU total"]}.get(kind, [])
    return (tabulate(out, headers=headers, disable_numparse=True) +
            f"\nSelf CPU time total: {total_cpu / 1000:.3f} ms")


MATH_OPS = ("mm", "matmul", "conv", "linear", "attention", "einsum")


def operator_below_peak(averages, device: str, peak: float | None, share: float = 0.5) -> list[Hypothesis]:
    """The operator with the most FLOPs (the profiler's estimate) reaching less than `share` of the peak in its
    profiled time, children included: its shapes or dtype, more than the rest of the step, are what to change."""
    # Total, not self, time: the profiler puts the FLOPs on the top operator (aten::conv2d) while its kernels
    # run in children (mkldnn_convolution, the device's kernels).
    key = "device_time_total" if device == "cuda" else "cpu_time_total"
    # Only the math the peak is quoted for: elementwise operators are judged by bandwidth, not by FLOP/s.
    ranked = [a for a in averages if (getattr(a, "flops", 0) or 0) > 0 and (getattr(a, key, 0) or 0) > 0
              and any(k in str(a.key) for k in MATH_OPS)]
    if not peak or not ranked:
        return []
    top = max(ranked, key=lambda a: a.flops)
    rate = top.flops / (getattr(top, key) * 1e-6)
    if rate / peak >= share:
        return []
    return [Hypothesis(
        "op_below_peak",
        f"{top.key}, the operator with the most FLOPs ({top.flops / 1e9:.3g} GFLOP in {top.count} profiled calls), "
        f"reaches {rate / 1e12:.3g} TFLOP/s: {rate / peak:.1%} of the {peak / 1e12:.3g} TFLOP/s peak "
        f"(profiled time, which the profiler inflates a little)",
        "its shapes or dtype keep it off the peak: small or odd sizes, a transposed or non-contiguous operand, "
        "float32 where TF32 or bf16 would do",
        f"time {top.key} alone at these shapes, padded to multiples of 64 and in other dtypes (bench_core.measure), "
        "then bench_core.ab on the step")]


def profile(scenario: str, fn: Callable[[], Any], cfg: ProfileConfig, setup: Callable[[], Any] | None = None,
            *, peak_flops: float | None = None, extra: tuple[Hypothesis, ...] = ()) -> ProfileResult:
    """One profiled pass of the step. `peak_flops` lets the FLOP rules judge utilization (with `with_flops`);
    `extra` are hypotheses found outside the trace (the counted work's roofline), reported with its own."""
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
                      record_shapes=cfg.record_shapes or cfg.with_flops, profile_memory=cfg.profile_memory,
                      with_stack=cfg.with_stack, with_flops=cfg.with_flops) as prof:
            for _ in range(steps):
                if setup is not None:
                    setup()
                fn()
                prof.step()
        if cfg.device == "cuda":
            torch.cuda.synchronize()
    finally:
        _ACTIVE["on"] = False
    averages = list(prof.key_averages())
    doc = artifacts.profiler_json(prof.export_chrome_trace)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    facts, rows = analyze(events)
    rows = [*extra, *rows, *(operator_below_peak(averages, cfg.device, peak_flops) if cfg.with_flops else [])]
    # Everything this pass shows or writes goes through redaction: the trace (its metadata included), the
    # operator table, the hypotheses, the stage names in the facts, and the scenario name that titles the
    # report and names the file.
    clean, found = redact(doc)
    name, _ = redact(scenario, found)
    table = operator_table(averages, cfg.device, found)
    if cfg.profile_memory:
        table += "\n" + operator_table(averages, "memory", found)
    if cfg.with_flops:
        table += "\n" + operator_table(averages, "flops", found)
    shown = tuple(Hypothesis(**d) for d in redact([r.to_dict() for r in rows], found)[0])
    facts = replace(facts, stage_us={redact(k, found)[0]: v for k, v in facts.stage_us.items()},
                    notes=tuple(redact(list(facts.notes), found)[0]))
    if found and cfg.refuse_sensitive:  # a refusal refuses everywhere: no file, and nothing of the trace shown
        return ProfileResult(name, None, describe(found) + " (refused: no trace written, nothing of it shown)",
                             "(refused)", replace(facts, stage_us={}, notes=()), (), refused=True)
    path = artifacts.write_trace(cfg.folder, name, clean, tensorboard=cfg.tensorboard)
    artifacts.write_hypotheses(path, {"scenario": name, "trace": path.name, "redaction": describe(found),
                                      "facts": facts.to_dict(), "hypotheses": [h.to_dict() for h in shown]})
    return ProfileResult(name, path, describe(found), table, facts, shown)
