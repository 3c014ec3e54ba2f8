"""From a profiler trace to hypotheses: observation -> hypothesis -> next check. Pure functions.

Works on Chrome-trace events (what torch.profiler exports). Every row carries the numbers it rests
on; none claims a cause or a speed-up. A figure the trace cannot give (no GPU events) is reported as
not observed, never as zero.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from bench_core.timing.flops import bound, leading_operator

STAGE_PREFIX = "stage::"
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


@dataclass(frozen=True)
class Hypothesis:
    rule: str
    observation: str
    hypothesis: str
    next_check: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TraceFacts:
    steps: int
    step_us: float | None                # mean wall time of a profiler step
    gpu_observed: bool
    gpu_busy_us: float | None            # per step; None when GPU activity was not observed
    stage_us: Mapping[str, float]        # per step, from stage:: labels
    notes: tuple[str, ...] = ()
    comm_us: float | None = None         # per step, collectives in flight (gloo's threads, NCCL kernels); None: none seen
    comm_overlap_us: float | None = None  # per step, the part of comm_us with computation running beside it
    kernel_us: float | None = None       # per step, the sum of the device's kernel durations (not their union, no
                                         # gaps, no copies): kernel time, beside event time and end-to-end time

    def to_dict(self) -> dict:
        return {**self.__dict__, "stage_us": dict(self.stage_us), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TraceFacts":
        return cls(**{**d, "stage_us": dict(d.get("stage_us") or {}), "notes": tuple(d.get("notes") or ())})


COMM_WORDS = ("all_reduce", "allreduce", "reduce_scatter", "all_gather", "allgather", "broadcast")


def _is_collective(e: Mapping) -> bool:
    """A collective's own span: gloo runs it on threads of its own (`gloo:all_reduce`); NCCL as device kernels."""
    name = str(e.get("name", "")).lower()
    if e.get("cat") == "kernel":
        return name.startswith("nccl")
    return name.startswith("gloo:") or name.startswith("nccl:") and e.get("cat") != "cpu_op"


def comm_facts(ev: Sequence[Mapping], steps: int) -> tuple[float | None, float | None]:
    """(collective time, the part of it with computation beside it), per step; (None, None) with no collective.

    Computation is the device's other kernels where the trace has them, else the operators of the thread that
    ran the profiler steps (on the CPU, autograd runs backward on the calling thread)."""
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if _is_collective(e)]
    if not comm:
        return None, None
    n = max(steps, 1)
    kernels = [e for e in ev if e.get("cat") == "kernel" and not _is_collective(e)]
    if kernels:
        busy = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    else:
        main = {e.get("tid") for e in ev if STEP_RE.match(str(e.get("name", "")))}
        busy = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "cpu_op" and e.get("tid") in main
                and str(e.get("name", "")).startswith("aten::")]
    merged = _merged(comm)
    return sum(e - s for s, e in merged) / n, _overlap_us(merged, busy) / n


def _merged(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def rank_hypotheses(by_rank: Sequence[TraceFacts], *, exposed_share: float = 0.2, wait_share: float = 0.1
                    ) -> list[Hypothesis]:
    """What the ranks' traces say together: communication the step does not hide, and a rank the others wait for.

    A collective finishes only when the last rank arrives, so the ranks that arrive first spend longer in it: the
    rank with the least time in collectives is the one the others wait for."""
    seen = [(r, f) for r, f in enumerate(by_rank) if f.comm_us is not None and f.step_us]
    if not seen:
        return []
    rows = []
    exposed = [(f.comm_us - (f.comm_overlap_us or 0.0), f) for _, f in seen]
    mean_exposed = sum(x for x, _ in exposed) / len(exposed)
    mean_step = sum(f.step_us for _, f in seen) / len(seen)
    mean_comm = sum(f.comm_us for _, f in seen) / len(seen)
    if mean_exposed / mean_step >= exposed_share:
        rows.append(Hypothesis(
            "comm_not_overlapped",
            f"collectives are in flight {mean_comm:.0f} us per step, {mean_exposed:.0f} us of it with no computation "
            f"beside them ({mean_exposed / mean_step:.0%} of the {mean_step:.0f} us step; mean over {len(seen)} ranks)",
            "communication not overlapped: gradients are reduced after backward instead of while it runs (buckets "
            "too large, the last bucket late, or a waiting peer)",
            "the exposed-communication column (step vs no_sync step), then bench.ab_distributed on bucket_cap_mb, "
            "gradient_as_bucket_view, static_graph or a compression hook"))
    (slow, fs), (waits, fw) = min(seen, key=lambda x: x[1].comm_us), max(seen, key=lambda x: x[1].comm_us)
    gap = fw.comm_us - fs.comm_us
    if slow != waits and gap >= wait_share * mean_step:
        rows.append(Hypothesis(
            "rank_waits",
            f"rank {waits} spends {fw.comm_us:.0f} us per step in collectives, rank {slow} {fs.comm_us:.0f} us: "
            f"rank {waits} waits {gap:.0f} us per step ({gap / mean_step:.0%} of the step)",
            f"rank {slow} arrives last at each collective: it is slower (more work, a slower device or host, "
            f"other processes) and the others wait for it",
            f"the straggler column (local step, per rank), then profile rank {slow}'s trace for where its step differs"))
    return rows


def _complete(events: Iterable[Mapping]) -> list[Mapping]:
    return [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]


def _union_us(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in _merged(intervals))


def _overlap_us(spans: Sequence[tuple[float, float]], busy: Sequence[tuple[float, float]]) -> float:
    """Time inside `spans` during which `busy` intervals run (busy merged first)."""
    merged, total = _merged(busy), 0.0
    for s, e in spans:
        for bs, be in merged:
            total += max(0.0, min(e, be) - max(s, bs))
    return total


def _launched_in_stage(ev: Sequence[Mapping], stage: str) -> set:
    """Correlation ids of the device work launched (on the CPU timeline) inside a `stage::` span."""
    spans = [(e.get("tid"), e["ts"], e["ts"] + e["dur"]) for e in ev
             if e.get("name") == f"{STAGE_PREFIX}{stage}" and e.get("cat") != "gpu_user_annotation"]
    out = set()
    for e in ev:
        if e.get("cat") == "cuda_runtime" and (e.get("args") or {}).get("correlation") is not None:
            if any(tid == e.get("tid") and s <= e["ts"] <= end for tid, s, end in spans):
                out.add(e["args"]["correlation"])
    return out


def facts(events: Iterable[Mapping]) -> TraceFacts:
    ev = _complete(events)
    # GPU traces carry a gpu_user_annotation copy of every ProfilerStep: counting both would halve every per-step figure
    steps = [e for e in ev if STEP_RE.match(str(e.get("name", ""))) and e.get("cat") != "gpu_user_annotation"]
    n = len(steps) or 1
    gpu = [e for e in ev if e.get("cat") in GPU_CATS]
    stage = defaultdict(float)
    for e in ev:
        name = str(e.get("name", ""))
        if name.startswith(STAGE_PREFIX) and e.get("cat") != "gpu_user_annotation":
            stage[name[len(STAGE_PREFIX):]] += e["dur"] / n
    notes = []
    if not steps:
        notes.append("no ProfilerStep markers: per-step figures are over the whole trace")
    if not gpu:
        notes.append("GPU activity not observed in this trace")
    comm, overlap = comm_facts(ev, len(steps))
    kernels = [e["dur"] for e in ev if e.get("cat") == "kernel"]
    return TraceFacts(
        comm_us=comm, comm_overlap_us=overlap, kernel_us=sum(kernels) / n if kernels else None,
        steps=len(steps),
        step_us=(sum(e["dur"] for e in steps) / len(steps)) if steps else None,
        gpu_observed=bool(gpu),
        gpu_busy_us=(_union_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu]) / n) if gpu else None,
        stage_us=dict(stage),
        notes=tuple(notes),
    )


def analyze(events: Sequence[Mapping], *, idle_fraction: float = 0.5, min_launches: int = 100,
            short_us: float = 10.0, dominant_share: float = 0.5,
            leading_share: float = 0.25) -> tuple[TraceFacts, list[Hypothesis]]:
    """What a trace shows, and the hypotheses its rules point at: the device idle while a batch is read, the
    same copy to the device every step, work fragmented into many short launches, one operator leading."""
    ev = _complete(events)
    f = facts(ev)
    n = max(f.steps, 1)
    rows = _input_bound(ev, f, n, idle_fraction) + _repeated_h2d(ev, f)
    rows += _fragmented(ev, n, min_launches, short_us) + _leading_operator(ev, f, n, dominant_share, leading_share)
    return f, rows


PREPARED = ("time the same compute on a batch already prepared on the device and compare it with this step; "
            "if the prepared one is much faster, the loader is the bottleneck (more workers, pinned memory)")
FUSE = "batch or fuse the work (fewer, larger operators; torch.compile), then bench.validate and bench.ab the change"


def _input_bound(ev, f: TraceFacts, n: int, idle_fraction: float) -> list[Hypothesis]:
    """The device idle while a batch is read (or, without GPU events, reading taking a fifth of the step)."""
    reads = [(e["ts"], e["ts"] + e["dur"]) for e in ev
             if e.get("name") == f"{STAGE_PREFIX}batch_read" and e.get("cat") != "gpu_user_annotation"]
    if not reads:
        return []
    read_us = sum(e - s for s, e in reads)
    if f.gpu_observed:
        busy = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in GPU_CATS]
        idle = read_us - _overlap_us(reads, busy)
        if read_us > 0 and idle / read_us >= idle_fraction:
            return [Hypothesis(
                "input_bound",
                f"the device is idle for {idle / n:.0f} us per step while a batch is read "
                f"({idle / read_us:.0%} of the {read_us / n:.0f} us batch read)",
                "the input pipeline cannot keep up with the device", PREPARED)]
    elif f.step_us and read_us / n / f.step_us >= 0.2:
        return [Hypothesis(
            "input_bound",
            f"reading a batch takes {read_us / n:.0f} us of a {f.step_us:.0f} us step "
            f"({read_us / n / f.step_us:.0%}); device idle time not observed (no GPU events)",
            "the input pipeline may be what the step waits for", PREPARED)]
    return []


def _repeated_h2d(ev, f: TraceFacts) -> list[Hypothesis]:
    """The same-sized host-to-device copy in every step (copying the batch in is the step's job, not a constant)."""
    h2d = Counter()
    batch_copies = _launched_in_stage(ev, "transfer")
    for e in ev:
        if e.get("cat") == "gpu_memcpy" and "HtoD" in str(e.get("name", "")) and \
                (e.get("args") or {}).get("correlation") not in batch_copies:
            h2d[(e.get("args") or {}).get("bytes")] += 1
    return [Hypothesis(
        "repeated_h2d", f"a {size}-byte host-to-device copy happens {count} times in {f.steps} steps",
        "a constant is re-created on the host and copied to the device every step",
        "create it once, outside the step, and check the change from a saved state: bench.validate, then bench.ab")
        for size, count in h2d.items() if size is not None and f.steps and count >= f.steps]


def _fragmented(ev, n: int, min_launches: int, short_us: float) -> list[Hypothesis]:
    """Many short kernels a step (or, without GPU events, many short top-level operators)."""
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    if kernels:
        per_step = len(kernels) / n
        short = sum(1 for e in kernels if e["dur"] < short_us)
        if per_step >= min_launches and short / len(kernels) >= 0.5:
            return [Hypothesis(
                "fragmented",
                f"{per_step:.0f} kernels per step, {short / len(kernels):.0%} of them shorter than {short_us:g} us",
                "the work is fragmented into many small launches", FUSE)]
        return []
    top = top_level([e for e in ev if e.get("cat") == "cpu_op"])
    per_step = len(top) / n
    if top and per_step >= min_launches and sum(1 for e in top if e["dur"] < short_us) / len(top) >= 0.5:
        return [Hypothesis(
            "fragmented",
            f"{per_step:.0f} top-level operators per step, most shorter than {short_us:g} us (GPU kernels not observed)",
            "the work is fragmented into many small operator calls", FUSE)]
    return []


def _leading_operator(ev, f: TraceFacts, n: int, dominant_share: float, leading_share: float) -> list[Hypothesis]:
    """One operator dominating, or leading by a clear share: named, with its share and its calls."""
    self_us = self_times(ev)
    total = sum(self_us.values())
    if total <= 0:
        return []
    ranked = sorted(self_us.items(), key=lambda kv: -kv[1])
    (name, t), second = ranked[0], (ranked[1] if len(ranked) > 1 else (None, 0.0))
    calls = sum(1 for e in ev if str(e.get("name")) == name and e.get("cat") in ("kernel", "cpu_op")) / n
    where = "device" if f.gpu_observed else "CPU"
    seen = f"{name} takes {t / total:.0%} of self {where} time ({t / n:.0f} us per step, {calls:.0f} calls per step"
    if t / total >= dominant_share:
        return [Hypothesis(
            "dominant_op", seen + ")", "this operator's shapes or algorithm decide the step's cost",
            f"time {name} alone on the same inputs (bench_core.measure), and compare alternatives with bench_core.ab")]
    if t / total >= leading_share and t >= 2 * second[1]:
        return [Hypothesis(
            "leading_op", seen + f"; the next, {second[0]}, {second[1] / total:.0%})",
            "the largest single cost: its shapes, dtype or layout are where a change pays most",
            f"time {name} alone on the same inputs (bench_core.measure) in other dtypes or layouts, then "
            "bench_core.ab on the step")]
    return []


def top_level(ops: Sequence[Mapping]) -> list[Mapping]:
    """Operators not nested inside another operator of the same thread (one pass over sorted events)."""
    out, ends = [], {}
    for e in sorted(ops, key=lambda e: (str(e.get("tid")), e["ts"], -e["dur"])):
        tid = str(e.get("tid"))
        if e["ts"] >= ends.get(tid, float("-inf")):
            out.append(e)
            ends[tid] = e["ts"] + e["dur"]
    return out


def self_times(ev: Sequence[Mapping]) -> dict[str, float]:
    """Self time per name: GPU kernels when observed (their duration), else CPU operators minus children."""
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    out: dict[str, float] = defaultdict(float)
    if kernels:
        for e in kernels:
            out[str(e["name"])] += e["dur"]
        return dict(out)
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op"), key=lambda e: (e.get("tid"), e["ts"], -e["dur"]))
    stack: list[tuple[float, Mapping]] = []
    for e in ops:
        while stack and (stack[-1][1].get("tid") != e.get("tid") or stack[-1][0] <= e["ts"]):
            stack.pop()
        out[str(e["name"])] += e["dur"]
        if stack:
            out[str(stack[-1][1]["name"])] -= e["dur"]
        stack.append((e["ts"] + e["dur"], e))
    return dict(out)


def roofline_hypotheses(work: Mapping[str, Any], step_s: float | None, peak: float | None,
                        bandwidth: float | None, *, compute_share: float = 0.5,
                        traffic_share: float = 0.3) -> list:
    """Diagnose rules from the counted work and the measured step: a step that sits under one roof of the
    roofline but far below it. Counted bytes assume no cache, so "below bandwidth" holds even for that
    upper bound of the traffic."""
    flops, moved = work.get("flops") or 0, work.get("bytes")
    if not step_s or step_s <= 0 or not moved:
        return []
    # Nothing counted (elementwise work has no formula) but bytes moved: only the memory roof can be judged.
    roof = bound(flops, moved, peak, bandwidth) or ("memory" if not flops and bandwidth else None)
    if roof is None:
        return []
    where = (f"{flops / moved:.3g} FLOP/byte, the ridge at {peak / bandwidth:.3g}" if flops else
             "no FLOPs counted, only bytes moved")
    lead = leading_operator(work)
    if roof == "compute" and flops / step_s / peak < compute_share:
        share = f"; {lead[0]} does {lead[1] / flops:.0%} of the FLOPs" if lead else ""
        return [Hypothesis(
            "below_compute_peak",
            f"compute-bound ({where}) but at {flops / step_s / peak:.0%} of the {peak / 1e12:.3g} TFLOP/s peak{share}",
            "the shapes or the dtype keep the math units off their peak (small or odd sizes, float32 where TF32 or "
            "bf16 would do), or time outside the math (Python, launches) fills the step",
            f"time {lead[0] if lead else 'the largest operator'} alone at the step's shapes, padded to multiples of "
            "64 and in other dtypes (bench_core.measure), then bench_core.ab on the step")]
    if roof == "memory" and moved / step_s / bandwidth < traffic_share:   # bandwidth is known on this path
        return [Hypothesis(
            "below_bandwidth",
            f"memory-bound ({where}) but moving {moved / step_s / bandwidth:.0%} of the {bandwidth / 1e9:.3g} GB/s "
            f"bandwidth, counting every byte as traffic",
            "the work is fragmented into many small operators, or overhead (Python, dispatch, launches) rather "
            "than data movement sets the step's time",
            "fuse or batch the elementwise work (torch.compile), then bench.validate and bench.ab the change")]
    return []
