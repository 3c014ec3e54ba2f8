"""How good is the stored-baseline gate's decision, under noise we choose? A simulation driven by the
gate's own functions (`compare.prior_from_logs`, `estimate_logs`, `decide_family`,
`replicate_until_decided`), so what it reports is what `--bench-compare` does.

The model of a run (one process) of one scenario: log(run median) = level + process drift
N(0, spread^2) + the median's own error (within-run sd 3% over 20 samples) + a slow-process excess
log(1.16) with probability 20% ("slow processes", on or off per cell). A baseline is 9 scenarios x 5
runs of that; the variance prior (and the two levels, where the fit finds them) is fitted from its 9
scenarios, and scenario 0 is gated, as a family of one (the least correction, so the most false alarms).

Because a baseline is recorded once and reused, false alarms are counted per fixed baseline: for each
of --baselines baselines, --candidates fresh candidates of unchanged code run the gate's protocol
(one process, then fresh processes up to the budget while a possible slowdown is undecided). Reported:
the average false-"slower" rate, the share of baselines above 2% and 3%, and the worst baseline; then
how often a 10% and a 30% slowdown are found from 1 and 3 fixed candidate runs and with replication.

    python quality/gate_sim.py --baselines 300 --candidates 150 --detect-trials 1000   # the table in docs/gate.md
    python quality/gate_sim.py --baselines 20 --candidates 50     # a quick look
    python quality/gate_sim.py --baseline-runs 10                 # baselines of 10 runs
    python quality/gate_sim.py --told-slow --spreads 0.03         # a ceiling: the gate told which were slow

Writes the table and the settings to .bench/gate_sim-<time>.json (never overwriting).
"""
from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

SCENARIOS, WITHIN = 9, 0.03 * 1.2533 / math.sqrt(20)
SLOW_SHARE, SLOW_EXCESS = 0.20, math.log(1.16)


def draw(rng, n: int, spread: float, slow: bool, shift: float = 0.0, told: bool = False) -> np.ndarray:
    """n runs' log medians. `told`: the gate is told which processes were slow, and sees only the others
    (a ceiling: what any model of slow processes could at best recover; generous, as the runs it counts
    are the others, so it may start more processes than the budget)."""
    x = rng.normal(0.0, spread, n) + rng.normal(0.0, WITHIN, n) + shift
    if slow:
        is_slow = rng.random(n) < SLOW_SHARE
        x = x[~is_slow] if told else x + is_slow * SLOW_EXCESS
    return x


def protocol(base: np.ndarray, prior, first: list, more, config):
    """One gate decision on scenario 0: the gate's own protocol (what BenchSession.gate runs)."""
    from bench_core.deciding.estimate import estimate_logs
    from bench_core.deciding.gate import decide_family
    from bench_core.deciding.sequential import replicate_until_decided

    def judge(runs):
        (c,) = decide_family([estimate_logs(base, np.asarray(runs), config, prior, name="s0")], config)
        return c
    runs = list(first)
    return replicate_until_decided(runs, judge, more, config)


def cell(args) -> dict:
    spread, slow, shift, mode, n_base, n_cand, seed, gate_kw, runs, told = args
    from bench_core.deciding.comparison import GateConfig
    from bench_core.deciding.estimate import prior_from_logs
    from bench_core.deciding.verdicts import SLOWER

    config = GateConfig(**gate_kw)
    rng = np.random.default_rng(seed)

    def one():  # a run that gives a median (told: the slow ones are dropped, so draw until one is not)
        while not (x := draw(rng, 1, spread, slow, shift, told)).size:
            pass
        return x[0]

    per_baseline, runs_used = [], []
    for _ in range(n_base):
        history = [draw(rng, runs, spread, slow, told=told) for _ in range(SCENARIOS)]
        while not history[0].size:   # told, and every baseline run of the gated scenario was slow
            history[0] = draw(rng, runs, spread, slow, told=told)
        prior, base = prior_from_logs(history), history[0]
        hits = 0
        for _ in range(n_cand):
            if mode == "replicate":
                first, more = [one()], one
            else:  # a fixed number of candidate runs, no replication
                first, more = [one() for _ in range(int(mode))], None
            c = protocol(base, prior, first, more, config)
            hits += c.verdict == SLOWER
            runs_used.append(c.candidate_runs)
        per_baseline.append(hits / n_cand)
    fa = np.array(per_baseline)
    return {"spread": spread, "slow": slow, "shift": shift, "mode": mode, "baselines": n_base, "candidates": n_cand,
            "rate": float(fa.mean()), "over_2pct": float(np.mean(fa > 0.02)), "over_3pct": float(np.mean(fa > 0.03)),
            "worst": float(fa.max()), "mean_runs": float(np.mean(runs_used))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baselines", type=int, default=200, help="fixed baselines per false-alarm cell")
    ap.add_argument("--candidates", type=int, default=300, help="unchanged candidates per baseline")
    ap.add_argument("--detect-trials", type=int, default=2000, help="slowed candidates per detection cell")
    ap.add_argument("--spreads", type=float, nargs="+", default=[0.03, 0.08, 0.15])
    ap.add_argument("--min-runs", type=int, default=None)
    ap.add_argument("--max-runs", type=int, default=None)
    ap.add_argument("--guard-rate", type=float, default=None, help="GateConfig.guard_rate (the candidate's share)")
    ap.add_argument("--guard-baselines", type=float, default=None, help="GateConfig.guard_baselines")
    ap.add_argument("--chase-p", type=float, default=None, help="GateConfig.chase_p (what is worth replicating)")
    ap.add_argument("--baseline-runs", type=int, default=5, help="runs of each scenario in a baseline")
    ap.add_argument("--told-slow", action="store_true",
                    help="a ceiling, not the gate as it is: the gate is told which processes were slow and sees "
                         "only the others (runs are then counted among those)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-save", action="store_true")
    ns = ap.parse_args(argv)

    from tabulate import tabulate

    gate_kw = {k: v for k, v in (("min_runs", ns.min_runs), ("max_runs", ns.max_runs), ("guard_rate", ns.guard_rate),
                                 ("guard_baselines", ns.guard_baselines),
                                 ("chase_p", ns.chase_p)) if v is not None}
    jobs = []
    for i, spread in enumerate(ns.spreads):
        for slow in (False, True):
            jobs.append((spread, slow, 0.0, "replicate", ns.baselines, ns.candidates, ns.seed * 1000 + 10 * i + slow,
                         gate_kw, ns.baseline_runs, ns.told_slow))
            for shift in (math.log(1.10), math.log(1.30)):
                for mode in ("1", "3", "replicate"):
                    # detection: many baselines, few candidates each (the average over baselines is the question)
                    per = 10
                    jobs.append((spread, slow, shift, mode, max(1, ns.detect_trials // per), per,
                                 ns.seed * 1000 + 10 * i + slow + int(100 * shift) + len(mode), gate_kw,
                                 ns.baseline_runs, ns.told_slow))
    with ProcessPoolExecutor(ns.workers) as pool:
        out = list(pool.map(cell, jobs))
    rows = []
    for spread in ns.spreads:
        for slow in (False, True):
            got = {(r["shift"], r["mode"]): r for r in out if r["spread"] == spread and r["slow"] == slow}
            aa = got[(0.0, "replicate")]
            det = lambda s, mode: got[(math.log(s), mode)]["rate"]
            rows.append([f"{spread:.0%}", "20% at +16%" if slow else "none",
                         f"{aa['rate']:.2%}", f"{aa['over_2pct']:.1%}", f"{aa['over_3pct']:.1%}", f"{aa['worst']:.1%}",
                         f"{det(1.10, '1'):.0%} / {det(1.10, '3'):.0%} / {det(1.10, 'replicate'):.0%}",
                         f"{det(1.30, '1'):.0%} / {det(1.30, '3'):.0%} / {det(1.30, 'replicate'):.0%}",
                         f"{aa['mean_runs']:.2f} / {got[(math.log(1.10), 'replicate')]['mean_runs']:.2f}"])
    headers = ["spread", "slow processes", "false slower", "baselines >2%", "baselines >3%", "worst baseline",
               "+10% found (1 / 3 runs / replicated)", "+30% found (1 / 3 / replicated)", "runs used (A/A / +10%)"]
    from bench_core.deciding.comparison import GateConfig

    g = GateConfig(**gate_kw)
    print(f"gate: alpha={g.alpha}, threshold={g.threshold:.0%}, min_runs={g.min_runs}, max_runs={g.max_runs} "
          f"(looks at {list(g.looks)}), guard {g.guard_rate:.1%}/{g.guard_baselines:.1%}; baselines of "
          f"{ns.baseline_runs} runs{' (TOLD which processes were slow: a ceiling)' if ns.told_slow else ''}; false alarms over "
          f"{ns.baselines} fixed baselines x {ns.candidates} candidates; detection over {ns.detect_trials} "
          f"candidates per cell")
    print(tabulate(rows, headers=headers, tablefmt="github"))
    if not ns.no_save:
        from pathlib import Path

        from bench_core.files.atomic import write_stamped_json

        path = write_stamped_json(Path(".bench"), "gate_sim", {"settings": vars(ns), "gate": g.__dict__, "cells": out})
        print(f"written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
