"""Does `--bench-against` decide this suite's own distributed scenarios right? A/A never slower; a rank step made
1.5x slower called slower, exit 1.

Run as its own benchmark, never in the test suite (real launches: minutes):
    python quality/distributed_against.py [--aa 2] [--rounds 6] [--quick]

It checks out this repository's HEAD into a temporary worktree, runs `pytest benchmarks/test_distributed.py -k
train_step --bench-against HEAD` there `--aa` times with nothing changed, then once with the DDP MLP builder's step
doing its work twice on every other call (1.5x the work, the same result on every rank), and reports each run's
exit code and each scenario's verdict, ratio and interval. Raw results go to .bench/distributed_against-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_core.files import atomic

SLOWER = '''

_ddp_mlp_as_committed = ddp_mlp


def ddp_mlp(ctx):
    inner = _ddp_mlp_as_committed(ctx)
    once, calls = inner.step, [0]

    def step():
        calls[0] += 1
        out = once()
        return once() if calls[0] % 2 else out
    inner.step = step
    return inner
'''


def run(tree: Path, args: list[str]) -> dict:
    out = tree / ".bench" / f"out-{time.monotonic_ns()}"
    started = time.monotonic()
    ran = subprocess.run([sys.executable, "-m", "pytest", "benchmarks/test_distributed.py", "-k", "train_step", "-q",
                          "-p", "no:cacheprovider", "--bench-against", "HEAD", "--bench-out", str(out),
                          "--bench-history", "none", *args], cwd=tree, capture_output=True, text=True)
    files = sorted(out.glob("session-*.json"))
    recs = json.loads(files[-1].read_text())["against"]["scenarios"] if files else []
    return {"exit": ran.returncode, "wall_s": round(time.monotonic() - started, 1), "load": os.getloadavg()[0],
            "scenarios": {r["scenario"]: {k: r["comparison"].get(k) for k in ("verdict", "ratio", "ci_low", "ci_high")}
                          for r in recs if r.get("comparison")},
            "tail": ran.stdout.strip().splitlines()[-3:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aa", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="--bench-quick (3 rounds) instead of --rounds")
    ns = ap.parse_args()
    args = ["--bench-quick"] if ns.quick else ["--bench-rounds", str(ns.rounds), "--bench-max-rounds", str(ns.rounds)]
    repo = Path(__file__).resolve().parents[1]
    report = {"args": args, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                                       text=True).stdout.strip(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="distributed-against-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), "HEAD"], cwd=repo, check=True,
                       capture_output=True)
        try:
            for k in range(ns.aa):
                report["runs"].append({"kind": "A/A", **run(tree, args)})
                print(json.dumps(report["runs"][-1]), flush=True)
            with (tree / "benchmarks" / "test_distributed.py").open("a") as f:
                f.write(SLOWER)
            report["runs"].append({"kind": "ddp_mlp 1.5x", **run(tree, args)})
            print(json.dumps(report["runs"][-1]), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, capture_output=True)
    path = atomic.write_stamped_json(repo / ".bench", "distributed_against", report)
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
