"""Small models the scenarios share. Sizes come from the scenarios, so the CPU suite stays quick."""
from __future__ import annotations

import torch
from torch import nn


def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class SmallCNN(nn.Module):
    """conv-batchnorm-relu blocks, pooling between them, a linear head."""

    def __init__(self, width: int = 16, blocks: int = 3, classes: int = 10, in_ch: int = 3):
        super().__init__()
        layers, c = [], in_ch
        for i in range(blocks):
            layers += [conv_block(c, width * 2**i), nn.MaxPool2d(2)]
            c = width * 2**i
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class MLP(nn.Module):
    def __init__(self, d_in: int, hidden: int, classes: int = 10, layers: int = 3):
        super().__init__()
        mods, d = [], d_in
        for _ in range(layers):
            mods += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        mods.append(nn.Linear(d, classes))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


def synthetic_images(n: int, size: int, classes: int = 10, seed: int = 0):
    """A learnable synthetic set: the label shifts the image mean, so a few steps lower the loss."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, 3, size, size, generator=g) + (y.float() / classes).view(-1, 1, 1, 1)
    return x, y
