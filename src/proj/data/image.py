"""Image classification data modules held in memory as tensors, and what image data modules share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from projkit.data import checks
from projkit.data.image_files import image_problems, predict_files, refused_images
from projkit.data.in_memory import TensorImageDataset
from projkit.data.loaders import SplitLoaders
from projkit.deploy import Preprocessing
from projkit.errors import ConfigError
from projkit.reliability import TrainOrder
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets

from proj.data.augment import random_hflip, random_translate

Split = tuple[torch.Tensor, torch.Tensor]


class ImageDataModule(SplitLoaders, LightningDataModule):
    """Shared loading, splitting and batching for image data modules.

    A subclass states its facts (``num_classes`` and their names, ``classes``; ``input_shape``;
    normalisation ``mean``/``std``; pixel ``scale``; which augmentations suit it) and implements
    ``load(train)`` returning uint8 ``(N, C, H, W)`` images with int64 labels; downloads belong in
    ``prepare_data``, which Lightning runs on one process per node only. A subclass whose images do
    not fit in memory may put any map-style datasets in ``splits`` instead (items of a uint8
    ``(C, H, W)`` image and its label): they are loaded item by item, with ``num_workers`` workers
    and Lightning's default collation, and resume as exactly (``TrainOrder``). The validation split is
    cut from the training set with ``split_seed``, so it never changes with the training seed.
    Batches travel as stored (uint8) and are scaled, augmented (training only) and normalised on
    the device after transfer, drawing from the global RNG in step order, so a resumed run repeats
    the augmentation exactly; ``to_pixels`` undoes the normalisation for display.

    With ``stream_from`` (a folder or ``s3://`` URL that ``optimize`` wrote), the splits are read
    from streaming chunks instead, through LitData's loader, with the same batches on the device.

    ``predict`` reads the test split, or with ``predict_path`` every image file directly in that
    folder, in name order (``predict_files``), converted to ``input_shape`` and to the stored
    ``scale`` by ``preprocessing``, so that it is normalised exactly as training data is.
    """

    num_classes: int
    classes: tuple[str, ...]
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    scale: float = 255.0
    augment_pad: int = 0
    augment_flip: bool = False

    def __init__(
        self,
        data_dir: str = "data",
        batch_size: int = 128,
        val_fraction: float = 0.1,
        split_seed: int = 12345,
        augment: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        predict_path: str | None = None,
        stream_from: str | None = None,
    ) -> None:
        super().__init__()
        checks.loader_settings(batch_size, num_workers)
        checks.fraction("val_fraction", val_fraction)
        self.save_hyperparameters()
        self.data_dir = Path(data_dir)
        self.predict_path = None if predict_path is None else Path(predict_path)
        self.predict_files: list[str] = []
        self.splits: dict[str, Dataset] = {}
        self.train_order = TrainOrder()
        self._normalisation: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def load(self, train: bool) -> Split:
        """The official training (``train=True``) or test set as uint8 images and int64 labels."""
        raise NotImplementedError

    def split_train_val(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[Split, Split]:
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.hparams.split_seed))
        n_val = max(1, round(self.hparams.val_fraction * len(labels)))
        val, train = order[:n_val], order[n_val:]
        return (images[train], labels[train]), (images[val], labels[val])

    def setup(self, stage: str) -> None:
        adopt_network_normalisation(self)
        if stage == "predict" and self.predict_path is not None:
            self.setup_predict_files()
            return
        if "train" in self.splits:
            return
        if self.hparams.stream_from:
            self.stream_splits(self.hparams.stream_from)
            rank_zero_info(f"{type(self).__name__}: streaming from '{self.hparams.stream_from}'")
            return
        train, val = self.split_train_val(*self.load(train=True))
        self.splits.update(
            train=TensorImageDataset(*train),
            val=TensorImageDataset(*val),
            test=TensorImageDataset(*self.load(train=False)),
        )
        sizes = ", ".join(f"{name} {len(ds)}" for name, ds in self.splits.items())
        rank_zero_info(f"{type(self).__name__}: {sizes} images of shape {self.input_shape}")

    def predict_dataloader(self) -> DataLoader:
        return self.loader("test" if self.predict_path is None else "predict")

    @property
    def stream_facts(self) -> dict[str, Any]:
        """What chunks written from this data must agree with when read back."""
        return {"classes": list(self.classes), "input_shape": list(self.input_shape)}

    def stream_items(self, split: str) -> list[tuple[torch.Tensor, int]]:
        """``optimize``: a split's images, stored uint8 ``(C, H, W)``, with their labels."""
        dataset = self.splits[split]
        return [(image, int(label)) for image, label in (dataset[i] for i in range(len(dataset)))]

    def on_after_batch_transfer(
        self, batch: Split | torch.Tensor, dataloader_idx: int
    ) -> Split | torch.Tensor:
        if isinstance(batch, torch.Tensor):
            return batch  # the model summary's example input, already a normalised float batch
        images, labels = batch
        x = images.float().div_(self.scale)
        if self.hparams.augment and self.trainer is not None and self.trainer.training:
            x = random_translate(x, self.augment_pad) if self.augment_pad else x
            x = random_hflip(x) if self.augment_flip else x
        mean, std = self.normalisation(x.device)
        return x.sub_(mean).div_(std), labels

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Undo the normalisation: intensities in [0, 1], the images as a person sees them."""
        mean, std = self.normalisation(x.device)
        return (x * std + mean).clamp(0.0, 1.0)

    def normalisation(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``mean`` and ``std`` as ``(1, C, 1, 1)`` tensors on ``device``, made once: a tensor made
        from Python numbers on a GPU waits for its copy, which would be a host sync per batch."""
        if device not in self._normalisation:
            mean, std = (torch.tensor(v, device=device).view(1, -1, 1, 1) for v in (self.mean, self.std))
            self._normalisation[device] = (mean, std)
        return self._normalisation[device]

    def setup_predict_files(self) -> None:
        """Decode every file of ``predict_path`` now, so that a bad folder or file stops the run
        before any prediction, with the field and the fix."""
        if "predict" in self.splits:
            return
        folder = self.predict_path
        paths = predict_files(folder)
        if problems := image_problems(paths, (self.preprocessing.mode,)):
            raise refused_images(problems, "data.predict_path", folder)
        images = torch.stack([self.read_image(path) for path in paths])
        # No labels: -1, as torchvision's STL10 marks its unlabelled images.
        self.splits["predict"] = TensorImageDataset(images, torch.full((len(images),), -1))
        self.predict_files = [path.name for path in paths]
        rank_zero_info(
            f"{type(self).__name__}: {len(paths)} image files from '{folder}', as shape {self.input_shape}"
        )

    @property
    def preprocessing(self) -> Preprocessing:
        """How ``predict_path``'s files become images of the data (and ``model.json`` says so): stretched
        to ``input_shape`` with Pillow's box filter, which averages the pixels each output pixel covers
        (how the 8×8 digits were made from 32×32 bitmaps), to the stored ``scale`` levels."""
        return Preprocessing.stretch(self.input_shape, filter="box", levels=int(self.scale))

    def read_image(self, path: Path) -> torch.Tensor:
        """One image file as a stored image: ``input_shape``'s channels (grey or RGB) and size,
        intensities in [0, ``scale``] as uint8, by ``preprocessing``: the aspect ratio is not kept,
        and an image enlarged by a whole factor shrinks back exactly."""
        with Image.open(path) as image:
            return torch.from_numpy(self.preprocessing.stored(image))


def adopt_network_normalisation(datamodule: LightningDataModule) -> None:
    """Normalise with the network's ``mean`` and ``std`` when it states them (``TorchvisionNet``
    with pretrained weights): those weights were trained on images normalised so."""
    trainer = datamodule.trainer
    net = getattr(trainer.lightning_module, "net", None) if trainer is not None else None
    stated = getattr(net, "mean", None), getattr(net, "std", None)
    if None not in stated and tuple(map(tuple, stated)) != (datamodule.mean, datamodule.std):
        datamodule.mean, datamodule.std = map(tuple, stated)
        rank_zero_info(f"{type(datamodule).__name__}: normalising with the network's mean and std {stated}")
    if hasattr(datamodule, "_normalisation"):
        datamodule._normalisation.clear()


DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 8×8 digits of ``digits.csv.gz`` (pixels 0-16) and their labels.

    The file is the test set of UCI's Optical Recognition of Handwritten Digits (E. Alpaydin and
    C. Kaynak, 1998; CC BY 4.0), byte for byte as scikit-learn ships it: shipped here instead, as
    scikit-learn would bring SciPy, which torchmetrics then imports in every process (2 s each).
    """
    table = np.loadtxt(DIGITS_FILE, delimiter=",", dtype=np.uint8)
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


class DigitsDataModule(ImageDataModule):
    """The 8×8 handwritten digits shipped with the package (1,797 images): real data, no download.

    It has no official test set, so a seeded ``test_fraction`` is held out first and the
    validation split is then cut from the rest.
    """

    num_classes = 10
    classes = tuple("0123456789")
    input_shape = (1, 8, 8)
    mean = (0.3,)
    std = (0.38,)
    scale = 16.0
    augment_pad = 1

    def __init__(self, test_fraction: float = 0.2, batch_size: int = 64, **kwargs: Any) -> None:
        """``kwargs``: ``ImageDataModule``'s settings, which the CLI and ``--help`` list too."""
        checks.fraction("test_fraction", test_fraction)
        super().__init__(batch_size=batch_size, **kwargs)

    def load(self, train: bool) -> Split:
        pixels, targets = load_digits()
        images = torch.from_numpy(pixels).unsqueeze(1)
        labels = torch.from_numpy(targets)
        generator = torch.Generator().manual_seed(self.hparams.split_seed + 1)
        order = torch.randperm(len(labels), generator=generator)
        n_test = round(self.hparams.test_fraction * len(labels))
        index = order[n_test:] if train else order[:n_test]
        return images[index], labels[index]


class _TorchvisionDataModule(ImageDataModule):
    """A torchvision dataset: downloaded in ``prepare_data``, read from ``data_dir`` afterwards."""

    dataset_class: type[datasets.VisionDataset]
    files_hint: str

    def prepare_data(self) -> None:
        if self.hparams.stream_from:
            return  # the chunks are the data
        trainer = self.trainer
        if self.predict_path is not None and trainer is not None and trainer.state.fn == TrainerFn.PREDICTING:
            return  # predicting on one's own files needs no download
        for train in (True, False):
            try:
                self.dataset_class(str(self.data_dir), train=train, download=True)
            except Exception as error:
                said = " ".join(str(error).split())  # torchvision's message takes a line per mirror
                raise ConfigError(
                    f"Could not download {self.dataset_class.__name__} into '{self.data_dir}' "
                    f"({type(error).__name__}: {said}). Without a network, copy {self.files_hint} "
                    f"there yourself, or point data.init_args.data_dir at a folder holding them."
                ) from error

    def torchvision_dataset(self, train: bool) -> datasets.VisionDataset:
        try:
            return self.dataset_class(str(self.data_dir), train=train, download=False)
        except RuntimeError as error:
            raise FileNotFoundError(
                f"{self.dataset_class.__name__} not found in '{self.data_dir}': expected {self.files_hint}. "
                "Run `fit` once with a network to download it, or set data.init_args.data_dir."
            ) from error


class MNISTDataModule(_TorchvisionDataModule):
    """MNIST handwritten digits, 28×28 grey, 60k train / 10k test."""

    dataset_class = datasets.MNIST
    files_hint = "the four IDX files (train-images-idx3-ubyte, …) under MNIST/raw/"
    num_classes = 10
    classes = tuple("0123456789")
    input_shape = (1, 28, 28)
    mean = (0.1307,)
    std = (0.3081,)
    augment_pad = 2

    def load(self, train: bool) -> Split:
        ds = self.torchvision_dataset(train)
        return ds.data.unsqueeze(1), ds.targets.long()


class FashionMNISTDataModule(MNISTDataModule):
    """Zalando's Fashion-MNIST: ten clothing classes, 28×28 grey, 60k train / 10k test."""

    dataset_class = datasets.FashionMNIST
    files_hint = "the four IDX files (train-images-idx3-ubyte, …) under FashionMNIST/raw/"
    classes = tuple(datasets.FashionMNIST.classes)
    mean = (0.2860,)
    std = (0.3530,)
    augment_flip = True


class CIFAR10DataModule(_TorchvisionDataModule):
    """CIFAR-10: ten object classes, 32×32 colour, 50k train / 10k test."""

    dataset_class = datasets.CIFAR10
    files_hint = "the extracted cifar-10-batches-py/ folder (data_batch_1…5, test_batch, batches.meta)"
    num_classes = 10
    classes = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    input_shape = (3, 32, 32)
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    augment_pad = 4
    augment_flip = True

    def load(self, train: bool) -> Split:
        ds = self.torchvision_dataset(train)
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        return images, torch.tensor(ds.targets, dtype=torch.long)
