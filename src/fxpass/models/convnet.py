"""A tiny convolutional network, built from a config with random weights.

The second model the tests run passes on, next to the Llama-style decoder: convolutions,
batch norms (whose running statistics become buffer mutations when exported in training
mode), ReLUs (in place with ``inplace_relu=True``, so export keeps ``aten.relu_``), pooling
and a linear classifier — the ops vision backends care about.

>>> model = build_convnet(channels=(4, 8))
>>> model(*model.example_inputs()).shape
torch.Size([2, 10])
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ConvNet", "ConvNetConfig", "build_convnet"]


@dataclass(frozen=True)
class ConvNetConfig:
    """Shape of a :class:`ConvNet`: one conv/bn/relu/pool block per entry of ``channels``."""

    channels: tuple[int, ...] = (8, 16)
    in_channels: int = 3
    image_size: int = 16
    classes: int = 10
    batch: int = 2
    kernel_size: int = 3
    inplace_relu: bool = False
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if not self.channels:
            raise ValueError("channels must name at least one block, e.g. channels=(8, 16)")
        if self.image_size < 2 ** len(self.channels):
            raise ValueError(
                f"image_size {self.image_size} is too small for {len(self.channels)} "
                f"pooling blocks; use at least {2 ** len(self.channels)}"
            )

    def replace(self, **changes) -> ConvNetConfig:
        return dataclasses.replace(self, **changes)


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size: int, inplace: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=inplace)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.relu(self.bn(self.conv(x))))


class ConvNet(nn.Module):
    """conv/bn/relu/pool blocks, global average pooling, a linear classifier."""

    def __init__(self, cfg: ConvNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        widths = (cfg.in_channels, *cfg.channels)
        self.blocks = nn.Sequential(
            *(
                _Block(a, b, cfg.kernel_size, cfg.inplace_relu)
                for a, b in itertools.pairwise(widths)
            )
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cfg.channels[-1], cfg.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.blocks(x))
        return self.fc(torch.flatten(x, 1))

    def example_inputs(self, seed: int = 0, batch: int | None = None) -> tuple[torch.Tensor]:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(seed)
        shape = (batch or cfg.batch, cfg.in_channels, cfg.image_size, cfg.image_size)
        return (torch.randn(shape, generator=gen).to(cfg.dtype),)


def build_convnet(
    cfg: ConvNetConfig | None = None, *, seed: int = 0, train: bool = False, **overrides
) -> ConvNet:
    """Build a :class:`ConvNet` with seeded random weights, in eval mode unless ``train``.

    The batch norms get random running statistics too, so folding or dropping them is
    visible in the outputs.
    """
    cfg = cfg or ConvNetConfig()
    if overrides:
        cfg = cfg.replace(**overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ConvNet(cfg)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn_like(m.running_mean))
                m.running_var.copy_(1.0 + 0.2 * torch.rand_like(m.running_var))
                m.weight.data.copy_(1.0 + 0.1 * torch.randn_like(m.weight))
                m.bias.data.copy_(0.1 * torch.randn_like(m.bias))
    model = model.to(cfg.dtype)
    return model.train() if train else model.eval()
