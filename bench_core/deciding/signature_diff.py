"""Two work signatures compared exactly: every difference in words, per step, and the counters that grew.
Pure: no torch, no timing; the same two signatures give the same facts on every run."""
from __future__ import annotations

from bench_core.core.signature import INSTRUCTION_TOLERANCE, Signature


def _mb(n: int) -> str:
    return f"{n / 2 ** 20:.2f} MB" if abs(n) >= 2 ** 20 else f"{n / 1024:.1f} KB" if abs(n) >= 1024 else f"{n} B"


def differences(base: Signature, cand: Signature) -> list[str]:
    """Every way the candidate's step differs from the baseline's, in words, per step; empty when the same."""
    out = []
    for op in sorted(set(base.syncs) | set(cand.syncs)):
        d = cand.syncs.get(op, 0) - base.syncs.get(op, 0)
        if d:
            out.append(f"{d:+d} synchronization(s) per step: {op}")
    for way in sorted(set(base.copies) | set(cand.copies)):
        d = cand.copies.get(way, 0) - base.copies.get(way, 0)
        db = cand.copy_bytes.get(way, 0) - base.copy_bytes.get(way, 0)
        if d or db:
            out.append(f"{d:+d} copies {way} per step ({'+' if db >= 0 else '-'}{_mb(abs(db))})")
    if cand.allocations != base.allocations or cand.allocated_bytes != base.allocated_bytes:
        db = cand.allocated_bytes - base.allocated_bytes
        out.append(f"{cand.allocations - base.allocations:+d} allocations per step "
                   f"({'+' if db >= 0 else '-'}{_mb(abs(db))})")
    if cand.graphs != base.graphs:
        out.append(f"torch.compile graphs {base.graphs} -> {cand.graphs}")
    if cand.graph_breaks != base.graph_breaks and None not in (cand.graph_breaks, base.graph_breaks):
        new = [r for r in cand.break_reasons if r not in base.break_reasons]
        out.append(f"graph breaks {base.graph_breaks} -> {cand.graph_breaks}" + (f": {'; '.join(new)}" if new else ""))
    if cand.recompiles != base.recompiles:
        new = [r for r in cand.recompile_reasons if r not in base.recompile_reasons]
        out.append(f"recompilations per call {base.recompiles} -> {cand.recompiles}"
                   + (f", the guard that failed: {'; '.join(new)}" if new else ""))
    for op in sorted(set(base.operators) | set(cand.operators)):
        d = cand.operators.get(op, 0) - base.operators.get(op, 0)
        if d:
            out.append(f"{d:+d} {op} per step")
    if _instructions_moved(base, cand):
        out.append(f"host instructions per step {base.instructions:,} -> {cand.instructions:,} "
                   f"({cand.instructions / base.instructions - 1:+.1%}, callgrind)")
    return out


def _instructions_moved(base: Signature, cand: Signature, up_only: bool = False) -> bool:
    """Both counted, and the candidate's differs (or grew) by more than the counts' own run-to-run wobble."""
    if base.instructions is None or cand.instructions is None or not base.instructions:
        return False
    change = cand.instructions / base.instructions - 1
    return change > INSTRUCTION_TOLERANCE or (not up_only and change < -INSTRUCTION_TOLERANCE)


def grown(base: Signature, cand: Signature, counters) -> list[str]:
    """Of `counters` (names from COUNTERS), those whose total per step grew from base to cand, in words
    (instructions: by more than INSTRUCTION_TOLERANCE, where both were counted)."""
    out = []
    for c in counters:
        if c == "instructions":
            if _instructions_moved(base, cand, up_only=True):
                out.append(f"instructions: {base.instructions:,} -> {cand.instructions:,} per step "
                           f"({cand.instructions / base.instructions - 1:+.1%})")
        elif cand.total(c) > base.total(c):
            out.append(f"{c}: {base.total(c)} -> {cand.total(c)} per step")
    return out


def attach(c, base: Signature | None, cand: Signature | None, no_growth=()):
    """Comparison `c` with the facts of its two signatures (`differences`) and the counters of `no_growth` that
    grew (which fail it); unchanged where either side was not counted."""
    from dataclasses import replace

    if c is None or base is None or cand is None:
        return c
    return replace(c, facts=tuple(differences(base, cand)), grown=tuple(grown(base, cand, no_growth)))


def latest(runs) -> Signature | None:
    """The signature of the latest of `runs` (measurements) that has one."""
    counted = [r.signature for r in runs if getattr(r, "signature", None) is not None]
    return counted[-1] if counted else None
