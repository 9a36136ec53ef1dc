"""Classify one image file with an exported image model: onnxruntime, numpy and Pillow, no template.
The file is prepared as model.json says (preprocess.py), as `predict` prepares it.
python kit/examples/classify_image.py runs/digits/version_0/export/last digit.png"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from preprocess import pixels

folder, image_file = Path(sys.argv[1]), sys.argv[2]
spec = json.loads((folder / "model.json").read_text())
session = onnxruntime.InferenceSession(folder / "model.onnx")
logits = session.run(None, {spec["input"]["name"]: pixels(image_file, spec["preprocessing"])[None]})[0][0]
probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
print(spec["classes"][probs.argmax()], f"{probs.max():.6f}")
