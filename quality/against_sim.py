"""How do `--bench-against`'s looks trade rounds for power, under noise we choose? A simulation driven by the
decision's own code (`compare.Judge`: `estimate_rounds`, `decide_family`, the chase rule `possible_slowdown`), so
what it reports is what a scenario's rounds would decide.

The model of a round: its log ratio (candidate / baseline) is the change, plus each side's instance bias
(`inst`, one draw per side and round: a forked child's memory layout), plus each pair's own noise (`pair`, the two
samples of a pair), with t-distributed tails (4 degrees of freedom, scaled to the same sd) unless --normal; a round's
estimate is the median of its pairs, as in the suite. Each trial decides one scenario of a family of nine (the
quality repository's), threshold 2%, alpha 0.01, going from look to look while the chase rule asks.

Reported per noise level and change (1.00: an A/A, 1.05, 1.10) and per schedule: how often "slower" was said,
how often "unchanged" (A/A only), and the mean rounds run.

    python quality/against_sim.py                                   # the table in docs/side-by-side.md
    python quality/against_sim.py --schedules 12:36:12,8:48:8 --trials 1000
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from bench_core.core.scenario import Scenario
from bench_core.deciding.comparison import GateConfig
from bench_core.deciding.sequential import planned_looks
from bench_core.timing.protocol import Rounds
from bench_core.timing.sampling import Sample
from bench_core.workflows.side_by_side.compare import Judge

# (inst, pair): sd of each side's instance bias and of a pair's noise, in log time; a round's ratio spreads by
# sqrt(2 inst^2 + pair^2 / 2): 0.8%, 1.6% (one process), 3.2%, 5.5%, 8.6%, 12.3%, 17.9% (forked rounds)
NOISE = ((0.003, 0.01), (0.005, 0.02), (0.01, 0.04), (0.03, 0.05), (0.05, 0.07), (0.08, 0.07), (0.12, 0.08))
CHANGES = (1.0, 1.05, 1.10)
FAMILY, PAIRS = 9, 2


def draw(rng, n: int, normal: bool) -> np.ndarray:
    return rng.standard_normal(n) if normal else rng.standard_t(4, n) / math.sqrt(2)


def trial(rng, judge: Judge, looks: tuple[int, ...], change: float, inst: float, pair: float, normal: bool):
    """One scenario's sequential rounds: (verdict, rounds run)."""
    last = looks[-1]
    logs = (math.log(change) + inst * (draw(rng, last, normal) - draw(rng, last, normal))[:, None]
            + pair * draw(rng, last * PAIRS, normal).reshape(last, PAIRS))
    base = tuple((Sample(10.0, None),) * PAIRS for _ in range(last))
    cand = tuple(tuple(Sample(10.0 * math.exp(x), None) for x in row) for row in logs)
    n = looks[0]
    while True:
        res = Rounds(base[:n], cand[:n])
        c = judge(res, "host")
        later = [k for k in looks if k > n]
        if not later or not judge.go_on(res):
            return c.verdict, n
        n = later[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--schedules", default="12:36:12,8:48:8",
                    help="FIRST:LAST:EVERY,... (the looks: planned_looks(FIRST, LAST, EVERY))")
    ap.add_argument("--normal", action="store_true", help="normal noise instead of t(4) tails")
    ap.add_argument("--seed", type=int, default=7)
    ns = ap.parse_args(argv)
    schedules = [planned_looks(*map(int, s.split(":"))) for s in ns.schedules.split(",")]
    print("inst   pair   round  change | " + " | ".join(f"looks {','.join(map(str, s))}: slower, unchanged, rounds"
                                                          for s in schedules))
    for inst, pair in NOISE:
        for change in CHANGES:
            cells = []
            for looks in schedules:
                rng = np.random.default_rng(ns.seed)
                judge = Judge(Scenario("s", ("compute",)), "cpu", 0.02, GateConfig(threshold=0.02), FAMILY, looks)
                out = [trial(rng, judge, looks, change, inst, pair, ns.normal) for _ in range(ns.trials)]
                slower = sum(v == "slower" for v, _ in out) / ns.trials
                unchanged = sum(v == "unchanged" for v, _ in out) / ns.trials
                cells.append(f"{100 * slower:5.1f}% {100 * unchanged:5.1f}% {np.mean([n for _, n in out]):5.1f}")
            spread = math.sqrt(2 * inst ** 2 + pair ** 2 / PAIRS)
            print(f"{inst:.3f}  {pair:.3f}  {100 * spread:4.1f}%  {change:.2f}   | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
