"""How good is the interleaved A/B decision on this machine? Measured, not assumed.

Each trial is one A/B call with its default settings, in a fresh process:
  A/B  baseline = 20 units of work per call, candidate = 19 (5% less work)  -> "faster" is a detection
  A/A  both 20 units                                                       -> any verdict but "no significant
                                                                               difference" is a false call
Each side is its own instance, built separately (its own tensors, model, optimizer): the bias an instance
carries is part of what the decision must survive.
  --workload matmul  20 matmuls of 256x256 (compute-bound)
  --workload cnn     20 training steps of a small CNN (the workload where instance bias is largest)
  --mode plain       `ab(a, b)`: one instance per side, 60 interleaved pairs
  --mode rounds      `ab_rounds(make_a, make_b)`: both rebuilt every round, 12 rounds x 8 pairs
                     (looks at 12, 24, 36 rounds)
Usage: python quality/ab_quality.py --ab-trials 10 --aa-trials 20 [--workload cnn] [--mode rounds]
Writes the verdicts to .bench/ab_quality-<time>.json (never overwriting).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from against_quality import WORK_V1  # noqa: E402 - the workloads, one source for both quality scripts

# The worker: `build(kind, units)` from the workloads above, and 20 matmuls of 256x256 for --workload matmul
# (the workload of this script's earlier figures).
WORKER = WORK_V1 + r"""
import json, sys
from bench_core.workflows.ab import ab, ab_rounds
torch.set_num_threads(1)
workload, mode, calls_a, calls_b, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

def make(units):
    if workload == "matmul":
        a = torch.randn(256, 256)
        def step():
            for _ in range(units):
                torch.mm(a, a)
        return step
    return build(workload, units)

if mode == "plain":
    r = ab(make(calls_a), make(calls_b), seed=seed)
else:
    r = ab_rounds(lambda: make(calls_a), lambda: make(calls_b), seed=seed)
print(json.dumps({"verdict": r.verdict, "speedup": r.speedup, "ci": [r.ci_low, r.ci_high], "p": r.p_value,
                  "rounds_run": r.params.get("rounds_run")}))
"""


def trial(ns, calls_a: int, calls_b: int, seed: int) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, ns.workload, ns.mode, str(calls_a), str(calls_b), str(seed)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ab-trials", type=int, default=10)
    ap.add_argument("--aa-trials", type=int, default=20)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--workload", choices=("matmul", "cnn"), default="matmul")
    ap.add_argument("--mode", choices=("plain", "rounds"), default="plain")
    ns = ap.parse_args(argv)
    from tabulate import tabulate

    from bench_core.files import atomic

    results = {"A/B": [], "A/A": []}
    for i in range(max(ns.ab_trials, ns.aa_trials)):  # alternate, so both see the same machine
        if i < ns.ab_trials:
            results["A/B"].append(trial(ns, ns.calls, ns.calls - 1, i))
        if i < ns.aa_trials:
            results["A/A"].append(trial(ns, ns.calls, ns.calls, 1000 + i))
        print(f"  trial {i} done", file=sys.stderr)
    ab, aa = results["A/B"], results["A/A"]
    detected = sum(r["verdict"] == "faster" for r in ab)
    false_calls = sum(r["verdict"] in ("faster", "slower") for r in aa)
    covered = sum(r["ci"][0] is not None and r["ci"][0] <= 1.0 <= r["ci"][1] for r in aa)
    true_speedup = ns.calls / (ns.calls - 1)
    span = lambda rs: f"{min(r['speedup'] for r in rs):.3f} .. {max(r['speedup'] for r in rs):.3f}"
    rows = []   # a kind with no trials has no row
    if ab:
        rows.append(["A/B (candidate 1/20 less work)", f"{detected}/{len(ab)} detected as faster", span(ab)])
    if aa:
        rows.append(["A/A (identical code, separate instances)",
                     f"{false_calls}/{len(aa)} called different; the interval (at the level decided) covers 1.0 in "
                     f"{covered}/{len(aa)}", span(aa)])
    print(f"{ns.workload}, {ns.mode}: work ratio {true_speedup:.3f}; one call per trial, default settings, "
          f"fresh process each")
    print(tabulate(rows, headers=["comparison", "outcome", "speedup estimates (min .. max)"]))
    ran = {k: [r["rounds_run"] for r in v if r.get("rounds_run")] for k, v in results.items()}
    if any(ran.values()):   # rounds mode: what the sequential looks cost
        print("rounds run, mean: " + ", ".join(f"{k} {sum(v) / len(v):.1f}" for k, v in ran.items() if v))
    path = atomic.write_stamped_json(Path(".bench"), "ab_quality", {"settings": vars(ns), "results": results})
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
