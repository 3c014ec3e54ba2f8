"""How good is `bench-core bisect` on real timings? A throwaway repository of 16 commits after GOOD with two real
workloads, one slowed by 25% at one commit and the other by 10% at another, and A/A ranges where nothing changes.

    python quality/bisect_quality.py [--aa 30] [--found 3] [--scenarios mm,mem]

Each bisect is `bench-core bisect GOOD BAD -k NAME -- benchmarks --bench-threads 1` (the suite's defaults
otherwise). Reported: for each slowed scenario, the commit found against the true one and the decisions used
(at most ceil(log2 16) + 2 = 6), and for A/A ranges how often the answer was "no change in range". Raw results go
to .bench/bisect_quality-<time>.json.
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

WORK = '''
import torch

UNITS = {{"mm": {mm}, "mem": {mem}}}


def build(kind):
    torch.manual_seed(0)
    if kind == "mm":
        a = torch.randn(192, 192)
        return lambda: [a @ a for _ in range(UNITS["mm"])]
    x = torch.randn(2_000_000)
    return lambda: [x.mul(1.0001).add_(1.0) for _ in range(UNITS["mem"])]
'''

TEST = '''
import pytest
from bench_core import Scenario
import work


@pytest.mark.parametrize("kind", ["mm", "mem"])
def test_workload(bench, kind):
    bench.run(Scenario(kind, ("compute",)), work.build(kind))
'''

CONFTEST = "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent / 'benchmarks'))\n"
MM_AT, MEM_AT = 5, 12     # the commits (1-based after GOOD) that slow each workload


def make_repo(root: Path) -> list[str]:
    env = dict(os.environ, GIT_AUTHOR_NAME="q", GIT_AUTHOR_EMAIL="q@example.invalid", GIT_COMMITTER_NAME="q",
               GIT_COMMITTER_EMAIL="q@example.invalid")

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True, env=env).stdout

    (root / "benchmarks").mkdir(parents=True)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "benchmarks" / "test_w.py").write_text(TEST)
    (root / ".gitignore").write_text(".bench/\n")
    git("init", "-q")
    shas = []
    for i in range(17):
        mm, mem = (25 if i >= MM_AT else 20), (22 if i >= MEM_AT else 20)
        (root / "benchmarks" / "work.py").write_text(WORK.format(mm=mm, mem=mem) + f"# commit {i}\n")
        git("add", "-A")
        git("commit", "-qm", f"commit {i}")
        shas.append(git("rev-parse", "HEAD").strip())
    return shas


def bisect(root: Path, good: str, bad: str, name: str) -> dict:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bench_core", "bisect", good, bad, "-k", name, "--repo", str(root), "--",
                    "benchmarks", "--bench-threads", "1"], capture_output=True, text=True)
    record = sorted((root / ".bench").glob("bisect-*.json"))[-1]
    doc = json.loads(record.read_text())
    record.unlink()
    return {"outcome": doc["outcome"], "first_bad": doc["first_bad"], "decisions": len(doc["steps"]),
            "wall_s": time.perf_counter() - t0, "steps": doc["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aa", type=int, default=30, help="A/A ranges to bisect")
    ap.add_argument("--found", type=int, default=3, help="bisects of each slowed scenario")
    ap.add_argument("--scenarios", default="mm,mem", help="the slowed scenarios to bisect (mm: +25%%, mem: +10%%)")
    ns = ap.parse_args()
    out: dict = {"found": {}, "aa": []}
    with tempfile.TemporaryDirectory(prefix="bisect-quality-") as tmp:
        root = Path(tmp) / "repo"
        shas = make_repo(root)
        for name, at, size in [c for c in (("mm", MM_AT, "25%"), ("mem", MEM_AT, "10%"))
                               if c[0] in ns.scenarios.split(",")]:
            runs = [bisect(root, shas[0], shas[-1], name) for _ in range(ns.found)]
            out["found"][name] = {"true": shas[at], "size": size, "runs": runs}
            hits = sum(r["outcome"] == "found" and r["first_bad"] == shas[at] for r in runs)
            undecided = sum(r["outcome"] == "undecided" for r in runs)
            print(f"{name} (+{size} at commit {at}): found {hits}/{len(runs)} ({undecided} undecided), decisions "
                  f"{[r['decisions'] for r in runs]}, {sum(r['wall_s'] for r in runs) / len(runs):.0f} s each",
                  flush=True)
        for t in range(ns.aa):   # a range with no change for mm: commits 5..16 (all 25 units)
            out["aa"].append(bisect(root, shas[MM_AT], shas[-1], "mm"))
            print(f"A/A {t + 1}/{ns.aa}: {out['aa'][-1]['outcome']}", flush=True)
    none = sum(r["outcome"] == "no change in range" for r in out["aa"])
    print(f"A/A ranges: 'no change in range' in {none}/{len(out['aa'])}")
    print(f"written to {atomic.write_stamped_json(Path('.bench'), 'bisect_quality', out)}")


if __name__ == "__main__":
    main()
