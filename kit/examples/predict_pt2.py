"""Classify image files with model.pt2 in plain PyTorch: torch.export.load needs neither this
template nor Lightning, only torch (and numpy and Pillow to prepare the files: preprocess.py).
    python kit/examples/predict_pt2.py runs/digits/version_0/export/last a.png b.png c.png"""

import io
import json
import re
import sys
import zipfile
from pathlib import Path

import torch
from preprocess import pixels

# What torch.export.save writes for a model of plain tensors; nothing in it is unpickled.
PLAIN = (
    r"archive_format|archive_version|byteorder|\.data/\w+|models/\w+\.json|extra/[\w.]+"
    r"|data/(weights/weight|constants/tensor)_\d+"
)


def pickled(archive: Path) -> str | None:
    """The first file of ``archive`` that torch.export.load would unpickle, running any code it
    holds: a weight or constant marked as pickled, an object, sample inputs beyond tensors."""
    with zipfile.ZipFile(archive) as zipped:
        for name in zipped.namelist():
            part = name.split("/", 1)[-1]
            if re.fullmatch(r"data/(weights|constants)/\w+_config\.json", part):
                entries = json.loads(zipped.read(name))["config"].values()
                if any(e["use_pickle"] or not re.match("weight_|tensor_", e["path_name"]) for e in entries):
                    return name
            elif re.fullmatch(r"data/sample_inputs/\w+\.pt", part):
                try:
                    torch.load(io.BytesIO(zipped.read(name)), weights_only=True)
                except Exception:
                    return name
            elif not re.fullmatch(PLAIN, part):
                return name
    return None


folder, files = Path(sys.argv[1]), sys.argv[2:]
spec = json.loads((folder / "model.json").read_text())
if found := pickled(folder / "model.pt2"):
    sys.exit(f"{folder / 'model.pt2'}: {found} holds pickled objects, which run code when loaded: not loaded")
model = torch.export.load(folder / "model.pt2").module()
batch = torch.stack([torch.from_numpy(pixels(file, spec["preprocessing"])) for file in files])
with torch.no_grad():
    probs = model(batch).softmax(dim=-1)
for file, p in zip(files, probs, strict=True):
    print(file, spec["classes"][p.argmax()], f"{p.max():.6f}")
