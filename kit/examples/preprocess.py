"""An image file as the pixels an exported image model takes, from model.json's "preprocessing"
alone, by numpy and Pillow: the steps `predict` and `serve` apply, so a file gets the same answer
here. classify_image.py and predict_pt2.py import it; copy it beside code of your own."""

import numpy as np
from PIL import Image


def pixels(file: str, pre: dict) -> np.ndarray:
    """float32 pixels in [0, 1], channels first (C, H, W)."""
    image = Image.open(file)
    if image.mode.startswith("I"):  # 16-bit grey: scaled to 8 bits (Pillow's convert would clip it)
        scaled = (np.asarray(image, np.float64) / 257).round()
        image = Image.fromarray(np.clip(scaled, 0, 255).astype(np.uint8))
    image = image.convert(pre["mode"])
    resize, (width, height) = pre["resize"], image.size
    if "size" in resize:  # stretched to (width, height)
        size = resize["size"]
    else:  # the shorter side to shorter_side, the longer in proportion, rounded down
        side = resize["shorter_side"]
        size = (side, int(side * height / width)) if width <= height else (int(side * width / height), side)
    image = image.resize(tuple(size), Image.Resampling[resize["filter"].upper()])
    if pre["crop"]:  # the centre (width, height)
        (width, height), (crop_width, crop_height) = image.size, pre["crop"]
        left, top = (width - crop_width) // 2, (height - crop_height) // 2
        image = image.crop((left, top, left + crop_width, top + crop_height))
    levels = pre["levels"]  # the intensities the training data stores
    values = np.round(np.asarray(image, np.float32) / 255 * levels) / levels
    return values.reshape(*values.shape[:2], -1).transpose(2, 0, 1)
