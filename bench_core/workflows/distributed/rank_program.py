"""What runs in every rank of a distributed scenario: `python -m torch.distributed.run ... -m bench_core.workflows.distributed.rank_program SPEC`.

torch's elastic launcher starts the ranks; each one reads the spec the parent wrote, joins the process group,
calls the scenario's builder (a module-level function of the benchmark file, `build(ctx) -> RankStep`) and
takes the same samples in the same order as every other rank, with the one sample loop of `sampling`:

  cold start   the first step, timed on its own on every rank
  warmup       untimed steps
  samples      `repeats` steps; where the builder gives a local step (gradient sync off) one of those beside
               each, in a seeded order every rank shares; a barrier *before* each window, never inside
  check        every parameter against rank 0's (broadcast), the largest difference over all ranks
  gather       every rank's samples to every rank; local rank 0 of each node writes the result
  validation   a fresh instance, a few synchronised steps, against the builder's single-process reference

That is a measurement (`measure_rank`); a spec with `ab` measures two configurations in rounds instead
(`ab_rank`), one with `profile` runs the diagnose pass (`profile_rank`).

Each rank keeps a status file (its pid and phase) for the parent, which uses it to name a rank that hangs and
to end every rank by its own id; a rank that raises writes its traceback beside it.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import random
import socket
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from bench_core.workflows.distributed import peers
from bench_core.workflows.side_server import loaded_files

VALIDATION_STEPS = 3


@dataclass(frozen=True)
class RankContext:
    """What a builder knows about the rank it builds for."""

    rank: int
    world_size: int
    local_rank: int
    device: str              # "cpu" or "cuda:<local rank>"
    quick: bool = False
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def size(self, cpu, gpu, quick=None):
        """Small on the CPU, realistic on the GPU, smallest in --bench-quick (as `bench.size`)."""
        from bench_core.timing.counts import pick_size

        return pick_size("cuda" if self.on_gpu else "cpu", self.quick, cpu, gpu, quick)


@dataclass
class RankStep:
    """A builder's answer: one rank's step, and what the suite needs to judge it.

    `local_step`: the same step with gradient synchronisation off (DDP's `no_sync()`), timed beside the real
    one to estimate the communication the step does not hide; `snapshot()` is called (untimed) before each
    local step and returns the function that puts the state back after it, so the ranks never drift apart.
    `replicated()`: the parameters, which must be identical on every rank after the steps (DDP's replicas; a
    sharded DTensor is compared whole, so for FSDP the check says only that the shards assemble the same way).
    `reference(steps)`: on rank 0, the same parameters after `steps` steps of a single-process run on the
    global batch, from the same start; compared with a fresh instance after that many steps.
    `settings()`: what the step really runs with, read back from the objects built (DDP's bucket size as it
    holds it), not the parameters asked for: an A/B records it per side, so a candidate that silently ran
    with the baseline's settings shows.
    """

    step: Callable[[], Any]
    local_step: Callable[[], Any] | None = None
    snapshot: Callable[[], Callable[[], None]] | None = None
    replicated: Callable[[], Iterable[Any]] | None = None
    reference: Callable[[int], Sequence[Any]] | None = None
    tolerance: tuple[float, float] = (1e-4, 1e-5)   # (rtol, atol) for the reference check, float32's
    settings: Callable[[], Mapping[str, Any]] | None = None

    def __post_init__(self):
        if not callable(self.step):
            raise TypeError("RankStep.step must be callable")
        if (self.local_step is None) != (self.snapshot is None):
            raise TypeError("RankStep: a local_step needs a snapshot that restores the state after it, and the "
                            "other way round (the ranks would drift apart)")


def module_state_snapshot(module, optimizer=None) -> Callable[[], Callable[[], None]]:
    """A `snapshot` for a module and its optimizer: parameters and buffers copied, optimizer state deep-copied."""
    import torch

    def snapshot():
        tensors = [t.detach().clone() for t in (*module.parameters(), *module.buffers())]
        opt = None if optimizer is None else copy.deepcopy(optimizer.state_dict())

        def restore():
            with torch.no_grad():
                for t, saved in zip((*module.parameters(), *module.buffers()), tensors):
                    t.copy_(saved)
            if opt is not None:
                optimizer.load_state_dict(opt)
        return restore
    return snapshot


def ddp_training(ctx: RankContext, make_model: Callable[[], Any], make_optimizer: Callable[[Any], Any],
                 batch: Callable[[int, int], tuple[Any, Any]], loss_fn: Callable[[Any, Any], Any], *,
                 reference: bool = True, **ddp_options) -> RankStep:
    """The DDP training step every library scenario uses: forward, backward (gradients all-reduced in
    buckets while backward runs), optimizer step, on rank r's shard `batch(r, world_size)`.

    The model is built from seed 0 on every rank (DDP also broadcasts rank 0's weights). The local step is the
    same step under `no_sync()`. The reference, where asked for, is the model trained on all shards at once in
    one process: with a mean loss over equal shards, DDP's averaged gradient is that gradient."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = make_model().to(ctx.device).train()
    ddp = DDP(model, device_ids=[ctx.local_rank] if ctx.on_gpu else None, **ddp_options)
    opt = make_optimizer(ddp)
    x, y = (t.to(ctx.device) for t in batch(ctx.rank, ctx.world_size))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    def local_step():
        with ddp.no_sync():
            return step()

    def settings():
        return {"bucket_cap_mb": ddp.bucket_bytes_cap / 2 ** 20, "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
                "static_graph": ddp.static_graph, "optimizer": type(opt).__name__, "lr": opt.param_groups[0]["lr"]}

    return RankStep(step, local_step, module_state_snapshot(model, opt), lambda: list(model.parameters()),
                    single_process(ctx, make_model, make_optimizer, batch, loss_fn) if reference else None,
                    settings=settings)


def single_process(ctx: RankContext, make_model: Callable[[], Any], make_optimizer: Callable[[Any], Any],
                   batch: Callable[[int, int], tuple[Any, Any]], loss_fn: Callable[[Any, Any], Any]
                   ) -> Callable[[int], list]:
    """A `reference` for a data-parallel step: the model built from seed 0 in one process and trained on every
    rank's shard at once; with a mean loss over equal shards, the ranks' averaged gradient is its gradient."""
    import torch

    def reference(steps: int) -> list:
        torch.manual_seed(0)
        m = make_model().to(ctx.device).train()
        o = make_optimizer(m)
        shards = [batch(r, ctx.world_size) for r in range(ctx.world_size)]
        xs, ys = (torch.cat([s[i] for s in shards]).to(ctx.device) for i in (0, 1))
        for _ in range(steps):
            o.zero_grad(set_to_none=True)
            loss_fn(m(xs), ys).backward()
            o.step()
        return list(m.parameters())
    return reference


# -- the rank program ----------------------------------------------------------------------------------
def _load_builder(spec: Mapping[str, Any]) -> Callable[[RankContext], RankStep]:
    sys.path[:0] = [p for p in spec["import_roots"] if p not in sys.path]
    path = Path(spec["builder_file"])
    mod_name = f"_bench_rank_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    module_spec.loader.exec_module(module)
    return getattr(module, spec["builder"])


def _max_diff_from_rank0(tensors: Iterable[Any], device: str) -> float:
    """The largest absolute difference of any of these tensors from rank 0's, over all ranks."""
    import torch
    import torch.distributed as dist

    worst = torch.zeros((), dtype=torch.float64, device=device)
    for t in _whole(tensors):
        ref = t.clone()
        dist.broadcast(ref, src=0)
        if t.numel():
            worst = torch.maximum(worst, (t.double() - ref.double()).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def _whole(tensors: Iterable[Any]) -> list[Any]:
    """Tensors as whole tensors: a sharded DTensor is gathered (a collective: every rank calls this)."""
    return [t.detach().full_tensor() if hasattr(t, "full_tensor") else t.detach() for t in tensors]


def _max_abs_diff(ours: Sequence[Any], theirs: Sequence[Any]) -> float:
    """The largest absolute difference between paired tensors (0.0 for none or empty ones)."""
    return max((float((a.double() - b.double().to(a.device)).abs().max()) for a, b in zip(ours, theirs) if a.numel()),
               default=0.0)


def _reference_check(fresh: RankStep, steps: int, rank: int) -> dict | None:
    """The fresh instance's parameters against the single-process reference, judged on rank 0."""
    import torch

    ours = _whole(fresh.replicated())
    if rank != 0:
        return None
    rtol, atol = fresh.tolerance
    ref = [t.detach() for t in fresh.reference(steps)]
    if len(ours) != len(ref) or any(a.shape != b.shape for a, b in zip(ours, ref)):
        return {"steps": steps, "ok": False, "max_abs_diff": None, "rtol": rtol, "atol": atol,
                "problem": "the reference's parameters have other shapes or another count"}
    worst = _max_abs_diff(ours, ref)
    ok = all(torch.allclose(a, b.to(a.device), rtol=rtol, atol=atol) for a, b in zip(ours, ref))
    return {"steps": steps, "ok": ok, "max_abs_diff": worst, "rtol": rtol, "atol": atol}


class _Rank:
    """This rank's place in the world, its builder, and the sample loop behind a barrier."""

    def __init__(self, spec: Mapping[str, Any], status: Callable[[str], None]):
        import torch.distributed as dist

        from bench_core.timing.backends import backend_for
        from bench_core.timing.sampling import Sampler, set_threads

        self.spec, self.status, self.dist = spec, status, dist
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.on_gpu = spec["device"] == "cuda"
        self.device = f"cuda:{self.local_rank}" if self.on_gpu else "cpu"
        self.threads = set_threads(spec.get("threads"))
        if spec.get("malloc_pinned"):   # as the session's own process (--bench-malloc), before anything is built
            from bench_core.workflows.malloc import pin_malloc

            pin_malloc()
        self.builder = _load_builder(spec)
        self.ctx = RankContext(self.rank, self.world, self.local_rank, self.device, spec["quick"],
                               spec.get("params") or {})
        self.sampler = Sampler(spec["scenario"], backend_for("cuda" if self.on_gpu else "cpu"),
                               before_sample=dist.barrier)   # outside the window: every rank starts the step together
        # the same seed on every rank: the same steps, so the same collectives, in the same order
        self.order = random.Random(spec.get("seed", 0))

    def build(self, **variant) -> RankStep:
        ctx = self.ctx if not variant else RankContext(self.rank, self.world, self.local_rank, self.device,
                                                       self.ctx.quick, {**self.ctx.params, **variant})
        inst = self.builder(ctx)
        if not isinstance(inst, RankStep):
            raise TypeError(f"{self.spec['builder']} returned {type(inst).__name__}, not a RankStep")
        return inst

    def untimed(self, fn, what):
        return self.sampler.warm(fn, what)   # after the barrier, as a timed step would be

    def me(self) -> dict:
        return {"rank": self.rank, "host": socket.gethostname(), "node": int(os.environ.get(peers.NODE_ENV, 0)),
                "pid": os.getpid(), "threads": self.threads}

    def gathered(self, mine: Mapping[str, Any]) -> list:
        self.status("gathering")
        everyone: list = [None] * self.world
        self.dist.all_gather_object(everyone, {**self.me(), **mine})
        return sorted(everyone, key=lambda d: d["rank"])

    def max_over_ranks(self, value: float) -> float:
        import torch

        t = torch.tensor(float(value), dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t)


def _ms(samples, on_gpu: bool) -> dict:
    return {"host_ms": [s.host_ms for s in samples], "gpu_ms": [s.gpu_ms for s in samples] if on_gpu else None}


def measure_rank(me: _Rank) -> dict:
    """The series (`timing.measuring.series`, behind the rank's barrier, the local step beside where given),
    then the replica check and the reference."""
    from bench_core.timing.measuring import Beside, series

    spec, status = me.spec, me.status
    status("build")
    inst = me.build()
    beside = None if inst.local_step is None else Beside(inst.local_step, inst.snapshot)
    taken = series(me.sampler, inst.step, warmup=spec["warmup"], repeats=spec["repeats"], beside=beside,
                   order=me.order, phase=status)
    cold, step, local = taken.cold, list(taken.samples), list(taken.beside)
    status("checking the replicas")
    diff = _max_diff_from_rank0(inst.replicated(), me.device) if inst.replicated is not None else None
    loc = _ms(local, me.on_gpu)
    everyone = me.gathered({"cold_host_ms": cold.host_ms, "cold_gpu_ms": cold.gpu_ms,
                            **_ms(step, me.on_gpu), "local_host_ms": loc["host_ms"] if local else None,
                            "local_gpu_ms": loc["gpu_ms"] if local else None})
    reference = None
    if spec.get("validate") and inst.reference is not None:
        status("validation")
        del inst
        fresh = me.build()
        for i in range(VALIDATION_STEPS):
            me.untimed(fresh.step, f"validation step {i}")
        found = [_reference_check(fresh, VALIDATION_STEPS, me.rank)]
        me.dist.broadcast_object_list(found, src=0)
        reference = found[0]
    return {"ranks": everyone, "replicas_max_abs_diff": diff, "reference": reference}


def profile_rank(me: _Rank) -> dict:
    """The diagnose pass, in every rank: a fresh instance, a first step and the warmup untimed, then the profiler
    over the same steps on every rank; each rank writes its own redacted trace, under a new name."""
    from bench_core.workflows.diagnose.profile import ProfileConfig, profile

    spec = me.spec
    cfg = ProfileConfig(**{**spec["profile"], "folder": Path(spec["profile"]["folder"])})
    me.status("build")
    inst = me.build()
    for i in range(1 + spec["warmup"]):
        me.untimed(inst.step, f"step {i} before profiling")
    me.status("profiling")
    me.dist.barrier()
    res = profile(f"{spec['scenario']}.rank{me.rank}", inst.step, cfg)
    return {"ranks": me.gathered({"profile": {
        "scenario": res.scenario, "trace": None if res.trace_path is None else str(res.trace_path),
        "redaction": res.redaction, "table": res.table, "facts": res.facts.to_dict(),
        "hypotheses": [h.to_dict() for h in res.hypotheses], "refused": res.refused}})}


SIDES = ("baseline", "candidate")


def ab_rank(me: _Rank) -> dict:
    """Two configurations of one scenario (`spec["ab"]`: each side's parameters, given to the builder) in the same
    processes, in the one rounds loop (`timing.protocol.run_rounds`, the rank's barrier before every sample, the
    same seed on every rank so every rank takes the same steps in the same order). In round 0 the two must start
    from identical parameters, and after the same steps on the same data they must still agree within the
    candidate's tolerance (correctness and speed decide together)."""
    from bench_core.timing.protocol import Instance, run_rounds

    spec, status = me.spec, me.status
    steps: dict[str, RankStep] = {}
    check: dict[str, Any] = {}
    built: dict[str, Any] = {}

    def builder(side: str):
        def build(r: int) -> Instance:
            status(f"round {r}: build")
            steps[side] = me.build(**spec["ab"][side])
            return Instance(steps[side].step)
        return build

    def after_build(r: int) -> None:
        status(f"round {r}: steps")
        if r == 0:
            check.update(_start_check(me, steps))
            built.update({s: None if steps[s].settings is None else dict(steps[s].settings()) for s in SIDES})

    def after_round(r: int) -> None:
        if r == 0:
            check.update(_end_check(me, steps, 1 + spec["warmup"] + spec["pairs"]))
            check["ok"] = check["ok"] and check["start_max_abs_diff"] == 0.0
        steps.clear()   # this round's instances go before the next round allocates its own

    res = run_rounds({s: builder(s) for s in SIDES}, me.sampler, rounds=spec["rounds"], pairs=spec["pairs"],
                     warmup=spec["warmup"], seed=spec.get("seed", 0), min_rounds=1, after_build=after_build,
                     after_round=after_round, ahead="always")
    everyone = me.gathered({side: {"cold_host_ms": res.cold[side][0].host_ms, "cold_gpu_ms": res.cold[side][0].gpu_ms,
                                   "as_built": built[side],
                                   "rounds": [_ms(rnd, me.on_gpu) for rnd in getattr(res, side)]} for side in SIDES})
    return {"ranks": everyone, "correctness": check}


def _start_check(me: _Rank, steps: Mapping[str, RankStep]) -> dict:
    start = [_whole(steps[s].replicated()) if steps[s].replicated is not None else None for s in SIDES]
    if None in start:
        raise TypeError(f"{me.spec['builder']}: an A/B needs RankStep.replicated, to prove both sides start "
                        f"from the same parameters and end equal")
    return {"start_max_abs_diff": me.max_over_ranks(_max_abs_diff(*start))}


def _end_check(me: _Rank, steps: Mapping[str, RankStep], taken: int) -> dict:
    import torch

    rtol, atol = steps["candidate"].tolerance
    a, b = (_whole(steps[s].replicated()) for s in SIDES)
    close = all(x.shape == y.shape and bool(torch.allclose(x, y, rtol=rtol, atol=atol)) for x, y in zip(a, b))
    return {"steps": taken, "end_max_abs_diff": me.max_over_ranks(_max_abs_diff(a, b)),
            "ok": me.max_over_ranks(0.0 if close and len(a) == len(b) else 1.0) == 0.0, "rtol": rtol, "atol": atol}


def run_rank(spec: Mapping[str, Any], status: Callable[[str], None],
             on_silent: Callable[[int, Mapping[str, Any]], None] | None = None,
             phase: Callable[[], str] = lambda: "") -> dict | None:
    """One rank's whole part; returns the gathered result on each node's local rank 0, else None. `on_silent`:
    what to do when a peer ends before this rank (`peers.PeerWatch`)."""
    import datetime

    import torch
    import torch.distributed as dist

    if spec["device"] == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    status("joining the process group")
    dist.init_process_group(spec["backend"], timeout=datetime.timedelta(seconds=spec["collective_timeout_s"]))
    store, watch = peers.default_store(), None
    if store is not None and on_silent is not None:
        watch = peers.PeerWatch(store, dist.get_rank(), dist.get_world_size(),
                                int(os.environ.get("LOCAL_RANK", 0)) == 0, phase, on_silent,
                                silent_s=spec.get("silent_s", peers.SILENT_S)).start(dist.barrier)
    try:
        me = _Rank(spec, status)
        out = ab_rank(me) if spec.get("ab") else profile_rank(me) if spec.get("profile") else measure_rank(me)
        status("done")
        if watch is not None:   # every rank stops watching before any ends: a store held by a rank's process
            watch.stop()        # (older torch) goes with it, and a rank still watching would take that for a death
            dist.barrier()
        if me.local_rank != 0:
            return None
        return {"world_size": me.world, "nnodes": me.world // int(os.environ.get("LOCAL_WORLD_SIZE", me.world)),
                "backend": spec["backend"], "torch": torch.__version__, **out,
                **({"loaded": loaded_files(spec["proof_roots"])} if spec.get("proof_roots") else {})}
    except BaseException as exc:
        if watch is not None and peers.between_ranks(exc):   # a peer's end, seen by a collective: name that peer
            found = watch.culprit()
            if found is not None:
                cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
                on_silent(found[0], {**found[1], "cause": cause})
        if watch is not None:   # said at once, so a peer on another node names it instead of waiting for it
            try:
                watch.stop(failed=True)
            except Exception:  # noqa: BLE001 - the store is gone too: this rank's own error is what to report
                pass
        raise
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    from bench_core.files import exchange

    argv = sys.argv[1:] if argv is None else argv
    spec = exchange.read_rank_spec(Path(argv[0]))
    out = Path(spec["out_dir"])
    rank = int(os.environ.get("RANK", 0))
    phase = ["starting"]

    def status(what: str) -> None:
        phase[0] = what
        exchange.write_rank_status(out, rank, {"pid": os.getpid(), "phase": what, "host": socket.gethostname()})

    def silent(peer: int, said: Mapping[str, Any]) -> None:   # from the watch's thread: this rank fails now
        exchange.write_rank_error(out, rank, phase[0],
                                  peers.peer_ended(peer, said, spec.get("silent_s", peers.SILENT_S)), peer=peer)
        os._exit(3)   # this rank's main thread waits in a collective for that peer: it never returns

    status("starting")
    try:
        result = run_rank(spec, status, silent, lambda: phase[0])
    except BaseException:
        exchange.write_rank_error(out, rank, phase[0], traceback.format_exc())
        return 1
    if result is not None:
        exchange.write_rank_result(out, int(os.environ.get("GROUP_RANK", 0)), result)
    return 0


if __name__ == "__main__":   # run as the package's module, so a builder's RankStep is this module's RankStep
    import atexit

    from bench_core.workflows.distributed.rank_program import main as _main

    _code = _main()
    # its exit handlers run (the user's own, logging), then the rank ends without the interpreter taking down every
    # object one by one, for which its launcher (and every launch after it) waits
    atexit._run_exitfuncs()
    for _stream in (sys.stdout, sys.stderr):
        _stream.flush()
    os._exit(_code)
