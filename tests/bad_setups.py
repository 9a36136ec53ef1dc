"""What the rows of this project's bad-input table (bad_inputs.py) are made of: the command lines of
its digits and text experiments, and the files, folders and checkpoints a row writes first."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from projkit.testing import write_png
from projkit.testing.bad_input import QUICK, Setup

from conftest import CONFIGS, CORPUS

# The character GPT at 2 layers of 64 on the tests' play.
SMALL_GPT = (
    "--model.init_args.net.init_args.n_layer=2",
    "--model.init_args.net.init_args.n_embd=64",
    "--data.init_args.path={corpus}",
)
# The placeholders of the rows' arguments.
VALUES = {
    "digits": str(CONFIGS / "digits.yaml"),
    "text": str(CONFIGS / "shakespeare_char_cpu.yaml"),
    "corpus": str(CORPUS),
}


def digits(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    """A row's command on the digits experiment, a few steps long."""
    return (subcommand, "--config", "{digits}", *QUICK, *args)


def text(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    """A row's command on the small character GPT, a few steps long."""
    return (subcommand, "--config", "{text}", *QUICK, *SMALL_GPT, *args)


def text_checkpoint(make: Callable[[str], object]) -> Setup:
    """A text checkpoint ``init.ckpt`` of the corpus's characters, made by ``make(vocab)``."""

    def setup(workdir: Path, ckpt: Path) -> None:
        vocab = "".join(sorted(set(CORPUS.read_text())))
        torch.save(make(vocab), workdir / "init.ckpt")

    return setup


def image_folder(workdir: Path, ckpt: Path) -> None:
    import numpy as np

    for label in (0, 1):
        write_png(workdir / "imgs" / "train" / f"c{label}" / "0.png", np.full((4, 4), 255 * label))


def bad_image_folder(workdir: Path, ckpt: Path) -> None:
    """Two classes of three good PNGs in train/ (and one each in val/, test/), and three bad files
    beside them: a truncated PNG, an empty one and a note saved under an image's name."""
    import numpy as np

    for split, n in (("train", 3), ("val", 1), ("test", 1)):
        for label in (0, 1):
            for i in range(n):
                write_png(
                    workdir / "imgs" / split / f"c{label}" / f"{i}.png", np.full((8, 8), 200 * label + i)
                )
    good = (workdir / "imgs" / "train" / "c0" / "0.png").read_bytes()
    (workdir / "imgs" / "train" / "c0" / "cut.png").write_bytes(good[: len(good) // 2])
    (workdir / "imgs" / "train" / "c1" / "empty.png").write_bytes(b"")
    (workdir / "imgs" / "val" / "c1" / "note.png").write_text("remember to label these\n")


def cut_in_its_signature(workdir: Path, ckpt: Path) -> None:
    """Found by tests/test_fuzz_trees.py: a PNG of its first 5 bytes was told to be converted to PNG."""
    image_folder(workdir, ckpt)
    path = workdir / "imgs" / "train" / "c1" / "0.png"
    path.write_bytes(path.read_bytes()[:5])


def one_class_folder(workdir: Path, ckpt: Path) -> None:
    image_folder(workdir, ckpt)
    shutil.rmtree(workdir / "imgs" / "train" / "c1")


def val_class_train_lacks(workdir: Path, ckpt: Path) -> None:
    image_folder(workdir, ckpt)
    shutil.copytree(workdir / "imgs" / "train" / "c1", workdir / "imgs" / "val" / "fox")


def image_folder_fit(*args: str) -> tuple[str, ...]:
    return (
        "fit",
        "--config",
        str(CONFIGS / "image_folder.yaml"),
        *QUICK,
        "--data.init_args.root=imgs",
        *args,
    )
