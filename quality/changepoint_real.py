"""Change points in real histories: 30 real `pytest benchmarks` runs of a scenario recorded into a history store,
its work 10% larger from run 19 on (run index 18), and what `bench-core history` finds there.

    python quality/changepoint_real.py [--histories 4] [--runs 30] [--workloads matmul,memory]

Each run is a fresh `pytest` process at the suite's defaults (`--bench-threads 1`), so the history holds this
machine's real run-to-run spread, slow processes included. Reported per workload: the runs' measured spread (sd of
the run-level mean log time, from the runs before the step), how often a change point was found whose range of runs
holds run 19, the ranges' widths, and false change points before the step. Raw results go to
.bench/changepoint_real-<time>.json.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench_core.files import atomic

TEST = '''
import os
import torch
from bench_core import Scenario

UNITS = round(20 * float(os.environ["CP_LEVEL"]))


def test_{kind}(bench):
    torch.manual_seed(0)
    if "{kind}" == "matmul":
        a = torch.randn(192, 192)

        def step():
            for _ in range(UNITS):
                a @ a
    else:
        x = torch.randn(2_000_000)

        def step():
            for _ in range(UNITS):
                x.mul(1.0001).add_(1.0)
    bench.run(Scenario("{kind}", ("compute",)), step)
'''


def history(root: Path, kind: str, runs: int, at: int, step: float, index: int) -> dict:
    from bench_core.files.history import History
    from bench_core.workflows.scenario_history import scenario_history

    folder = root / f"{kind}-{index}"
    (folder / "benchmarks").mkdir(parents=True)
    (folder / "benchmarks" / f"test_{kind}.py").write_text(TEST.format(kind=kind))
    db = folder / "history.sqlite"
    for r in range(runs):
        env = dict(os.environ, CP_LEVEL=str(step if r >= at else 1.0))
        subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider",
                        "--bench-threads", "1", "--bench-out", str(folder / "out"), "--bench-history", str(db)],
                       cwd=folder, env=env, capture_output=True, check=True)
    with History(db) as h:
        (mh,) = scenario_history(h, kind)
    logs = [p.mean_log for p in mh.points]
    return {"mean_logs": logs, "changes": [{"index": c.point.index, "first_low": c.point.first_low,
                                             "first_high": c.point.first_high, "ratio": c.point.ratio,
                                             "p": c.point.p_value} for c in mh.changes]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--histories", type=int, default=4)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--workloads", default="matmul,memory")
    ns = ap.parse_args()
    at, out = 18, {}
    with tempfile.TemporaryDirectory(prefix="changepoint-real-") as tmp:
        for kind in ns.workloads.split(","):
            found = [history(Path(tmp), kind, ns.runs, at, 1.10, i) for i in range(ns.histories)]
            out[kind] = found
            spread = np.mean([np.std(f["mean_logs"][:at], ddof=1) for f in found])
            held = sum(any(c["first_low"] <= at <= c["first_high"] for c in f["changes"]) for f in found)
            false = sum(sum(c["first_high"] < at - 1 for c in f["changes"]) for f in found)
            widths = [c["first_high"] - c["first_low"] + 1 for f in found for c in f["changes"]]
            print(f"{kind}: run-to-run spread {math.expm1(spread):.1%}; +10% step's range holds run {at + 1} in "
                  f"{held}/{len(found)}; widths {widths}; change points before the step {false}", flush=True)
    print(f"written to {atomic.write_stamped_json(Path('.bench'), 'changepoint_real', out)}")


if __name__ == "__main__":
    main()
