"""Small CNN: a training step and an inference request.

Training: the window holds forward, backward and the optimizer step on a batch already on the device.
Inference: model loading (construction, state load, move to device) is the cold start, never inside a
request; a request is forward in eval mode under inference_mode.
"""
import io

import pytest
import torch
from torch import nn

from bench_core import Scenario
from models import SmallCNN, synthetic_images


def _train_step_fn(model, opt, x, y, losses):
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())  # kept on device: reading it here would sync inside the window

    return step


def test_cnn_train_step(bench):
    batch = bench.size(cpu=16, gpu=128, quick=8)
    size = bench.size(cpu=32, gpu=64, quick=16)
    width = bench.size(cpu=16, gpu=64, quick=8)
    dev = bench.device
    torch.manual_seed(0)
    model = SmallCNN(width=width).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = synthetic_images(batch, size)
    x, y = x.to(dev), y.to(dev)
    losses = []
    scenario = Scenario(
        "cnn_train_step", ("forward", "backward", "optimizer_step"),
        {"shapes": {"x": list(x.shape)}, "batch_size": batch, "dtype": "float32", "mode": "train",
         "compiled": False, "data_source": "synthetic, on device", "model": f"SmallCNN(width={width})",
         "optimizer": "AdamW"},
        description="one training step of a small CNN on a batch already on the device",
    )
    m = bench.run(scenario, _train_step_fn(model, opt, x, y, losses), items=batch)
    values = torch.stack(losses).float().cpu()
    assert torch.isfinite(values).all(), "training produced a non-finite loss"
    assert values[-3:].mean() < values[:3].mean(), "loss did not decrease: the step is not training"
    assert m.summary.n == m.repeats


def test_cnn_inference_request(bench):
    batch = bench.size(cpu=8, gpu=64, quick=4)
    size = bench.size(cpu=32, gpu=64, quick=16)
    width = bench.size(cpu=16, gpu=64, quick=8)
    dev = bench.device
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.save(SmallCNN(width=width).state_dict(), buf)  # the "checkpoint" a server would load
    x = synthetic_images(batch, size)[0].to(dev)
    state = {}

    def load():
        buf.seek(0)
        model = SmallCNN(width=width)
        model.load_state_dict(torch.load(buf, weights_only=True))
        state["model"] = model.to(dev).eval()

    outputs = []

    def request():
        with torch.inference_mode():
            outputs.append(state["model"](x))

    scenario = Scenario(
        "cnn_inference_request", ("request",),
        {"shapes": {"x": list(x.shape)}, "batch_size": batch, "dtype": "float32", "mode": "eval",
         "compiled": False, "data_source": "synthetic, on device", "model": f"SmallCNN(width={width})"},
        description="one inference request; model loading timed once as the cold start",
    )
    m = bench.run(scenario, request, load=load, items=batch)
    assert m.cold_start.load_ms is not None and m.cold_start.load_ms > 0
    out = outputs[-1]
    assert out.shape == (batch, 10)
    assert torch.isfinite(out).all()
