"""Whole-tensor datasets whose batches are cut by one indexing operation, and batch augmentations."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset


class TensorImageDataset(Dataset):
    """Images held as one ``(N, C, H, W)`` tensor in their stored dtype (``uint8`` for most sets).

    ``DataLoader`` hands ``__getitems__`` the sampler's whole list of indices, so a batch costs one
    gather instead of ``batch_size`` item calls plus a collate; pair it with ``collate_fn=keep_batch``.
    Batches leave as ``uint8`` (a quarter of the bytes to copy to the device); scaling, normalisation
    and augmentation happen on the device, in the data module's ``on_after_batch_transfer``.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices)
        return self.images[index], self.labels[index]


def keep_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate for datasets whose ``__getitems__`` already returns a whole batch."""
    return batch


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
