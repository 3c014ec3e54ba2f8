"""Tables for people of what was decided: the comparison table (a gate's or side by side's verdicts, with their
notes), the A/B decisions table, and the Markdown report for a job summary or a pull-request comment, which
holds both with the session's results.
"""
from __future__ import annotations

import math
from typing import Sequence

from tabulate import tabulate

from bench_core.core.records import Measurement
from bench_core.core.stats import per_second, summarize
from bench_core.deciding.comparison import Comparison, level_text
from bench_core.output.fitting import below, fit, flops_text, ms_text
from bench_core.output.tables import SESSION_HEADERS, session_rows

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
    ratio = num(c.ratio, ".3f" if c.ratio is None or c.ratio >= 0.1 else ".3g")   # 0.0188, not 0.019
    return [c.name, num(c.baseline_median, ".4g"), num(c.candidate_median, ".4g"), ratio, ci, p,
            f"{c.baseline_runs}/{c.candidate_runs}{spread}", c.verdict]


def comparison_notes(comparisons: Sequence[Comparison]) -> list[str]:
    """What each comparison says beside its verdict: its warnings, and each side's achieved FLOP/s where both
    were counted. The terminal and the Markdown report show the same lines."""
    out = [f"{c.name}: warning: {n}" for c in comparisons for n in c.notes]
    out += [f"{c.name}: work signature: {f}" for c in comparisons for f in c.facts]
    out += [f"{c.name}: FAILS, grew (--bench-no-growth): {g}" for c in comparisons for g in c.grown]
    out += [f"{c.name}: time moved (profiler passes after measuring, a hypothesis): {t}" for c in comparisons
            for t in c.moved]
    return out + [f"{c.name}: achieved {flops_text(c.achieved_flops[0], per_s=True)} -> "
                  f"{flops_text(c.achieved_flops[1], per_s=True)} "
                  f"({c.achieved_flops[1] / c.achieved_flops[0] - 1:+.1%}; counted FLOPs over the median step)"
                  for c in comparisons if c.achieved_flops and c.achieved_flops[0] > 0]


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
        med = lambda xs: ms_text(summarize(xs).median) if xs else "-"
        corr = "-" if r.correctness is None else ("pass" if r.correctness.get("ok") else "FAIL")
        p = "-" if r.p_value is None else f"{r.p_value:.2g}"
        rows.append([name, med(r.baseline_ms), med(r.candidate_ms), r.speedup_text, p, len(r.baseline_ms), corr,
                     r.verdict])
    from bench_core.deciding.verdicts import SPEEDUP_MEANS

    levels = {1.0 - float((r.params or {}).get("alpha", 0.01)) for _, r in decisions}
    interval = f"speedup [{levels.pop():.0%} CI]" if len(levels) == 1 else "speedup [CI at 1 - alpha]"
    # as the comparison table does: a verdict other than "unchanged" says why beside its row, so that an
    # "inconclusive" next to an interval that excludes 1.0 is not left to be guessed at
    why = [f"{name}: {r.verdict}: {r.reason}" for name, r in decisions if r.verdict != "unchanged" and r.reason]
    return fit(["comparison", "baseline ms", "candidate ms", interval, "p", "pairs", "correct", "verdict"],
               rows, wide=wide, fmt=fmt, foldable=("pairs", "correct"), droppable=("p", "baseline ms", "candidate ms")
               ) + below([SPEEDUP_MEANS, *why, *(line for name, r in decisions for line in work_lines(name, r))], wide)


def work_lines(name: str, r) -> list[str]:
    """An A/B's counted work in words: how its work signatures differ, where its time moved (a slower or faster
    verdict's profiler pass), each side's achieved FLOP/s, and a warning when the FLOP counts differ."""
    facts = [f"{name}: work signature: {f}" for f in getattr(r, "facts", ())]
    moved = [f"{name}: time moved (profiler passes after measuring, a hypothesis): {t}"
             for t in getattr(r, "moved", ())]
    return facts + moved + _flop_lines(name, r)


def _flop_lines(name: str, r) -> list[str]:
    f = r.flops or {}
    if set(f) != {"baseline", "candidate"} or not r.baseline_ms or not r.candidate_ms:
        return []
    rate = {side: per_second(f[side], summarize(ms).median) for side, ms in (("baseline", r.baseline_ms),
                                                                              ("candidate", r.candidate_ms))}
    out = [f"{name}: achieved {flops_text(rate['baseline'], per_s=True)} -> "
           f"{flops_text(rate['candidate'], per_s=True)} (counted FLOPs over the median step)"]
    if f["baseline"] != f["candidate"]:
        out.append(f"{name}: warning: counted FLOPs differ: baseline {f['baseline']} -> candidate {f['candidate']} "
                   f"per step: the two do different work")
    return out


MARKDOWN_LIMIT = 1_000_000   # GitHub's job summary takes at most 1 MiB; leave room for other steps


def markdown(title: str, outcome: str | None, comparisons: Sequence[Comparison], failing: Sequence[Comparison],
             results: Sequence[Measurement], errors: Sequence[tuple[str, str]], decisions, notes: Sequence[str],
             first: str | None = None) -> str:
    """A report for $GITHUB_STEP_SUMMARY or a pull-request comment: the verdict summary first, then the tables,
    then the notes; cut (and saying so) before GitHub's 1 MiB limit. `failing`: the comparisons that failed
    their items (the session decides which). `first`: what a reader must know before any figure."""
    parts = [f"## {title}", ""] + ([f"> **{first}**", ""] if first else [])
    if outcome:
        bad = list(failing)
        parts += [f"**{'FAILED' if bad or errors else 'passed'}**: {outcome}", ""]
        parts += [f"- :x: `{c.name}`: {c.verdict}: {c.reason}" for c in bad] + ([""] if bad else [])
        parts += [tabulate([comparison_row(c) for c in comparisons], headers=compare_headers(comparisons),
                           tablefmt="github", disable_numparse=True), ""]
    if errors:
        parts += ["**Failed scenarios**", ""] + [f"- `{n}`: {p}" for n, p in errors] + [""]
    parts += ["<details><summary>Results</summary>", "",
              tabulate(session_rows(results), headers=SESSION_HEADERS, tablefmt="github", disable_numparse=True),
              "", "</details>", ""]
    if decisions:
        parts += ["<details><summary>A/B decisions</summary>", "",
                  decisions_table(decisions, fmt="github", wide=True), "", "</details>", ""]
    parts += [f"- {n}" for n in notes if n]
    text = "\n".join(parts) + "\n"
    if len(text.encode()) > MARKDOWN_LIMIT:
        cut = text.encode()[:MARKDOWN_LIMIT - 200].decode(errors="ignore")
        text = cut + "\n\n*(report cut at GitHub's summary limit: the session file has everything)*\n"
    return text
