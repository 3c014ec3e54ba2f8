"""What the slow samples of process mode's forked rounds did: page faults, context switches, or neither?

Run as its own measurement, never in the test suite (about a minute):
    python quality/sample_faults.py [--filter "memory or cnn"] [--sessions 1] [--one-process]

It builds `against_quality.py --isolated`'s throwaway repository (every scenario in process mode; with
`--one-process`, its plain repository, both sides in the session's own process, for comparison) and runs
`pytest --bench-against HEAD~1 --bench-threads 1 -k FILTER` with a plugin (forwarded to both sides' servers with
`-p`, so their round children load it) that wraps each timed sample in `getrusage` (minor faults, involuntary
context switches), the CPU it started and ended on, and the kernel's count of the thread's time on a CPU and
waiting for one (/proc/thread-self/schedstat; a VM's stolen time is in neither). A round's first call (its cold
observation) is left out. The plugin's reads and its line to a file fall between samples, outside the timed
window, but inside a round: a census is not a quality run. Per workload it prints how many samples ran more than
6% over the workload's median, and what those did against the rest; before that, per session (from its file), how
much a round's ratio spreads with each side's samples averaged (what the decision uses) and with each side's faster
sample instead (a robust reading, not used: see docs/side-by-side.md).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from against_quality import make_repo  # noqa: E402

PLUGIN = r'''
import ctypes, os, resource, time
from bench_core.timing import protocol

_sample_of, _libc, _out = protocol.sample_of, ctypes.CDLL(None), os.environ["SAMPLE_FAULTS_DIR"]


def _sched():   # this thread's time on a CPU and waiting for one, ns (the kernel's own accounting)
    with open("/proc/thread-self/schedstat") as fh:
        on, wait = fh.read().split()[:2]
    return int(on), int(wait)


def sample_of(sampler, inst, what, ahead):
    r0, c0, s0, t0 = resource.getrusage(resource.RUSAGE_SELF), _libc.sched_getcpu(), _sched(), time.perf_counter()
    s = _sample_of(sampler, inst, what, ahead)
    t1, s1, r1, c1 = time.perf_counter(), _sched(), resource.getrusage(resource.RUSAGE_SELF), _libc.sched_getcpu()
    with open(os.path.join(_out, f"{os.getpid()}.tsv"), "a") as fh:
        fh.write("\t".join(map(str, (getattr(inst.scenario, "name", "?"), what, int(ahead), s.host_ms,
                                     r1.ru_minflt - r0.ru_minflt, r1.ru_nivcsw - r0.ru_nivcsw, c0 != c1,
                                     (t1 - t0) * 1e3, (s1[0] - s0[0]) / 1e6, (s1[1] - s0[1]) / 1e6))) + "\n")
    return s


protocol.sample_of = sample_of
'''

OVER = 1.06   # a sample this much over its workload's median is a slow one


def samples_by_workload(folder: Path) -> dict[str, np.ndarray]:
    """The round children's samples after their first call (one file a child), by workload (the scenario name
    before its "["): rows of (host_ms, faults, involuntary switches, moved CPU, ahead, wall ms of the whole
    request, ms on a CPU, ms waiting for one)."""
    by: dict[str, list[tuple]] = {}
    for f in folder.glob("*.tsv"):
        for line in f.read_text().splitlines():
            name, what, ahead, h, fl, cs, moved, wall, on, wait = line.split("\t")
            if not what.startswith("the first call"):
                by.setdefault(name.split("[")[0], []).append(
                    (float(h), int(fl), int(cs), moved == "True", int(ahead), float(wall), float(on), float(wait)))
    return {w: np.array(rows, dtype=float) for w, rows in by.items()}


def _of(x: np.ndarray) -> str:
    """Mean and how often non-zero, of one count over a group of samples (a group may be empty)."""
    return f"mean {x.mean():8.1f}, any in {np.mean(x > 0):4.0%}" if x.size else "none"


def fault_table(by: dict[str, np.ndarray]) -> None:
    for w, a in sorted(by.items()):
        slow = a[:, 0] > OVER * np.median(a[:, 0])
        print(f"{w}: {len(a)} samples, median {np.median(a[:, 0]):.2f} ms, {slow.sum()} over {OVER:.2f}x it")
        for i, name in ((1, "minor faults"), (2, "involuntary switches"), (3, "moved CPU")):
            print(f"    {name:22s} slow: {_of(a[slow, i])}   rest: {_of(a[~slow, i])}")
        big = a[:, 1] > 1000
        print(f"    samples with over 1,000 faults: {big.sum()} ({big[slow].sum()} of them slow)")
        # without a call ahead the request is the sample (and its clock reads): its wall time against the
        # kernel's count of this thread's time on a CPU says whether a slow sample ran longer or was held off
        alone = a[:, 4] == 0
        for name, m in (("slow", slow & alone), ("rest", ~slow & alone)):
            if m.any():
                print(f"    {name} (no call ahead, {m.sum()}): wall {a[m, 5].mean():6.2f} ms, on a CPU "
                      f"{a[m, 6].mean():6.2f} ms, waiting for one {a[m, 7].mean():5.2f} ms, "
                      f"neither {np.mean(a[m, 5] - a[m, 6] - a[m, 7]):5.2f} ms")


def spread_table(session: Path) -> None:
    doc = json.loads(session.read_text())
    for rec in doc["against"]["scenarios"]:
        r = rec["rounds"]
        if isinstance(r, list):
            continue
        sides = [[np.log([x[0] for x in rr]) for rr in r["samples_host_gpu_ms"][s]] for s in ("baseline", "candidate")]
        mean = np.array([c.mean() - b.mean() for b, c in zip(*sides)])
        fast = np.array([c.min() - b.min() for b, c in zip(*sides)])
        print(f"{rec['scenario']:16s} {len(mean):3d} rounds   a round's ratio spreads {mean.std(ddof=1):6.2%} "
              f"(samples averaged, estimate {math.exp(mean.mean()):.3f}), {fast.std(ddof=1):6.2%} "
              f"(each side's faster sample, {math.exp(fast.mean()):.3f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--filter", default="memory or cnn", help="pytest -k over the nine scenarios")
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--one-process", action="store_true", help="the repository whose sides share one process")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root, plug, faults = Path(tmp, "repo"), Path(tmp, "plug"), Path(tmp, "faults")
        make_repo(root, isolated=not args.one_process)
        plug.mkdir()
        faults.mkdir()
        (plug / "sample_faults_plugin.py").write_text(PLUGIN)
        env = dict(os.environ, SAMPLE_FAULTS_DIR=str(faults),
                   PYTHONPATH=os.pathsep.join([str(plug), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        for k in range(args.sessions):
            out = Path(tmp, f"out{k}")
            proc = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider",
                                   "-p", "sample_faults_plugin", "--bench-threads", "1", "--bench-out", str(out),
                                   "--bench-against", "HEAD~1", "-k", args.filter],
                                  cwd=root, env=env, capture_output=True, text=True)
            if proc.returncode not in (0, 1):
                raise SystemExit(f"pytest failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
            print(f"--- session {k + 1}: {proc.stdout.strip().splitlines()[-1]}")
            spread_table(Path(glob.glob(str(out / "session-*.json"))[0]))
        print(f"--- the samples of {len(list(faults.glob('*.tsv')))} process(es) that took them")
        fault_table(samples_by_workload(faults))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
