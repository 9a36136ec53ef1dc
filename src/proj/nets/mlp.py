from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch
from torch import nn


class MLP(nn.Module):
    """A fully connected baseline: flatten, then (Linear-LayerNorm-GELU-Dropout) per hidden layer."""

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        hidden_sizes: Sequence[int] = (256, 128),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if hidden_sizes and min(hidden_sizes) < 1:
            raise ValueError(f"net.hidden_sizes must be positive widths, got {list(hidden_sizes)}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = prod(input_shape)
        for hidden in hidden_sizes:
            layers += [
                nn.Linear(width, hidden),
                nn.LayerNorm(hidden),
                nn.GELU(),
                nn.Dropout(dropout),
            ]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
