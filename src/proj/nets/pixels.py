"""An image network that takes pixels, so that whoever runs it cannot forget or mismatch the
normalisation its weights were trained with."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class PixelInput(nn.Module):
    """``net`` behind the data's normalisation: float pixels in [0, 1], ``(N, C, H, W)``, in;
    ``net``'s output out.

    The normalisation is the same arithmetic as the data modules' (subtract ``mean``, divide by
    ``std``, per channel), so the logits equal those of ``net`` on the data's own batches. This is
    what ``python -m proj export`` traces for image models.
    """

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net((pixels - self.mean) / self.std)
