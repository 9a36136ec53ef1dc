"""A dataset of whole tensors whose batches are made by one indexing operation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset


class TensorImageDataset(Dataset):
    """Images held as one ``(N, C, H, W)`` tensor, normalised (and augmented) a batch at a time.

    ``DataLoader`` hands ``__getitems__`` the sampler's whole list of indices, so a batch costs one
    gather instead of ``batch_size`` item calls plus a collate; pair it with ``collate=keep_batch``.
    Images stay in their stored dtype (``uint8`` for the torchvision sets) until a batch is cut.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        scale: float = 255.0,
        augment: bool = False,
        flip: bool = False,
        pad: int = 0,
    ) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.scale = scale
        self.augment = augment
        self.flip = flip
        self.pad = pad

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices)
        x = self.images[index].float().div_(self.scale)
        if self.augment:
            x = random_translate(x, self.pad) if self.pad else x
            x = random_hflip(x) if self.flip else x
        return (x - self.mean) / self.std, self.labels[index]


def keep_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate for ``TensorImageDataset``: its ``__getitems__`` already returns a whole batch."""
    return batch


def random_translate(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift each image by its own random offset in [-pad, pad] pixels, filling with zeros."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    top = torch.randint(0, 2 * pad + 1, (n, 1))
    left = torch.randint(0, 2 * pad + 1, (n, 1))
    rows = (top + torch.arange(h)).view(n, 1, h, 1)
    cols = (left + torch.arange(w)).view(n, 1, 1, w)
    batch = torch.arange(n).view(n, 1, 1, 1)
    channels = torch.arange(x.shape[1]).view(1, -1, 1, 1)
    return padded[batch, channels, rows, cols]


def random_hflip(x: torch.Tensor) -> torch.Tensor:
    """Mirror a random half of the images left to right."""
    flip = torch.rand(x.shape[0]) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
