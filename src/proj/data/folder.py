"""Your own images: a folder of image files, one subfolder per class, decoded file by file."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from PIL import Image
from projkit.data import checks
from projkit.data.facts import file_fact
from projkit.data.image_files import image_files, image_problem, image_problems, predict_files, refused_images
from projkit.data.loaders import SplitLoaders
from projkit.deploy import Preprocessing
from projkit.errors import ConfigError
from projkit.preprocessing import to_mode
from projkit.reliability import TrainOrder
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from proj.data.folder_stream import file_items, stream_folder
from proj.data.image import adopt_network_normalisation

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SPLITS = ("train", "val", "test")


class ImageFiles(Dataset):
    """``(path, label)`` samples, each read with Pillow as ``mode`` ("RGB" or "L") and passed
    through ``transform`` when it is asked for: the images need not fit in memory. ``field`` is the
    setting that named the files, for the message about an unreadable one."""

    def __init__(
        self, samples: Sequence[tuple[str, int]], mode: str, transform: v2.Transform, field: str = "data.root"
    ) -> None:
        self.samples = list(samples)
        self.mode = mode
        self.transform = transform
        self.field = field

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        try:
            with Image.open(path) as image:
                image = to_mode(image, self.mode)
        except (OSError, ValueError) as error:  # changed since the check before the first step
            problem = image_problem(Path(path), (self.mode,)) or error
            raise ConfigError(f"{self.field}: '{path}' {problem}, since the run began.") from error
        return self.transform(image), label


class Prepared:
    """A Pillow image through a ``Preprocessing``, as the uint8 image tensor torchvision's transforms
    take (a class, not a lambda: loader workers may need to pickle it)."""

    def __init__(self, preprocessing: Preprocessing) -> None:
        self.preprocessing = preprocessing

    def __call__(self, image: Image.Image) -> tv_tensors.Image:
        return tv_tensors.Image(torch.from_numpy(self.preprocessing.stored(image)))


class ImageFolderDataModule(SplitLoaders, LightningDataModule):
    """Image classification on a folder of image files, in torchvision's ``ImageFolder`` layout::

        root/train/<class>/*.png    root/val/<class>/*.png    root/test/<class>/*.png

    or one folder split three ways, ``root/<class>/*.png``. A split without its folder is cut
    from the training images (``test_fraction`` and ``val_fraction`` of them), seeded by
    ``split_seed``, so the training seed never moves it. The classes are the
    training folder's subfolders, in name order; files of other types than images are skipped.

    Unlike the in-memory tensor modules, the files are decoded one by one in the loader's
    ``num_workers`` processes and transformed there with torchvision's transforms v2: training
    images get a random resized crop (``crop_scale`` of the area) and a horizontal flip (``flip``)
    when ``augment`` is on; evaluation images are resized and centre-cropped to ``crop_fraction``
    of their side (ImageNet's 0.875) by ``preprocessing``, the Pillow steps that ``model.json``
    states for a deployment. Both end at ``image_size`` squared, normalised with ``mean``
    and ``std`` (ImageNet's by default), so nothing is left to do on the device. The order and
    every random crop resume exactly (``TrainOrder``), with any number of workers.

    ``num_classes`` and ``input_shape`` (``channels``: 3 converts to RGB, 1 to grey) are known once
    the folder is found, which the CLI needs when it builds the model. ``predict_path`` predicts on
    every image file directly in that folder, through the evaluation transform.

    Every file is decoded once before the first step, so a truncated, empty or mislabelled file
    stops the command at once, named with every other such file, rather than the run partway
    through; ``bad_files="skip"`` leaves them out instead, saying how many (``predict_path``'s too).

    With ``stream_from`` (what ``optimize`` wrote), the files' bytes are read from the chunks and
    decoded and transformed as from the folder, every random crop repeated on a resume; the classes
    come from the chunks, so ``root`` need not exist.
    """

    def __init__(
        self,
        root: str = "data/my_images",
        image_size: int = 32,
        channels: int = 3,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 12345,
        augment: bool = True,
        flip: bool = True,
        crop_scale: tuple[float, float] = (0.5, 1.0),
        crop_fraction: float = 0.875,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        num_workers: int = 0,
        pin_memory: bool = False,
        predict_path: str | None = None,
        bad_files: Literal["refuse", "skip"] = "refuse",
        stream_from: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root)
        self.crop_scale = tuple(crop_scale)
        self.mean = tuple(mean)
        self.std = tuple(std)
        self.predict_path = None if predict_path is None else Path(predict_path)
        self.predict_files: list[str] = []
        self.splits: dict[str, ImageFiles] = {}
        self.train_order = TrainOrder()
        self._classes: tuple[str, ...] | None = None
        self.check_settings()

    def check_settings(self) -> None:
        """Refuse settings no image can be cut or normalised with, before any file is read."""
        given = self.hparams
        checks.positive("image_size", given.image_size)
        if given.channels not in (1, 3):
            raise ValueError(f"data.channels must be 1 (grey) or 3 (RGB), got {given.channels}")
        checks.loader_settings(given.batch_size, given.num_workers)
        checks.fraction("val_fraction", given.val_fraction)
        checks.fraction("test_fraction", given.test_fraction)
        if given.val_fraction + given.test_fraction >= 1.0:
            raise ValueError(
                f"data.val_fraction + data.test_fraction must be below 1 to leave training images, got "
                f"{given.val_fraction} + {given.test_fraction}"
            )
        if not 0.0 < self.crop_scale[0] <= self.crop_scale[1] <= 1.0:
            raise ValueError(
                f"data.crop_scale must be (low, high) with 0 < low <= high <= 1, got {list(self.crop_scale)}"
            )
        if not 0.0 < given.crop_fraction <= 1.0:
            raise ValueError(f"data.crop_fraction must be in (0, 1], got {given.crop_fraction}")
        if len(self.mean) != given.channels or len(self.std) != given.channels or min(self.std) <= 0:
            raise ValueError(
                f"data.mean and data.std need one value per channel ({given.channels}), std positive; got "
                f"mean {list(self.mean)}, std {list(self.std)}. With channels 1, e.g. "
                "--data.init_args.mean=[0.5] --data.init_args.std=[0.25]."
            )

    @property
    def split_folders(self) -> bool:
        """Whether ``root`` holds ``train/`` (and maybe ``val/``, ``test/``) rather than the classes."""
        return (self.root / "train").is_dir()

    @file_fact
    def classes(self) -> tuple[str, ...]:
        if self._classes is None:
            url = self.hparams.stream_from
            self._classes = tuple(self.stream_record(url)["facts"]["classes"]) if url else self.find_classes()
        return self._classes

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.hparams.channels, self.hparams.image_size, self.hparams.image_size)

    def find_classes(self) -> tuple[str, ...]:
        fix = "or point --data.init_args.root at your folder"
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"data.root: no folder at '{self.root}'. Put your images in {self.root}/train/<class>/ "
                f"(and val/, test/ beside train/ if you have them) or in {self.root}/<class>/, {fix}."
            )
        folder = self.root / "train" if self.split_folders else self.root
        names = tuple(sorted(_subfolders(folder)))
        if not self.split_folders and {"val", "test"} & set(names):
            raise ConfigError(
                f"data.root: '{self.root}' has val/ or test/ but no train/ folder. Add the training "
                f"images as {self.root}/train/<class>/, or put the classes directly in {self.root}."
            )
        if not names:
            raise ConfigError(
                f"data.root: '{folder}' holds no class folders. Put each class's images in a subfolder "
                f"named after the class ({folder}/<class>/*.png), {fix}."
            )
        if len(names) == 1:
            inner = folder / names[0]
            hint = (
                f"if the classes are the subfolders of '{inner}', point --data.init_args.root at it"
                if _subfolders(inner)
                else f"add a folder of images for each other class beside it ({folder}/<class>/)"
            )
            raise ConfigError(
                f"data.root: '{folder}' holds one class folder ({names[0]}), and a classifier needs at "
                f"least two classes: {hint}."
            )
        return names

    def setup(self, stage: str) -> None:
        adopt_network_normalisation(self)
        if stage == "predict" and self.predict_path is not None:
            self.setup_predict_files()
            return
        if "train" in self.splits:
            return
        mode = "L" if self.hparams.channels == 1 else "RGB"
        if self.hparams.stream_from:
            stream_folder(self, mode)
            return
        samples = self.find_samples()
        self.splits.update(
            train=ImageFiles(samples["train"], mode, self.train_transform()),
            val=ImageFiles(samples["val"], mode, self.eval_transform()),
            test=ImageFiles(samples["test"], mode, self.eval_transform()),
        )
        sizes = ", ".join(f"{name} {len(ds)}" for name, ds in self.splits.items())
        rank_zero_info(
            f"ImageFolderDataModule: '{self.root}', {self.num_classes} classes; {sizes} image files, "
            f"as shape {self.input_shape}"
        )

    @property
    def stream_facts(self) -> dict[str, Any]:
        """What chunks written from this folder must agree with: its classes and channels (the files
        were checked to convert to them); ``image_size`` is applied when they are read."""
        return {"classes": list(self.classes), "channels": self.hparams.channels}

    def stream_items(self, split: str) -> Iterator[tuple[bytes, int]]:
        """``optimize``: a split's files as their bytes, with their labels; training's shuffled."""
        return file_items(self.splits[split].samples, self.hparams.split_seed if split == "train" else None)

    def find_samples(self) -> dict[str, list[tuple[str, int]]]:
        """Each split's ``(path, label)`` samples: from its own folder, or cut from the training ones.

        Every file is read once before the first step (``readable``). Links are followed, each real
        folder walked once and each real file taken once (``image_files``)."""
        folders = {
            split: self.root / split if self.split_folders else self.root
            for split in (SPLITS if self.split_folders else ("train",))
        }
        folders = {split: folder for split, folder in folders.items() if folder.is_dir()}
        for folder in folders.values():
            if extra := sorted(set(_subfolders(folder)) - set(self.classes)):
                raise ConfigError(
                    f"data.root: '{folder}' has class folders that '{self.root / 'train'}' lacks: "
                    f"{', '.join(extra)}. Every class needs training images: add them there, or remove "
                    "those folders."
                )
        # The data set's own folders are walked from the top only: a link into one (`up -> ..`) is
        # not followed, which would loop or give one class's images another's label.
        walked = {os.path.realpath(self.root)}
        for folder in folders.values():
            walked.add(os.path.realpath(folder))
            walked.update(os.path.realpath(folder / name) for name in self.classes)
        seen: set[str] = set()
        found = {
            split: [
                (str(path), label)
                for label, name in enumerate(self.classes)
                if (folder / name).is_dir()
                for path in image_files(folder / name, walked, seen)
            ]
            for split, folder in folders.items()
        }
        found = self.readable(found)
        train = found["train"]
        present = {label for _, label in train}
        if empty := [name for label, name in enumerate(self.classes) if label not in present]:
            raise ConfigError(
                f"data.root: no image files for the class(es) {', '.join(empty)} in their training "
                "folder. Add images (PNG, JPEG, … as Pillow reads them) or remove the empty folders."
            )
        order = torch.randperm(
            len(train), generator=torch.Generator().manual_seed(self.hparams.split_seed)
        ).tolist()
        for split, fraction in (("test", self.hparams.test_fraction), ("val", self.hparams.val_fraction)):
            if split not in found:
                n = max(1, round(fraction * len(train)))
                found[split], order = [train[i] for i in order[:n]], order[n:]
        if len(order) < len(train):
            found["train"] = [train[i] for i in sorted(order)]
        if not found["train"]:
            raise ConfigError(
                f"data.root: '{self.root}' has {len(train)} training image(s), too few to also cut "
                "validation and test splits from. Add images, or give val/ and test/ folders."
            )
        return found

    def readable(self, found: dict[str, list[tuple[str, int]]]) -> dict[str, list[tuple[str, int]]]:
        """The samples, each file decoded once (``image_problems``): unreadable ones refused, all
        named, or with ``bad_files="skip"`` left out and counted."""
        paths = [Path(path) for samples in found.values() for path, _ in samples]
        problems = image_problems(paths, (self.preprocessing.mode,))
        if problems and self.hparams.bad_files == "refuse":
            hint = " Or set --data.init_args.bad_files=skip to train without them."
            raise refused_images(problems, "data.root", self.root, hint)
        if problems:
            bad = {str(path) for path in problems}
            found = {split: [s for s in samples if s[0] not in bad] for split, samples in found.items()}
            rank_zero_warn(
                f"data.root: left out {len(problems)} unreadable file(s) (data.bad_files=skip), such as "
                f"'{next(iter(problems))}'."
            )
        return found

    def train_transform(self) -> v2.Transform:
        if not self.hparams.augment:
            return self.eval_transform()
        steps: list[v2.Transform] = [
            v2.ToImage(),
            v2.RandomResizedCrop(self.hparams.image_size, scale=self.crop_scale, antialias=True),
        ]
        if self.hparams.flip:
            steps.append(v2.RandomHorizontalFlip())
        return v2.Compose([*steps, *self.to_normalised()])

    @property
    def preprocessing(self) -> Preprocessing:
        """Evaluation's (and predict's) way from a file to pixels, which ``model.json`` states for a
        deployment: the short side resized bilinearly to ``image_size / crop_fraction``, the centre
        ``image_size`` square cut out."""
        size = self.hparams.image_size
        return Preprocessing(
            "L" if self.hparams.channels == 1 else "RGB",
            shorter_side=round(size / self.hparams.crop_fraction),
            filter="bilinear",
            crop=(size, size),
        )

    def eval_transform(self) -> v2.Transform:
        return v2.Compose([Prepared(self.preprocessing), *self.to_normalised()])

    def to_normalised(self) -> list[v2.Transform]:
        return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Undo the normalisation: intensities in [0, 1], the images as a person sees them."""
        mean = torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, -1, 1, 1)
        return (x * std + mean).clamp(0.0, 1.0)

    def setup_predict_files(self) -> None:
        """Every file directly in ``predict_path``, each opened now (its header only) so that a bad
        file stops the run before any prediction, with the field and the fix."""
        if "predict" in self.splits:
            return
        paths = predict_files(self.predict_path)
        if problems := image_problems(paths, (self.preprocessing.mode,)):
            if self.hparams.bad_files == "refuse":
                hint = " Or set --data.init_args.bad_files=skip to predict on the others."
                raise refused_images(problems, "data.predict_path", self.predict_path, hint)
            paths = [path for path in paths if path not in problems]
            if not paths:
                raise refused_images(problems, "data.predict_path", self.predict_path, " None is left.")
            rank_zero_warn(
                f"data.predict_path: left out {len(problems)} unreadable file(s) (data.bad_files=skip), such "
                f"as '{next(iter(problems))}'; predictions.csv has no row for them."
            )
        # No labels: -1, as torchvision's STL10 marks its unlabelled images.
        samples = [(str(path), -1) for path in paths]
        mode = "L" if self.hparams.channels == 1 else "RGB"
        self.splits["predict"] = ImageFiles(samples, mode, self.eval_transform(), "data.predict_path")
        self.predict_files = [path.name for path in paths]
        rank_zero_info(
            f"ImageFolderDataModule: {len(paths)} image files from '{self.predict_path}', as shape "
            f"{self.input_shape}"
        )

    def predict_dataloader(self) -> DataLoader:
        return self.loader("test" if self.predict_path is None else "predict")


def _subfolders(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
