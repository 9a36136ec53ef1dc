"""``predict`` on the template's own data: the digits model on a folder of image files (grey and
colour, small and large) and 16-bit files. The prediction writers themselves (files never
overwritten, killed while writing, DDP order, the language model's continuations) and the refusal of
a bad folder to predict on (the kit's image files) are tested on the kit's tiny project, in
kit/tests/test_predict.py."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from projkit.callbacks import PredictionFileWriter
from projkit.testing import TINY_FIT, config, fit

from proj import main

QUIET = ("--trainer.enable_progress_bar=false",)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``last.ckpt`` of two digits training steps: enough for a checkpoint, not for good predictions."""
    folder = tmp_path_factory.mktemp("tiny_digits")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        fit("digits.yaml", extra=(*TINY_FIT, "--test_after_fit=false", *QUIET))
    return folder / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"


def predict(*args: str):
    return main(["predict", *args, *QUIET])


def predict_digits(checkpoint: Path, *args: str):
    return predict("--config", config("digits.yaml"), f"--ckpt_path={checkpoint}", *args)


def written(cli) -> Path:
    """The file the CLI's prediction writer wrote."""
    (writer,) = [c for c in cli.trainer.callbacks if isinstance(c, PredictionFileWriter)]
    return writer.path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_digit_files(folder: Path, images: torch.Tensor) -> list[str]:
    """Each 8×8 digit (intensities 0-16) twice: as an 8×8 grey PNG, and as a 32×32 RGB PNG that the
    data module must turn grey and shrink. Both read back as the digit exactly."""
    folder.mkdir()
    names = []
    for i, image in enumerate(images):
        grey = (image[0].double().numpy() * 255 / 16).round().astype(np.uint8)
        Image.fromarray(grey).save(folder / f"digit{i:02d}.png")
        large = Image.fromarray(np.stack([grey] * 3, axis=-1)).resize((32, 32), Image.Resampling.NEAREST)
        large.save(folder / f"large{i:02d}.png")
        names += [f"digit{i:02d}.png", f"large{i:02d}.png"]
    (folder / ".DS_Store").write_bytes(b"\0")  # hidden: not an image to classify
    return sorted(names)


@pytest.mark.slow
def test_predict_on_a_folder_of_image_files(tiny_checkpoint, workdir):
    on_split = predict_digits(tiny_checkpoint)
    split_rows = read_csv(written(on_split))
    n = 20
    names = write_digit_files(workdir / "mine", on_split.datamodule.splits["test"].images[:n])

    cli = predict_digits(tiny_checkpoint, "--data.init_args.predict_path=mine")
    rows = read_csv(written(cli))
    assert list(rows[0]) == ["file", "class", "probability"]
    assert [row["file"] for row in rows] == names
    assert {row["class"] for row in rows} <= set(cli.datamodule.classes)
    by_file = {row["file"]: row for row in rows}
    # The files hold the split's first images, so they get the same predictions.
    for i in range(n):
        for name in (f"digit{i:02d}.png", f"large{i:02d}.png"):
            row, expected = by_file[name], split_rows[i]
            assert row["class"] == expected["class"], name
            assert float(row["probability"]) == pytest.approx(float(expected["probability"]), abs=2e-6)


def test_sixteen_bit_and_smaller_files_are_converted(tmp_path):
    from proj.data import CIFAR10DataModule, DigitsDataModule

    ramp = np.tile(np.linspace(0, 65535, 8).round().astype(np.uint16), (8, 1))
    Image.fromarray(ramp).save(tmp_path / "deep.png")  # 16-bit grey, which Pillow's 8-bit conversion clips
    digits = DigitsDataModule().read_image(tmp_path / "deep.png")
    assert digits.shape == (1, 8, 8) and digits[0, 0].tolist() == [0, 2, 5, 7, 9, 11, 14, 16]
    colour = CIFAR10DataModule().read_image(tmp_path / "deep.png")  # grey to RGB, enlarged to 32×32
    assert colour.shape == (3, 32, 32) and colour.dtype == torch.uint8
    assert torch.equal(colour[0], colour[1]) and colour[0, 0, 0] == 0 and colour[0, 0, -1] == 255
