from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class ConvNet(nn.Module):
    """A small VGG-style CNN: (conv-BN-ReLU ×2, max-pool) per stage, global average pool, linear head.

    Global pooling makes the head independent of the input size, so the same network trains on
    8×8 digits, 28×28 MNIST and 32×32 CIFAR-10; each stage halves the resolution while it is > 1.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        channels: Sequence[int] = (32, 64),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if not channels or min(channels) < 1:
            raise ValueError(
                f"net.channels must be a non-empty list of positive widths, got {list(channels)}"
            )
        in_channels, height, width = input_shape
        layers: list[nn.Module] = []
        size = min(height, width)
        for out_channels in channels:
            layers += [
                _conv_bn_relu(in_channels, out_channels),
                _conv_bn_relu(out_channels, out_channels),
            ]
            if size > 1:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            in_channels = out_channels
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(in_channels, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )
