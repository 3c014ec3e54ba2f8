"""A history for a fleet, measured: runners writing one store at once, in PostgreSQL and in SQLite, and what adding
a run and reading a series cost once the store holds 100,000 results.

    python quality/history_fleet.py [--runners 8] [--runs 100] [--results 100000] [--url postgresql://...]

Without --url a throwaway PostgreSQL cluster is started (tests/pg_cluster.py, at the server's own defaults: fsync
on) and removed at the end; the SQLite file lies in a temporary folder on the same disk. A run holds 10 scenarios of
30 samples each.

Phase 1, at once: RUNNERS processes each add RUNS runs of their own, each followed by an attempt at their
neighbour's run of the same index (the same run_id, which the neighbour may be writing at that moment), into one
store that none of them has created yet; then the store is checked: every run whole (10 results), none twice, none
missing. Phase 2, at size: one process fills a fresh store to RESULTS results through `History.add_run`, then times
50 more runs and 20 `series` queries of one scenario (RESULTS / 10 points each). Raw figures go to
.bench/history_fleet-<time>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
SCENARIOS = 10

WRITER = '''
import json, os, sys, time
from bench_core.files.history import History
docs, k, where, go = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3], sys.argv[4]
own, other = docs[k], docs[(k + 1) % len(docs)]
while not os.path.exists(go):
    time.sleep(0.005)
took, added = {"own": [], "other": []}, 0
with History(where) as h:
    for mine, theirs in zip(own, other):
        for kind, doc in (("own", mine), ("other", theirs)):
            t = time.perf_counter()
            added += h.add_run(doc)
            took[kind].append(time.perf_counter() - t)
print(json.dumps({"added": added, "took": took}))
'''


def _templates(count: int) -> list[dict]:
    """`count` runs of SCENARIOS scenarios, 30 samples each, from which every stored run is copied."""
    from bench_core.files import storage
    from helpers import ENV, runs

    out = []
    for i in range(count):
        env = {**ENV, "git_commit": f"{i:040d}", "git_dirty": False}
        results = [m for s in range(SCENARIOS) for m in runs([1.0 + 0.1 * s], n=30, seed=i * SCENARIOS + s,
                                                             name=f"s{s}", env=env)]
        out.append(storage.run_doc(results, env))
    return out


def _copy(template: dict, run_id: str, index: int) -> dict:
    created = f"2026-12-06T{index // 3600 % 24:02d}:{index // 60 % 60:02d}:{index % 60:02d}+00:00"
    return {**template, "run_id": run_id, "created": created}


def _ms(xs) -> dict:
    xs = sorted(x * 1000 for x in xs)
    return {"median_ms": round(statistics.median(xs), 2), "p95_ms": round(xs[int(0.95 * (len(xs) - 1))], 2),
            "max_ms": round(xs[-1], 2)}


def at_once(where: str, runners: int, each: int, folder: Path) -> dict:
    """Phase 1 on one store: every run whole, none twice, none missing, and what it took."""
    from bench_core.files.history import History

    templates = _templates(10)
    docs = [[_copy(templates[i % 10], f"r{k}-{i}", i) for i in range(each)] for k in range(runners)]
    (folder / "docs.json").write_text(json.dumps(docs))
    go = folder / f"go-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder / "docs.json"), str(k), where, str(go)],
                              stdout=subprocess.PIPE, text=True, env=env) for k in range(runners)]
    try:
        time.sleep(3)   # every runner started and waiting: they begin together
        start = time.perf_counter()
        go.touch()
        said = [json.loads(p.communicate(timeout=1800)[0]) for p in procs]
        wall = time.perf_counter() - start
    finally:
        for p in procs:
            p.kill()
    count: dict[str, int] = {}
    with History(where, create=False) as h:
        for row in h.rows():
            count[row["run_id"]] = count.get(row["run_id"], 0) + 1
    expected = {f"r{k}-{i}" for k in range(runners) for i in range(each)}
    return {"runs": len(expected), "held": len(count), "missing": len(expected - set(count)),
            "foreign": len(set(count) - expected), "not_whole": sum(n != SCENARIOS for n in count.values()),
            "added_by_runners": sum(s["added"] for s in said), "exit_codes": [p.returncode for p in procs],
            "wall_s": round(wall, 2), "runs_per_s": round(len(expected) / wall, 1),
            "add_own": _ms([x for s in said for x in s["took"]["own"]]),
            "add_held_elsewhere": _ms([x for s in said for x in s["took"]["other"]])}


def at_size(where: str, results: int) -> dict:
    """Phase 2 on one store: filled by one writer, then one more run's insert and a series query, timed."""
    from bench_core.files.history import History

    templates = _templates(10)
    fill = results // SCENARIOS
    with History(where) as h:
        start = time.perf_counter()
        for i in range(fill):
            h.add_run(_copy(templates[i % 10], f"fill-{i}", i))
        filled = time.perf_counter() - start
        adds = []
        for i in range(50):
            t = time.perf_counter()
            h.add_run(_copy(templates[i % 10], f"more-{i}", fill + i))
            adds.append(time.perf_counter() - t)
        series, points = [], 0
        for _ in range(20):
            t = time.perf_counter()
            points = len(h.series("s3"))
            series.append(time.perf_counter() - t)
    return {"results": (fill + 50) * SCENARIOS, "fill_s": round(filled, 1), "fill_runs_per_s": round(fill / filled, 1),
            "add_at_size": _ms(adds), "series_points": points, "series_at_size": _ms(series)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runners", type=int, default=8)
    ap.add_argument("--runs", type=int, default=100, help="runs of its own per runner")
    ap.add_argument("--results", type=int, default=100_000, help="the store's size in phase 2")
    ap.add_argument("--url", help="a PostgreSQL server's database to use (emptied of nothing: give a fresh one); "
                                  "else a throwaway cluster")
    args = ap.parse_args()
    import pg_cluster
    from bench_core.files import atomic

    out = {"args": vars(args), "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}}
    with ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="history-fleet-"))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        if args.url:
            urls = {phase: args.url for phase in ("at_once", "at_size")}   # phase 2 adds beside phase 1's runs
        else:
            admin = stack.enter_context(pg_cluster.cluster(durable=True))
            urls = {phase: pg_cluster.database(admin, phase) for phase in ("at_once", "at_size")}
        for name, where in (("postgresql", urls["at_once"]), ("sqlite", str(folder / "at_once.sqlite"))):
            out[f"{name} at once"] = at_once(where, args.runners, args.runs, folder)
            print(name, "at once:", json.dumps(out[f"{name} at once"]), flush=True)
        for name, where in (("postgresql", urls["at_size"]), ("sqlite", str(folder / "at_size.sqlite"))):
            out[f"{name} at size"] = at_size(where, args.results)
            print(name, "at size:", json.dumps(out[f"{name} at size"]), flush=True)
    out["machine"]["load_after"] = os.getloadavg()
    print(f"written to {atomic.write_stamped_json(ROOT / '.bench', 'history_fleet', out)}")


if __name__ == "__main__":
    main()
