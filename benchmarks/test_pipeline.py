"""Input pipeline: the same compute fed by a DataLoader with 0 and with 2 workers, or by a prepared batch.

The dataset does real per-item work (a small augmentation), as image pipelines do, so waiting for data
shows up as a difference between the three, not as a guess. Worker start-up is the cold start.
"""
from collections import deque

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench_core import Scenario


class NoisyImages(Dataset):
    """Synthetic images with per-item work: noise, a random flip and normalization."""

    def __init__(self, n, size):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, self.size, self.size, generator=g)
        if i % 2:
            img = img.flip(-1)
        img = (img - 0.5) / 0.25
        return img, i % 10


def _cycle(loader):
    while True:
        yield from loader


@pytest.mark.parametrize("feed", ["prepared", "workers0", "workers2"])
def test_input_pipeline(bench, feed):
    dev = bench.device
    batch, size, n = bench.size(cpu=(32, 48, 4096), gpu=(256, 96, 65536), quick=(8, 16, 256))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10)).to(dev).eval()
    ds = NoisyImages(n, size)
    outs = deque(maxlen=1)  # last output only: a list makes each call allocate anew
    if feed == "prepared":
        xb = torch.stack([ds[i][0] for i in range(batch)]).to(dev)
        window, source = ("forward",), "prepared batch on device"

        def get():
            return xb
    else:
        workers = int(feed[-1])
        state = {}
        window = ("batch_read", "transfer", "forward")
        source = f"DataLoader(num_workers={workers}) over NoisyImages (per-item augmentation)"

        def get():
            return next(state["it"])[0].to(dev, non_blocking=True)

    def step():
        with torch.inference_mode():
            outs.append(model(get()))

    kwargs = {}
    if feed != "prepared":
        def load():  # worker processes start here, once: the cold start, not a request
            loader = DataLoader(ds, batch_size=batch, num_workers=workers, pin_memory=bench.on_gpu,
                                persistent_workers=workers > 0)
            state["it"] = _cycle(loader)
        kwargs["load"] = load
    scenario = Scenario(
        f"input_pipeline[{feed}]", window,
        {"shapes": {"x": [batch, 3, size, size]}, "batch_size": batch, "dtype": "float32", "mode": "eval",
         "compiled": False, "data_source": source},
    )
    bench.run(scenario, step, items=batch, **kwargs)
    assert outs[-1].shape == (batch, 10) and torch.isfinite(outs[-1]).all()
