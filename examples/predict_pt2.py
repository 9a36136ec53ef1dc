"""Classify image files with model.pt2 in plain PyTorch: torch.export.load needs neither this
template nor Lightning, only torch (and Pillow to read the files).
    python examples/predict_pt2.py runs/digits/version_0/export/last a.png b.png c.png"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

folder, files = Path(sys.argv[1]), sys.argv[2:]
spec = json.loads((folder / "model.json").read_text())
channels, height, width = spec["input"]["shape"][1:]
model = torch.export.load(folder / "model.pt2").module()


def pixels(file: str) -> torch.Tensor:
    image = Image.open(file).convert("L" if channels == 1 else "RGB").resize((width, height), Image.BOX)
    return (
        torch.from_numpy(np.asarray(image, np.float32) / 255)
        .reshape(height, width, channels)
        .permute(2, 0, 1)
    )


with torch.no_grad():
    probs = model(torch.stack([pixels(file) for file in files])).softmax(dim=-1)
for file, p in zip(files, probs, strict=True):
    print(file, spec["classes"][p.argmax()], f"{p.max():.4f}")
