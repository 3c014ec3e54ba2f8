"""How good is `--bench-against` on this machine? A/A and real slowdowns, quiet and with a competing process.

Run as its own benchmark, never in the test suite (it takes minutes):
    python quality/against_quality.py [--trials 30] [--conditions quiet,loaded] [--rounds 10 --pairs 4]
    python quality/against_quality.py --isolated --trials 30 --conditions quiet,loaded   # process mode
    python quality/against_quality.py --pb ...    # the same workloads as pytest-benchmark tests

It creates a throwaway git repository with two real commits. The first has nine scenarios: three workloads
(compute-bound matmul, memory-bound elementwise, a small CNN training step), each of 20 units of work. The
second commit changes their source: "same" (a comment: nothing measured changes, an A/A), "plus5" (21 units,
5% more work) and "plus10" (22 units). Each trial is one `pytest --bench-against HEAD~1` in a fresh process (with
`--bench-threads 1` unless `--threads auto`: torch's own, the suite's default), at the suite's defaults otherwise, deciding all nine scenarios as one family. "loaded" runs
a busy-looping process beside it the whole time. Every few trials a plain `pytest` of the same scenarios is
timed, for the cost ratio.

Reported per condition and workload: false "slower"/"faster" on the A/A, how often the A/A's 95% interval
(the t-interval over rounds, unadjusted) covers 1.0, how often +5% and +10% are called slower, the rounds each
ran (the first look's, or more for a possible slowdown), and the wall time of a --bench-against run against a
plain run. Raw results go to .bench/against_quality-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from scipy import stats as st
from tabulate import tabulate

from bench_core.files import atomic
from bench_core.timing.protocol import unit_means

WORK_V1 = '''
import torch

UNITS = {"same": 20, "plus5": 20, "plus10": 20}


def build(kind, units):
    torch.manual_seed(0)
    if kind == "matmul":
        a, b = torch.randn(192, 192), torch.randn(192, 192)

        def step():
            for _ in range(units):
                a @ b
    elif kind == "memory":
        x = torch.randn(2_000_000)          # 8 MB: past the 1 MB of L2 per core

        def step():
            for _ in range(units):
                x.mul(1.0001).add_(1.0)
    else:
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 10))
        opt = torch.optim.AdamW(m.parameters(), 1e-3)
        xb, yb = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))

        def step():
            for _ in range(units):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(xb), yb).backward()
                opt.step()
    return step
'''

WORK_V2 = WORK_V1.replace('UNITS = {"same": 20, "plus5": 20, "plus10": 20}',
                          '# a change to the code that changes nothing measured for "same"\n'
                          'UNITS = {"same": 20, "plus5": 21, "plus10": 22}')

TEST = '''
import pytest
from bench_core import Scenario
import work


@pytest.mark.parametrize("variant", ["same", "plus5", "plus10"])
@pytest.mark.parametrize("kind", ["matmul", "memory", "cnn"])
def test_workload(bench, kind, variant):
    bench.run(Scenario(f"{kind}[{variant}]", ("compute",), {"units_kind": kind}), work.build(kind, work.UNITS[variant]))
'''

# the same nine scenarios written as a pytest-benchmark suite (--pb): bench_core adopts the `benchmark` fixture
TEST_PB = '''
import pytest
import work


@pytest.mark.parametrize("variant", ["same", "plus5", "plus10"])
@pytest.mark.parametrize("kind", ["matmul", "memory", "cnn"])
def test_workload(benchmark, kind, variant):
    benchmark(work.build(kind, work.UNITS[variant]))
'''

CONFTEST = '''
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))
'''

COMPETITOR = "while True:\n    sum(i * i for i in range(100000))\n"


ISOLATED = '''
# registered at import: a second copy of this module cannot load into the same process, so
# --bench-against runs each side in a pytest process of its own (the mode this variant measures)
LIB = torch.library.Library("against_quality_isolated", "DEF")
LIB.define("noop(Tensor x) -> Tensor")
'''


def make_repo(root: Path, isolated: bool = False, pb: bool = False) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="q", GIT_AUTHOR_EMAIL="q@example.invalid", GIT_COMMITTER_NAME="q",
               GIT_COMMITTER_EMAIL="q@example.invalid")

    def git(*args):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, env=env)

    (root / "benchmarks").mkdir(parents=True)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "benchmarks" / "test_workloads.py").write_text(textwrap.dedent(TEST_PB if pb else TEST))
    extra = ISOLATED if isolated else ""
    (root / "benchmarks" / "work.py").write_text(WORK_V1.replace("import torch\n", "import torch\n" + extra, 1))
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base: 20 units everywhere")
    (root / "benchmarks" / "work.py").write_text(WORK_V2.replace("import torch\n", "import torch\n" + extra, 1))
    git("commit", "-qam", "same (comment only), plus5 (21 units), plus10 (22 units)")


THREADS = ["--bench-threads", "1"]   # the figures in docs/side-by-side.md were taken so; --threads auto: the default


def pytest_run(root: Path, out: Path, extra: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider",
                           *THREADS, "--bench-out", str(out), *extra],
                          cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1: a scenario was (rightly or wrongly) called slower
        raise RuntimeError(f"pytest failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return wall


def trial_rows(session_file: Path) -> list[dict]:
    doc = json.loads(session_file.read_text())
    rows = []
    for rec in doc["against"]["scenarios"]:
        c = rec["comparison"]
        parts = rec["rounds"]   # a list in older files of worker mode: one per pair of processes
        logs = np.asarray([np.mean(p["round_log_ratios"]) for p in parts] if isinstance(parts, list)
                          else unit_means(parts["round_log_ratios"], parts.get("units") or ()))
        n = logs.size
        se = logs.std(ddof=1) / math.sqrt(n)
        q = st.t.ppf(0.975, n - 1)
        # "matmul[plus5]" from a bench test; "test_workload[matmul-plus5]" from the pytest-benchmark suite
        inside = rec["scenario"].rstrip("]").split("[", 1)[1]
        kind, variant = inside.split("-") if "-" in inside else (rec["scenario"].split("[")[0], inside)
        rows.append({"kind": kind, "variant": variant, "verdict": c["verdict"], "ratio": c["ratio"],
                     "ci95": [math.exp(logs.mean() - q * se), math.exp(logs.mean() + q * se)],
                     "ci_decided": [c["ci_low"], c["ci_high"]], "confidence": c["confidence"], "rounds": n,
                     "mode": ("pairs of processes" if isinstance(parts, list) else
                              "forked rounds, pairs of servers" if parts.get("units") else
                              "forked rounds" if "why_processes" in rec["code"] else "one process")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--threads", default="1", help="--bench-threads of every run ('auto': torch's own, the default)")
    ap.add_argument("--malloc", default=None, choices=("as-is", "pinned"), help="--bench-malloc (the suite's default)")
    ap.add_argument("--conditions", default="quiet,loaded")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--max-rounds", type=int, default=None, help="--bench-max-rounds (the last look)")
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--worker-pairs", type=int, default=None, help="--bench-worker-pairs (worker mode)")
    ap.add_argument("--plain-every", type=int, default=5, help="time a plain run every N trials")
    ap.add_argument("--pb", action="store_true",
                    help="the scenarios written as pytest-benchmark tests (the `benchmark` fixture, adopted)")
    ap.add_argument("--isolated", action="store_true",
                    help="code that cannot load twice (a torch.library registration): measures process mode")
    ns = ap.parse_args(argv)
    THREADS[:] = ["--bench-threads", ns.threads] + (["--bench-malloc", ns.malloc] if ns.malloc else [])
    extra = ["--bench-against", "HEAD~1"]
    extra += ["--bench-rounds", str(ns.rounds)] if ns.rounds else []
    extra += ["--bench-max-rounds", str(ns.max_rounds)] if ns.max_rounds else []
    extra += ["--bench-pairs", str(ns.pairs)] if ns.pairs else []
    extra += ["--bench-worker-pairs", str(ns.worker_pairs)] if ns.worker_pairs else []
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="against-quality-") as tmp:
        root = Path(tmp) / "repo"
        make_repo(root, ns.isolated, ns.pb)
        for cond in ns.conditions.split(","):
            competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if cond == "loaded" else None
            try:
                res = results[cond] = {"trials": [], "wall_against": [], "wall_plain": []}
                for t in range(ns.trials):
                    out = Path(tmp) / f"{cond}-{t}"
                    res["wall_against"].append(pytest_run(root, out, extra))
                    res["trials"].append(trial_rows(next(out.glob("session-*.json"))))
                    if t % ns.plain_every == 0:
                        res["wall_plain"].append(pytest_run(root, Path(tmp) / f"{cond}-plain-{t}", []))
                    print(f"{cond} trial {t + 1}/{ns.trials}: {res['wall_against'][-1]:.1f} s", flush=True)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()
    table = []
    for cond, res in results.items():
        cost = np.median(res["wall_against"]) / np.median(res["wall_plain"])
        for kind in ("matmul", "memory", "cnn"):
            def rows(variant):
                return [r for trial in res["trials"] for r in trial if r["kind"] == kind and r["variant"] == variant]
            aa, p5, p10 = rows("same"), rows("plus5"), rows("plus10")
            false = sum(r["verdict"] in ("slower", "faster") for r in aa)
            cover = sum(r["ci95"][0] <= 1.0 <= r["ci95"][1] for r in aa)
            det5 = sum(r["verdict"] == "slower" for r in p5)
            det10 = sum(r["verdict"] == "slower" for r in p10)

            def rounds(rs):
                return f"{np.mean([r['rounds'] for r in rs]):.1f}"
            spread = np.std([math.log(r["ratio"]) for r in aa], ddof=1)
            table.append([cond, kind, f"{false}/{len(aa)}", f"{cover}/{len(aa)}", f"{spread:.1%}",
                          f"{det5}/{len(p5)} (median ratio {np.median([r['ratio'] for r in p5]):.3f})",
                          f"{det10}/{len(p10)} (median ratio {np.median([r['ratio'] for r in p10]):.3f})",
                          f"{rounds(aa)} / {rounds(p5)} / {rounds(p10)}",
                          f"{np.median(res['wall_against']):.1f} s / {np.median(res['wall_plain']):.1f} s = {cost:.1f}x"])
    modes = sorted({r["mode"] for res in results.values() for t in res["trials"] for r in t})
    print(f"mode(s) that ran: {', '.join(modes)} (rounds column: process pairs where pairs of processes ran)")
    print(tabulate(table, headers=["condition", "workload", "A/A false calls", "A/A 95% CI covers 1",
                                   "A/A spread of ratio", "+5% called slower", "+10% called slower",
                                   "rounds run (A/A / +5% / +10%)",
                                   "wall: against / plain"]))
    path = atomic.write_stamped_json(Path(".bench"), "against_quality", {"settings": vars(ns), "results": results})
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
