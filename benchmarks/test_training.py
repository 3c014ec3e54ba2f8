"""Training steps: MLP and CNN, with the batch already on the device or read from a DataLoader.

"prepared": the window holds forward, backward, optimizer step on a batch already on the device.
"dataloader": the window also holds reading the next batch from a DataLoader and the host-to-device
transfer, so the difference between the two is what input handling costs.
"""
from collections import deque

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bench_core import Scenario
from bench_core import stage
from models import MLP, SmallCNN, synthetic_images


def _cycle(loader):
    while True:
        yield from loader


def _build(kind, bench):
    torch.manual_seed(0)
    if kind == "mlp":
        d, h, batch, n = bench.size(cpu=(256, 512, 64, 512), gpu=(4096, 4096, 512, 8192), quick=(32, 64, 16, 64))
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 10, (n,), generator=g)
        x = torch.randn(n, d, generator=g) + nn.functional.one_hot(y, d).float() * 2
        model = MLP(d, h)
        return model, x, y, batch, f"MLP({d}->{h}x3->10)"
    batch, size, width, n = bench.size(cpu=(16, 32, 16, 128), gpu=(128, 64, 64, 2048), quick=(8, 16, 8, 32))
    x, y = synthetic_images(n, size)
    return SmallCNN(width=width), x, y, batch, f"SmallCNN(width={width})"


@pytest.mark.parametrize("source", ["prepared", "dataloader"])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_train_step(bench, kind, source):
    dev = bench.device
    model, x, y, batch, desc = _build(kind, bench)
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    probe_x, probe_y = x[:batch].to(dev), y[:batch].to(dev)

    def probe_loss():
        with torch.no_grad():
            return float(loss_fn(model(probe_x), probe_y))

    if source == "prepared":
        xb, yb = x[:batch].to(dev), y[:batch].to(dev)
        window = ("forward", "backward", "optimizer_step")

        def next_batch():
            return xb, yb
    else:
        loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True,
                            pin_memory=bench.on_gpu)
        it = _cycle(loader)
        window = ("batch_read", "transfer", "forward", "backward", "optimizer_step")

        def next_batch():
            with stage("batch_read"):
                xb, yb = next(it)
            with stage("transfer"):
                return xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)

    def step():
        xb, yb = next_batch()
        opt.zero_grad(set_to_none=True)
        with stage("forward"):
            loss = loss_fn(model(xb), yb)
        with stage("backward"):
            loss.backward()
        with stage("optimizer_step"):
            opt.step()
        losses.append(loss.detach())

    scenario = Scenario(
        f"train_step[{kind}-{source}]", window,
        {"shapes": {"x": [batch, *x.shape[1:]]}, "batch_size": batch, "dtype": "float32", "mode": "train",
         "compiled": False, "data_source": "synthetic, on device" if source == "prepared" else
         "DataLoader(num_workers=0, shuffle) over an in-memory TensorDataset", "model": desc, "optimizer": "AdamW"},
    )
    before = probe_loss()
    bench.run(scenario, step, items=batch)
    assert torch.isfinite(torch.stack(losses)).all(), "non-finite loss"
    # on a fixed probe batch, so a shuffled loader's easy and hard batches cannot fake or hide progress
    assert probe_loss() < before, "loss on the probe batch did not decrease: the step is not training"


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_cnn_inference_batch_sizes(bench, batch):
    """Requests at several batch sizes; model loading is the cold start, never inside a request."""
    dev = bench.device
    size, width = bench.size(cpu=(32, 16), gpu=(64, 64), quick=(16, 8))
    batch = batch if not bench.on_gpu else batch * 8
    torch.manual_seed(0)
    weights = SmallCNN(width=width).state_dict()
    x = synthetic_images(batch, size)[0].to(dev)
    state, outs = {}, deque(maxlen=1)  # last output only: a list makes each call allocate anew

    def load():
        model = SmallCNN(width=width)
        model.load_state_dict(weights)
        state["model"] = model.to(dev).eval()

    def request():
        with torch.inference_mode():
            outs.append(state["model"](x))

    scenario = Scenario(
        f"inference_request[bs{batch}]", ("request",),
        {"shapes": {"x": list(x.shape)}, "batch_size": batch, "dtype": "float32", "mode": "eval",
         "compiled": False, "data_source": "synthetic, on device", "model": f"SmallCNN(width={width})"},
    )
    m = bench.run(scenario, request, load=load, items=batch)
    assert m.cold_start.load_ms is not None
    assert outs[-1].shape == (batch, 10) and torch.isfinite(outs[-1]).all()
