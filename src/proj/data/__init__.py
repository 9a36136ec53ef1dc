"""LightningDataModules: each owns its download, splits and loaders and states the data's facts
(``num_classes``, ``input_shape``, a vocabulary) for the CLI to link into the model."""

from proj.data.folder import ImageFolderDataModule
from proj.data.image import (
    CIFAR10DataModule,
    DigitsDataModule,
    FashionMNISTDataModule,
    ImageDataModule,
    MNISTDataModule,
)
from proj.data.text import CharTokenizer, TextDataModule

__all__ = [
    "CIFAR10DataModule",
    "CharTokenizer",
    "DigitsDataModule",
    "FashionMNISTDataModule",
    "ImageDataModule",
    "ImageFolderDataModule",
    "MNISTDataModule",
    "TextDataModule",
]
