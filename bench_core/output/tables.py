"""Tables for people: the session table and the comparison table (tabulate).

Every table fits WIDTH columns unless asked to be wide: a column whose value is the same on every row is
said once under the table instead, the columns that matter least go next (and the table says which),
and prose lines wrap.
"""
from __future__ import annotations

import math
import textwrap
from typing import Mapping, Sequence

import numpy as np
from tabulate import tabulate

from bench_core.deciding.gate import Comparison, level_text
from bench_core.core.records import Measurement
from bench_core.core.stats import clusters, per_second, summarize

NOT_OBSERVED = "n/o"  # not observed is not zero
WIDTH = 120           # terminals, CI logs and pull-request comments wrap beyond this


def fit(headers: Sequence[str], rows: Sequence[Sequence], *, wide: bool = False, droppable: Sequence[str] = (),
        foldable: Sequence[str] = (), fmt: str = "simple", width: int = WIDTH) -> str:
    """A tabulate table within `width` columns (or whole, when `wide`). `foldable` columns (descriptions,
    never the figures) with one value on every row become a line under the table; then the `droppable`
    columns go, in order, until it fits."""
    headers, rows = list(headers), [list(r) for r in rows]
    limits: dict[str, int] = {}   # columns wrapped to this many characters, the last resort

    def render():
        widths = [limits.get(h) for h in headers] if limits else None
        return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True, maxcolwidths=widths)
    text = render()
    if wide or not rows or max(map(len, text.splitlines())) <= width:
        return text
    def remove(h):
        i = headers.index(h)
        headers.pop(i)
        for r in rows:
            r.pop(i)
    same = [h for i, h in enumerate(headers) if h in foldable and len({str(r[i]) for r in rows}) == 1]
    said = [f"{h}: {rows[0][headers.index(h)]}" for h in same]
    for h in same:
        remove(h)
    left_out = []
    for h in droppable:
        if max(map(len, render().splitlines())) <= width:
            break
        if h in headers:
            remove(h)
            left_out.append(h)
    text = render()
    # the first column is the name a reader looks for (and copies into -k): it wraps only when longer than half
    # the table, which no real name is
    named = max([len(str(r[0])) for r in rows] + [0]) <= width // 2
    for _ in range(3):   # still too wide: the widest columns wrap their text, down to one level for all of them
        over = max(map(len, text.splitlines())) - width
        if over <= 0:
            break
        cols = {h: limits.get(h) or max([len(str(h))] + [len(x) for r in rows for x in str(r[i]).splitlines()])
                for i, h in enumerate(headers) if i > 0 or not named}
        if not cols:
            break
        level = max(cols.values())
        while level > 12 and sum(max(0, c - level) for c in cols.values()) < over:
            level -= 1
        limits.update({h: level for h, c in cols.items() if c > level})
        text = render()
    foot = ([f"every row: {', '.join(said)}"] if said else []) + (
        [f"left out to fit {width} columns: {', '.join(left_out)} (wide tables show them)"] if left_out else [])
    return text + "".join(f"\n{wrap(line, width)}" for line in foot)   # width may differ from WIDTH


def wrap(line: str, width: int = WIDTH) -> str:
    """Prose within `width` columns; continuation lines indented."""
    return textwrap.fill(line, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


def below(lines: Sequence[str], wide: bool = False) -> str:
    """Prose lines to follow a table, each on its own line: wrapped to WIDTH unless the tables are wide."""
    return "".join(f"\n{line if wide else wrap(line)}" for line in lines)


def _ms(v: float | None) -> str:
    if v is None:
        return NOT_OBSERVED
    if v >= 100:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.3f}"
    return f"{v:.4f}"


def _bytes(v: int | None) -> str:
    if v is None:
        return NOT_OBSERVED
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(v)  # pragma: no cover


def _rate(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}/s" if v >= 100 else f"{v:.2f}/s"


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
        return (f"samples fall into two clusters, {n_lo} around {_ms(lo)} ms and {n_hi} around {_ms(hi)} ms "
                f"({hi / lo:.1f}x): likely {cause}; the median is one cluster's, not the code's")
    s = summarize(samples)
    if s.n >= 5 and s.cv is not None and s.cv > NOISY_CV:
        return (f"samples vary widely (CV {s.cv:.0%}, min {_ms(s.min)} ms, max {_ms(s.max)} ms): likely a busy "
                f"machine, frequency scaling or a cold cache; more repeats or a quieter runner")
    return None


def session_rows(results: Sequence[Measurement], shapes: Sequence[str | None] | None = None) -> list[list[str]]:
    """`shapes`: each result's `sample_shape`, when the caller has them already."""
    shapes = [sample_shape(m.primary_ms, m.threads) for m in results] if shapes is None else shapes
    rows = []
    for m, shape in zip(results, shapes):
        s = m.summary
        cold = m.cold_start.first_call_gpu_ms if m.gpu_ms is not None else m.cold_start.first_call_ms
        cold_txt = _ms(cold)
        if m.cold_start.load_ms is not None:
            cold_txt += f" (+load {_ms(m.cold_start.load_ms)})"
        mode = m.mode if m.mode == "per_call" else f"block x{m.block_size}"
        name = m.name + (" (!)" if shape else "")   # the warning is on the row; its words are under the table
        rows.append([name, m.device, "-" if m.threads is None else m.threads, m.timer, mode, cold_txt, _ms(s.median),
                     _ms(s.iqr), _ms(s.min), _ms(s.max), s.n, _rate(m.throughput), _bytes(m.memory.window_peak_bytes)])
        if m.gpu_ms is not None:  # the end-to-end figure, on its own row: never mixed with GPU time
            h = m.host_summary
            rows.append(["  (end-to-end)", m.device, "-" if m.threads is None else m.threads, "host+sync", mode,
                         _ms(m.cold_start.first_call_ms),
                         _ms(h.median), _ms(h.iqr), _ms(h.min), _ms(h.max), h.n, "", ""])
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
    out += below([f"{m.name}: its cold start {_ms(m.cold_start.first_call_ms)} held torch.compile's tracing "
                  f"{_ms(m.cold_start.tracing_ms)} and compilation {_ms(m.cold_start.compiling_ms)} (end-to-end)"
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
            text = (f"{m.name}: cache cold: L2 flushed before every sample ({_bytes(c['flush_bytes'])} written outside "
                    f"the window)" if c["state"] == "cold" else
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
                       f"{_ms(gr['graph_gpu_median_ms'])} replayed, {_ms(gr['eager_gpu_median_ms'])} eager; launch "
                       f"overhead {_ms(gr['launch_overhead_ms'])} per step (eager minus graph); replay {gr['output']}")
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


def _flops(v: float | None, per_s: bool = False) -> str:
    if v is None:
        return NOT_OBSERVED
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}FLOP{'/s' if per_s else ''}"
    return f"{v:.0f} FLOP{'/s' if per_s else ''}"


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
            share = "-" if rate is None or not peak else f"{rate / peak:.1%} of {_flops(peak, per_s=True)}"
            rows.append([m.name, _flops(m.work["flops"]), _flops(rate, per_s=True), share, intensity,
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
        rows.append([m.name, _bytes(m.memory.peak_allocated_bytes), _bytes(m.memory.window_peak_bytes),
                     _rate(m.throughput), h2d, NOT_OBSERVED if wait is None else f"{wait:.0%}"])
    return rows


def resource_table(results: Sequence[Measurement], environment: Mapping, data_wait: dict[str, float] | None = None,
                   wide: bool = False) -> str:
    where = environment.get("gpu_name") or environment.get("cpu_model") or "this machine"
    body = fit(RESOURCE_HEADERS, resource_rows(results, data_wait), wide=wide)
    caveat = (f"measured on this machine ({where}); a local run does not prove a rented server's host CPU, disk or "
              f"network. Waiting for data comes from a diagnose pass (--bench-profile); n/o: not observed")
    return body + below([caveat], wide)


COMPARE_HEADERS = ["scenario", "baseline ms", "current ms", "ratio", "interval (level)", "p (adj)",
                   "runs b/c (b spread)", "verdict"]
COMPARE_DROPPABLE = ("p (adj)", "baseline ms", "current ms")


def comparison_row(c: Comparison) -> list[str]:
    def num(v, f):
        return "-" if v is None else format(v, f)

    ci = "-" if c.ci_low is None else f"[{c.ci_low:.3g}, {c.ci_high:.3g}] ({level_text(c.confidence)})"
    p = "-" if c.p_value is None else f"{c.p_value:.2g} ({c.p_adjusted:.2g})"
    # the baseline's own run-to-run spread, measured: how much one run of it may be trusted
    spread = "" if c.baseline_spread is None else f" ({math.expm1(c.baseline_spread):.1%})"
    return [c.name, num(c.baseline_median, ".4g"), num(c.candidate_median, ".4g"), num(c.ratio, ".3f"), ci, p,
            f"{c.baseline_runs}/{c.candidate_runs}{spread}", c.verdict]


def comparison_notes(comparisons: Sequence[Comparison]) -> list[str]:
    """What each comparison says beside its verdict: its warnings, and each side's achieved FLOP/s where both
    were counted. The terminal and the Markdown report show the same lines."""
    out = [f"{c.name}: warning: {n}" for c in comparisons for n in c.notes]
    out += [f"{c.name}: work signature: {f}" for c in comparisons for f in c.facts]
    out += [f"{c.name}: FAILS, grew (--bench-no-growth): {g}" for c in comparisons for g in c.grown]
    out += [f"{c.name}: time moved (profiler passes after measuring, a hypothesis): {t}" for c in comparisons
            for t in c.moved]
    return out + [f"{c.name}: achieved {_flops(c.achieved_flops[0], per_s=True)} -> "
                  f"{_flops(c.achieved_flops[1], per_s=True)} ({c.achieved_flops[1] / c.achieved_flops[0] - 1:+.1%}; "
                  f"counted FLOPs over the median step)" for c in comparisons if c.achieved_flops and c.achieved_flops[0] > 0]


def compare_headers(comparisons: Sequence[Comparison]) -> list[str]:
    """Side by side counts rounds of one process (or pairs of processes) where a stored gate counts runs."""
    if comparisons and all((c.method or "").startswith("side by side") for c in comparisons):
        return [h.replace("runs b/c (b spread)", "rounds b/c") for h in COMPARE_HEADERS]
    return COMPARE_HEADERS


COLUMNS_MEAN = ("baseline ms and current ms: medians of all samples pooled; the ratio and its interval: the estimate "
                "over runs (rounds), which is what is decided, so the medians need not divide to it")


def comparison_table(comparisons: Sequence[Comparison], alpha: float, fmt: str = "simple", wide: bool = False) -> str:
    headers = compare_headers(comparisons)
    body = fit(headers, [comparison_row(c) for c in comparisons], wide=wide, fmt=fmt,
               foldable=(headers[-2],), droppable=COMPARE_DROPPABLE)
    # an advice shared by several inconclusive rows is said once, under them, not once per scenario
    split = {c.name: c.reason.rsplit(": ", 1) for c in comparisons if c.verdict == "inconclusive" and ": " in c.reason}
    advice = [parts[1] for parts in split.values()]
    shared = sorted({a for a in advice if advice.count(a) > 1})
    notes = [f"{c.name}: {c.verdict}: {split[c.name][0] if split.get(c.name, ['', ''])[1] in shared else c.reason}"
             for c in comparisons if c.verdict != "unchanged"]
    notes += [f"to decide the inconclusive ones: {a}" for a in shared]
    notes += comparison_notes(comparisons)
    methods = sorted({c.adjustment for c in comparisons if c.adjustment})
    foot = (f"\np-values adjusted by {'; '.join(methods) or 'nothing (no scenario was decidable)'}; alpha={alpha}; "
            f"each interval is at the level its verdict was decided at")
    lines = [foot.lstrip("\n"), COLUMNS_MEAN, *notes]
    return body + below(lines, wide)


def decisions_table(decisions, fmt: str = "simple", wide: bool = False) -> str:
    """One row per A/B decision: medians, speedup with interval, p, correctness, verdict."""
    rows = []
    for name, r in decisions:
        med = lambda xs: _ms(summarize(xs).median) if xs else "-"
        corr = "-" if r.correctness is None else ("pass" if r.correctness.get("ok") else "FAIL")
        p = "-" if r.p_value is None else f"{r.p_value:.2g}"
        rows.append([name, med(r.baseline_ms), med(r.candidate_ms), r.speedup_text, p, len(r.baseline_ms), corr, r.verdict])
    from bench_core.deciding.verdicts import SPEEDUP_MEANS

    levels = {1.0 - float((r.params or {}).get("alpha", 0.01)) for _, r in decisions}
    interval = f"speedup [{levels.pop():.0%} CI]" if len(levels) == 1 else "speedup [CI at 1 - alpha]"
    return fit(["comparison", "baseline ms", "candidate ms", interval, "p", "pairs", "correct", "verdict"],
               rows, wide=wide, fmt=fmt, foldable=("pairs", "correct"), droppable=("p", "baseline ms", "candidate ms")
               ) + below([SPEEDUP_MEANS, *(line for name, r in decisions for line in work_lines(name, r))], wide)


def work_lines(name: str, r) -> list[str]:
    """An A/B's counted work in words: how its work signatures differ, where its time moved (a slower or faster
    verdict's profiler pass), each side's achieved FLOP/s, and a warning when the FLOP counts differ."""
    facts = [f"{name}: work signature: {f}" for f in getattr(r, "facts", ())]
    moved = [f"{name}: time moved (profiler passes after measuring, a hypothesis): {t}" for t in getattr(r, "moved", ())]
    return facts + moved + _flop_lines(name, r)


def _flop_lines(name: str, r) -> list[str]:
    f = r.flops or {}
    if set(f) != {"baseline", "candidate"} or not r.baseline_ms or not r.candidate_ms:
        return []
    rate = {side: per_second(f[side], summarize(ms).median) for side, ms in (("baseline", r.baseline_ms),
                                                                              ("candidate", r.candidate_ms))}
    out = [f"{name}: achieved {_flops(rate['baseline'], per_s=True)} -> {_flops(rate['candidate'], per_s=True)} "
           f"(counted FLOPs over the median step)"]
    if f["baseline"] != f["candidate"]:
        out.append(f"{name}: warning: counted FLOPs differ: baseline {f['baseline']} -> candidate {f['candidate']} "
                   f"per step: the two do different work")
    return out


MARKDOWN_LIMIT = 1_000_000   # GitHub's job summary takes at most 1 MiB; leave room for other steps


def markdown(title: str, outcome: str | None, comparisons: Sequence[Comparison], failing: Sequence[Comparison],
             results: Sequence[Measurement], errors: Sequence[tuple[str, str]], decisions, notes: Sequence[str]) -> str:
    """A report for $GITHUB_STEP_SUMMARY or a pull-request comment: the verdict summary first, then the tables,
    then the notes; cut (and saying so) before GitHub's 1 MiB limit. `failing`: the comparisons that failed
    their items (the session decides which)."""
    parts = [f"## {title}", ""]
    if outcome:
        bad = list(failing)
        parts += [f"**{'FAILED' if bad or errors else 'passed'}**: {outcome}", ""]
        parts += [f"- :x: `{c.name}`: {c.verdict}: {c.reason}" for c in bad] + ([""] if bad else [])
        parts += [tabulate([comparison_row(c) for c in comparisons], headers=compare_headers(comparisons), tablefmt="github",
                           disable_numparse=True), ""]
    if errors:
        parts += ["**Failed scenarios**", ""] + [f"- `{n}`: {p}" for n, p in errors] + [""]
    parts += ["<details><summary>Results</summary>", "",
              tabulate(session_rows(results), headers=SESSION_HEADERS, tablefmt="github", disable_numparse=True),
              "", "</details>", ""]
    if decisions:
        parts += ["<details><summary>A/B decisions</summary>", "", decisions_table(decisions, fmt="github", wide=True), "",
                  "</details>", ""]
    parts += [f"- {n}" for n in notes if n]
    text = "\n".join(parts) + "\n"
    if len(text.encode()) > MARKDOWN_LIMIT:
        cut = text.encode()[:MARKDOWN_LIMIT - 200].decode(errors="ignore")
        text = cut + "\n\n*(report cut at GitHub's summary limit: the session file has everything)*\n"
    return text


RANKS_HEADERS = ["scenario", "ranks", "step ms (slowest rank)", "per rank: median ms", "straggler",
                 "exposed communication", "scaling", "replicas"]


def ranks_rows(results: Sequence[Measurement]) -> list[list[str]]:
    from bench_core.core.ranks import exposure, rank_rows, scaling_efficiency, straggler

    rows = []
    for m in results:
        rs = m.ranks
        if rs is None:
            continue
        per = ", ".join(f"{r}: {_ms(med)}" + ("" if loc is None else f" ({_ms(loc)} local)")
                        for r, _, med, _, loc in rank_rows(rs))
        st = straggler(rs)
        if st is None:
            strag = "-"
        else:
            how = f"{st.excess:+.1%} [{st.ci_low:+.1%}, {st.ci_high:+.1%}]"
            strag = (f"rank {st.rank} {how}" if st.named else f"none (slowest: rank {st.rank} {how})") + \
                f" ({st.figure}, p={st.p_value:.2g})"
        ex = exposure(rs)
        if ex is None:
            exposed = NOT_OBSERVED
        else:
            lo, hi = ex.interval_ms
            exposed = f"{_ms(ex.exposed_ms)} ms [{_ms(lo)}, {_ms(hi)}] ({ex.share:.0%} of the step)"
        eff = scaling_efficiency(rs)
        scaling = NOT_OBSERVED if eff is None else f"{eff:.0%} (1 rank: {_ms(float(np.median(rs.one_rank_ms)))} ms)"
        rep = NOT_OBSERVED if rs.replicas_max_abs_diff is None else (
            "identical" if rs.replicas_max_abs_diff == 0 else f"differ by {rs.replicas_max_abs_diff:.3g}")
        if rs.reference is not None:
            rep += "; reference " + ("ok" if rs.reference.get("ok") else "MISMATCH") + \
                f" ({rs.reference.get('steps')} steps)"
        hosts = f" on {rs.nnodes} hosts" if rs.nnodes > 1 else ""
        rows.append([m.name, f"{rs.world_size} {rs.backend}{hosts}", _ms(m.summary.median), per, strag, exposed,
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
                                  headers=["observation", "hypothesis", "next check"], tablefmt=fmt, maxcolwidths=[50, 34, 50])


def history_table(history, wide: bool = False, scenario: str | None = None) -> str:
    """One machine's runs of a scenario, oldest first, and its change points under them (with the bisection that
    decides each one's range, where `scenario` is named)."""
    starts = {c.point.index: c for c in history.changes}
    rows = []
    for i, p in enumerate(history.points):
        mark = f"<- {starts[i].point.ratio:.3f}x" if i in starts else ""
        rows.append([i + 1, p.created[:19], (p.commit or "-")[:12] + ("+" if p.dirty else ""), p.branch or "-",
                     _ms(p.median_ms), p.n, mark])
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
                     f"{s.allocations} ({mb(s.allocated_bytes)})", s.graphs, s.graph_breaks, s.recompiles,
                     NOT_OBSERVED if s.instructions is None else f"{s.instructions:,}"])
    return fit(["scenario", "operators", "syncs", "copies", "allocations", "graphs", "breaks", "recompiles",
                "instructions"], rows, wide=wide, foldable=("graphs", "breaks", "recompiles"),
               droppable=("instructions",)) + below(["per step, counted once after the window, exactly; n/o: not "
                                                      "counted (instructions: --bench-instructions)"], wide)
