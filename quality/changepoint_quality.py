"""How good are the history's change points? Simulated histories of run-level mean log times (the method's own
arithmetic; no machine time is involved, so the figures hold on any machine for the spreads given).

    python quality/changepoint_quality.py [--histories 30] [--runs 30] [--spreads 0.025,0.038,0.052,0.089] [--alpha 0.01]
    python quality/changepoint_quality.py --statistics [--histories 60]

`--statistics` asks instead whether another statistic would find a 10% step more often at the same false-alarm
rate: the permutation test of the segment's best split (as `change_points` runs it) with the Mann-Whitney statistic
it uses, with normal scores (van der Waerden), with the difference of means (a CUSUM t), and with that t on runs
winsorized at 2 robust spreads; detection of the step, and A/A histories called changed, for each.

Per run-to-run spread (the sd of a run's mean log time: this machine's measured spreads are in docs/gate.md):
false change points in A/A histories (no step), and, with a step of 10% (and 25%) after run 18, how often a
change point is found whose range of runs (where the new level may begin, 95%) holds it, with the ranges' median
width, and how often one is found within one run of it, with the median estimated ratio. Normal noise, and normal
noise with one run in ten 30% slow (a shared machine's slow processes).
"""
from __future__ import annotations

import argparse
import math

import numpy as np
from tabulate import tabulate

from bench_core.deciding.changepoints import change_points, split_scores


def history(rng, runs, spread, step, slow):
    x = rng.normal(0, spread, runs)
    if slow:
        x += np.where(rng.random(runs) < 0.1, math.log(1.3), 0.0)
    x[18:] += math.log(step)
    return x


def _best_t(a: np.ndarray, min_size: int = 3) -> float:
    """The largest standardized difference of means over the splits (the spread of the whole segment)."""
    n = a.size
    k = np.arange(min_size, n - min_size + 1)
    before = np.cumsum(a)[k - 1]
    diff = (a.sum() - before) / (n - k) - before / k
    return float(np.max(np.abs(diff) / (a.std(ddof=1) * np.sqrt(1 / k + 1 / (n - k)))))


def _statistics():
    from scipy.stats import norm, rankdata

    def winsorized(x):
        m = np.median(x)
        s = max(1.4826 * np.median(np.abs(x - m)), 1e-12)
        return np.clip(x, m - 2 * s, m + 2 * s)
    return {"Mann-Whitney (used)": lambda x: float(np.abs(split_scores(rankdata(x), 3)).max()),
            "normal scores": lambda x: _best_t(norm.ppf(rankdata(x) / (x.size + 1))),
            "mean difference (t)": _best_t,
            "t, winsorized": lambda x: _best_t(winsorized(x))}


def compare_statistics(ns) -> None:
    """Detection of a 10% step, and false alarms, per statistic, each through the same permutation test."""
    perm = np.random.default_rng(1)

    def p_value(x, stat, permutations=499):
        seen = stat(x)
        null = [stat(perm.permutation(x)) for _ in range(permutations)]
        return (1 + sum(v >= seen - 1e-12 for v in null)) / (permutations + 1)
    rows = []
    for slow in (False, True):
        for spread in (float(s) for s in ns.spreads.split(",")):
            row = ["1 in 10 runs 30% slow" if slow else "normal", f"{spread:.1%}"]
            for stat in _statistics().values():
                found = aa = 0
                steps, flat = np.random.default_rng(7), np.random.default_rng(8)   # the same histories per statistic
                for _ in range(ns.histories):
                    found += p_value(history(steps, ns.runs, spread, 1.10, slow), stat) < ns.alpha
                    aa += p_value(history(flat, ns.runs, spread, 1.0, slow), stat) < ns.alpha
                row.append(f"{found}/{ns.histories} (A/A {aa})")
            rows.append(row)
    print(f"{ns.histories} histories of {ns.runs} runs, a 10% step after run 18, permutation test at alpha {ns.alpha}")
    print(tabulate(rows, headers=["noise", "spread", *_statistics()]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--histories", type=int, default=30)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--spreads", default="0.025,0.038,0.052,0.089")
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--statistics", action="store_true", help="compare the split statistic with alternatives")
    ns = ap.parse_args()
    if ns.statistics:
        return compare_statistics(ns)
    rng = np.random.default_rng(0)
    rows = []
    for slow in (False, True):
        for spread in (float(s) for s in ns.spreads.split(",")):
            aa = sum(len(change_points(history(rng, ns.runs, spread, 1.0, slow), alpha=ns.alpha, seed=i))
                     for i in range(ns.histories))
            row = ["1 in 10 runs 30% slow" if slow else "normal", f"{spread:.1%}", f"{aa}/{ns.histories}"]
            for step in (1.10, 1.25):
                near = held = 0
                ratios, widths = [], []
                for i in range(ns.histories):
                    cps = change_points(history(rng, ns.runs, spread, step, slow), alpha=ns.alpha, seed=i)
                    hit = [c for c in cps if abs(c.index - 18) <= 1]
                    near += bool(hit)
                    held += any(c.first_low <= 18 <= c.first_high for c in cps)
                    widths += [c.first_high - c.first_low + 1 for c in cps]
                    ratios += [c.ratio for c in hit[:1]]
                width = f"{np.median(widths):g}" if widths else "-"
                row.append(f"{held}/{ns.histories} (width {width}; within 1 run {near}; median "
                           f"{np.median(ratios) if ratios else math.nan:.3f})")
            rows.append(row)
    print(f"{ns.histories} histories of {ns.runs} runs, the step after run 18, alpha {ns.alpha}")
    print(tabulate(rows, headers=["noise", "spread", "A/A false change points", "+10%: range holds it",
                                  "+25%: range holds it"]))


if __name__ == "__main__":
    main()
