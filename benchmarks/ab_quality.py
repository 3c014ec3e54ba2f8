"""How good is the interleaved A/B decision on this machine? Measured, not assumed.

Each trial is one call of `bench_core.ab` with its default settings, in a fresh process:
  A/B  baseline = 20 matmuls per call, candidate = 19 (5% less work)  -> "faster" is a detection
  A/A  both 20 matmuls                                               -> any verdict but "no significant
                                                                         difference" is a false call
Usage: python benchmarks/ab_quality.py --ab-trials 10 --aa-trials 20
Writes the verdicts to .bench/ab_quality-<time>.json (never overwriting).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, torch
from bench_core.interleaved import ab
torch.set_num_threads(1)
calls_a, calls_b, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
a = torch.randn(256, 256)
def base():
    for _ in range(calls_a):
        torch.mm(a, a)
def cand():
    for _ in range(calls_b):
        torch.mm(a, a)
r = ab(base, cand, seed=seed)
print(json.dumps({"verdict": r.verdict, "speedup": r.speedup, "ci": [r.ci_low, r.ci_high], "p": r.p_value}))
"""


def trial(calls_a: int, calls_b: int, seed: int) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, str(calls_a), str(calls_b), str(seed)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ab-trials", type=int, default=10)
    ap.add_argument("--aa-trials", type=int, default=20)
    ap.add_argument("--calls", type=int, default=20)
    ns = ap.parse_args(argv)
    from tabulate import tabulate

    from bench_core import storage

    results = {"A/B": [], "A/A": []}
    for i in range(max(ns.ab_trials, ns.aa_trials)):  # alternate, so both see the same machine
        if i < ns.ab_trials:
            results["A/B"].append(trial(ns.calls, ns.calls - 1, i))
        if i < ns.aa_trials:
            results["A/A"].append(trial(ns.calls, ns.calls, 1000 + i))
        print(f"  trial {i} done", file=sys.stderr)
    ab, aa = results["A/B"], results["A/A"]
    detected = sum(r["verdict"] == "faster" for r in ab)
    false_calls = sum(r["verdict"] != "no significant difference" for r in aa)
    true_speedup = ns.calls / (ns.calls - 1)
    rows = [["A/B (candidate 1/20 less work)", f"{detected}/{len(ab)} detected as faster",
             f"{min(r['speedup'] for r in ab):.3f} .. {max(r['speedup'] for r in ab):.3f}"],
            ["A/A (identical)", f"{false_calls}/{len(aa)} called different",
             f"{min(r['speedup'] for r in aa):.3f} .. {max(r['speedup'] for r in aa):.3f}"]]
    print(f"work ratio {true_speedup:.3f}; one ab() call per trial, default settings, fresh process each")
    print(tabulate(rows, headers=["comparison", "outcome", "speedup estimates (min .. max)"]))
    path = storage.write_stamped_json(Path(".bench"), "ab_quality", {"settings": vars(ns), "results": results})
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
