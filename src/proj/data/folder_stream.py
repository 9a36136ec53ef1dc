"""The image-folder experiment streamed (``stream_from``): each image stored as its file's own bytes,
decoded and transformed when it is read, as from the folder, so ``image_size``, ``augment`` and the
crop settings still apply after ``optimize``; the classes come from the chunks' record."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from projkit.preprocessing import to_mode
from torchvision.transforms import v2


class EncodedImage:
    """A streamed item, an image file's bytes and its label, decoded as ``mode`` ("RGB" or "L") and
    passed through ``transform``: what ``ImageFiles`` does with the file (a class, not a lambda:
    LitData's loader workers pickle it)."""

    def __init__(self, mode: str, transform: v2.Transform) -> None:
        self.mode = mode
        self.transform = transform

    def __call__(self, item: tuple[bytes | memoryview, int]) -> tuple[torch.Tensor, int]:
        data, label = item
        with Image.open(io.BytesIO(data)) as image:
            image = to_mode(image, self.mode)
        return self.transform(image), label


def file_items(samples: Sequence[tuple[str, int]], seed: int | None = None) -> Iterator[tuple[bytes, int]]:
    """``optimize``: each sample as its file's bytes (LitData stores ``bytes`` as they are) and label,
    one file at a time; with ``seed``, in an order shuffled by it. The training split is written so:
    its files come class by class, and LitData's shuffle reorders chunks and blocks of 256 items,
    not the whole split, so batches would hold one or two classes."""
    if seed is not None:
        order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed)).tolist()
        samples = [samples[i] for i in order]
    for path, label in samples:
        yield Path(path).read_bytes(), label


def stream_folder(datamodule: Any, mode: str) -> None:
    """``ImageFolderDataModule.setup`` with ``stream_from``: its splits read from the chunks, training's
    through its random transform (seeded per item by the kit, so a resume repeats it), evaluation's
    through its evaluation transform."""
    url = datamodule.hparams.stream_from
    trained = EncodedImage(mode, datamodule.train_transform())
    evaluated = EncodedImage(mode, datamodule.eval_transform())
    datamodule.stream_splits(url, transform=evaluated, train_transform=trained)
    rank_zero_info(f"ImageFolderDataModule: streaming from '{url}', {datamodule.num_classes} classes")
