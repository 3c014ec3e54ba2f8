"""When to gather more evidence: the one keep-going rule, and the looks that alpha is split over.

Every sequential decision in bench_core (the stored-baseline gate's fresh processes, side by side's extra
rounds, A/B's extra rounds) looks at its evidence only at planned amounts, decided before the first look,
so the error rate holds whatever path the data take; between looks it goes on only while `chase` says the
undecided answer is worth the cost. Pure: a comparison is read by its fields, never built here.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from bench_core.core.stats import t_sf
from bench_core.deciding.verdicts import INCONCLUSIVE


def planned_looks(first: int, last: int, every: int) -> tuple[int, ...]:
    """The amounts of evidence (runs, rounds) at which a sequential decision may stop: `first`, then every
    `every` more, and `last`. Alpha is split over all of them, whether or not they are reached."""
    return tuple(sorted({*range(first, last + 1, every), last}))


def chase(undecided: bool, p_value: float | None, chase_p: float, beyond_reach: float = 0.0) -> bool:
    """The one keep-going rule: an undecided answer whose p, less the part of it that more evidence of this
    kind cannot rule out (`beyond_reach`), is below `chase_p`. Loose on purpose: it only decides whether to
    spend time, never what is said."""
    return undecided and p_value is not None and p_value - beyond_reach < chase_p


def all_slow_chance(c: Any) -> float:
    """The chance, under the two-level model, that every candidate run of a slower-looking comparison was one of
    the machine's slow processes (share^m): only more processes rule it out. 0 elsewhere: slow processes only
    ever look slower."""
    slower = c.ratio is not None and c.ratio > 1
    return c.slow_share ** c.candidate_runs if slower and c.slow_share is not None else 0.0


def possible_change(c: Any, chase_p: float, beyond: float = 0.0) -> bool:
    """A comparison (gate or side by side), undecided and looking changed at one-sided p < chase_p, either way:
    what more evidence is spent on. A possible speedup is chased as a possible slowdown is: a null comparison
    that only one direction chases gets more looks, so more chances, in that direction alone, and a real
    speedup deserves the same power as a real slowdown.

    Under the two-level model a slower-looking p holds the chance that every candidate run was slow (share^m:
    one run in five, for a single run on a machine with 20% slow processes), which only more processes can rule
    out, so the chase leaves it out (docs/gate.md measures what that is worth). Slow processes only ever look
    slower, so a faster-looking comparison has no such part.

    `beyond` (side by side: half the threshold): p is then that of a change of more than `beyond`, where the
    comparison has a t-interval (`se`, `df`). A verdict needs the estimate past the threshold, and the small
    bias that a pair of processes keeps would otherwise send many A/A comparisons to a later look only to say
    "unchanged" (docs/side-by-side.md)."""
    undecided = (c.verdict == INCONCLUSIVE and not c.unusable and c.ratio is not None and c.ratio > 0
                 and c.ratio != 1)
    all_slow = all_slow_chance(c) if undecided else 0.0
    p = c.p_value
    if beyond > 0 and undecided and c.se and c.df:
        p = t_sf((abs(math.log(c.ratio)) - math.log1p(beyond)) / c.se, c.df)
    return chase(undecided, p, chase_p, all_slow)


def worth_replicating(c: Any, config: Any) -> bool:
    """Could fresh candidate runs, within the gate's budget (`config`: a GateConfig), turn this into a decision?
    A possible change, either way, that is not limited by the baseline alone (each run costs a process); under
    `config.chase == "confirm"`, only one that looks changed over the whole family (`Comparison.pending`)."""
    if c.candidate_runs >= config.max_runs:
        return False
    if config.chase == "confirm":
        return c.pending is not None and c.more_runs is not None
    return possible_change(c, config.chase_p) and c.more_runs is not None


def replicate_until_decided(runs: list, judge: Callable[[list], Any], replicate: Callable[[], Any] | None,
                            config: Any) -> Any:
    """The gate's protocol over fresh processes: decide on `runs`; while a possible change is worth
    chasing, add runs up to the next look and decide again. `replicate()` returns one new run, or None
    when no more can be had (the loop then stops with the last decision). `runs` grows in place."""
    c = judge(runs)
    while replicate is not None and worth_replicating(c, config):
        target = next(n for n in config.looks if n > len(runs))
        while len(runs) < target:
            new = replicate()
            if new is None:
                return c
            runs.append(new)
        c = judge(runs)
    return c
