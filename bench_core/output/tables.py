"""Tables for people of what was measured: the session table (with how GPU results were taken), counted work,
resources, work signatures, distributed ranks, a diagnose pass's hypotheses and a scenario's history. Each fits
WIDTH columns unless asked to be wide (`fitting`); comparisons and the Markdown report are `comparison_tables`'.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from tabulate import tabulate

from bench_core.core.records import Measurement
from bench_core.core.stats import clusters, per_second, summarize
from bench_core.output.fitting import NOT_OBSERVED, below, bytes_text, fit, flops_text, ms_text, rate_text

SESSION_HEADERS = ["scenario", "device", "threads", "timer", "mode", "cold start ms", "median ms", "IQR ms",
                   "min ms", "max ms", "n", "throughput", "window mem"]


NOISY_CV = 0.25   # samples spread more than this (coefficient of variation) are too noisy to read at a glance


def sample_shape(samples: Sequence[float], threads: int | None = None) -> str | None:
    """A warning, in words with the likely cause, when samples fall into separate clusters or spread widely.
    `threads`: the torch threads the samples ran on (more threads than free cores is a cause only above one)."""
    split = clusters(samples)
    if split is not None:
        (lo, n_lo), (hi, n_hi) = split
        cause = ("another process competing for the CPU or GPU (torch ran on one thread here)" if threads == 1 else
                 "another process competing for the CPU or GPU, or more threads than free cores (--bench-threads 1)")
        return (f"samples fall into two clusters, {n_lo} around {ms_text(lo)} ms and {n_hi} around {ms_text(hi)} ms "
                f"({hi / lo:.1f}x): likely {cause}; the median is one cluster's, not the code's")
    s = summarize(samples)
    if s.n >= 5 and s.cv is not None and s.cv > NOISY_CV:
        own = "" if threads == 1 else ", the step's own threads (--bench-threads 1 tells)"
        return (f"samples vary widely (CV {s.cv:.0%}, min {ms_text(s.min)} ms, max {ms_text(s.max)} ms): why is not "
                f"known from this run (a busy machine, frequency scaling, a cold cache{own} can each do it)")
    return None


def session_rows(results: Sequence[Measurement], shapes: Sequence[str | None] | None = None) -> list[list[str]]:
    """`shapes`: each result's `sample_shape`, when the caller has them already."""
    shapes = [sample_shape(m.primary_ms, m.threads) for m in results] if shapes is None else shapes
    rows = []
    for m, shape in zip(results, shapes):
        s = m.summary
        cold = m.cold_start.first_call_gpu_ms if m.gpu_ms is not None else m.cold_start.first_call_ms
        cold_txt = ms_text(cold)
        if m.cold_start.load_ms is not None:
            cold_txt += f" (+load {ms_text(m.cold_start.load_ms)})"
        mode = m.mode if m.mode == "per_call" else f"block x{m.block_size}"
        name = m.name + (" (!)" if shape else "")   # the warning is on the row; its words are under the table
        rows.append([name, m.device, "-" if m.threads is None else m.threads, m.timer, mode, cold_txt,
                     ms_text(s.median), ms_text(s.iqr), ms_text(s.min), ms_text(s.max), s.n, rate_text(m.throughput),
                     bytes_text(m.memory.window_peak_bytes)])
        if m.gpu_ms is not None:  # the end-to-end figure, on its own row: never mixed with GPU time
            h = m.host_summary
            rows.append(["  (end-to-end)", m.device, "-" if m.threads is None else m.threads, "host+sync", mode,
                         ms_text(m.cold_start.first_call_ms),
                         ms_text(h.median), ms_text(h.iqr), ms_text(h.min), ms_text(h.max), h.n, "", ""])
    return rows


def session_table(results: Sequence[Measurement], errors: Sequence[tuple[str, str]] = (), fmt: str = "simple",
                  wide: bool = False) -> str:
    shapes = [sample_shape(m.primary_ms, m.threads) for m in results]
    out = fit(SESSION_HEADERS, session_rows(results, shapes), wide=wide, fmt=fmt,
              foldable=("device", "threads", "timer", "mode", "n", "throughput", "window mem"),
              droppable=("IQR ms", "window mem", "throughput", "min ms"))
    out += below([f"{m.name} (!): {shape}" for m, shape in zip(results, shapes) if shape], wide)
    out += below([f"{m.name}: the GPU during its window: {'; '.join(m.telemetry['flags'])}"
                  for m in results if m.telemetry is not None and m.telemetry["flags"]], wide)
    out += below(gpu_timing_lines(results), wide)
    out += below([f"{m.name}: its cold start {ms_text(m.cold_start.first_call_ms)} held torch.compile's tracing "
                  f"{ms_text(m.cold_start.tracing_ms)} and compilation {ms_text(m.cold_start.compiling_ms)} "
                  f"(end-to-end)"
                  for m in results if m.cold_start.tracing_ms is not None], wide)
    if errors:
        out += "\n\nfailed scenarios:" + below([f"  {n}: {p}" for n, p in errors], wide)
    return out


def gpu_timing_lines(results: Sequence[Measurement]) -> list[str]:
    """How GPU results were taken, where it was more than plain: the cache state (and the flush's self-check), the
    CUDA graph with launch overhead, the samples set aside as throttled; and whether clocks were locked."""
    out, seen = [], []
    for m in results:
        if "gpu_modes" in m.scenario.metadata:   # declared, and said where they were not applied
            out.append(f"{m.name}: GPU timing modes {m.scenario.metadata['gpu_modes']}")
        g = m.gpu_timing or {}
        if g.get("cache"):
            c = g["cache"]
            text = (f"{m.name}: cache cold: L2 flushed before every sample ({bytes_text(c['flush_bytes'])} written "
                    f"outside the window)" if c["state"] == "cold" else
                    f"{m.name}: cache hot: samples back to back, each finding what the one before left in L2")
            check = c.get("check")
            if check:
                pairs = ("" if "colder_pairs" not in check else   # records before the pairs: medians of 10
                         f" (the fastest of {check['samples']} cold-hot pairs; cold the slower in "
                         f"{check['colder_pairs']})")
                text += (f"; self-check on an L2-sized probe: {check['cold_ms'] * 1e3:.1f} us cold, "
                         f"{check['hot_ms'] * 1e3:.1f} us hot{pairs}" +
                         ("" if check["colder"] else " - NOT colder: the flush did not leave the cache cold on this "
                                                     "device or driver; 'cold' may be warm"))
            out.append(text)
        if g.get("graph"):
            gr = g["graph"]
            out.append(f"{m.name}: CUDA graph, {gr['replays_per_sample']} replays per sample: GPU time per step "
                       f"{ms_text(gr['graph_gpu_median_ms'])} replayed, {ms_text(gr['eager_gpu_median_ms'])} eager; "
                       f"launch overhead {ms_text(gr['launch_overhead_ms'])} per step (eager minus graph); "
                       f"replay {gr['output']}")
        clocks = g.get("clocks")
        if clocks:
            seen += [x for x in clocks["sm_mhz"] if x]
            flagged, n = clocks["flagged"], len(clocks["sm_mhz"])
            why = "; ".join(sorted(set(flagged.values())))
            if flagged and clocks["decided_on"] == "unthrottled":
                out.append(f"{m.name}: {len(flagged)} of {n} samples taken while the GPU was throttled ({why}): set "
                           f"aside, decided on the other {n - len(flagged)}")
            elif flagged:
                out.append(f"{m.name} (marked): {m.throttle_mark} ({why}); decided on all {n}")
    if seen:
        locked = all((m.gpu_timing or {}).get("clocks", {}).get("locked") for m in results
                     if (m.gpu_timing or {}).get("clocks"))
        spread = f"{min(seen)} MHz" if min(seen) == max(seen) else f"{min(seen)}-{max(seen)} MHz"
        out.append(f"GPU SM clock over every sample: {spread}; " + (
            "locked (NVML: applications clocks setting)" if locked else
            "not locked (bench_core never changes clocks: sudo nvidia-smi --lock-gpu-clocks=<MHz> locks them)"))
    return out


def work_table(results: Sequence[Measurement], peak_of, wide: bool = False, bandwidth_of=lambda m: None) -> str:
    """Counted FLOPs per step, achieved FLOP/s at the median, the share of the peak (`peak_of(m)`, FLOP/s or
    None), the arithmetic intensity and the roof it sits under (`bandwidth_of(m)`, bytes/s or None), the
    leading operator, and what was not counted."""
    from bench_core.timing.flops import bound, leading_operator
    rows, notes = [], []
    for m in results:
        if m.work is None:
            rows.append([m.name, "not counted", "-", "-", "-", "-"])
            continue
        lead = leading_operator(m.work)
        moved = m.work.get("bytes")
        intensity = "-" if not moved or not m.work["flops"] else f"{m.work['flops'] / moved:.3g}"
        peak = peak_of(m)
        roof = bound(m.work["flops"], moved, peak, bandwidth_of(m))
        intensity += "" if roof is None else f" ({roof}-bound)"
        if m.work["flops"] == 0:   # nothing with a formula ran: none counted, which is not zero work
            rows.append([m.name, "none counted", "-", "-", intensity, "-"])
        else:
            rate = m.flops_per_s
            share = "-" if rate is None or not peak else f"{rate / peak:.1%} of {flops_text(peak, per_s=True)}"
            rows.append([m.name, flops_text(m.work["flops"]), flops_text(rate, per_s=True), share, intensity,
                         "-" if lead is None else f"{lead[0]} {lead[1] / m.work['flops']:.0%}"])
        missing = m.work.get("not_counted") or {}
        if missing:
            notes.append(f"{m.name}: not counted (no FLOP formula in torch): "
                         + ", ".join(f"{op} x{n}" for op, n in list(missing.items())[:8])
                         + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    body = fit(["scenario", "FLOPs per step", "achieved", "of peak", "FLOP/byte", "largest counted"], rows, wide=wide)
    foot = ["counted once after the timed window with torch's FLOP counter (matmuls, convolutions, attention); "
            "elementwise work has no formula and is listed as not counted, never as zero. FLOP/byte: counted FLOPs "
            "over the bytes every data-moving operator read and wrote, with no cache between; compute- or "
            "memory-bound against the roofline's ridge, peak FLOP/s over memory bandwidth (a known GPU's, or on the "
            "CPU a 64 MiB copy timed once)"] + notes
    return body + below(foot, wide)


RESOURCE_HEADERS = ["scenario", "peak device mem", "window mem", "throughput", "host-to-device", "waiting for data"]


def resource_rows(results: Sequence[Measurement], data_wait: dict[str, float] | None = None) -> list[list[str]]:
    """What each scenario needed, from what was measured. `data_wait`: the share of a step spent reading a
    batch, by scenario, from a diagnose pass (it is not in the measurement itself)."""
    rows = []
    for m in results:
        shapes = m.scenario.metadata.get("shapes")
        copied = shapes.get("bytes") if isinstance(shapes, Mapping) else None
        h2d = NOT_OBSERVED
        rate = per_second(copied, m.summary.median) if isinstance(copied, int) else None
        if "transfer" in m.scenario.window and rate is not None:
            h2d = f"{rate / 1e9:.2f} GB/s"
        wait = (data_wait or {}).get(m.name)
        rows.append([m.name, bytes_text(m.memory.peak_allocated_bytes), bytes_text(m.memory.window_peak_bytes),
                     rate_text(m.throughput), h2d, NOT_OBSERVED if wait is None else f"{wait:.0%}"])
    return rows


def resource_table(results: Sequence[Measurement], environment: Mapping, data_wait: dict[str, float] | None = None,
                   wide: bool = False) -> str:
    where = environment.get("gpu_name") or environment.get("cpu_model") or "this machine"
    body = fit(RESOURCE_HEADERS, resource_rows(results, data_wait), wide=wide)
    caveat = (f"measured on this machine ({where}); a local run does not prove a rented server's host CPU, disk or "
              f"network. Waiting for data comes from a diagnose pass (--bench-profile); n/o: not observed")
    return body + below([caveat], wide)


RANKS_HEADERS = ["scenario", "ranks", "step ms (slowest rank)", "per rank: median ms", "straggler",
                 "exposed communication", "scaling", "replicas"]


def ranks_rows(results: Sequence[Measurement]) -> list[list[str]]:
    from bench_core.core.ranks import exposure, rank_rows, scaling_efficiency, straggler

    rows = []
    for m in results:
        rs = m.ranks
        if rs is None:
            continue
        per = ", ".join(f"{r}: {ms_text(med)}" + ("" if loc is None else f" ({ms_text(loc)} local)")
                        for r, _, med, _, loc in rank_rows(rs))
        st = straggler(rs)
        if st is None:
            strag = "-"
        else:
            how = f"{st.excess:+.1%} [{st.ci_low:+.1%}, {st.ci_high:+.1%}]"
            at = rs.where(st.rank)
            strag = (f"rank {st.rank}{at} {how}" if st.named else f"none (slowest: rank {st.rank}{at} {how})") + \
                f" ({st.figure}, p={st.p_value:.2g})"
        ex = exposure(rs)
        if ex is None:
            exposed = NOT_OBSERVED
        else:
            lo, hi = ex.interval_ms
            exposed = f"{ms_text(ex.exposed_ms)} ms [{ms_text(lo)}, {ms_text(hi)}] ({ex.share:.0%} of the step)"
        eff = scaling_efficiency(rs)
        scaling = NOT_OBSERVED if eff is None else f"{eff:.0%} (1 rank: {ms_text(float(np.median(rs.one_rank_ms)))} ms)"
        rep = NOT_OBSERVED if rs.replicas_max_abs_diff is None else (
            "identical" if rs.replicas_max_abs_diff == 0 else f"differ by {rs.replicas_max_abs_diff:.3g}")
        if rs.reference is not None:
            rep += "; reference " + ("ok" if rs.reference.get("ok") else "MISMATCH") + \
                f" ({rs.reference.get('steps')} steps)"
        hosts = f" on {rs.nnodes} hosts" if rs.nnodes > 1 else ""
        rows.append([m.name, f"{rs.world_size} {rs.backend}{hosts}", ms_text(m.summary.median), per, strag, exposed,
                     scaling, rep])
    return rows


def ranks_table(results: Sequence[Measurement], wide: bool = False) -> str:
    """Distributed scenarios: the slowest rank per step, each rank, the straggler, exposed communication."""
    from bench_core.core.ranks import STRAGGLER_ALPHA, STRAGGLER_EXCESS

    out = fit(RANKS_HEADERS, ranks_rows(results), wide=wide, droppable=("scaling", "per rank: median ms"))
    return out + below([
        "step ms: median over steps of the slowest rank's time for each step (steps aligned by index, a barrier "
        "before each window, none inside); local: the same step with gradient sync off, interleaved with it",
        "exposed communication: step over local step, paired by index (Hodges-Lehmann, 95% interval)",
        f"straggler: the slowest rank against the others' median at each step (paired, 95% interval), named when the "
        f"whole interval is beyond +{STRAGGLER_EXCESS:.0%} and p < {STRAGGLER_ALPHA} (p times the world size); judged "
        f"on the local step where it was measured, since a synchronised fast rank waits for the slow one and reports "
        f"its time. One launch's straggler may be one process's bias (several percent on a shared CPU): a slow host "
        f"or device is slow in every launch", "scaling: weak (same batch per rank), median at 1 rank over at N"],
        wide)


def hypotheses_table(rows: Sequence, f, fmt: str = "simple", measured: Measurement | None = None) -> str:
    """A diagnose pass's hypotheses (observation, hypothesis, next check) under what its trace measured (`f`);
    with the scenario's result (`measured`), the three step times side by side, each named, never mixed."""
    head = (f"{f.steps} profiled steps; step {f.step_us:.0f} us" if f.step_us else f"{f.steps} profiled steps")
    head += "; GPU busy " + (f"{f.gpu_busy_us:.0f} us/step" if f.gpu_busy_us is not None else "not observed")
    if f.kernel_us is not None or (measured is not None and measured.gpu_ms is not None):
        event = "not observed" if measured is None or measured.gpu_ms is None else \
            f"{measured.gpu_summary.median * 1e3:.0f} us (CUDA events around the step, the result's median)"
        e2e = "not observed" if measured is None else \
            f"{measured.host_summary.median * 1e3:.0f} us (host clock after synchronizing, the result's median)"
        kernel = "not observed" if f.kernel_us is None else \
            f"{f.kernel_us:.0f} us (the sum of its kernels' durations in this trace, profiled)"
        head += f"\nstep time, three figures: kernel time {kernel}; event time {event}; end-to-end {e2e}"
    if f.comm_us is not None:
        head += f"; collectives {f.comm_us:.0f} us/step, {f.comm_overlap_us or 0.0:.0f} us of it beside computation"
    if f.stage_us:
        head += "; stages (us/step): " + ", ".join(f"{k} {v:.0f}" for k, v in f.stage_us.items())
    if not rows:
        return head + "\nno rule matched: nothing in this trace points at a hypothesis"
    return head + "\n" + tabulate([[r.observation, r.hypothesis, r.next_check] for r in rows],
                                  headers=["observation", "hypothesis", "next check"], tablefmt=fmt,
                                  maxcolwidths=[50, 34, 50])


def history_table(history, wide: bool = False, scenario: str | None = None) -> str:
    """One machine's runs of a scenario, oldest first, and its change points under them (with the bisection that
    decides each one's range, where `scenario` is named)."""
    starts = {c.point.index: c for c in history.changes}
    rows = []
    for i, p in enumerate(history.points):
        mark = f"<- {starts[i].point.ratio:.3f}x" if i in starts else ""
        rows.append([i + 1, p.created[:19], (p.commit or "-")[:12] + ("+" if p.dirty else ""), p.branch or "-",
                     ms_text(p.median_ms), p.n, mark])
    out = fit(["run", "created", "commit", "branch", "median ms", "n", "change"], rows, wide=wide,
              foldable=("branch", "n"), droppable=())
    lines = []
    for c in history.changes:
        lines.append(f"change point at {c.runs}, commits {c.commits}: {c.point.ratio:.3f}x "
                     f"[{c.point.ci_low:.3f}, {c.point.ci_high:.3f}] ({c.point.confidence:.0%}), permutation "
                     f"p={c.point.p_value:.3g}, {c.point.before} runs before and {c.point.after} after in its segment")
        command = None if scenario is None else c.bisect(scenario)
        if command:
            lines.append(f"  which commit: {command} -- <your pytest arguments>")
    lines = lines or [f"no change point in {len(history.points)} runs (the search needs at least 6)"
                      if len(history.points) < 6 else f"no change point in {len(history.points)} runs"]
    return out + below(lines, wide)


def signature_table(results: Sequence[Measurement], wide: bool = False) -> str:
    """Each counted work signature in one row: what one step does (operators, host reads that synchronize,
    copies, allocations, torch.compile's graphs, breaks and recompilations, host instructions where counted)."""
    def mb(n: int) -> str:
        return f"{n / 2 ** 20:.2f} MB" if n >= 2 ** 20 else f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} B"
    rows = []
    for m in results:
        s = m.signature
        if s is None:
            continue
        rows.append([m.name, s.total("operators"), s.total("syncs"),
                     f"{s.total('copies')} ({mb(sum(s.copy_bytes.values()))})",
                     f"{s.allocations} ({mb(s.allocated_bytes)})", s.graphs,
                     NOT_OBSERVED if s.graph_breaks is None else s.graph_breaks, s.recompiles,
                     NOT_OBSERVED if s.instructions is None else f"{s.instructions:,}"])
    return fit(["scenario", "operators", "syncs", "copies", "allocations", "graphs", "breaks", "recompiles",
                "instructions"], rows, wide=wide, foldable=("graphs", "breaks", "recompiles"),
               droppable=("instructions",)) + below(["per step, counted once after the window, exactly; n/o: not "
                                                      "counted (instructions: --bench-instructions)"], wide)
