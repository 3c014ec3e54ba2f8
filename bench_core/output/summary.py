"""The end-of-session report for the terminal, read off a session's ledger: results, ranks, counted work,
resource needs, A/B decisions, diagnose passes and the comparison with its baseline, in reading order."""
from __future__ import annotations

import math

from bench_core.core.redact import redact
from bench_core.output.comparison_tables import comparison_table, decisions_table
from bench_core.output.fitting import below
from bench_core.output.tables import (hypotheses_table, ranks_table, resource_table, session_table, signature_table,
                                      work_table)
from bench_core.timing.flops import bandwidth_for, peak_flops_for


def shown(session, text: str) -> str:
    """Text for people: in a diagnose session, whose report may be shared, with secrets redacted."""
    return text if session.config.profile is None else redact(text)[0]


def summary_sections(session) -> list[tuple[str, str]]:
    """The report as (title, text) sections, in reading order."""
    s = session
    if not s.results and not s.errors and not s.decisions and s.compared_with is None:
        return []
    wide = s.config.wide
    # what could not be counted (FLOPs, signatures, instructions) is said, never shown as nothing: under the work
    # table where there is one, else under the results (or an A/B-only session's decisions)
    uncounted = [] if s.config.count_flops and s.results else list(s.uncounted)
    notes = [f"{test} left behind (undone, so later scenarios start from the session's state): {'; '.join(what)}"
             for test, what in s.leaks] + uncounted
    notes += [f"{test}: not measured by bench_core: {why}" for test, why in s.unmeasured if s.compared_with is None]
    out = [(title, session_table(group, s.errors if i == 0 else (), wide=wide) + below(notes if i == 0 else [], wide))
           for i, (title, group) in enumerate(result_groups(s))]   # an A/B-only session has no table
    if any(m.ranks is not None for m in s.results):
        out.append(("bench_core distributed scenarios (every rank)", ranks_table(s.results, wide=wide)))
    if s.config.count_flops and s.results:
        text = work_table(s.results, lambda m: peak_flops_for(m, s.environment, s.config.peak_tflops), wide=wide,
                          bandwidth_of=lambda m: bandwidth_for(m, s.environment))
        out.append(("bench_core work and utilization (counted FLOPs)", text + below(s.uncounted, wide)))
    if any(m.signature is not None for m in s.results):
        out.append(("bench_core work signatures", signature_table(s.results, wide=wide)))
    if s.results:
        wait = {p.scenario: p.facts.stage_us["batch_read"] / p.facts.step_us for p in s.profiles
                if p.facts.step_us and "batch_read" in p.facts.stage_us}
        out.append(("bench_core resource needs", resource_table(s.results, s.environment, wait, wide)))
    if s.decisions:
        out.append(("bench_core A/B decisions (interleaved, paired)", decisions_table(s.decisions, wide=wide) + (
            "" if s.results or s.errors else below(uncounted, wide))))
    measured = {m.name: m for m in s.results}
    for p in s.profiles:
        where = f"trace: {p.trace_path}" if p.trace_path else "trace: not written"
        out.append((f"bench_core diagnose: {p.scenario} (profiled separately; not in any result)",
                    f"{p.table}\n{hypotheses_table(p.hypotheses, p.facts, measured=measured.get(p.scenario))}\n"
                    f"{where} ({p.redaction})"))
    if s.compared_with is not None:
        text = comparison_table(s.comparisons, s.config.gate.alpha, wide=wide) + below(comparison_lines(s), wide)
        out.append((f"bench_core comparison with {s.compared_with}", text))
    return [(shown(s, title), shown(s, text)) for title, text in out]


def result_groups(s) -> list[tuple[str, list]]:
    """The results table's titles and rows: one table, or one a group where pytest-benchmark's
    --benchmark-group-by puts the session's results in several (its groups, in the order first met)."""
    if not s.results and not s.errors:
        return []
    keys = [_group_key(s.config.group_by, m) if s.config.group_by else "" for m in s.results]
    order = list(dict.fromkeys(keys))
    if len(order) <= 1:
        return [("bench_core results", list(s.results))]
    return [(f"bench_core results: {key or 'no group'}", [m for m, k in zip(s.results, keys) if k == key])
            for key in order]


# pytest-benchmark's --benchmark-group-by keys, besides param:NAME; the plugin refuses any other
GROUP_KEYS = ("group", "name", "fullname", "func", "fullfunc", "param")


def _group_key(group_by: str, m) -> str:
    """pytest-benchmark's grouping keys (group, name, fullname, func, fullfunc, param, param:NAME), for a result."""
    meta = m.scenario.metadata
    test = meta.get("test", m.name)
    parts = []
    for key in (k.strip() for k in group_by.split(",") if k.strip()):
        value = {"group": meta.get("group"), "name": m.name, "fullname": test, "func": m.name.split("[")[0],
                 "fullfunc": test.split("[")[0],
                 "param": m.name[m.name.index("["):] if "[" in m.name else None}.get(key)
        if key.startswith("param:"):
            p = key.split(":", 1)[1]
            value = f"{p}={(meta.get('params') or {}).get(p)}"
        parts.append(f"{key} {value}" if key == "group" and value is not None else value or "")
    return ", ".join(p for p in parts if p)


def comparison_lines(s) -> list[str]:
    """The session's own lines under the comparison table: warnings, the prior, the outcome."""
    lines = []
    missing = s.missing_from_run()
    if missing:
        lines.append(f"in {s.compared_side} but not run now: {', '.join(missing)}")
    if s.revision is not None:
        commit = s.revision.revision.commit
        python = s.config.against.python
        lines.append(f"baseline = {s.revision.revision.label} ({commit[:12] if commit else 'no commit'})"
                     f"{f' in {python}' if python else ''}; current = {s.revision.current.describe()}")
        if s.revision.compiled is not None:
            lines.append(s.revision.compiled.said)
        methods: dict[str, list[str]] = {}
        for c in s.comparisons:
            methods.setdefault(c.method, []).append(c.name)
        for method, names in methods.items():   # one mode for all, or each mode with the scenarios it ran
            lines.append(method if len(methods) == 1 else f"{method}: {', '.join(names)}")
        why: dict[str, list[str]] = {}   # one reason, said once, with the scenarios it sent to processes
        borrowed = [rec.scenario for rec in s.side_by_side if rec.code.get("test_from_this_tree")]
        if borrowed:
            lines.append(f"{', '.join(borrowed)}: {s.revision.revision.label}'s side ran this tree's test file, which "
                         f"git does not track and the revision does not have (a benchmark written since)")
        for rec in s.side_by_side:
            reason = rec.code.get("why_processes")
            if reason and not reason.startswith("asked for"):   # asked for: the method line says so already
                why.setdefault(reason, []).append(rec.scenario)
        for reason, names in why.items():
            who = names[0] if len(names) == 1 else f"{len(names)} scenarios ({', '.join(names)})"
            lines.append(f"{who}: each side in a process of its own: {reason}")
    if s.workers is not None and s.workers.started:
        lines.append(f"process mode: {len(s.workers.scenarios)} scenario(s) served by {s.workers.started} pytest "
                     f"process(es), each kept from scenario to scenario of its test file")
    lines += [f"{name}: {note}" for name, note in s.one_side]
    lines += [f"{test}: not measured by bench_core: {why}" for test, why in s.unmeasured]
    lines += [f"warning: {note}" for note in s.baseline_notes]
    if s.prior is not None:
        lines.append(f"run-to-run variance prior: {math.expm1(math.sqrt(s.prior.variance)):.1%} spread, "
                     f"worth {s.prior.df:.3g} runs ({s.prior.source})")
    lines.append(s.outcome())
    return lines


def plot_groups(s) -> list[tuple[str, str, list[tuple[str, tuple[float, ...]]]]]:
    """(name, title, groups) for every plot: a result with its baseline runs and fresh processes, and
    each A/B decision's two sides. The figure the gate compares: GPU time where there is one."""
    out = []
    for m in s.results:
        groups = [("this run", m.primary_ms)]
        groups += [(f"fresh process {i + 1}", r.primary_ms) for i, r in enumerate(s.replicas.get(m.name, ()))]
        if s.baseline is not None:
            groups += [(f"baseline run {i}", r.primary_ms) for i, r in enumerate(s.baseline.get(m.name, ()))]
        title = f"{m.name}: {m.timer} time" + (f" against baseline {s.config.compare!r}" if s.baseline else "")
        out.append((m.name, title, groups))
    for name, r in s.decisions:
        out.append((f"ab-{name}", f"A/B {name}: baseline and candidate, interleaved pairs",
                    [("baseline", tuple(r.baseline_ms)), ("candidate", tuple(r.candidate_ms))]))
    return out
