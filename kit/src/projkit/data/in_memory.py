"""Datasets held in memory as whole tensors, whose batches are cut by one indexing operation."""

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
