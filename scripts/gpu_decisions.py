"""GPU decisions measured on the GPU (issue #50): how small a change the gates find on a real device, at what
false-alarm rate and cost, within a few minutes of device time.

    python scripts/gpu_decisions.py --dry-run                       # the plan, with its time per step
    python scripts/gpu_decisions.py --out DIR                       # on a GPU machine (bash scripts/gpu_check.sh)
    python scripts/gpu_decisions.py --device cpu --budget-s 120     # the same code on the CPU, small sizes

It writes a throwaway git repository with two real commits, as quality/against_quality.py does. Three workloads,
each a step of 100 units of work: a compute-bound matmul, a memory-bound elementwise pass over a buffer twice the
L2, and a launch-bound step of many small kernels (on the CPU, where the script only checks itself, all small).
The second commit changes nothing measured for "same" (an A/A) and makes 102 units of "plus2" and 105 of "plus5":
more of the same kernels, never a sleep. Decided by:

- side by side: one `pytest --bench-against HEAD~1` per trial and workload, a fresh process deciding that
  workload's changes as one family (one process: both sides in it, rounds of fresh instances);
- the stored gate: a baseline of several processes of the first commit (`--bench-save`, `--bench-append`), then
  per trial a few fresh processes of the second, decided as `bench-core compare` decides a file
  (`gate.compare_sets`, every candidate process at once; not the pytest gate's replication, which would start a
  process per scenario and look). On a GPU the memory-bound step is also decided with the L2 flushed before
  every sample (cache "cold": side by side does not take GPU timing modes);
- the `benchmark` fixture: the matmul written as a pytest-benchmark test (adopted by bench_core), side by side.

Every decision is also made in cycle space: each sample's time x the SM clock read at its end (NVML, with the
telemetry extra), decided by the same bench_core function as the time-space one. bench_core's side-by-side record
keeps host and GPU time only, so the repository's conftest adds each round sample's SM clock to it
(`gpu_decisions_sm_mhz`); where no clock was read the cycle-space column says "not observed".

A plan comes first: steps with estimated seconds, fitted to `--budget-s` (shortened or dropped, each said);
`--dry-run` prints it and stops. The run does each step's first trial, then more trials round-robin while the
budget holds (judged by the trials already timed), up to each step's wish. Writes `gpu_decisions-<time>.md` (a
table docs/gpu.md can take as it is) and `gpu_decisions-<time>.json` (every decision, raw) into `--out`, never
overwriting, with the session files and logs under it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

# -- the workloads ---------------------------------------------------------------------------------------------

WORKLOADS = ("matmul", "memory", "launch")
CHANGES = {"same": 100, "plus2": 102, "plus5": 105}    # units of work per step in the second commit
BASE_UNITS = 100
CHANGE_LABEL = {"same": "A/A", "plus2": "+2%", "plus5": "+5%"}
PB_CHANGES = ("same", "plus5")     # the `benchmark`-fixture path: its first question only, to keep it cheap
# the stored gate also decides this workload with the L2 flushed before every sample, on a GPU only: a user who
# states cache="cold" gates with the stored baseline, so this is what such a user gets (bench_core does not apply a
# cache mode on the CPU, and side by side does not take one)
COLD = ("memory",)

WORK = '''
import os

import torch

DEVICE = os.environ.get("GPU_DECISIONS_DEVICE", "cpu")
UNITS = {UNITS}


def build(kind, units):
    """One step of `units` units of work; everything is allocated here, outside the timed window."""
    torch.manual_seed(0)
    dev = DEVICE
    if kind == "matmul":                      # compute-bound: each unit one float32 matmul
        n = 1024 if dev == "cuda" else 64
        a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
        out = torch.empty(n, n, device=dev)

        def step():
            for _ in range(units):
                torch.mm(a, b, out=out)
    elif kind == "memory":                    # memory-bound: each unit one pass over a buffer twice the L2
        n = (2 * torch.cuda.get_device_properties(0).L2_cache_size // 4) if dev == "cuda" else 1 << 16
        x, y = torch.randn(n, device=dev), torch.empty(n, device=dev)

        def step():
            for _ in range(units):
                torch.mul(x, 1.0001, out=y)
    else:                                     # launch-bound: each unit one kernel on a tiny tensor
        s, t = torch.randn(256, device=dev), torch.empty(256, device=dev)

        def step():
            for _ in range(units):
                torch.add(s, 1.0, out=t)
    return step
'''

BENCH_TEST = '''
import pytest

from bench_core import Scenario
import work


@pytest.mark.parametrize("change", {CHANGES})
def test_{KIND}{SUFFIX}(bench, change):
    assert bench.device == work.DEVICE, f"bench runs on {{bench.device}}, the workload on {{work.DEVICE}}"
    bench.run(Scenario(f"{KIND}{SUFFIX_NAME}[{{change}}]", ("compute",), {{"workload": "{KIND}"}}{CACHE}),
              work.build("{KIND}", work.UNITS[change]))
'''

PB_TEST = '''
import pytest

import work


@pytest.mark.parametrize("change", {CHANGES})
def test_pb(benchmark, change):
    benchmark(work.build("matmul", work.UNITS[change]))
'''

CONFTEST = '''
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))

# gpu_decisions: bench_core's side-by-side record keeps each round sample's host and GPU time but not the SM clock
# its sampler read at the sample's end, and the cycle-space decision needs it; added here as a field of our own,
# and nothing at all where bench_core's code is not as this expects
try:
    from bench_core.timing import protocol as _protocol

    _plain_to_dict = _protocol.Rounds.to_dict

    def _sm_mhz(sample):
        clocks = getattr(sample, "clocks", None)
        return None if not clocks or clocks[1] is None else getattr(clocks[1], "sm_mhz", None)

    def _with_clocks(self):
        doc = _plain_to_dict(self)
        doc["gpu_decisions_sm_mhz"] = {side: [[_sm_mhz(x) for x in r] for r in getattr(self, side)]
                                       for side in ("baseline", "candidate")}
        return doc

    _protocol.Rounds.to_dict = _with_clocks
except (ImportError, AttributeError):
    pass
'''


def benchmark_files(workloads: Sequence[str], changes: Sequence[str], device: str) -> dict[str, str]:
    """The benchmark files, by name: one per workload, one per cold workload (GPU), the pytest-benchmark one."""
    files = {}
    for kind in workloads:
        files[f"test_{kind}.py"] = BENCH_TEST.format(KIND=kind, SUFFIX="", SUFFIX_NAME="", CACHE="",
                                                     CHANGES=list(changes))
        if device == "cuda" and kind in COLD:
            files[f"test_{kind}_cold.py"] = BENCH_TEST.format(KIND=kind, SUFFIX="_cold", SUFFIX_NAME="-cold",
                                                              CACHE=', cache="cold"', CHANGES=list(changes))
    pb = [c for c in changes if c in PB_CHANGES]
    if "matmul" in workloads and pb:
        files["test_pb.py"] = PB_TEST.format(CHANGES=pb)
    return files


def make_trees(root: Path, workloads: Sequence[str], changes: Sequence[str], device: str) -> tuple[Path, Path]:
    """`root/repo`, a git repository of two commits (base: 100 units everywhere; then the changes), and
    `root/base`, the first commit's files as a plain folder (the stored baseline is taken there)."""
    repo, base = root / "repo", root / "base"
    files = {f"benchmarks/{k}": textwrap.dedent(v) for k, v in benchmark_files(workloads, changes, device).items()}
    files["conftest.py"] = CONFTEST
    v1 = WORK.replace("UNITS = {UNITS}", f"UNITS = {({c: BASE_UNITS for c in changes})!r}")
    v2 = WORK.replace("UNITS = {UNITS}", f"# a change that changes nothing measured for \"same\"\n"
                                         f"UNITS = {({c: CHANGES[c] for c in changes})!r}")
    for tree, work in ((base, v1), (repo, v1)):
        for name, text in {**files, "benchmarks/work.py": work}.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(text)
    env = dict(os.environ, GIT_AUTHOR_NAME="d", GIT_AUTHOR_EMAIL="d@example.invalid", GIT_COMMITTER_NAME="d",
               GIT_COMMITTER_EMAIL="d@example.invalid")

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", f"base: {BASE_UNITS} units everywhere")
    (repo / "benchmarks" / "work.py").write_text(v2)
    git("commit", "-qam", "same (a comment only), plus2 (102 units), plus5 (105 units)")
    return repo, base


# -- the plan ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Costs:
    """Planning estimates in seconds: what a step is expected to take, never a measurement. The run records each
    trial's wall time beside its estimate, so that a later plan can start from what was seen."""

    process_s: float    # one pytest process before its first scenario: interpreter, torch, CUDA context, collection
    measure_s: float    # one scenario measured plainly: cold start, warmup, samples
    decide_s: float     # one scenario side by side in one process: rounds to its last look, a profiler pass


# the GPU's are assumptions until a run times them; the CPU's are set from this project's 2-core VM, rounded up
COSTS = {"cuda": Costs(process_s=6.0, measure_s=0.5, decide_s=5.0),
         "cpu": Costs(process_s=2.0, measure_s=0.3, decide_s=1.5)}
# --bench-quick takes 3 rounds at one look and 5 samples: a fraction of the rounds and samples above
QUICK_COSTS = {"cuda": Costs(process_s=6.0, measure_s=0.2, decide_s=1.0),
               "cpu": Costs(process_s=2.0, measure_s=0.1, decide_s=0.4)}


@dataclass(frozen=True)
class Step:
    """One question asked `repeats` times (trials), each trial a pytest session or a set of processes."""

    key: str
    kind: str                     # "against" | "stored" | "pb"
    workload: str
    cache: str
    changes: tuple[str, ...]
    gate: str
    setup: str                    # what runs once before the first trial
    setup_s: float
    each_s: float                 # one trial
    least: int = 1                # trials the step needs to be worth running
    want: int = 1                 # trials it would take given the time
    repeats: int = 0              # trials the plan fits (set by `fit`)
    files: tuple[str, ...] = ()   # benchmark files it runs

    @property
    def seconds(self) -> float:
        return (self.setup_s if self.repeats else 0.0) + self.repeats * self.each_s


@dataclass(frozen=True)
class Plan:
    device: str
    budget_s: float
    costs: Costs
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    order: tuple[tuple[str, int], ...] = ()   # (step key, trial index): the order trials run in, to each one's want

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


def build_steps(device: str, workloads: Sequence[str], changes: Sequence[str], gates: Sequence[str], costs: Costs,
                trials: int = 10, stored_trials: int = 3, pb_trials: int = 3, baseline_runs: int = 5,
                candidate_runs: int = 3) -> tuple[list[Step], list[str]]:
    """The steps asked for, in the order of their importance, with their estimates; and what was left out before
    any fitting (a cache mode the device cannot take)."""
    c, steps, notes = costs, [], []
    n = len(changes)
    if "against" in gates:
        for w in workloads:
            steps.append(Step(f"against-{w}", "against", w, "unstated (hot)", tuple(changes),
                              "side by side (HEAD~1, one process)", "a plain run of the same scenarios",
                              c.process_s + n * c.measure_s, c.process_s + n * c.decide_s, want=trials,
                              files=(f"test_{w}.py",)))
    if "stored" in gates:
        cold = [w for w in workloads if w in COLD]
        if device != "cuda" and cold:
            notes.append(f"cold cache ({', '.join(cold)}): GPU only (bench_core does not apply a cache mode on the "
                         f"CPU)")
            cold = []
        files = tuple(f"test_{w}.py" for w in workloads) + tuple(f"test_{w}_cold.py" for w in cold)
        scenarios = n * len(files)
        per_process = c.process_s + scenarios * c.measure_s
        steps.append(Step("stored", "stored", "all", "unstated (hot)" + (", cold" if cold else ""),
                          tuple(changes), f"stored ({baseline_runs} baseline runs, {candidate_runs} candidate runs)",
                          f"a baseline of {baseline_runs} processes", baseline_runs * per_process,
                          candidate_runs * per_process, want=stored_trials, files=files))
    pb = [ch for ch in changes if ch in PB_CHANGES]
    if "pb" in gates and "matmul" in workloads and pb:
        steps.append(Step("pb-matmul", "pb", "matmul (benchmark fixture)", "unstated (hot)", tuple(pb),
                          "side by side (HEAD~1, one process)", "a plain run of the same tests",
                          c.process_s + len(pb) * c.measure_s, c.process_s + len(pb) * c.decide_s, want=pb_trials,
                          files=("test_pb.py",)))
    elif "pb" in gates:
        notes.append("the benchmark-fixture path needs the matmul workload and the A/A or +5% change: left out")
    return steps, notes


def fit(steps: Sequence[Step], budget_s: float, device: str = "cuda", costs: Costs = COSTS["cuda"],
        notes: Sequence[str] = ()) -> Plan:
    """The steps fitted to the budget, by their estimates. Each step's least trials first, in the given order
    (a step whose least does not fit is dropped, and said); then one more trial at a time, round-robin, while
    the estimates fit; a step that got fewer trials than it wants is said to be shortened. `order` lists every
    trial up to each step's want, in the order a run takes them: a run goes on past the plan while the time it
    measures allows, and stops short of it where the time runs out. Pure."""
    out, said, used = [], list(notes), 0.0
    for s in steps:
        need = s.setup_s + s.least * s.each_s
        if used + need <= budget_s:
            out.append(replace(s, repeats=s.least))
            used += need
        else:
            said.append(f"dropped {s.key}: its least ({s.least} trial(s) and its setup) needs {need:.0f} s, "
                        f"{max(budget_s - used, 0):.0f} s left of {budget_s:.0f} s")
    grew = True
    while grew:
        grew = False
        for i, s in enumerate(out):
            if s.repeats < s.want and used + s.each_s <= budget_s:
                out[i] = replace(s, repeats=s.repeats + 1)
                used += s.each_s
                grew = True
    for s in out:
        if s.repeats < s.want:
            said.append(f"shortened {s.key}: {s.repeats} of {s.want} trials fit the estimates (more run while the "
                        f"measured time allows)")
    order = [(s.key, t) for s in out for t in range(s.least)]
    for t in range(max((s.want for s in out), default=0)):
        order += [(s.key, t) for s in out if s.least <= t < s.want]
    return Plan(device, budget_s, costs, tuple(out), tuple(said), tuple(order))


def plan_table(plan: Plan) -> str:
    from tabulate import tabulate

    c = plan.costs
    rows = [[s.key, s.workload, s.cache, ", ".join(CHANGE_LABEL[x] for x in s.changes), s.gate,
             f"{s.setup_s:.0f} s", f"{s.repeats} (up to {s.want})", f"{s.each_s:.0f} s", f"{s.seconds:.0f} s"]
            for s in plan.steps]
    head = (f"plan for {plan.device}: {plan.seconds:.0f} s of the {plan.budget_s:.0f} s budget (estimates: a pytest "
            f"process {c.process_s:g} s, a scenario measured {c.measure_s:g} s, decided side by side {c.decide_s:g} s)")
    body = tabulate(rows, headers=["step", "workload", "cache", "changes", "gate", "setup", "trials", "each",
                                   "total"], tablefmt="github")
    return "\n".join([head, body, *plan.notes])


# -- running -----------------------------------------------------------------------------------------------------

class BudgetSpent(BaseException):
    """The run was told to stop (SIGTERM from a time limit): what was decided so far is still written. Not an
    Exception, so that a trial's own error handling cannot swallow it and go on."""


@dataclass
class Trial:
    step: str
    index: int                    # -1: the step's setup
    wall_s: float = 0.0
    estimate_s: float = 0.0
    sessions: list[str] = field(default_factory=list)
    error: str | None = None


def run_pytest(cwd: Path, files: Sequence[str], extra: Sequence[str], out: Path, log: Path, device: str,
               timeout_s: float) -> tuple[float, Path | None, str | None]:
    """One pytest process in `cwd` on `files`: (wall seconds, its session file, an error in words or None). Exit 1
    is a verdict (a scenario called slower fails its item), not an error."""
    cmd = [sys.executable, "-m", "pytest", *[f"benchmarks/{f}" for f in files], "-q", "-p", "no:cacheprovider",
           "--bench-out", str(out), "--bench-history", "none", *(["--gpu"] if device == "cuda" else []), *extra]
    env = dict(os.environ, GPU_DECISIONS_DEVICE=device)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired as exc:
        log.write_text(f"$ {' '.join(cmd)}\n{exc.stdout or ''}\n{exc.stderr or ''}")
        return time.perf_counter() - t0, None, f"timed out after {timeout_s:.0f} s (the budget's end)"
    wall = time.perf_counter() - t0
    log.write_text(f"$ {' '.join(cmd)}\n(cwd {cwd}, exit {proc.returncode}, {wall:.1f} s)\n"
                   f"{proc.stdout}\n{proc.stderr}")
    sessions = sorted(out.glob("session-*.json"))
    if proc.returncode not in (0, 1):
        return wall, None, f"pytest exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-600:]}"
    if not sessions:
        return wall, None, f"pytest wrote no session file into {out}: see {log}"
    return wall, sessions[-1], None


# -- deciding ----------------------------------------------------------------------------------------------------

def label(name: str) -> tuple[str, str, str]:
    """(workload, cache, change) of a scenario name: "memory-cold[plus5]", "matmul[same]", "test_pb[plus5]"."""
    m = re.fullmatch(r"(.+?)\[(\w+)\]", name)
    if m is None:
        return name, "?", "?"
    head, change = m.groups()
    if head.startswith("test_pb"):
        return "matmul (benchmark fixture)", "unstated (hot)", change
    if head.endswith("-cold"):
        return head[:-len("-cold")], "cold", change
    return head, "unstated (hot)", change


def _rounds_parts(doc: Mapping[str, Any], mhz: bool):
    """A side-by-side record's rounds as bench_core's `Rounds` (one, or one per pair of processes), each sample
    its decided time (GPU time where there is one) or, with `mhz`, that time x the SM clock at its end (ms x MHz:
    thousands of cycles). None where a sample's clock was not read."""
    from bench_core.timing.protocol import Rounds
    from bench_core.timing.sampling import Sample

    parts = []
    for part in (doc if isinstance(doc, list) else [doc]):
        clocks = part.get("gpu_decisions_sm_mhz") if mhz else None
        if mhz and not clocks:
            return None
        sides = {}
        for side in ("baseline", "candidate"):
            rounds = []
            for i, r in enumerate(part["samples_host_gpu_ms"][side]):
                row = []
                for j, (host, gpu) in enumerate(r):
                    t = gpu if gpu is not None else host
                    if mhz:
                        f = clocks[side][i][j]
                        if f is None:
                            return None
                        t = t * f
                    row.append(Sample(t))
                rounds.append(tuple(row))
            sides[side] = tuple(rounds)
        parts.append(Rounds(**sides, units=tuple(part.get("units") or ())))
    return parts


def _family(comparison: Mapping[str, Any], default: int) -> int:
    """How many scenarios the session adjusted over, from its own words ("bonferroni over 3 scenarios ...")."""
    m = re.search(r"over (\d+) scenario", comparison.get("adjustment") or "")
    if m:
        return int(m.group(1))
    return 1 if (comparison.get("adjustment") or "").startswith("none") else default


def decide_rounds(name: str, parts, threshold: float, looks: int, family: int) -> dict:
    """bench_core's own side-by-side decision (`estimate_rounds`, then `decide_family`) of the given rounds."""
    from bench_core.deciding.comparison import GateConfig
    from bench_core.deciding.gate import decide_family
    from bench_core.deciding.rounds import estimate_rounds
    from bench_core.timing.protocol import joined

    est = estimate_rounds(name, parts[0] if len(parts) == 1 else joined(parts), threshold, timer="recomputed", looks=tuple(range(1, looks + 1)))
    (c,) = decide_family([est], GateConfig(threshold=threshold), family_size=family)
    return _verdict(c.verdict, c.ratio, c.ci_low, c.ci_high, c.confidence)


def _verdict(verdict, ratio, lo, hi, confidence) -> dict:
    return {"verdict": verdict, "ratio": ratio, "ci": [lo, hi] if lo is not None else None, "confidence": confidence}


def _span(values) -> list[float] | None:
    seen = [v for v in values if v is not None]
    return [min(seen), max(seen)] if seen else None


def side_by_side_decisions(doc: Mapping[str, Any]) -> list[dict]:
    """Every decision of one side-by-side session file: the session's own verdict, the same recomputed from its
    raw rounds (a check that this script reads them as bench_core does), and the cycle-space one."""
    records = (doc.get("against") or {}).get("scenarios") or []
    out = []
    for rec in records:
        c, rounds = rec["comparison"], rec["rounds"]
        workload, cache, change = label(rec["scenario"])
        parts = rounds if isinstance(rounds, list) else [rounds]
        units = set(parts[0].get("units") or ()) if len(parts) == 1 else set(range(len(parts)))
        n = len(units) or len(parts[0]["round_log_ratios"])
        d = {"scenario": rec["scenario"], "workload": workload, "cache": cache, "change": change,
             **_verdict(c["verdict"], c.get("ratio"), c.get("ci_low"), c.get("ci_high"), c.get("confidence")),
             "rounds": n, "unit": "pairs of processes" if units else "rounds",
             "method": rec.get("method"), "sm_mhz": None, "recomputed": None, "cycles": None}
        if c.get("ratio") is not None and c["verdict"] not in ("incomparable",):
            family, looks = _family(c, len(records)), int(c.get("looks") or 1)
            d["recomputed"] = decide_rounds(rec["scenario"], _rounds_parts(rounds, False), c["threshold"], looks,
                                            family)
            clocks = [f for p in parts for side in (p.get("gpu_decisions_sm_mhz") or {}).values()
                      for r in side for f in r]
            d["sm_mhz"] = _span(clocks)
            cyc = _rounds_parts(rounds, True)
            d["cycles"] = (decide_rounds(rec["scenario"], cyc, c["threshold"], looks, family) if cyc is not None
                           else {"not_observed": "no SM clock was read for every sample"})
        out.append(d)
    return out


def in_cycles(m):
    """A GPU measurement with each decided sample's time x the SM clock read at its end (ms x MHz), or None where
    the clocks were not read (no NVML) or a decided sample's clock is missing. Samples set aside as throttled stay
    aside, as in the time-space decision."""
    clocks = (m.gpu_timing or {}).get("clocks")
    if not clocks or m.gpu_ms is None:
        return None
    sm, flagged = list(clocks["sm_mhz"]), clocks.get("flagged") or {}
    kept = ([i for i in range(len(sm)) if str(i) not in flagged] if clocks.get("decided_on") == "unthrottled"
            else list(range(len(sm))))
    if len(kept) != len(m.gpu_ms) or any(sm[i] is None for i in kept):
        return None
    cycles = tuple(g * sm[i] for g, i in zip(m.gpu_ms, kept))
    return replace(m, host_ms=cycles, gpu_ms=cycles, repeats=len(cycles), gpu_timing=None)


def stored_decisions(baseline: Mapping[str, Sequence[Any]], candidate: Mapping[str, Sequence[Any]],
                     threshold: float) -> list[dict]:
    """The stored gate's decisions of every candidate scenario, as `bench-core compare` decides a file
    (`compare_sets`: the prior fitted from the whole baseline, Bonferroni over its scenarios), in time and, for
    the scenarios whose every run read its clocks, in cycle space."""
    from bench_core.deciding.comparison import GateConfig
    from bench_core.deciding.gate import compare_sets

    config = GateConfig(threshold=threshold)
    timed = {c.name: c for c in compare_sets(baseline, candidate, config)}
    b_cyc = {n: [in_cycles(m) for m in ms] for n, ms in baseline.items()}
    c_cyc = {n: [in_cycles(m) for m in ms] for n, ms in candidate.items()}
    whole = [n for n in b_cyc if all(b_cyc[n]) and all(c_cyc.get(n) or [None])]
    cycled = ({c.name: c for c in compare_sets({n: b_cyc[n] for n in whole}, {n: c_cyc[n] for n in whole}, config)}
              if whole else {})
    out = []
    for name in candidate:
        c = timed[name]
        workload, cache, change = label(name)
        sm = [f for m in (*baseline.get(name, ()), *candidate[name])
              for f in ((m.gpu_timing or {}).get("clocks") or {}).get("sm_mhz", ())]
        cyc = cycled.get(name)
        out.append({"scenario": name, "workload": workload, "cache": cache, "change": change,
                    **_verdict(c.verdict, c.ratio, c.ci_low, c.ci_high, c.confidence),
                    "rounds": c.candidate_runs, "unit": f"candidate runs (baseline {c.baseline_runs})",
                    "method": c.adjustment, "sm_mhz": _span(sm), "recomputed": None,
                    "cycles": (_verdict(cyc.verdict, cyc.ratio, cyc.ci_low, cyc.ci_high, cyc.confidence)
                               if cyc is not None else {"not_observed": "no SM clock was read for every sample"})})
    return out


# -- the summary -------------------------------------------------------------------------------------------------

VERDICTS = ("slower", "faster", "unchanged", "inconclusive", "incomparable")


def counts(verdicts: Sequence[str | None]) -> str:
    n = {v: sum(x == v for x in verdicts) for v in (*VERDICTS, None)}
    parts = [f"{k} {n[k]}" for k in VERDICTS if n[k]] + ([f"undecided {n[None]}"] if n[None] else [])
    return ", ".join(parts) or "none"


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summary_rows(decisions: Sequence[Mapping[str, Any]]) -> list[dict]:
    """One row per (gate, workload, cache, change), in the order first met."""
    groups: dict[tuple, list] = {}
    for d in decisions:
        groups.setdefault((d["gate"], d["workload"], d["cache"], d["change"]), []).append(d)
    rows = []
    for (gate, workload, cache, change), ds in groups.items():
        widths = [d["ci"][1] / d["ci"][0] - 1 for d in ds if d.get("ci") and d["ci"][0]]
        lo = [d["sm_mhz"][0] for d in ds if d.get("sm_mhz")]
        hi = [d["sm_mhz"][1] for d in ds if d.get("sm_mhz")]
        cyc = [d["cycles"] for d in ds if d.get("cycles")]
        observed = [c["verdict"] for c in cyc if "verdict" in c]
        walls, costs = [d["wall_s"] for d in ds], [d.get("cost") for d in ds]
        rows.append({
            "workload": workload, "cache": cache, "change": CHANGE_LABEL.get(change, change), "gate": gate,
            "decisions": len(ds), "verdicts": counts([d["verdict"] for d in ds]),
            "median ratio": _fmt(_median([d.get("ratio") for d in ds]), "{:.3f}"),
            "median interval width": _fmt(_median(widths), "{:.1%}"),
            "rounds": f"{_fmt(_median([d['rounds'] for d in ds]), '{:g}')} {ds[0]['unit']}",
            "wall per trial": (f"{_median(walls):.1f} s" +
                                 (f" ({_median(costs):.1f}x plain)" if _median(costs) is not None else "")),
            "SM clock": f"{min(lo)}-{max(hi)} MHz" if lo else "not observed",
            "cycle-space verdicts": counts(observed) if observed and len(observed) == len(ds) else
            (f"{counts(observed)}; not observed in {len(ds) - len(observed)}" if observed else "not observed"),
        })
    return rows


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else spec.format(v)


def targets(decisions: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each gate against the issue's aims: +2% found in at least 9 of 10, no false call in 30 A/A, at most 3x a
    plain run."""
    lines = []
    for gate in dict.fromkeys(d["gate"] for d in decisions):
        ds = [d for d in decisions if d["gate"] == gate]
        aa = [d for d in ds if d["change"] == "same"]
        p2 = [d for d in ds if d["change"] == "plus2"]
        p5 = [d for d in ds if d["change"] == "plus5"]
        cost = _median([d.get("cost") for d in ds])
        lines.append(f"{gate}: A/A called slower or faster in {sum(d['verdict'] in ('slower', 'faster') for d in aa)}"
                     f" of {len(aa)}; +2% called slower in {sum(d['verdict'] == 'slower' for d in p2)} of {len(p2)}; "
                     f"+5% in {sum(d['verdict'] == 'slower' for d in p5)} of {len(p5)}; median cost "
                     f"{_fmt(cost, '{:.1f}')}x a plain run (aims: no false call in 30, +2% in 9 of 10, at most 3x)")
    return lines


COLUMNS = ("workload", "cache", "change", "gate", "decisions", "verdicts", "median ratio", "median interval width",
           "rounds", "wall per trial", "SM clock", "cycle-space verdicts")


def markdown(doc: Mapping[str, Any]) -> str:
    rows = summary_rows(doc["decisions"])
    lines = [f"## GPU decisions ({doc['device']}, {doc['started']})", "",
             f"{doc['environment']}; budget {doc['budget_s']:.0f} s, {doc['spent_s']:.0f} s spent. Each trial runs "
             f"in fresh processes: a side-by-side session decides its workload's changes as one family, the stored "
             f"gate every scenario of its baseline as one.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    if not rows:
        lines.append("| " + " | ".join(["none decided"] + [""] * (len(COLUMNS) - 1)) + " |")
    lines += ["", *[f"- {t}" for t in targets(doc["decisions"])]]
    lines += ["", "Interval: at the level the verdict was decided at (family and looks adjusted); width is high / "
                  "low - 1. Cycle space: each sample's time x the SM clock read at its end, decided by the same "
                  "function. Wall: one trial (a side-by-side session, or the stored gate's candidate processes), "
                  "against a plain run of the same scenarios."]
    if doc["notes"]:
        lines += ["", "Notes:", *[f"- {n}" for n in doc["notes"]]]
    return "\n".join(lines) + "\n"


# -- the run -----------------------------------------------------------------------------------------------------

class Runner:
    """Runs a plan's trials in its order while the budget holds; `out` (this run's own folder) keeps every
    session file, log and the stored baseline, `work` the throwaway trees."""

    def __init__(self, plan: Plan, out: Path, work: Path, threshold: float, extra: Sequence[str],
                 baseline_runs: int, candidate_runs: int):
        self.plan, self.out, self.work, self.threshold, self.extra = plan, out, work, threshold, list(extra)
        self.baseline_runs, self.candidate_runs = baseline_runs, candidate_runs
        self.steps = {s.key: s for s in plan.steps}
        self.t0 = time.monotonic()
        self.trials: list[Trial] = []
        self.decisions: list[dict] = []
        self.notes: list[str] = list(plan.notes)
        self.plain_s: dict[str, float] = {}       # step -> wall of its plain reference run
        self.failed: set[str] = set()             # steps whose setup failed: their trials cannot run
        self.environment: str | None = None
        self.stopped: str | None = None           # why the run ended early, if it did

    def left(self) -> float:
        return self.plan.budget_s - (time.monotonic() - self.t0)

    def expected(self, step: Step) -> float:
        """A trial's expected time: the mean of its step's trials so far, else the plan's estimate."""
        seen = [t.wall_s for t in self.trials if t.step == step.key and t.index >= 0 and t.error is None]
        return statistics.mean(seen) if seen else step.each_s

    def pytest(self, step: Step, name: str, cwd: Path, files, extra) -> tuple[float, Path | None, str | None]:
        out = self.out / "sessions" / name
        return run_pytest(cwd, files, [*extra, *self.extra], out, self.out / "logs" / f"{name}.log",
                          self.plan.device, self.left() + 5)

    def run(self) -> None:
        repo, base = self.work / "repo", self.work / "base"
        done: dict[str, int] = {}
        for key, t in self.plan.order:
            step = self.steps[key]
            if key in self.failed:
                continue
            first = key not in done
            need = (step.setup_s if first else 0.0) + self.expected(step)
            if need > self.left():
                if t < step.least:
                    self.notes.append(f"skipped {key} trial {t + 1}: {need:.0f} s expected, {self.left():.0f} s of "
                                      f"the budget left")
                continue
            if first and not self.setup(step, repo, base):
                self.failed.add(key)
                continue
            done[key] = done.get(key, 0) + 1
            self.trial(step, t, repo)
        for key, step in self.steps.items():
            if done.get(key, 0) < step.want and key not in self.failed:
                self.notes.append(f"{key}: {done.get(key, 0)} of {step.want} trials ran within the budget")

    def setup(self, step: Step, repo: Path, base: Path) -> bool:
        trial = Trial(step.key, -1, estimate_s=step.setup_s)
        self.trials.append(trial)
        if step.kind == "stored":
            walls = []
            for i in range(self.baseline_runs):
                save = ["--bench-save", "gpu_decisions"] + (["--bench-append"] if i else [])
                wall, session, err = self.pytest(step, f"{step.key}-baseline-{i}", base, step.files,
                                                 [*save, "--bench-baselines", str(self.out / "baselines")])
                walls.append(wall)
                if err:
                    trial.error = f"baseline run {i + 1}: {err}"
                    break
                trial.sessions.append(str(session))
            trial.wall_s = sum(walls)
            if walls and trial.error is None:
                self.plain_s[step.key] = statistics.median(walls)
        else:
            trial.wall_s, session, trial.error = self.pytest(step, f"{step.key}-plain", repo, step.files, [])
            if session is not None:
                trial.sessions.append(str(session))
                self.plain_s[step.key] = trial.wall_s
        self.say(step, trial)
        if trial.error:
            self.notes.append(f"{step.key}: {step.setup} failed, so its trials did not run: {trial.error}")
        return trial.error is None

    def trial(self, step: Step, t: int, repo: Path) -> None:
        trial = Trial(step.key, t, estimate_s=step.each_s)
        self.trials.append(trial)
        name = f"{step.key}-{t}"
        found: list[dict] = []
        try:
            if step.kind == "stored":
                found = self.stored_trial(step, trial, name, repo)
            else:
                trial.wall_s, session, trial.error = self.pytest(step, name, repo, step.files,
                                                                 ["--bench-against", "HEAD~1"])
                if session is not None:
                    trial.sessions.append(str(session))
                    doc = json.loads(session.read_text())
                    self.environment = self.environment or _environment(doc)
                    found = side_by_side_decisions(doc)
                    if not found:
                        trial.error = f"the session decided nothing: see {self.out / 'logs' / (name + '.log')}"
        except Exception as exc:  # noqa: BLE001 - one trial's failure is said and counted; the others still run
            trial.error = f"{type(exc).__name__}: {exc}"
        plain = self.plain_s.get(step.key)
        gate = step.gate if step.kind != "pb" else f"{step.gate}, benchmark fixture"
        for d in found:
            d.update(gate=gate, step=step.key, trial=t, wall_s=trial.wall_s, decided_in_session=len(found),
                     cost=trial.wall_s / plain if plain else None)
            self.decisions.append(d)
            rec = d.get("recomputed")
            if rec is not None and rec["verdict"] != d["verdict"]:
                self.notes.append(f"{name} {d['scenario']}: the session said {d['verdict']}, its rounds recomputed "
                                  f"here say {rec['verdict']}")
        if trial.error:
            self.notes.append(f"{name}: {trial.error}")
        self.say(step, trial, found)

    def stored_trial(self, step: Step, trial: Trial, name: str, repo: Path) -> list[dict]:
        from bench_core.files import storage

        walls, candidate = [], {}
        for i in range(self.candidate_runs):
            wall, session, err = self.pytest(step, f"{name}-run{i}", repo, step.files, [])
            walls.append(wall)
            if err:
                trial.error = f"candidate run {i + 1}: {err}"
                break
            trial.sessions.append(str(session))
            self.environment = self.environment or _environment(json.loads(session.read_text()))
            for n, ms in storage.load_candidate(session).items():
                candidate.setdefault(n, []).extend(ms)
        trial.wall_s = sum(walls)
        if trial.error:
            return []
        baseline = storage.by_scenario(storage.load_baseline(self.out / "baselines", "gpu_decisions"))
        return stored_decisions(baseline, candidate, self.threshold)

    def say(self, step: Step, trial: Trial, found: Sequence[Mapping] = ()) -> None:
        what = "setup" if trial.index < 0 else f"trial {trial.index + 1}"
        verdicts = counts([d["verdict"] for d in found])
        tail = f"error: {trial.error}" if trial.error else f"{len(found)} decisions: {verdicts}" if found else "ok"
        print(f"[{time.monotonic() - self.t0:5.0f} s] {step.key} {what}: {trial.wall_s:.1f} s (estimate "
              f"{trial.estimate_s:.0f} s); {tail}", flush=True)


def _environment(doc: Mapping[str, Any]) -> str:
    """The machine in words, from a session file's environment."""
    env = doc.get("environment") or {}
    if env.get("gpu_name"):
        return (f"{env['gpu_name']} (driver {env.get('gpu_driver') or '?'}, CUDA {env.get('cuda_version') or '?'}), "
                f"torch {env.get('torch') or '?'}")
    return f"{env.get('cpu_model') or 'CPU'} ({env.get('cpu_count') or '?'} cores), torch {env.get('torch') or '?'}"


def _finite(value):
    """The raw document with every non-finite number as None: the JSON writer refuses NaN, rightly."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def default_device(dry_run: bool) -> str:
    """cuda where it is available; a dry run plans for cuda without asking (it plans the GPU's run)."""
    if dry_run:
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="where to measure (default: cuda where available; a dry run plans for cuda)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="seconds for the whole run (default 240)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    ap.add_argument("--out", default=None, help="folder for the summary, the raw JSON, sessions and logs "
                                                "(default: $OUT, else .bench/gpu_decisions)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--changes", default=",".join(CHANGES))
    ap.add_argument("--gates", default="against,stored,pb", help="side by side (against), the stored gate "
                                                                  "(stored), the benchmark fixture (pb)")
    ap.add_argument("--trials", type=int, default=10, help="side-by-side trials per workload, at most")
    ap.add_argument("--stored-trials", type=int, default=3)
    ap.add_argument("--pb-trials", type=int, default=3)
    ap.add_argument("--baseline-runs", type=int, default=5, help="processes in the stored baseline")
    ap.add_argument("--candidate-runs", type=int, default=3, help="candidate processes per stored-gate trial")
    ap.add_argument("--threshold", type=float, default=0.02,
                    help="the stored gate's noise threshold (default 0.02, side by side's own; the stored gate's "
                         "default of 0.05 could not call +2%% slower)")
    ap.add_argument("--quick", action="store_true", help="--bench-quick for every pytest (a smoke run)")
    ap.add_argument("--pytest-args", default="", help="more arguments for every pytest, e.g. \"--bench-pairs 1\"")
    ap.add_argument("--process-s", type=float, default=None, help="the plan's estimate of a pytest process's start")
    ns = ap.parse_args(argv)
    for flag, given, known in (("--workloads", ns.workloads, WORKLOADS), ("--changes", ns.changes, CHANGES),
                               ("--gates", ns.gates, ("against", "stored", "pb"))):
        items = [x.strip() for x in given.split(",") if x.strip()]
        wrong = [x for x in items if x not in known]
        if wrong or not items:
            ap.error(f"{flag} {given!r}: choose from {', '.join(known)} (comma-separated), not {wrong or 'nothing'}")
        setattr(ns, flag[2:], [x for x in known if x in items])
    for flag in ("trials", "stored_trials", "pb_trials", "baseline_runs", "candidate_runs"):
        if getattr(ns, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(ns, flag)}")
    if ns.baseline_runs < 2:
        ap.error("--baseline-runs must be at least 2: a stored baseline's spread comes from its runs")
    if not 0 < ns.threshold < 1:
        ap.error(f"--threshold is a fraction in (0, 1), got {ns.threshold}")
    if ns.budget_s <= 0:
        ap.error(f"--budget-s must be positive, got {ns.budget_s}")
    return ns


def make_plan(ns: argparse.Namespace, device: str) -> Plan:
    costs = (QUICK_COSTS if ns.quick else COSTS)[device]
    if ns.process_s is not None:
        costs = replace(costs, process_s=ns.process_s)
    steps, notes = build_steps(device, ns.workloads, ns.changes, ns.gates, costs, ns.trials, ns.stored_trials,
                               ns.pb_trials, ns.baseline_runs, ns.candidate_runs)
    return fit(steps, ns.budget_s, device, costs, notes)


def main(argv=None) -> int:
    ns = parse(argv)
    device = ns.device or default_device(ns.dry_run)
    plan = make_plan(ns, device)
    print(plan_table(plan), flush=True)
    if ns.dry_run:
        return 0
    if not plan.steps:
        print("nothing fits the budget: no step runs", file=sys.stderr)
        return 1
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("--device cuda: CUDA is not available here (no GPU, or a CPU build of torch); --device cpu runs "
                  "the same code on the CPU", file=sys.stderr)
            return 2
    if shutil.which("git") is None and any(s.kind != "stored" for s in plan.steps):
        print("git is not installed: side by side needs a repository of two commits (--gates stored needs none)",
              file=sys.stderr)
        return 2
    out = Path(ns.out or os.environ.get("OUT") or ".bench/gpu_decisions").absolute()
    out.mkdir(parents=True, exist_ok=True)
    own = run_folder(out)     # this run's sessions, logs and baseline: a second run into `out` never mixes with it

    def stop(signum, frame):
        raise BudgetSpent(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, stop)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    work = Path(tempfile.mkdtemp(prefix="gpu-decisions-"))
    runner = Runner(plan, own, work, ns.threshold, (["--bench-quick"] if ns.quick else []) + ns.pytest_args.split(),
                    ns.baseline_runs, ns.candidate_runs)
    try:
        make_trees(work, ns.workloads, ns.changes, device)
        runner.run()
    except BudgetSpent as exc:
        runner.stopped = f"the run was cut short ({exc}): what was decided before is below"
    except Exception as exc:  # noqa: BLE001 - whatever stopped the run, what was decided before it is written
        runner.stopped = f"the run stopped on an error: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if runner.stopped:
        runner.notes.append(runner.stopped)
    return report(ns, plan, runner, out, started)


def run_folder(out: Path) -> Path:
    """A new folder under `out` named for this run's start, never one that exists."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for i in range(1000):
        path = out / (f"run-{stamp}" if i == 0 else f"run-{stamp}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{out}: no free run-{stamp} folder name")


def report(ns, plan: Plan, runner: Runner, out: Path, started: str) -> int:
    from bench_core.files import atomic

    doc = {"device": plan.device, "started": started, "budget_s": plan.budget_s,
           "spent_s": time.monotonic() - runner.t0, "environment": runner.environment or "environment not read",
           "run_folder": str(runner.out),
           "settings": {k: v for k, v in vars(ns).items()}, "costs": plan.costs.__dict__,
           "plan": [{**s.__dict__, "seconds": s.seconds} for s in plan.steps],
           "trials": [t.__dict__ for t in runner.trials], "decisions": runner.decisions, "notes": runner.notes,
           "columns": list(COLUMNS), "summary": summary_rows(runner.decisions)}
    path = atomic.write_stamped_json(out, "gpu_decisions", _finite(doc))
    md = atomic.write_new(path.with_suffix(".md"), markdown(doc).encode())
    print(markdown(doc))
    print(f"written to {path} and {md}")
    errors = [t for t in runner.trials if t.error]
    return 1 if errors or runner.stopped or not runner.decisions else 0


if __name__ == "__main__":
    sys.exit(main())
