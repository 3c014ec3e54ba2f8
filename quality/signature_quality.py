"""Are work signatures deterministic, and what does counting one cost? (#29's proof)

    python quality/signature_quality.py [--runs 10] [--load 2]

1. Determinism: the repository of `against_quality.py` (nine scenarios: matmul, memory-bound, CNN training step,
   each A/A and +5%/+10% of work), `pytest --bench-against HEAD --bench-signature --bench-quick` RUNS times in fresh
   processes with LOAD busy processes beside it: A/A against its own commit, so every fact reported is a false one.
   The +5%/+10% scenarios change their work by a constant, which the signature must count exactly on every run
   (`--bench-against HEAD~1`, same number of runs).
2. Cost: per workload, one call of the step against one call under the signature recorder (median of 5 each).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import against_quality as aq  # noqa: E402


def facts_of(root: Path, out: Path, rev: str) -> dict[str, list[str]]:
    subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider", "--bench-threads",
                    "1", "--bench-quick", "--bench-signature", "--bench-against", rev, "--bench-out", str(out)],
                   cwd=root, capture_output=True, text=True)
    doc = json.loads(next(out.glob("session-*.json")).read_text())
    return {r["scenario"]: r["comparison"]["facts"] for r in doc["against"]["scenarios"]}


def cost() -> list[str]:
    import torch

    from bench_core.timing.signature_count import record

    torch.set_num_threads(1)
    ns: dict = {}
    exec(aq.WORK_V1, ns)
    lines = []
    for kind in ("matmul", "memory", "cnn"):
        step = ns["build"](kind, 20)
        step()
        plain, counted = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            step()
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            record(step)
            counted.append(time.perf_counter() - t0)
        p, c = statistics.median(plain) * 1e3, statistics.median(counted) * 1e3
        lines.append(f"{kind}: a step {p:.1f} ms, counted {c:.1f} ms ({c / p:.1f}x)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=2)
    ns = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", aq.COMPETITOR]) for _ in range(ns.load)]
    try:
        with tempfile.TemporaryDirectory(prefix="signature-quality-") as tmp:
            root = Path(tmp) / "repo"
            aq.make_repo(root)
            for rev in ("HEAD", "HEAD~1"):
                seen = [facts_of(root, Path(tmp) / f"{rev}-{i}", rev) for i in range(ns.runs)]
                distinct = {name: {json.dumps(run[name]) for run in seen} for name in seen[0]}
                with_facts = sum(any(run.values()) for run in seen)
                print(f"--bench-against {rev}, {ns.runs} runs under {ns.load} busy process(es): runs with any fact "
                      f"{with_facts}/{ns.runs}; scenarios whose facts differed between runs: "
                      f"{[n for n, d in distinct.items() if len(d) > 1]}")
                for name, d in sorted(distinct.items()):
                    print(f"  {name}: {sorted(d)[0] if d else '[]'}")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    for line in cost():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
