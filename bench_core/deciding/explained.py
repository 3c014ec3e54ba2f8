"""Where a verdict's time moved, said only where the evidence shows it: several profiler passes of each side,
alternated, give each operator's self time per step as a sample per pass; an operator is named only where its
difference is established (its interval excludes zero) and points the way the measured step moved, and only while
the named differences add up to no more than the step's own difference could hold. An operator whose calls per step
every pass of each side counted alike, and differently from the other side, is named as that counted fact, its time
left unestablished. Otherwise the explanation says that it is not known. Pure: passes in, lines out."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from bench_core.core.stats import t_quantile

Pass = Mapping[str, tuple[float, int]]   # operator -> (self ms per step, calls per step), one profiler pass

CONFIDENCE = 0.95   # each operator's interval: a first hypothesis to test, so not Bonferroni over every operator
SIZE_SLACK = 2.0    # the profiler's own overhead inflates operators' times: named differences may add up to this
                    # many times the measured step difference, never more
TOP = 5


def _interval(b: Sequence[float], c: Sequence[float]) -> tuple[float, float, float]:
    """Difference of means (c - b) and its t-interval at CONFIDENCE: Welch's where both sides have two passes or
    more; where one side has a single pass (a stored baseline's runs against this run's one), the other side's
    spread stands for both."""
    nb, nc = len(b), len(c)
    mb, mc = sum(b) / nb, sum(c) / nc
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1) if nb > 1 else None
    vc = sum((x - mc) ** 2 for x in c) / (nc - 1) if nc > 1 else None
    d = mc - mb
    if vb is None or vc is None:
        v, df = (vc, nc - 1) if vb is None else (vb, nb - 1)
        se2 = v * (1 / nb + 1 / nc)
    else:
        se2 = vb / nb + vc / nc
        df = se2 ** 2 / ((vb / nb) ** 2 / (nb - 1) + (vc / nc) ** 2 / (nc - 1)) if vb and vc else (
            nb - 1 if vb else nc - 1)
    if se2 == 0.0:
        return d, d, d
    half = t_quantile((1 - CONFIDENCE) / 2, df) * math.sqrt(se2)
    return d, d - half, d + half


def explained(base: Sequence[Pass], cand: Sequence[Pass], step_ms: float | None, floor_ms: float = 0.005
              ) -> list[str]:
    """The operators whose self time per step moved, established over the passes (three in all, two on one side) and
    pointing the way the step moved (`step_ms`: candidate minus baseline, the measured step difference), largest
    first, then those whose calls per step changed as every pass counted them; or one line saying why the time's
    move is not explained by a profiler pass."""
    n = min(len(base), len(cand))
    if n < 1 or len(base) + len(cand) < 3:
        return [f"not explained by a profiler pass ({len(base)} and {len(cand)} pass(es): an "
                f"operator's difference needs three in all, two on one side, to be told from the profiler's own "
                f"noise)"]
    rows, counted = [], []
    for op in sorted(set().union(*base, *cand)):
        b = [p.get(op, (0.0, 0))[0] for p in base]
        c = [p.get(op, (0.0, 0))[0] for p in cand]
        d, lo, hi = _interval(b, c)
        established = lo > 0 or hi < 0
        same_way = step_ms is None or d * step_ms > 0
        calls_b = {p.get(op, (0.0, 0))[1] for p in base}
        calls_c = {p.get(op, (0.0, 0))[1] for p in cand}
        if established and same_way and abs(d) >= floor_ms:
            calls = (round(sum(p.get(op, (0.0, 0))[1] for p in base) / len(base)),
                     round(sum(p.get(op, (0.0, 0))[1] for p in cand) / len(cand)))
            rows.append((abs(d), f"{op} {d:+.3g} ms per step [{lo:+.3g}, {hi:+.3g}] ({sum(b) / len(b):.3g} -> "
                                 f"{sum(c) / len(c):.3g} ms; calls {calls[0]} -> {calls[1]})"))
        elif len(calls_b) == len(calls_c) == 1 and calls_b != calls_c:
            # a count is a fact where every pass of a side agrees on it: no interval needed to say it changed
            (cb,), (cc,) = calls_b, calls_c
            # its time is not established, so no figure of it is shown: one can read larger than the step itself
            counted.append((abs(cc - cb), f"{op} calls {cb} -> {cc} per step (counted alike in every pass; its "
                                          f"time not established)"))
    rows.sort(reverse=True)
    counted.sort(key=lambda row: (-row[0], row[1]))
    named, facts = rows[:TOP], [text for _, text in counted[:TOP]]
    if not named:
        return facts or [f"not explained by a profiler pass (no operator's difference established over {n} "
                         f"alternated passes a side" + (", in the step's direction)" if step_ms is not None else ")")]
    total = sum(size for size, _ in named)
    if step_ms is not None and total > SIZE_SLACK * abs(step_ms):
        follows = "; below, only calls counted alike in every pass, facts whatever the time" if facts else ""
        return [f"not explained by a profiler pass (the operators' differences add up to {total:.3g} ms "
                f"per step, more than the measured step's {abs(step_ms):.3g} ms could hold){follows}", *facts]
    return [text for _, text in named] + facts
