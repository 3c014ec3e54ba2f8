"""A suite of thousands of tiny scenarios split over runners and gated as one family: does the merged gate keep its
false calls at alpha over the whole family, and does one real 2x scenario in one shard still fail it?

Run as its own benchmark, never in the test suite (it takes minutes):
    python quality/shards_family.py [--n 2000] [--shards 4] [--baseline-runs 3] [--aa 3]

It writes a throwaway project whose one test file has N parametrized scenarios, each a few tiny real torch calls
(timed on the real clock: the noise is this machine's), and runs it as `--bench-shard K/N` in N pytest processes
one after another, as N runners would, then `bench-core merge` (timed). The first `--baseline-runs` merged runs
become the baseline `main` (`bench-core baseline add`; `--baseline FILE` reuses one kept from an earlier run
instead); each later run's shards gate against it as .github/workflows/bench-shards.yml's do (`--bench-compare main
--bench-replicate confirm`: what looks changed over the whole family is measured again in fresh processes). Each
of the `--aa` next merged runs is gated with `bench-core compare main MERGED --json` (A/A: nothing changed), and one
last run with one scenario's work doubled (in whichever shard it falls) is gated the same way. Reported: the
shards' sizes, disjointness and coverage, the merge's time, what each shard measured again, per A/A run the
verdicts over the whole family, and the injected run's exit code and that scenario's verdict. Raw results go to .bench/shards_family-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench_core.files import atomic

SUITE = '''
import os

import pytest
import torch

from bench_core import Scenario

SLOW = int(os.environ.get("ZOO_SLOW", "-1"))
torch.set_num_threads(1)


@pytest.mark.parametrize("i", range({n}))
def test_tiny(bench, i):
    x = torch.ones(256 * (1 + i % 7))
    calls = 2 if i == SLOW else 1

    def step():
        for _ in range(calls * 20):
            x.mul(1.0001).sum()
    bench.run(Scenario(f"tiny[{{i}}]", ("forward",)), step, warmup=2, repeats=15)
'''


def run_shards(project: Path, n: int, tag: str, slow: int = -1, gated: bool = False) -> tuple[list[Path], float]:
    files, started = [], time.monotonic()
    env = {**os.environ, "ZOO_SLOW": str(slow)}
    # once a baseline exists, each shard gates against it as the workflow's shards do: what looks changed over the
    # family is measured again in fresh processes, whose runs the merged gate then reads
    against = ["--bench-compare", "main", "--bench-baselines", str(project / "baselines"), "--bench-replicate",
               "confirm"] if gated else []
    for k in range(1, n + 1):
        out = project / f"{tag}-{k}"
        subprocess.run([sys.executable, "-m", "pytest", "test_zoo.py", "-q", "-p", "no:cacheprovider", "-p",
                        "no:randomly", "--bench-shard", f"{k}/{n}", "--bench-out", str(out), "--bench-history",
                        "none", *against], cwd=project, env=env, check=False, capture_output=True)
        (f,) = out.glob("session-*.json")
        files.append(f)
    return files, time.monotonic() - started


def merge(project: Path, files: list[Path], tag: str) -> tuple[Path, float]:
    out = project / f"{tag}.json"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "bench_core", "merge", *map(str, files), "--out", str(out)], cwd=project,
                   check=True, capture_output=True)
    return out, time.monotonic() - started


def gate(project: Path, merged: Path) -> tuple[int, list[dict]]:
    ran = subprocess.run([sys.executable, "-m", "bench_core", "compare", "main", str(merged), "--baselines",
                          str(project / "baselines"), "--json"], cwd=project, capture_output=True, text=True)
    start = ran.stdout.find("[")
    return ran.returncode, json.loads(ran.stdout[start:ran.stdout.rindex("]") + 1]) if start >= 0 else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--aa", type=int, default=3)
    ap.add_argument("--slow", type=int, default=1234, help="the scenario whose work is doubled in the last run")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a baseline file of merged runs kept from an earlier run of this script (its baselines/main.json"
                         "): used instead of recording --baseline-runs new ones")
    ns = ap.parse_args()
    report: dict = {"n": ns.n, "shards": ns.shards, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="shards-family-") as tmp:
        project = Path(tmp)
        (project / "test_zoo.py").write_text(SUITE.format(n=ns.n))
        if ns.baseline is not None:
            (project / "baselines").mkdir()
            shutil.copyfile(ns.baseline, project / "baselines" / "main.json")
            ns.baseline_runs = 0
            report["baseline"] = str(ns.baseline)
        runs = []
        for r in range(ns.baseline_runs + ns.aa + 1):
            injected = r == ns.baseline_runs + ns.aa
            files, took = run_shards(project, ns.shards, f"run{r}", ns.slow if injected else -1,
                                     gated=r >= ns.baseline_runs)
            docs = [json.loads(f.read_text()) for f in files]
            names = [res["scenario"]["name"] for d in docs for res in d["results"]]
            merged, merge_s = merge(project, files, f"merged{r}")
            row = {"run": r, "shards_s": round(took, 1), "merge_s": round(merge_s, 2),
                   "per_shard": [d["shard"]["tests"] for d in docs], "scenarios": len(names),
                   "disjoint": len(names) == len(set(names)), "errors": sum(len(d.get("errors") or []) for d in docs),
                   "confirmed": {name: len(ms) for d in docs for name, ms in (d.get("replicas") or {}).items()},
                   "load": os.getloadavg()[0]}
            if r < ns.baseline_runs:
                subprocess.run([sys.executable, "-m", "bench_core", "baseline", "add", "main", str(merged),
                                "--baselines", str(project / "baselines")], cwd=project, check=True,
                               capture_output=True)
                row["role"] = "baseline"
            else:
                code, comps = gate(project, merged)
                verdicts = Counter(c.get("verdict") for c in comps)
                row.update(role="injected" if injected else "A/A", exit=code, verdicts=dict(verdicts),
                           decided=len(comps))
                row["called"] = {c["name"]: [c["verdict"], round(c["ratio"], 3), c["candidate_runs"]] for c in comps
                                 if c.get("verdict") in ("slower", "faster")}
                if injected:
                    row["slow_verdict"] = next((c.get("verdict") for c in comps
                                                if c.get("name") == f"tiny[{ns.slow}]"), None)
            runs.append(row)
            print(json.dumps(row), flush=True)
        report["runs"] = runs
    path = atomic.write_stamped_json(Path(".bench"), "shards_family", report)
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
