"""Augmentations of whole batches on the device, drawing from torch's global RNG in step order (so a
resumed run draws the same ones): what the in-memory image data modules apply after transfer."""

from __future__ import annotations

import torch


def random_translate(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift each image by its own random offset in [-pad, pad] pixels, filling with zeros."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    top = torch.randint(0, 2 * pad + 1, (n, 1), device=x.device)
    left = torch.randint(0, 2 * pad + 1, (n, 1), device=x.device)
    rows = (top + torch.arange(h, device=x.device)).view(n, 1, h, 1)
    cols = (left + torch.arange(w, device=x.device)).view(n, 1, 1, w)
    batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
    channels = torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1)
    return padded[batch, channels, rows, cols]


def random_hflip(x: torch.Tensor) -> torch.Tensor:
    """Mirror a random half of the images left to right."""
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
