"""How an image file becomes the pixels an image model takes, stated once and applied by everyone.

A data module states its evaluation preprocessing as a ``Preprocessing`` (its ``preprocessing``
attribute or property) and applies it itself to the images it predicts on; ``export`` writes the same
object into ``model.json`` (``describe``), and ``serve`` reads it back (``from_description``) and
applies it with this same code. Each step is one Pillow or numpy call that a deployment repeats from
``model.json`` alone, byte for byte (the examples of kit/docs/export.md, in kit/examples/, do): so a
file gets the same answer from ``predict``, from ``serve`` and from the examples. Only numpy and
Pillow are imported here: the server's HTTP processes preprocess without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

FILTERS = ("nearest", "box", "bilinear", "hamming", "bicubic", "lanczos")
MODES = ("L", "RGB")
MODE_NAMES = {"L": "grey", "RGB": "colour"}


def to_mode(image: Image.Image, mode: str) -> Image.Image:
    """``image`` as ``mode`` ("L" grey, "RGB"). 16-bit grey (Pillow's "I;16…" and "I") is first
    scaled to 8 bits (``round(v / 257)``): Pillow's own conversion clips it instead, which makes any
    value from 255 up white. Always a new image, read in full: it outlives the file it came from. A
    mode Pillow cannot convert to ``mode`` (LAB to grey) is a ValueError that says so, as
    ``conversion_problem`` says it beforehand."""
    if image.mode.startswith("I"):
        scaled = np.asarray(image, np.float64) / 257
        image = Image.fromarray(np.clip(scaled.round(), 0, 255).astype(np.uint8))
    image.load()  # a file's own errors (truncated, damaged) are raised as they are, not as a mode's
    if image.mode == mode:
        return image.copy()
    try:
        return image.convert(mode)
    except ValueError:
        raise ValueError(cannot_convert(image.mode, mode)) from None


def conversion_problem(mode: str, targets: Sequence[str] = MODES) -> str | None:
    """Why ``to_mode`` cannot turn an image of ``mode`` into each of ``targets``, or None: told by the
    mode alone (one pixel of it converted), whatever the image's size. ``predict``'s check of its
    files (``projkit.data.image_files.image_problem``) and ``serve``'s of a request both ask it."""
    for target in targets:
        try:
            to_mode(Image.new(mode, (1, 1)), target)
        except ValueError:  # Image.new's too: a mode Pillow decodes but cannot make
            return cannot_convert(mode, target)
    return None


def cannot_convert(mode: str, target: str) -> str:
    return f"its mode {mode} is one Pillow cannot convert to {target} ({MODE_NAMES[target]})"


@dataclass(frozen=True)
class Preprocessing:
    """An image file's way to the model's input, in order:

    1. ``mode``: converted to "L" (grey) or "RGB" (``to_mode``);
    2. resized with Pillow's ``filter`` either to ``size`` (width, height; the aspect ratio is not
       kept) or so that its shorter side is ``shorter_side`` (the longer one ``int(shorter_side *
       longer / shorter)``, as torchvision's ``Resize`` computes it);
    3. ``crop``: the centre (width, height), its left edge at ``(width - crop_width) // 2`` and its
       top at ``(height - crop_height) // 2``, when given;
    4. ``levels``: the intensities the data stores, ``round(v / 255 * levels)`` of 0..255 (255: the
       8-bit values as they are; the 8×8 digits store 17);
    5. divided by ``levels``: float32 pixels in [0, 1], channels first (C, H, W). What follows (the
       normalisation) is inside the exported graph.
    """

    mode: str
    size: tuple[int, int] | None = None
    shorter_side: int | None = None
    filter: str = "box"
    crop: tuple[int, int] | None = None
    levels: int = 255

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Preprocessing.mode must be one of {MODES}, got {self.mode!r}")
        if (self.size is None) == (self.shorter_side is None):
            raise ValueError("Preprocessing needs exactly one of size (width, height) and shorter_side")
        if self.filter not in FILTERS:
            raise ValueError(f"Preprocessing.filter must be one of {FILTERS}, got {self.filter!r}")
        sizes = [*(self.size or ()), *(self.crop or ()), self.shorter_side or 1]
        if not all(isinstance(n, int) and n > 0 for n in sizes):
            raise ValueError(f"Preprocessing sizes must be positive whole numbers, got {self}")
        if not (isinstance(self.levels, int) and 1 <= self.levels <= 255):
            raise ValueError(f"Preprocessing.levels must be a whole number in 1..255, got {self.levels!r}")
        object.__setattr__(self, "size", None if self.size is None else tuple(self.size))
        object.__setattr__(self, "crop", None if self.crop is None else tuple(self.crop))

    @classmethod
    def stretch(
        cls, input_shape: tuple[int, int, int], filter: str = "box", levels: int = 255
    ) -> Preprocessing:
        """Every image stretched to ``input_shape`` (C, H, W), grey for one channel, RGB for three."""
        channels, height, width = input_shape
        return cls("L" if channels == 1 else "RGB", size=(width, height), filter=filter, levels=levels)

    @property
    def output_size(self) -> tuple[int, int]:
        """(width, height) of what comes out: the crop when there is one, else ``size``."""
        if self.crop is not None:
            return self.crop
        if self.size is None:
            raise ValueError("a shorter-side resize without a crop has no fixed output size")
        return self.size

    def image(self, image: Image.Image) -> Image.Image:
        """Steps 1 to 3: the converted, resized and cropped Pillow image."""
        image = to_mode(image, self.mode)
        resample = Image.Resampling[self.filter.upper()]
        if self.size is not None:
            image = image.resize(self.size, resample)
        else:
            width, height = image.size
            side = self.shorter_side
            size = (
                (side, int(side * height / width)) if width <= height else (int(side * width / height), side)
            )
            image = image.resize(size, resample)
        if self.crop is not None:
            width, height = image.size
            left, top = (width - self.crop[0]) // 2, (height - self.crop[1]) // 2
            image = image.crop((left, top, left + self.crop[0], top + self.crop[1]))
        return image

    def stored(self, image: Image.Image) -> np.ndarray:
        """Steps 1 to 4: uint8 intensities 0..``levels``, (C, H, W), as a data set stores them."""
        values = np.asarray(self.image(image), np.float32)
        values = values.reshape(*values.shape[:2], -1).transpose(2, 0, 1)
        if self.levels != 255:
            values = np.round(values / 255 * self.levels)
        return values.astype(np.uint8)

    def pixels(self, image: Image.Image) -> np.ndarray:
        """Every step: float32 pixels in [0, 1], (C, H, W), what the exported model takes."""
        return self.stored(image).astype(np.float32) / np.float32(self.levels)

    def describe(self) -> dict[str, Any]:
        """What ``model.json`` says of it: every number, and in words how to apply them."""
        resize = {"size": list(self.size)} if self.size else {"shorter_side": self.shorter_side}
        return {
            "mode": self.mode,
            "resize": {**resize, "filter": self.filter},
            "crop": None if self.crop is None else list(self.crop),
            "levels": self.levels,
            "steps": (
                "Image.open(file); 16-bit grey to 8 bits as round(v / 257); .convert(mode); .resize to "
                "resize.size (width, height), or to the shorter side resize.shorter_side with the longer "
                "int(shorter_side * longer / shorter), with Image.Resampling[filter.upper()]; centre crop "
                "(width, height) from ((w - cw) // 2, (h - ch) // 2); round(v / 255 * levels) / levels "
                "as float32, channels first"
            ),
        }

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> Preprocessing:
        """The ``Preprocessing`` that ``describe`` wrote, as ``serve`` reads it from ``model.json``."""
        resize = description["resize"]
        crop = description.get("crop")
        return cls(
            mode=description["mode"],
            size=tuple(resize["size"]) if "size" in resize else None,
            shorter_side=resize.get("shorter_side"),
            filter=resize["filter"],
            crop=None if crop is None else tuple(crop),
            levels=int(description["levels"]),
        )
