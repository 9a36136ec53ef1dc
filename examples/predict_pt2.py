"""Classify image files with model.pt2 in plain PyTorch: torch.export.load needs neither this
template nor Lightning, only torch (and numpy and Pillow to prepare the files: preprocess.py).
    python examples/predict_pt2.py runs/digits/version_0/export/last a.png b.png c.png"""

import json
import sys
from pathlib import Path

import torch
from preprocess import pixels

folder, files = Path(sys.argv[1]), sys.argv[2:]
spec = json.loads((folder / "model.json").read_text())
model = torch.export.load(folder / "model.pt2").module()
batch = torch.stack([torch.from_numpy(pixels(file, spec["preprocessing"])) for file in files])
with torch.no_grad():
    probs = model(batch).softmax(dim=-1)
for file, p in zip(files, probs, strict=True):
    print(file, spec["classes"][p.argmax()], f"{p.max():.6f}")
