"""The parent side of a distributed scenario: check the request, launch the ranks with torch's elastic launcher
(`python -m torch.distributed.run`), wait within a time limit, end every rank by its own id, and turn what the
ranks gathered into a `Measurement` whose samples are the maximum over ranks of each step.

One host: `--standalone`, a rendezvous on a free port. Several hosts: every host runs the same suite with the
same `--bench-nnodes` and `--bench-rdzv-endpoint HOST:PORT`; node 0 hosts the rendezvous there (and fails at
once if the port is taken), the others join it. Each scenario is its own rendezvous, named after it, so the
hosts must run the same scenarios in the same order, as the same suite does.
"""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from bench_core.core.errors import ScenarioError
from bench_core.workflows.distributed.peers import NODE_ENV
from bench_core.core.records import ColdStart, Measurement
from bench_core.core.ranks import RankSamples, max_over_ranks
from bench_core.core.scenario import Scenario
from bench_core.files import children

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Topology:
    """Where the ranks run: `nproc` on this host, `nnodes` hosts in all, this host's `node_rank`, and the
    rendezvous `endpoint` HOST:PORT (None: one host, a free port found by the launcher)."""

    nproc: int = 2
    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None

    def __post_init__(self):
        for name, low in (("nproc", 1), ("nnodes", 1), ("node_rank", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"--bench-{name.replace('_', '-')} must be an integer >= {low}, got {v!r}")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"--bench-node-rank {self.node_rank} is not below --bench-nnodes {self.nnodes}")
        if self.nnodes > 1 and self.endpoint is None:
            raise ValueError(f"{self.nnodes} hosts need a rendezvous both can reach: pass --bench-rdzv-endpoint "
                             f"HOST:PORT (HOST is node 0's address)")
        if self.endpoint is not None:
            host, _, port = self.endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"--bench-rdzv-endpoint must be HOST:PORT, got {self.endpoint!r}")

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


def preflight(name: str, topology: Topology, device: str, torch_module=None) -> str:
    """The backend for `device`, or a ScenarioError that says what to do; checked before any process starts."""
    import torch

    torch = torch_module or torch
    dist = torch.distributed
    if not dist.is_available():
        raise ScenarioError(name, "this torch build has no torch.distributed; install a build with it to run "
                                  "distributed scenarios")
    backend = BACKENDS[device]
    available = dist.is_gloo_available() if backend == "gloo" else dist.is_nccl_available()
    if not available:
        raise ScenarioError(name, f"torch.distributed's {backend} backend is not in this torch build, and "
                                  f"{device} ranks need it: install a torch build with {backend}")
    if device == "cuda":
        short = gpus_short(topology.nproc, torch)
        if short:
            raise ScenarioError(name, short)
    if topology.endpoint is not None and topology.node_rank == 0:
        host, _, port = topology.endpoint.rpartition(":")
        if not port_free(host, int(port)):
            raise ScenarioError(name, f"port {port} on {host} is in use, so node 0 cannot host the rendezvous "
                                      f"there: pick a free port in --bench-rdzv-endpoint (the same on every host)")
    return backend


def gpus_short(nproc: int, torch_module=None) -> str | None:
    """Why `nproc` ranks cannot have a GPU each on this host, or None when they can."""
    import torch

    count = (torch_module or torch).cuda.device_count()
    if nproc <= count:
        return None
    return f"{nproc} ranks on this host need one GPU each, and it has {count}: pass --bench-nproc {max(count, 1)} or fewer"


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1" if host == "localhost" else host, port))
        except OSError:
            return False
    return True


def launch_command(topology: Topology, spec_path: Path, rdzv_id: str, python: str | None = None) -> list[str]:
    # its log folder in the launch's own (else the launcher leaves a torchelastic_* folder in the temp folder a run)
    cmd = [python or sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(topology.nproc),
           "--max-restarts", "0", "--monitor-interval", "0.2", "--log-dir", str(spec_path.parent / "elastic")]
    if topology.endpoint is None:
        cmd += ["--standalone"]
    else:
        cmd += ["--nnodes", str(topology.nnodes), "--node-rank", str(topology.node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", topology.endpoint, "--rdzv-id", rdzv_id,
                "--rdzv-conf", f"is_host={'true' if topology.node_rank == 0 else 'false'}"]
    return cmd + ["-m", "bench_core.workflows.distributed.rank_program", str(spec_path)]


def rdzv_id(name: str, launch: int) -> str:
    """One rendezvous per scenario and launch, the same on every host running the same suite."""
    return f"bench-{hashlib.sha256(name.encode()).hexdigest()[:12]}-{launch}"


def _ours(pid: int, spec_path: Path) -> bool:
    """A pid still runs one of this launch's ranks (and is not a reused id)."""
    if not Path("/proc").is_dir():   # no /proc (macOS): that the status file's pid is alive is the best we know
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:          # gone (or not ours to read)
        return False
    return "bench_core.workflows.distributed.rank_program" in cmdline and str(spec_path) in cmdline


def end_all(proc: subprocess.Popen, folder: Path, spec_path: Path) -> None:
    """End the launcher and every rank it started, by their own ids: ranks run in sessions of their own, so
    a killed launcher would leave them behind."""
    from bench_core.files.exchange import read_rank_files

    pids = [int(d["pid"]) for d in read_rank_files(folder)["status"].values() if "pid" in d]
    children.end(proc, others=pids, still_ours=lambda pid: _ours(pid, spec_path), grace_s=KILL_GRACE_S)


def run_ranks(name: str, spec: Mapping[str, Any], topology: Topology, timeout_s: float | None,
              launch: int = 0, cwd: Path | None = None, python: str | None = None) -> dict:
    """Launch the ranks (from `cwd`, else this folder; by `python`, else this interpreter), wait, and return this
    node's gathered result; every failure is a ScenarioError that names the rank and its phase, with its traceback
    where it raised."""
    from bench_core.files.exchange import rank_exchange, read_rank_files, write_rank_spec

    with rank_exchange() as tmp:
        folder = Path(tmp)
        spec_path = write_rank_spec(folder, {**spec, "out_dir": str(folder)})
        log = folder / "launcher.log"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1",
               NODE_ENV: str(topology.node_rank)}
        argv = launch_command(topology, spec_path, rdzv_id(name, launch), python)
        ran = children.run_logged(argv, log, timeout_s, ending=lambda proc: end_all(proc, folder, spec_path), env=env,
                                  cwd=str(cwd or os.getcwd()))
        code, tail = ran.code, ran.tail
        files = read_rank_files(folder)
        if code is None:
            phases = ", ".join(f"rank {r} in '{d.get('phase')}'" for r, d in sorted(files["status"].items()))
            raise ScenarioError(name, f"its ranks ran past the time limit of {timeout_s:g} s and were ended "
                                      f"({phases or 'no rank had started'}; a rank waiting in a collective for a "
                                      f"peer that never comes looks like this). --bench-timeout sets the limit")
        if files["errors"]:   # a rank's own failure first; then one that failed because a peer ended
            r, err = min(files["errors"].items(), key=lambda e: ("peer" in e[1], e[0]))
            others = sorted(set(files["errors"]) - {r})
            also = f" (ranks {others} failed too)" if others else ""
            if "peer" in err:
                raise ScenarioError(name, f"rank {r} stopped during '{err['phase']}'{also}: {err['traceback'].rstrip()}")
            raise ScenarioError(name, f"rank {r} failed during '{err['phase']}'{also}:\n{err['traceback'].rstrip()}")
        if code != 0 or not files["results"]:
            started = len(files["status"])
            raise ScenarioError(name, f"the launcher ended with exit code {code} and {started} of "
                                      f"{topology.nproc} ranks on this host had started; its last lines: {tail}")
        return files["results"][0]


def samples_from(result: Mapping[str, Any]) -> RankSamples:
    ranks = result["ranks"]
    col = lambda key: None if ranks[0].get(key) is None else [r[key] for r in ranks]   # noqa: E731
    return RankSamples(world_size=result["world_size"], nnodes=result.get("nnodes", 1), backend=result["backend"],
                       host_ms=col("host_ms"), gpu_ms=col("gpu_ms"), local_host_ms=col("local_host_ms"),
                       local_gpu_ms=col("local_gpu_ms"),
                       cold_ms=[r["cold_gpu_ms"] if r.get("cold_gpu_ms") is not None else r["cold_host_ms"] for r in ranks],
                       hosts=[r["host"] for r in ranks], replicas_max_abs_diff=result.get("replicas_max_abs_diff"),
                       nodes=[r["node"] for r in ranks] if all("node" in r for r in ranks) else (),
                       reference=result.get("reference"))


def measurement_from(scenario: Scenario, result: Mapping[str, Any], *, device: str, warmup: int, repeats: int,
                     items_per_rank: int | None, environment: Mapping[str, Any]) -> Measurement:
    """The scenario's result: per step the slowest rank (host and GPU time each), every rank kept beside; its
    throughput counts every rank's items."""
    ranks = samples_from(result)
    items = None if items_per_rank is None else items_per_rank * ranks.world_size
    threads = result["ranks"][0].get("threads")
    scenario = scenario.with_metadata(world_size=ranks.world_size, nnodes=ranks.nnodes, backend=ranks.backend,
                                      ranks_per_node=ranks.world_size // ranks.nnodes)
    return Measurement(
        scenario=scenario, device=device, mode="per_call", block_size=1, warmup=warmup, repeats=repeats,
        host_ms=max_over_ranks(ranks.host_ms),
        gpu_ms=None if ranks.gpu_ms is None else max_over_ranks(ranks.gpu_ms),
        cold_start=ColdStart(max(r["cold_host_ms"] for r in result["ranks"]),
                             None if ranks.gpu_ms is None else max(r["cold_gpu_ms"] for r in result["ranks"])),
        items=items, threads=threads, environment=environment,
        ranks=ranks)


def builder_location(name: str, build: Callable) -> tuple[str, str]:
    """(file, function name) a rank imports the builder by; it must be a module-level function of a file."""
    import inspect

    qual = getattr(build, "__qualname__", "")
    if not callable(build) or "<" in qual or "." in qual:
        raise ScenarioError(name, f"the builder {qual or build!r} must be a module-level function (each rank "
                                  f"imports it from its file), not a lambda, closure or method")
    path = inspect.getsourcefile(build)
    if path is None:
        raise ScenarioError(name, f"the builder {qual} has no source file to import it from")
    return str(Path(path).resolve()), build.__name__


def ab_result(result: Mapping[str, Any], *, alpha: float, min_effect: float, params: Mapping[str, Any],
              identities: Mapping[str, Any], environment: Mapping[str, Any]):
    """Two configurations measured in the same ranks, round by round: each pair's cost is the slowest rank's, each
    round's evidence the median log ratio of its pairs, the verdict a t-test over rounds (`rounds_decision`).
    A candidate that did not start from the baseline's parameters, or does not end equal to it, is rejected."""
    import numpy as np

    from bench_core.deciding.rounds import rounds_decision
    from bench_core.deciding.verdicts import REJECTED
    from bench_core.workflows.ab import ABResult

    ranks = result["ranks"]
    primary = "gpu_ms" if ranks[0]["baseline"]["rounds"][0]["gpu_ms"] is not None else "host_ms"

    def per_round(side: str) -> list[tuple[float, ...]]:
        n_rounds = len(ranks[0][side]["rounds"])
        return [max_over_ranks([r[side]["rounds"][k][primary] for r in ranks]) for k in range(n_rounds)]

    base, cand = per_round("baseline"), per_round("candidate")
    cold_key = "cold_gpu_ms" if primary == "gpu_ms" else "cold_host_ms"
    cold = {side: max(r[side][cold_key] for r in ranks) for side in ("baseline", "candidate")}
    check = dict(result["correctness"])
    # what each side ran with as built, read back in rank 0, beside what was asked for
    built = {side: ranks[0][side].get("as_built") for side in ("baseline", "candidate")}
    identities = {side: {**identities.get(side, {}), "as_built": built[side]} for side in ("baseline", "candidate")}
    common = dict(params={**params, "world_size": result["world_size"], "backend": result["backend"],
                          "timer": "cuda_event" if primary == "gpu_ms" else "host", "figure": "slowest rank per step"},
                  identities=identities, correctness=check, environment=environment)
    asked = [identities[side].get("params") for side in ("baseline", "candidate")]
    same = (f"; warning: both sides ran with the same settings as built ({built['candidate']}) though they asked "
            f"for {asked[0]} and {asked[1]}: the candidate's parameters may not reach its step"
            if built["baseline"] is not None and built["baseline"] == built["candidate"] and asked[0] != asked[1]
            else "")
    flat_b, flat_c = tuple(v for r in base for v in r), tuple(v for r in cand for v in r)
    if not check.get("ok"):
        why = ("the two sides did not start from the same parameters" if check.get("start_max_abs_diff")
               else f"after {check.get('steps')} steps from the same start the parameters differ by "
                    f"{check.get('end_max_abs_diff'):.3g} (rtol {check.get('rtol')}, atol {check.get('atol')})")
        return ABResult(REJECTED, f"{why}: the candidate gets no speed verdict", None, None, None, None,
                        flat_b, flat_c, cold, **common)
    if min(flat_b + flat_c) <= 0:
        from bench_core.deciding.verdicts import INCONCLUSIVE

        return ABResult(INCONCLUSIVE, "a sample is 0 ms (below the timer's resolution): no ratio", None, None, None,
                        None, flat_b, flat_c, cold, **common)
    logs = [float(np.median(np.log(c) - np.log(b))) for b, c in zip(base, cand)]
    d = rounds_decision(logs, alpha, min_effect)
    return ABResult(d.verdict, d.reason + same, d.speedup, d.ci_low, d.ci_high, d.p_value, flat_b, flat_c, cold,
                    **common)
