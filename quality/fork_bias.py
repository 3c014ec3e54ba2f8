"""Does a process forked from a warm server carry a fresh bias, or its server's? (the measurement behind the
side servers of `--bench-against`'s process mode, docs/side-by-side.md)

Two server processes start as the suite's do: torch imported, one thread (a forked child of a process that ran
a parallel region with more threads hangs in OpenMP), the workload built once. Both serve one A/A comparison of
identical code in lock-step, ROUNDS rounds of PAIRS alternated pairs, in one of two modes:
  fork     each round, each server forks a child that builds the workload afresh and is timed, then exits
  forkpad  the same, the child first allocating memory of a random shape (placement drawn afresh per child)
  forkpair the same, both children of a round drawing the same random shape (drawn afresh per round)
  inplace  each round, each server builds the workload afresh itself (what a worker process did before)
  zygote   as forkpad, from servers that never built or ran the workload (their allocator never saw it)
  fresh    each round two new processes, each building the workload once (the program as users run it)
A pair of servers gives one estimate (the mean of its round log ratios). Repeated over SERVERS pairs of servers,
the spread of those estimates says where the bias lives: if each fork is fresh, it is the spread of one round over
sqrt(ROUNDS); if it stays with the server, it stays near the spread of one round's server bias whatever ROUNDS.

    python quality/fork_bias.py [--workloads matmul,memory,cnn] [--servers 8] [--rounds 12] [--pairs 4]
"""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import time

SERVER = r'''
import os, sys, time, torch
torch.set_num_threads(1)
kind = sys.argv[1]
def build():
    torch.manual_seed(0)
    if kind == "matmul":
        a, b = torch.randn(192, 192), torch.randn(192, 192)
        return lambda: [a @ b for _ in range(20)]
    if kind == "memory":
        x = torch.randn(2_000_000)
        return lambda: [x.mul(1.0001).add_(1.0) for _ in range(20)]
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1),
                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    xb, yb = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    def step():
        for _ in range(20):
            opt.zero_grad(); torch.nn.functional.cross_entropy(m(xb), yb).backward(); opt.step()
    return step
if sys.argv[2:] != ["zygote"]:   # the server has run the workload once, as a fixture would have built it
    warm = build(); warm(); warm()
out = os.fdopen(os.dup(1), "w", buffering=1)
fn = None
while True:
    cmd, _, seed = sys.stdin.readline().strip().partition(" ")
    if cmd in ("", "quit"):
        break
    if cmd in ("fork", "forkpad"):
        pid = os.fork()
        if pid == 0:
            if cmd == "forkpad":   # a heap of a random shape before the build: placement drawn afresh per child
                import random, ctypes
                libc = ctypes.CDLL(None)
                rng = random.Random(int(seed) if seed else os.getpid() ^ time.perf_counter_ns())
                pads = [libc.malloc(rng.randint(1, 64) << rng.randint(4, 16)) for _ in range(rng.randint(1, 64))]
                big = torch.empty(rng.randint(0, 1 << 22), dtype=torch.uint8)
            fn = build(); fn()
            out.write("ok\n")
            while True:
                c = sys.stdin.readline().strip()
                if c == "t":
                    t0 = time.perf_counter_ns(); fn(); out.write(f"{time.perf_counter_ns() - t0}\n")
                else:
                    out.write("bye\n"); os._exit(0)
        os.waitpid(pid, 0)
    elif cmd == "build":
        fn = None; fn = build(); fn(); out.write("ok\n")
    elif cmd == "t":
        t0 = time.perf_counter_ns(); fn(); out.write(f"{time.perf_counter_ns() - t0}\n")
'''


SETTINGS = {   # how both servers of a pair are started: what a server's children might inherit as its bias
    "as-is": ([], {}),
    "hashseed": ([], {"PYTHONHASHSEED": "0"}),                         # the same str hashes in every server
    "noaslr": (["setarch", os.uname().machine, "-R"], {}),            # the same addresses in every server
    "both": (["setarch", os.uname().machine, "-R"], {"PYTHONHASHSEED": "0"}),
}


def pair_estimate(kind: str, mode: str, rounds: int, pairs: int, seed: int, setting: str = "as-is") -> list[float]:
    prefix, env = SETTINGS[setting]
    zygote = ["zygote"] if mode in ("zygote", "fresh") else []

    def start():
        return [subprocess.Popen([*prefix, sys.executable, "-c", SERVER, kind, *zygote], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, bufsize=1, env={**os.environ, **env})
                for _ in range(2)]

    def stop(procs):
        for p in procs:
            p.stdin.write("quit\n")
            p.stdin.close()
            p.wait()

    def ask(p, cmd):
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        return p.stdout.readline().strip()
    rng, out = random.Random(seed), []
    procs = start()
    try:
        for _ in range(rounds):
            if mode == "fresh" and out:   # each round two new processes, as the user's own runs are
                stop(procs)
                procs = start()
            shared = rng.getrandbits(62)
            for p in procs:
                cmd = {"fork": "fork", "forkpad": "forkpad", "zygote": "forkpad", "forkpair": f"forkpad {shared}"
                       }.get(mode, "build")
                assert ask(p, cmd) == "ok"
            for p in procs:   # the first call of each, kept out
                ask(p, "t")
            logs = []
            for _ in range(pairs):
                order = rng.sample([0, 1], 2)
                got = {i: int(ask(procs[i], "t")) for i in order}
                logs.append(math.log(got[1] / got[0]))
            out.append(statistics.median(logs))
            if mode not in ("inplace", "fresh"):
                for p in procs:
                    assert ask(p, "x") == "bye"
    finally:
        stop(procs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="matmul,memory,cnn")
    ap.add_argument("--modes", default="fork,inplace")
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--settings", default="as-is", help=f"how servers start, any of {','.join(SETTINGS)}")
    ns = ap.parse_args()
    print(f"{ns.servers} pairs of servers x {ns.rounds} rounds x {ns.pairs} pairs, A/A, one thread")
    for kind, mode, setting in [(k, m, s) for k in ns.workloads.split(",") for m in ns.modes.split(",")
                                for s in ns.settings.split(",")]:
        if True:
            t0 = time.monotonic()
            per = [pair_estimate(kind, mode, ns.rounds, ns.pairs, s, setting) for s in range(ns.servers)]
            one_round = statistics.stdev([x for r in per for x in r])
            means = [statistics.mean(r) for r in per]
            within = statistics.mean(statistics.stdev(r) for r in per)
            print(f"{kind:7s} {mode:8s} {setting:8s}: sd of one round {one_round * 100:5.2f}% (within a pair of servers "
                  f"{within * 100:5.2f}%); sd of a server pair's estimate {statistics.stdev(means) * 100:5.2f}% "
                  f"(fresh rounds would give {within / math.sqrt(ns.rounds) * 100:5.2f}%); mean ratio "
                  f"{math.exp(statistics.mean(means)):.4f}; {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
