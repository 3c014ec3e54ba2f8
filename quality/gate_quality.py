"""How good is the stored-baseline gate on this machine? Measured, not assumed.

Runs the same CPU workloads in separate processes; each process is one "run" of four scenarios
(matmuls of two sizes, a memory-bound elementwise chain, a small conv), measured with the suite's
default warmup and repeats. A = the workloads, B = the same with `--slowdown` more work in every
scenario. A and B processes alternate in time so both see the same machine. Then it asks the gate,
as `--bench-compare` would (variance prior fitted from the baseline's scenarios, decided one scenario
at a time with Bonferroni over the four, fresh processes drawn while a possible slowdown is undecided):

  A/A  baseline = K runs of A, candidate = other runs of A   -> any "slower" is a false alarm
  A/B  baseline = K runs of A, candidate = runs of B         -> "slower" is a detection
  B/A  baseline = K runs of B, candidate = runs of A         -> "faster" is a detection (a speedup)

Each trial draws a baseline and a candidate's processes at random from the measured pool (processes
are never reused within a trial). Usage:

    python quality/gate_quality.py --runs 16 --baseline-runs 5

It also asks whether a process's level is shared by its scenarios (`shared_level`): if it were, the
other scenarios of a run could tell a slow process from a regression.

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
from bench_core import Scenario, measure
from bench_core.files import storage
from bench_core.files.machine import fingerprint
from bench_core.timing.counts import DEFAULT_REPEATS, DEFAULT_WARMUP
from bench_core.workflows.malloc import settle_malloc
malloc = settle_malloc(sys.argv[3])   # as the plugin does at a session's start (--bench-malloc)
torch.manual_seed(0)
factor, out = float(sys.argv[1]), sys.argv[2]
a, b = torch.randn(256, 256), torch.randn(256, 256)
c, d = torch.randn(96, 96), torch.randn(96, 96)
v = torch.randn(1 << 20)
conv = torch.nn.Conv2d(8, 16, 3, padding=1)
img = torch.randn(4, 8, 32, 32)
def times(n):
    return max(1, round(n * factor))
def mm256():
    for _ in range(times(10)):
        torch.mm(a, b)
def mm96():
    for _ in range(times(40)):
        torch.mm(c, d)
def elementwise():
    x = v
    for _ in range(times(10)):
        x = x * 1.0001 + 0.5
def cnn():
    with torch.no_grad():
        for _ in range(times(10)):
            conv(img)
results = [measure(fn, scenario=Scenario(fn.__name__, ("compute",), {"variant": "A or B"}), warmup=DEFAULT_WARMUP,
                   repeats=DEFAULT_REPEATS, threads=1) for fn in (mm256, mm96, elementwise, cnn)]
storage.write_session(out, results, {**fingerprint("cpu"), "malloc": malloc})
"""


def run_processes(n: int, slowdown: float, folder: Path, malloc: str = "as-is") -> None:
    for i in range(n):
        for label, factor in (("A", 1.0), ("B", 1.0 + slowdown)):  # alternate so both see the same machine
            sub = folder / f"{label}{i:02d}"
            subprocess.run([sys.executable, "-c", WORKER, str(factor), str(sub), malloc], check=True)
            print(f"  run {label}{i:02d} done", file=sys.stderr)


def rates(runs_a, runs_b, k: int, trials: int, seed: int, config, fixed: int | None) -> dict:
    """Runs are lists of {scenario: Measurement}, one per process. `fixed`: that many candidate runs and
    no replication; None: the gate's own protocol, drawing fresh processes from the pool."""
    from bench_core.deciding.estimate import estimate, noise_prior
    from bench_core.deciding.gate import decide_family
    from bench_core.deciding.verdicts import FASTER, SLOWER
    from bench_core.deciding.sequential import replicate_until_decided

    rng = random.Random(seed)
    names = sorted(runs_a[0])
    out = {}
    # B/A: the slower code as the baseline, so the change is a speedup, which the gate chases as it chases a slowdown
    for kind in ("A/A", "A/B", "B/A"):
        verdicts, used, by_name, two_level = [], [], {n: 0 for n in names}, 0
        own, other = (runs_b, runs_a) if kind == "B/A" else (runs_a, runs_b)
        for _ in range(trials):
            order = rng.sample(range(len(own)), len(own))
            base_runs = [own[i] for i in order[:k]]
            pool = [own[i] for i in order[k:]] if kind == "A/A" else rng.sample(other, len(other))
            base = {n: [r[n] for r in base_runs] for n in names}
            prior = noise_prior(base)
            two_level += prior is not None and prior.slow is not None
            for name in names:
                def judge(runs, name=name):
                    (c,) = decide_family([estimate(name, base[name], [r[name] for r in runs], config, prior)], config,
                                         family_size=len(names))
                    return c
                draw = iter(pool)
                first = [next(draw) for _ in range(fixed or 1)]
                c = replicate_until_decided(first, judge, None if fixed else lambda: next(draw, None), config)
                verdicts.append(c.verdict)
                used.append(c.candidate_runs)
                by_name[name] += c.verdict == (FASTER if kind == "B/A" else SLOWER)
        out[kind] = {"decisions": len(verdicts), "slower": verdicts.count(SLOWER), "faster": verdicts.count(FASTER),
                     "counts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
                     "mean_runs": sum(used) / len(used), "slower_by_scenario": by_name,
                     "two_level_baselines": two_level}
    return out


def shared_level(runs) -> dict:
    """Is a slow process slow in every scenario it runs? From one side's runs ({scenario: Measurement} per
    process): the correlation of the scenarios' run-to-run deviations (log median minus the scenario's mean
    over runs), and each scenario's spread before and after subtracting its process's level as read from
    the *other* scenarios (their median deviation). A level shared across scenarios would show as high
    correlations and a smaller spread after; this is the fact a run-level slow-process model would need."""
    import numpy as np

    names = sorted(runs[0])
    dev = np.log([[r[n].summary.median for n in names] for r in runs])
    dev -= dev.mean(axis=0)
    corr = np.corrcoef(dev.T)
    off = corr[~np.eye(len(names), dtype=bool)]
    level = np.array([[np.median(np.delete(row, j)) for j in range(len(names))] for row in dev])
    return {"mean_correlation": float(off.mean()), "correlations": corr.round(3).tolist(), "scenarios": names,
            "spread": dict(zip(names, map(float, dev.std(axis=0, ddof=1)))),
            "spread_after_level": dict(zip(names, map(float, (dev - level).std(axis=0, ddof=1))))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=16, help="processes of A, and as many of B")
    ap.add_argument("--baseline-runs", type=int, default=5)
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--trials", type=int, default=200, help="random draws of baseline and candidates per rate")
    ap.add_argument("--from-dir", default=None, help="reuse the runs of an earlier invocation")
    ap.add_argument("--malloc", default="as-is", choices=("pinned", "as-is"),
                    help="glibc malloc's thresholds in each process, as --bench-malloc (as-is: the suite's default)")
    ns = ap.parse_args(argv)

    import numpy as np
    from tabulate import tabulate

    from bench_core.files import atomic, storage
    from bench_core.deciding.comparison import GateConfig

    if ns.runs < ns.baseline_runs + GateConfig().max_runs:
        ap.error(f"--runs must be at least --baseline-runs + {GateConfig().max_runs} (a baseline and a candidate's "
                 f"replication budget, drawn without reuse)")
    folder = Path(ns.from_dir) if ns.from_dir else Path(tempfile.mkdtemp(prefix="gate_quality-"))
    if not ns.from_dir:
        print(f"measuring {ns.runs} processes each of A and B (+{ns.slowdown:.0%} work) in {folder}", file=sys.stderr)
        run_processes(ns.runs, ns.slowdown, folder, ns.malloc)
    load = lambda label: [{m.name: m for m in storage.load_session(p)[1]}
                          for p in sorted(folder.glob(f"{label}*/session-*.json"))]
    runs_a, runs_b = load("A"), load("B")
    config = GateConfig()
    rows, results = [], []
    for label, fixed in (("1 run", 1), ("3 runs", 3), (f"replicated (up to {config.max_runs})", None)):
        r = rates(runs_a, runs_b, ns.baseline_runs, ns.trials, seed=7, config=config, fixed=fixed)
        results.append({"candidates": label, **r})
        aa, ab, ba = r["A/A"], r["A/B"], r["B/A"]
        per = ", ".join(f"{n} {k}" for n, k in ab["slower_by_scenario"].items())
        back = ", ".join(f"{n} {k}" for n, k in ba["slower_by_scenario"].items())
        rows.append([label, f"{aa['slower'] / aa['decisions']:.2%} ({aa['slower']}/{aa['decisions']})",
                     f"{aa['faster'] / aa['decisions']:.2%} ({aa['faster']}/{aa['decisions']})",
                     f"{ab['slower'] / ab['decisions']:.1%} ({ab['slower']}/{ab['decisions']}: {per} of {ns.trials})",
                     f"{ba['faster'] / ba['decisions']:.1%} ({ba['faster']}/{ba['decisions']}: {back} of {ns.trials})",
                     f"{aa['mean_runs']:.2f} / {ab['mean_runs']:.2f} / {ba['mean_runs']:.2f}"])
    spread = {}
    for name in sorted(runs_a[0]):
        meds_a = np.array([r[name].summary.median for r in runs_a])
        meds_b = np.array([r[name].summary.median for r in runs_b])
        spread[name] = {"run_to_run": float(np.std(np.log(meds_a), ddof=1)),
                        "b_over_a": float(np.median(meds_b) / np.median(meds_a))}
    print(f"\n{len(runs_a)} + {len(runs_b)} processes, {runs_a[0][next(iter(runs_a[0]))].repeats} samples per "
          f"scenario; run-to-run spread of A's medians and measured B/A: " +
          ", ".join(f"{n} {s['run_to_run']:.1%} ({s['b_over_a']:.3f})" for n, s in spread.items()))
    print(f"gate: alpha={config.alpha}, threshold={config.threshold:.0%}, min_runs={config.min_runs}, "
          f"max_runs={config.max_runs}; {ns.trials} draws x {len(spread)} scenarios per cell")
    print(tabulate(rows, headers=["candidate processes", "A/A false slower", "A/A false faster",
                                  f"A/B slower detected (+{ns.slowdown:.0%})", "B/A faster detected",
                                  "runs used A/A / A/B / B/A"], tablefmt="github"))
    two = {kind: results[0][kind]["two_level_baselines"] for kind in ("A/A", "A/B")}
    print(f"baselines whose runs were fitted as two levels (slow processes apart): {two['A/A']} of the A/A draws' "
          f"{ns.trials}, {two['A/B']} of the A/B draws'")
    shared = {label: shared_level(runs) for label, runs in (("A", runs_a), ("B", runs_b))}
    for label, sh in shared.items():
        print(f"process level shared across scenarios ({label}): mean correlation {sh['mean_correlation']:+.2f}; "
              "spread before -> after removing the other scenarios' level: " +
              ", ".join(f"{n} {sh['spread'][n]:.1%} -> {sh['spread_after_level'][n]:.1%}" for n in sh["scenarios"]))
    doc = {"settings": vars(ns), "gate": config.__dict__, "spread": spread, "rates": results, "runs_dir": str(folder),
           "shared_level": shared}
    path = atomic.write_stamped_json(Path(".bench"), "gate_quality", doc)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
