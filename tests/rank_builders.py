"""Builders that run inside the ranks of the distributed tests (module-level: each rank imports this file).

The paced step sleeps a fixed time so its figures are known: every rank `base_ms`, rank `slow_rank` 20% more
(a straggler made on purpose), and the synchronised step adds `comm_ms` after a real all-reduce (the
communication the step does not hide). A tiny DDP MLP runs inside it, so the replicas and the single-process
reference are checked on real training."""
import time

import torch
from torch import nn

from bench_core.workflows.distributed.rank_program import RankStep, ddp_training


def _mlp(ctx):
    def shard(rank, world):
        g = torch.Generator().manual_seed(1000 + rank)
        return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    return ddp_training(ctx, lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
                        lambda m: torch.optim.SGD(m.parameters(), lr=0.1), shard, nn.functional.cross_entropy)


def paced(ctx) -> RankStep:
    p = ctx.params
    inner = _mlp(ctx)
    pace = p["base_ms"] / 1e3 * (1.2 if ctx.rank == p.get("slow_rank") else 1.0)
    before = p.get("slow_ms", 0.0) / 1e3 if ctx.rank == p.get("slow_rank") else 0.0

    def step():
        time.sleep(before)                 # before the gradients' all-reduce: the other ranks wait for this one
        return synced()

    def synced():
        out = inner.step()
        time.sleep(pace)
        time.sleep(p["comm_ms"] / 1e3)    # stands for gradient traffic the step cannot hide
        return out

    def local_step():
        out = inner.local_step()
        time.sleep(pace)
        return out
    return RankStep(step, local_step, inner.snapshot, inner.replicated, inner.reference,
                    settings=lambda: {**inner.settings(), "base_ms": p["base_ms"]})


def crashing(ctx) -> RankStep:
    if ctx.rank == ctx.params.get("bad_rank", 1):
        raise RuntimeError(f"rank {ctx.rank} cannot build: out of unicorns")
    return _mlp(ctx)


def hanging(ctx) -> RankStep:
    if ctx.rank == 1:
        time.sleep(3600)   # never returns: rank 0 waits for it in the first barrier
    return _mlp(ctx)


def launcher_dies(ctx) -> RankStep:
    """Node 1 goes down: its launcher killed outright while the other node's rank waits for its rank in the first
    collective (which rank lands on which node is the rendezvous's choice)."""
    import os

    if os.environ.get("BENCH_CORE_NODE_RANK") == "1":
        import signal

        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(3600)
    return _mlp(ctx)


def diverging(ctx) -> RankStep:
    """A broken data-parallel step: rank 1 nudges its own weights after each step, so the replicas drift."""
    inner = _mlp(ctx)

    def step():
        out = inner.step()
        if ctx.rank == 1:
            with torch.no_grad():
                next(iter(inner.replicated())).add_(1e-3)
        return out
    return RankStep(step, replicated=inner.replicated)


def plain(ctx) -> RankStep:
    inner = _mlp(ctx)
    return RankStep(inner.step, replicated=inner.replicated)
