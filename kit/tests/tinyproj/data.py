"""Two data modules of data they make: images of a few noisy prototypes, and a seeded text."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from projkit.data import checks
from projkit.data.image_files import image_problems, predict_files, refused_images
from projkit.data.in_memory import TensorImageDataset
from projkit.data.loaders import SplitLoaders
from projkit.deploy import Preprocessing
from projkit.reliability import TrainOrder


class FlippedItems(Dataset):
    """Item by item, each image flipped left to right at random (torch's RNG): a per-item dataset
    whose draws an exact resume must repeat, in loader workers too."""

    def __init__(self, images: TensorImageDataset) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return flipped_at_random(self.images[index])


def flipped_at_random(item: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
    """An image flipped left to right at random, with its label: ``FlippedItems``' draw, and a
    streamed training item's with ``per_item`` (a function: LitData's workers pickle it)."""
    image, label = item
    return (image.flip(-1) if torch.rand(()) < 0.5 else image), label


class Blobs(SplitLoaders, LightningDataModule):
    """``num_classes`` grey prototype images of ``image_size`` squared with noise, as uint8 in memory:
    learnable in a few steps. Training batches get noise from the global RNG on the device
    (``augment``); ``per_item`` serves them one by one through ``FlippedItems`` instead (streamed:
    through ``flipped_at_random``).
    ``predict_path`` predicts on the image files of a folder; ``stream_from`` reads the splits from
    the chunks ``optimize`` wrote."""

    mean = (0.5,)
    std = (0.25,)

    def __init__(
        self,
        num_classes: int = 4,
        image_size: int = 4,
        samples: int = 320,
        batch_size: int = 16,
        augment: bool = True,
        per_item: bool = False,
        split_seed: int = 12345,
        num_workers: int = 0,
        pin_memory: bool = False,
        predict_path: str | None = None,
        stream_from: str | None = None,
    ) -> None:
        super().__init__()
        checks.positive("num_classes", num_classes)
        checks.positive("image_size", image_size)
        checks.loader_settings(batch_size, num_workers)
        self.save_hyperparameters()
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.splits: dict[str, Dataset] = {}
        self.train_order = TrainOrder()
        self.predict_files: list[str] = []

    @property
    def num_classes(self) -> int:
        return self.hparams.num_classes

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(f"c{i}" for i in range(self.num_classes))

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (1, self.hparams.image_size, self.hparams.image_size)

    @property
    def preprocessing(self) -> Preprocessing:
        """A file's way to the images: grey, the shorter side to ``image_size``, the centre square."""
        size = self.hparams.image_size
        return Preprocessing("L", shorter_side=size, filter="bilinear", crop=(size, size))

    def setup(self, stage: str) -> None:
        if stage == "predict" and self.hparams.predict_path is not None:
            self.setup_predict_files(Path(self.hparams.predict_path))
            return
        if self.splits:
            return
        if self.hparams.stream_from:
            flips = flipped_at_random if self.hparams.per_item else None
            self.stream_splits(self.hparams.stream_from, train_transform=flips)
            return
        generator = torch.Generator().manual_seed(self.hparams.split_seed)
        prototypes = torch.randint(0, 256, (self.num_classes, *self.input_shape), generator=generator)
        labels = torch.randint(0, self.num_classes, (self.hparams.samples,), generator=generator)
        noise = torch.randint(-40, 41, (len(labels), *self.input_shape), generator=generator)
        images = (prototypes[labels] + noise).clamp(0, 255).to(torch.uint8)
        cut = [int(0.7 * len(labels)), int(0.85 * len(labels))]
        parts = [
            TensorImageDataset(images[a:b], labels[a:b]) for a, b in zip([0, *cut], [*cut, None], strict=True)
        ]
        train = FlippedItems(parts[0]) if self.hparams.per_item else parts[0]
        self.splits = {"train": train, "val": parts[1], "test": parts[2]}

    @property
    def stream_facts(self) -> dict:
        return {"classes": list(self.classes), "input_shape": list(self.input_shape)}

    def stream_items(self, split: str) -> list:
        dataset = self.splits[split]
        return [(image, int(label)) for image, label in (dataset[i] for i in range(len(dataset)))]

    def setup_predict_files(self, folder: Path) -> None:
        paths = predict_files(folder)
        if problems := image_problems(paths):
            raise refused_images(problems, "data.predict_path", folder)
        images = [torch.from_numpy(self.preprocessing.stored(Image.open(path))) for path in paths]
        self.splits["predict"] = TensorImageDataset(torch.stack(images), torch.full((len(paths),), -1))
        self.predict_files = [path.name for path in paths]

    def predict_dataloader(self) -> DataLoader:
        return self.loader("predict" if "predict" in self.splits else "test")

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if isinstance(batch, torch.Tensor):
            return batch  # the model summary's example input
        images, labels = batch
        x = images.float().div_(255)
        if self.hparams.augment and self.trainer is not None and self.trainer.training:
            x = x + 0.05 * torch.randn_like(x)
        return (x - self.mean[0]) / self.std[0], labels


WORDS = ("the king", "my lord", "doth break", "shall know", "the crown", "thy face", "o'er the sea")


def play(characters: int, seed: int) -> str:
    """A text of about ``characters`` characters: speakers in capitals, lines of a few seeded words."""
    rng = random.Random(seed)
    speeches = []
    while sum(map(len, speeches)) < characters:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))).capitalize()
        speeches.append(f"{rng.choice(('ROMEO', 'JULIET', 'NURSE'))}:\n{line}.\n\n")
    return "".join(speeches)


class Windows(Dataset):
    """Windows of ``block_size + 1`` tokens at ``starts`` (every start when None), as inputs and
    next-token targets, a whole batch cut with one gather."""

    def __init__(self, tokens: torch.Tensor, block_size: int, starts: torch.Tensor | None = None) -> None:
        self.tokens, self.starts, self.offsets = tokens, starts, torch.arange(block_size + 1)

    def __len__(self) -> int:
        return len(self.starts) if self.starts is not None else len(self.tokens) - len(self.offsets) + 1

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.as_tensor(indices)
        starts = self.starts[starts] if self.starts is not None else starts
        windows = self.tokens[starts.unsqueeze(1) + self.offsets]
        return windows[:, :-1], windows[:, 1:]


class Chars(SplitLoaders, LightningDataModule):
    """Next-character prediction on a text file (``path``) or, without one, a seeded play of
    ``characters`` characters; the first ``train_fraction`` trains, the rest validates and tests."""

    def __init__(
        self,
        path: str | None = None,
        characters: int = 20_000,
        block_size: int = 16,
        batch_size: int = 16,
        train_fraction: float = 0.9,
        num_workers: int = 0,
        pin_memory: bool = False,
        predict_prompts: Sequence[str] = ("ROMEO:",),
    ) -> None:
        super().__init__()
        checks.positive("block_size", block_size)
        checks.loader_settings(batch_size, num_workers)
        checks.fraction("train_fraction", train_fraction)
        self.save_hyperparameters()
        self.text = Path(path).read_text(encoding="utf-8") if path else play(characters, seed=0)
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.splits: dict[str, Dataset] = {}
        self.train_order = TrainOrder()

    @property
    def vocab(self) -> str:
        return "".join(sorted(set(self.text)))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def setup(self, stage: str) -> None:
        if self.splits or stage == "predict":
            return
        tokens = torch.tensor([self.vocab.index(c) for c in self.text])
        cut, size = int(len(tokens) * self.hparams.train_fraction), self.hparams.block_size
        val = tokens[cut:]
        starts = torch.arange((len(val) - 1) // size) * size
        self.splits = {
            "train": Windows(tokens[:cut], size),
            "val": Windows(val, size, starts),
            "test": Windows(val, size, starts),
        }

    def train_epoch_size(self) -> int:
        return max(1, len(self.splits["train"].tokens) // self.hparams.block_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(list(self.hparams.predict_prompts), batch_size=self.batch_size, collate_fn=list)
