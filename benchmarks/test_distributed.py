"""Data-parallel training steps over several ranks, launched with torch's elastic launcher.

The window of every rank holds forward, backward (DDP all-reduces gradient buckets while backward runs) and the
optimizer step, on that rank's own shard of a batch already on its device. The result is the slowest rank's
time for each step; every rank's samples are kept. Gloo on the CPU, NCCL under --gpu (one GPU per rank).
The builders below run inside each rank, so they are module-level functions of this file.
"""
import pytest
import torch
from torch import nn

from bench_core import Scenario
from bench_core import RankStep, ddp_training, single_process
from models import MLP, SmallCNN, synthetic_images


def _mlp_sizes(ctx):
    return ctx.size(cpu=(256, 512, 64), gpu=(4096, 4096, 256), quick=(32, 64, 16))


def _mlp_shard(d, batch):
    def shard(rank, world):
        g = torch.Generator().manual_seed(1000 + rank)   # each rank its own data, as a sampler would give it
        return torch.randn(batch, d, generator=g), torch.randint(0, 10, (batch,), generator=g)
    return shard


def ddp_mlp(ctx) -> RankStep:
    d, h, batch = _mlp_sizes(ctx)
    return ddp_training(ctx, lambda: MLP(d, h), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
                        _mlp_shard(d, batch), nn.functional.cross_entropy,
                        bucket_cap_mb=ctx.params.get("bucket_cap_mb", 25),
                        gradient_as_bucket_view=ctx.params.get("gradient_as_bucket_view", False))


def ddp_cnn(ctx) -> RankStep:
    batch, size, width = ctx.size(cpu=(16, 32, 16), gpu=(64, 64, 64), quick=(4, 16, 8))

    def shard(rank, world):
        x, y = synthetic_images(batch, size, seed=1000 + rank)
        return x, y
    # BatchNorm normalises each rank's shard with its own statistics, so no single-process run on the whole
    # batch is the same computation: replicas are checked, the reference is not
    return ddp_training(ctx, lambda: SmallCNN(width=width), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
                        shard, nn.functional.cross_entropy, reference=False)


def fsdp_mlp(ctx) -> RankStep:
    """FSDP2: every Linear sharded over the ranks (`fully_shard`); parameters all-gathered for forward and
    backward, gradients reduce-scattered. No local step: without the reduce-scatter the sharded optimizer
    step has no gradient to use, so exposed communication is not estimated here."""
    from torch.distributed.fsdp import fully_shard

    d, h, batch = _mlp_sizes(ctx)
    torch.manual_seed(0)
    model = MLP(d, h).to(ctx.device).train()
    for layer in model.net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(ctx.device) for t in _mlp_shard(d, batch)(ctx.rank, ctx.world_size))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    reference = single_process(ctx, lambda: MLP(d, h), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
                               _mlp_shard(d, batch), nn.functional.cross_entropy)
    return RankStep(step, replicated=lambda: list(model.parameters()), reference=reference)


def _fsdp2_supported() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def _scenario(name, model, batch_per_rank, note):
    return Scenario(name, ("forward", "backward", "optimizer_step"),
                    {"batch_size_per_rank": batch_per_rank, "dtype": "float32", "mode": "train", "compiled": False,
                     "data_source": "synthetic, a shard per rank, on device", "model": model, "optimizer": "AdamW",
                     "parallelism": note})


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_ddp_train_step(bench, kind):
    if kind == "mlp":
        d, h, batch = bench.size(cpu=(256, 512, 64), gpu=(4096, 4096, 256), quick=(32, 64, 16))
        build, model = ddp_mlp, f"MLP({d}->{h}x3->10)"
    else:
        batch, size, width = bench.size(cpu=(16, 32, 16), gpu=(64, 64, 64), quick=(4, 16, 8))
        build, model = ddp_cnn, f"SmallCNN(width={width}) on {size}x{size}"
    scenario = _scenario(f"ddp_train_step[{kind}]", model, batch, "DDP, bucket_cap_mb=25")
    m = bench.run_distributed(scenario, build, nproc=2, items_per_rank=batch, scaling=kind == "mlp")
    assert m.ranks.world_size >= 1 and len(m.ranks.host_ms[0]) == m.repeats
    assert m.ranks.replicas_max_abs_diff == 0.0


@pytest.mark.skipif(not _fsdp2_supported(), reason="this torch build has no FSDP2 (torch.distributed.fsdp.fully_shard)")
def test_fsdp2_train_step(bench):
    d, h, batch = bench.size(cpu=(256, 512, 64), gpu=(4096, 4096, 256), quick=(32, 64, 16))
    scenario = _scenario("fsdp2_train_step[mlp]", f"MLP({d}->{h}x3->10)", batch, "FSDP2 fully_shard per Linear")
    m = bench.run_distributed(scenario, fsdp_mlp, nproc=2, items_per_rank=batch)
    assert m.ranks.reference is not None and m.ranks.reference["ok"]


def test_ddp_bucket_settings_ab(bench):
    """Does gradient bucketing matter here? DDP's default (25 MB buckets, gradients copied into them) against
    1 MB buckets with gradients as views of the buckets: the same start on every rank, the same result
    required, then timed pair by pair in the same ranks, both built anew every round."""
    res = bench.ab_distributed("ddp_mlp: 1 MB buckets, gradient_as_bucket_view vs default", ddp_mlp,
                               baseline={"bucket_cap_mb": 25}, candidate={"bucket_cap_mb": 1,
                                                                          "gradient_as_bucket_view": True})
    assert res.correctness["start_max_abs_diff"] == 0.0 and res.correctness["ok"]
