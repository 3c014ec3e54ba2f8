"""How good is the regression gate on this machine? Measured, not assumed.

Runs the same CPU workload in separate processes (each process is one "run", measured with the suite's
default warmup and repeats), A = the workload, B = the same workload with `--slowdown` more work (10%
by default: 10 matmuls per call against 11). A and B processes alternate in time so both see the
same machine. Then it asks the gate, as `--bench-compare` would:

  A/A  baseline = K runs of A, candidate = M other runs of A   -> any "slower" is a false alarm
  A/B  baseline = K runs of A, candidate = M runs of B         -> "slower" is a detection

for many choices of runs, and prints the rates with their counts. Usage:

    python benchmarks/gate_quality.py --runs 12 --baseline-runs 5 --candidate-runs 1 3

Writes the raw runs and the rates to .bench/gate_quality-<time>.json (never overwriting).
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import sys, torch
from bench_core import Scenario, measure, storage
from bench_core.environment import fingerprint
from bench_core.session import DEFAULT_WARMUP, DEFAULT_REPEATS
torch.manual_seed(0)
calls, size, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
a, b = torch.randn(size, size), torch.randn(size, size)
def fn():
    for _ in range(calls):
        torch.mm(a, b)
sc = Scenario("gate_workload", ("compute",), {"shapes": [size, size], "dtype": "float32", "calls": "A or B"})
# the first measurement, then the confirmation measurements the session takes on a "slower" verdict
ms = [measure(fn, scenario=sc, warmup=DEFAULT_WARMUP, repeats=DEFAULT_REPEATS, threads=1)
      for _ in range(1 + int(sys.argv[4]))]
storage.write_session(out, ms, fingerprint("cpu"))
"""


def run_processes(n: int, calls_a: int, calls_b: int, size: int, folder: Path, confirm: int) -> dict[str, list[Path]]:
    paths = {"A": [], "B": []}
    for i in range(n):
        for label, calls in (("A", calls_a), ("B", calls_b)):  # alternate so both see the same machine
            sub = folder / f"{label}{i:02d}"
            subprocess.run([sys.executable, "-c", WORKER, str(calls), str(size), str(sub), str(confirm)],
                           check=True)
            paths[label].append(next(sub.glob("session-*.json")))
            print(f"  run {label}{i:02d} done", file=sys.stderr)
    return paths


def rates(runs_a, runs_b, k: int, m: int, trials: int, seed: int, config) -> dict:
    from bench_core.compare import SLOWER, FASTER, compare_runs, confirm, decide_family

    def judge(base, cand):
        (c,) = decide_family([compare_runs("gate_workload", base, cand, config)], config)
        return c

    def gate(base, cand_runs):
        """What the session does: decide on the first samples, confirm a "slower" with fresh ones."""
        first = judge(base, [r[0] for r in cand_runs])
        if first.verdict != SLOWER or config.confirm_repeats == 0:
            return first
        return confirm(first, judge(base, [r[0].pooled_with(*r[1:1 + config.confirm_repeats]) for r in cand_runs]))

    rng = random.Random(seed)
    out = {}
    for kind in ("A/A", "A/B"):
        verdicts = []
        for _ in range(trials):
            if kind == "A/A":
                chosen = rng.sample(range(len(runs_a)), k + m)
                base, cand = [runs_a[i][0] for i in chosen[:k]], [runs_a[i] for i in chosen[k:]]
            else:
                base = [runs_a[i][0] for i in rng.sample(range(len(runs_a)), k)]
                cand = [runs_b[i] for i in rng.sample(range(len(runs_b)), m)]
            verdicts.append(gate(base, cand).verdict)
        counts = {v: verdicts.count(v) for v in sorted(set(verdicts))}
        out[kind] = {"trials": trials, "slower": verdicts.count(SLOWER), "faster": verdicts.count(FASTER),
                     "counts": counts}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=12, help="processes of A, and as many of B")
    ap.add_argument("--baseline-runs", type=int, default=5)
    ap.add_argument("--candidate-runs", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--calls", type=int, default=10, help="matmuls per call of A")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--trials", type=int, default=400, help="random choices of runs per rate")
    ap.add_argument("--from-dir", default=None, help="reuse the runs of an earlier invocation")
    ap.add_argument("--run-noise", type=float, default=None, help="gate prior run-to-run spread (default: the gate's)")
    ap.add_argument("--prior-runs", type=float, default=None, help="gate prior weight in runs (default: the gate's)")
    ns = ap.parse_args(argv)

    from tabulate import tabulate

    from bench_core import storage
    from bench_core.compare import GateConfig

    calls_b = round(ns.calls * (1 + ns.slowdown))
    folder = Path(ns.from_dir) if ns.from_dir else Path(tempfile.mkdtemp(prefix="gate_quality-"))
    if not ns.from_dir:
        print(f"measuring {ns.runs} runs each of A ({ns.calls} matmuls) and B ({calls_b}) in {folder}",
              file=sys.stderr)
        run_processes(ns.runs, ns.calls, calls_b, ns.size, folder, GateConfig().confirm_repeats)
    load = lambda label: [storage.load_session(p)[1] for p in sorted(folder.glob(f"{label}*/session-*.json"))]
    runs_a, runs_b = load("A"), load("B")
    config = GateConfig(**{k: v for k, v in (("run_noise", ns.run_noise), ("prior_runs", ns.prior_runs))
                           if v is not None})
    rows, results = [], []
    for m in ns.candidate_runs:
        r = rates(runs_a, runs_b, ns.baseline_runs, m, ns.trials, seed=m, config=config)
        results.append({"baseline_runs": ns.baseline_runs, "candidate_runs": m, **r})
        aa, ab = r["A/A"], r["A/B"]
        rows.append([ns.baseline_runs, m, f"{aa['slower'] / aa['trials']:.1%} ({aa['slower']}/{aa['trials']})",
                     f"{ab['slower'] / ab['trials']:.1%} ({ab['slower']}/{ab['trials']})",
                     ", ".join(f"{k} {v}" for k, v in aa["counts"].items()),
                     ", ".join(f"{k} {v}" for k, v in ab["counts"].items())])
    import numpy as np

    med = lambda rs: [float(np.median(x[0].primary_ms)) for x in rs]
    ma, mb = med(runs_a), med(runs_b)
    between = float(np.std(np.log(ma), ddof=1))
    within = float(np.mean([np.std(x[0].primary_ms, ddof=1) / np.mean(x[0].primary_ms) for x in runs_a]))
    print(f"\nruns: {len(runs_a)} A + {len(runs_b)} B, {runs_a[0][0].repeats} samples each; "
          f"true B/A ratio of medians {np.median(mb) / np.median(ma):.3f}; "
          f"within-run CV {within:.1%}, run-to-run spread of medians {between:.1%}")
    print(f"gate: alpha={config.alpha}, threshold={config.threshold:.0%}, prior run noise {config.run_noise:.0%}, "
          f"confirmation repeats {config.confirm_repeats}")
    print(tabulate(rows, headers=["baseline runs", "candidate runs", "A/A false alarms", f"A/B detected (+{ns.slowdown:.0%})",
                                  "A/A verdicts", "A/B verdicts"]))
    doc = {"settings": vars(ns), "gate": config.__dict__, "between_run_sd_log": between, "within_run_cv": within,
           "medians_a": ma, "medians_b": mb, "rates": results, "runs_dir": str(folder)}
    path = storage.write_stamped_json(Path(".bench"), "gate_quality", doc)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
