"""Classify one image file with an exported image model: onnxruntime, numpy and Pillow, no template.
python examples/classify_image.py runs/digits/version_0/export/last digit.png"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from PIL import Image

folder, image_file = Path(sys.argv[1]), sys.argv[2]
spec = json.loads((folder / "model.json").read_text())
channels, height, width = spec["input"]["shape"][1:]
image = Image.open(image_file).convert("L" if channels == 1 else "RGB").resize((width, height), Image.BOX)
pixels = np.asarray(image, np.float32).reshape(height, width, channels).transpose(2, 0, 1) / 255
session = onnxruntime.InferenceSession(folder / "model.onnx")
logits = session.run(None, {"pixels": pixels[None]})[0][0]
probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
print(spec["classes"][probs.argmax()], f"{probs.max():.4f}")
