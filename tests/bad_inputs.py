"""The table of bad input to this project's own modules: what a user may give its networks, data
modules and models, and what the CLI must answer.

Each row is one command line (after ``python -m proj``) with what it needs written first, the words
its message must hold (the first is the message's key, which the errors page, kit/docs/errors.md,
or the project's docs quote with its fix) and the exit code. ``test_bad_input.py`` runs every row; a
test there checks the docs against the keys. Arguments may hold ``{digits}``, ``{text}`` (the text
experiment's config), ``{corpus}`` (the tests' play, ``conftest.CORPUS``), ``{ckpt}`` (the baseline
run's last checkpoint) and ``{dir}`` (the working folder).

What the kit refuses whatever the project (the command line, config files, trainer settings,
checkpoints, run names, ...) is the kit's own table, kit/tests/bad_inputs.py, run on its tiny project.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from conftest import CONFIGS, CORPUS

# A few optimizer steps and test batches: a row that trains (today or by mistake) ends in seconds.
QUICK = (
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=1",
    "--trainer.enable_progress_bar=false",
)
# The character GPT at 2 layers of 64 on the tests' play.
SMALL_GPT = (
    "--model.init_args.net.init_args.n_layer=2",
    "--model.init_args.net.init_args.n_embd=64",
    "--data.init_args.path={corpus}",
)
MARKER = "payload_ran"  # the file a crafted checkpoint's code would write into the working folder


@dataclass(frozen=True)
class Case:
    kind: str
    name: str
    args: tuple[str, ...]
    words: tuple[str, ...]
    code: int = 2
    setup: Callable[[Path, Path], None] | None = None  # (working folder, baseline checkpoint)
    env: dict[str, str] = field(default_factory=dict)
    slow: bool = False
    cpu_only: bool = False  # a row about a machine without a GPU
    new_run: bool = False  # the command starts a run before it is refused (its checkpoints stay)

    def command(self, ckpt: Path, workdir: Path) -> list[str]:
        values = {
            "digits": str(CONFIGS / "digits.yaml"),
            "text": str(CONFIGS / "shakespeare_char_cpu.yaml"),
            "corpus": str(CORPUS),
            "ckpt": str(ckpt),
            "dir": str(workdir),
        }
        return [arg.format(**values) for arg in self.args]


def digits(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    return (subcommand, "--config", "{digits}", *QUICK, *args)


def text(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    return (subcommand, "--config", "{text}", *QUICK, *SMALL_GPT, *args)


def write(name: str, content: str | bytes) -> Callable[[Path, Path], None]:
    def setup(workdir: Path, ckpt: Path) -> None:
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    return setup


def make_folder(name: str) -> Callable[[Path, Path], None]:
    return lambda workdir, ckpt: (workdir / name).mkdir(parents=True, exist_ok=True)


class Payload:
    """Code hidden in a checkpoint: unpickling it writes the marker file, as any code could."""

    def __reduce__(self):
        return (Path.write_text, (Path(MARKER), "ran"))


def text_checkpoint(make: Callable[[str], object]) -> Callable[[Path, Path], None]:
    """A text checkpoint ``init.ckpt`` of the corpus's characters, made by ``make(vocab)``."""

    def setup(workdir: Path, ckpt: Path) -> None:
        vocab = "".join(sorted(set(CORPUS.read_text())))
        torch.save(make(vocab), workdir / "init.ckpt")

    return setup


def image_folder(workdir: Path, ckpt: Path) -> None:
    import numpy as np

    from conftest import write_png

    for label in (0, 1):
        write_png(workdir / "imgs" / "train" / f"c{label}" / "0.png", np.full((4, 4), 255 * label))


def bad_image_folder(workdir: Path, ckpt: Path) -> None:
    """Two classes of three good PNGs in train/ (and one each in val/, test/), and three bad files
    beside them: a truncated PNG, an empty one and a note saved under an image's name."""
    import numpy as np

    from conftest import write_png

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


CASES: list[Case] = [
    # Networks
    Case(
        "network",
        "constructor raises (dropout)",
        digits("fit", "--model.init_args.net.init_args.dropout=1.5"),
        ("model.init_args.net (", "proj.nets.ConvNet", "dropout"),
    ),
    Case(
        "network",
        "constructor raises (channels)",
        digits("fit", "--model.init_args.net.init_args.channels=[0]"),
        ("model.init_args.net (", "proj.nets.ConvNet", "net.channels must be"),
    ),
    Case(
        "network",
        "mlp negative width",
        digits(
            "fit",
            "--model.init_args.net=proj.nets.MLP",
            "--model.init_args.net.init_args.hidden_sizes=[-4]",
        ),
        ("model.init_args.net (", "proj.nets.MLP", "net.hidden_sizes must be"),
    ),
    Case(
        "network",
        "gpt heads do not divide",
        text("fit", "--model.init_args.net.init_args.n_head=3"),
        ("model.init_args.net (", "proj.nets.GPT", "n_embd (64) must be divisible by net.n_head (3)"),
    ),
    Case(
        "network",
        "gpt block_size 0",
        text("fit", "--model.init_args.net.init_args.block_size=0"),
        ("must be a positive integer", "block_size"),
    ),
    Case(
        "network",
        "gpt n_layer 0",
        text("fit", "--model.init_args.net.init_args.n_layer=0"),
        ("model.init_args.net (", "proj.nets.GPT", "net.n_layer must be a positive integer"),
    ),
    # Text data
    Case(
        "text",
        "one distinct character",
        text("fit", "--data.init_args.path=ones.txt"),
        ("holds one distinct character", "data.path: 'ones.txt'"),
        setup=write("ones.txt", "a" * 5000),
    ),
    Case(
        "text",
        "all NUL",
        text("fit", "--data.init_args.path=nul.txt"),
        ("holds NUL bytes", "data.path: 'nul.txt'"),
        setup=write("nul.txt", b"\x00" * 5000),
    ),
    Case(
        "text",
        "binary file",
        text("fit", "--data.init_args.path=blob.bin"),
        ("is not UTF-8 text", "data.path: 'blob.bin'"),
        setup=write("blob.bin", bytes(range(256)) * 40),
    ),
    Case(
        "text",
        "folder as path",
        text("fit", "--data.init_args.path=corpus_dir"),
        ("is a folder, not a text file", "data.path: 'corpus_dir'"),
        setup=make_folder("corpus_dir"),
    ),
    Case(
        "text",
        "a device as path in a config file",
        text("fit", "--config", "device.yaml"),
        ("is not a regular file (a device, pipe or socket)", "data.path: '/dev/zero'"),
        setup=write("device.yaml", "data:\n  init_args:\n    path: /dev/zero\n"),
    ),
    Case(
        "text",
        "a FIFO as path",
        text("fit", "--data.init_args.path=pipe"),
        ("a FIFO, device or socket, not a file", "--data.init_args.path=pipe"),
        setup=lambda workdir, ckpt: os.mkfifo(workdir / "pipe"),
    ),
    Case(
        "text",
        "empty file",
        text("fit", "--data.init_args.path=empty.txt"),
        ("is empty. Point data.init_args.path", "data.path: 'empty.txt'"),
        setup=write("empty.txt", ""),
    ),
    Case(
        "text",
        "too short",
        text("fit", "--data.init_args.path=short.txt"),
        ("too few for block_size", "data.path: 'short.txt' has 40 characters", "block_size 64"),
        setup=write("short.txt", "abcdefghij" * 4),
    ),
    Case(
        "text",
        "missing, no url",
        text("fit", "--data.init_args.path=none.txt", "--data.init_args.url=null"),
        ("and data.url is null", "data.path: no text file at 'none.txt'"),
    ),
    Case(
        "text",
        "latin1",
        text("fit", "--data.init_args.path=latin1.txt"),
        ("is not UTF-8 text", "data.path: 'latin1.txt'", "iconv"),
        setup=write("latin1.txt", ("caf\xe9 " * 500).encode("latin-1")),
    ),
    Case(
        "text",
        "train_fraction 1",
        text("fit", "--data.init_args.train_fraction=1"),
        ("must be in (0, 1)", "data.train_fraction"),
    ),
    Case(
        "text",
        "val_windows 0",
        text("fit", "--data.init_args.val_windows=0"),
        ("must be a positive integer", "data.val_windows", "or null"),
    ),
    # Image data
    Case(
        "data",
        "batch_size 0",
        digits("fit", "--data.batch_size=0"),
        ("must be a positive integer", "data.batch_size"),
    ),
    Case(
        "data",
        "val_fraction 1.5",
        digits("fit", "--data.val_fraction=1.5"),
        ("must be in (0, 1)", "data.val_fraction"),
    ),
    Case(
        "data",
        "test_fraction 0",
        digits("fit", "--data.init_args.test_fraction=0"),
        ("must be in (0, 1)", "data.test_fraction"),
    ),
    Case(
        "data", "num_workers -1", digits("fit", "--data.num_workers=-1"), ("must be >= 0", "data.num_workers")
    ),
    Case(
        "data",
        "image folder missing",
        ("fit", "--config", str(CONFIGS / "image_folder.yaml"), *QUICK, "--data.init_args.root=nowhere"),
        ("data.root: no folder at", "nowhere"),
    ),
    Case(
        "data",
        "image folder channels 2",
        (
            "fit",
            "--config",
            str(CONFIGS / "image_folder.yaml"),
            *QUICK,
            "--data.init_args.root=imgs",
            "--data.init_args.channels=2",
        ),
        ("must be 1 (grey) or 3", "data.channels"),
        setup=image_folder,
    ),
    Case(
        "data",
        "image folder with unreadable files",
        image_folder_fit(),
        (
            "cannot be read as images",
            "data.root: 3 file(s) under 'imgs'",
            "'train/c0/cut.png' is truncated",
            "'train/c1/empty.png' is empty (0 bytes)",
            "'val/c1/note.png' is a text file, not an image",
            "--data.init_args.bad_files=skip",
        ),
        setup=bad_image_folder,
    ),
    Case(
        "data",
        "image folder, unreadable files skipped",
        image_folder_fit("--data.init_args.bad_files=skip", "--test_after_fit=false"),
        ("left out 3 unreadable file(s)", "data.root"),
        code=0,
        setup=bad_image_folder,
    ),
    Case(
        "data",
        "image file cut inside its signature",
        image_folder_fit(),
        ("cannot be read as images", "'train/c1/0.png' is truncated or damaged: a PNG file"),
        setup=cut_in_its_signature,
    ),
    Case(
        "data",
        "image folder of one class",
        image_folder_fit(),
        ("holds one class folder", "data.root: 'imgs/train'", "(c0)", "at least two classes"),
        setup=one_class_folder,
    ),
    Case(
        "data",
        "image folder val class train lacks",
        image_folder_fit(),
        ("has class folders that", "data.root: 'imgs/val'", "lacks: fox"),
        setup=val_class_train_lacks,
    ),
    # Generation and predict
    Case(
        "generation",
        "no prompts",
        text("predict", "--allow_untrained=true", "--data.init_args.predict_prompts=[]"),
        ("is empty or a single string", "data.predict_prompts"),
    ),
    Case(
        "generation",
        "empty prompt",
        text("predict", "--allow_untrained=true", '--data.init_args.predict_prompts=["ROMEO:", ""]'),
        ("each prompt needs at least one character", "data.predict_prompts[1] is empty"),
    ),
    Case(
        "generation",
        "prompt outside vocabulary",
        text("predict", "--allow_untrained=true", '--data.init_args.predict_prompts=["ROMEO€"]'),
        ("are not in the model's vocabulary", "data.predict_prompts[0]: characters '€'"),
    ),
    Case(
        "generation",
        "predict_tokens -1",
        text("predict", "--allow_untrained=true", "--model.init_args.predict_tokens=-1"),
        ("must be >= 0", "model.predict_tokens"),
    ),
    Case(
        "generation",
        "temperature -1",
        text("fit", "--model.init_args.temperature=-1"),
        ("must be >= 0 (0: the most likely character)", "model.temperature"),
    ),
    Case(
        "generation",
        "top_k 0",
        text("fit", "--model.init_args.top_k=0"),
        ("must be a positive integer or null (no cut)", "model.top_k"),
    ),
    Case(
        "generation",
        "sample_tokens -5",
        text("fit", "--model.init_args.sample_tokens=-5"),
        ("must be >= 0", "model.sample_tokens"),
    ),
    Case(
        "generation",
        "num_samples -1",
        text("fit", "--model.init_args.num_samples=-1"),
        ("must be >= 0", "model.num_samples"),
    ),
    Case(
        "generation",
        "empty sample prompt",
        text("fit", "--model.init_args.sample_prompt="),
        ("it needs at least one character to continue", "model.sample_prompt is empty"),
    ),
    # Fine-tuning knobs
    Case(
        "finetune",
        "freeze everything",
        text("fit", '--model.init_args.freeze=["*"]'),
        ("the patterns match every parameter", "model.freeze"),
    ),
    Case(
        "finetune",
        "freeze nothing",
        text("fit", '--model.init_args.freeze=["net.h.*"]'),
        ("matches no parameter", "model.freeze: pattern 'net.h.*'"),
    ),
    Case(
        "finetune",
        "freeze a string",
        text("fit", "--model.init_args.freeze=net.*"),
        ("Expected a <class 'collections.abc.Sequence'>", "freeze", "net.*"),
    ),
    Case(
        "finetune",
        "label_smoothing -0.1",
        digits("fit", "--model.init_args.label_smoothing=-0.1"),
        ("must be in [0, 1] (0: none)", "model.label_smoothing"),
    ),
    Case(
        "finetune",
        "label_smoothing 1.5",
        digits("fit", "--model.init_args.label_smoothing=1.5"),
        ("must be in [0, 1] (0: none)", "model.label_smoothing"),
    ),
    Case(
        "finetune",
        "init_from missing",
        text("fit", "--model.init_args.init_from=nope.ckpt"),
        ("no checkpoint file at", "model.init_from", "nope.ckpt"),
    ),
    Case(
        "finetune",
        "init_from a list",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("holds no state_dict", "model.init_from: 'init.ckpt'"),
        setup=text_checkpoint(lambda vocab: [1, 2]),
    ),
    Case(
        "finetune",
        "init_from non-finite",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("holds non-finite weights", "model.init_from: 'init.ckpt'", "net.w"),
        setup=text_checkpoint(
            lambda vocab: {
                "state_dict": {"net.w": torch.tensor([float("inf")])},
                "hyper_parameters": {"vocab": vocab},
            }
        ),
    ),
    Case(
        "finetune",
        "init_from other sizes",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("does not fit this model", "model.init_from: 'init.ckpt'", "net.lm_head.weight"),
        setup=text_checkpoint(
            lambda vocab: {
                "state_dict": {"net.lm_head.weight": torch.zeros(3, 3)},
                "hyper_parameters": {"vocab": vocab},
            }
        ),
    ),
    Case(
        "finetune",
        "init_from wrong vocabulary",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("differs from the data's", "model.init_from: the vocabulary of 'init.ckpt'"),
        setup=text_checkpoint(lambda vocab: {"state_dict": {}, "hyper_parameters": {"vocab": "ab"}}),
    ),
    # Code in checkpoints, through the language model's init_from
    Case(
        "unsafe",
        "init_from with code",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("holds pickled objects that `weights_only=True` refuses", "model.init_from: 'init.ckpt'"),
        setup=text_checkpoint(lambda vocab: {"state_dict": {}, "hyper_parameters": {"vocab": Payload()}}),
    ),
]


def ids() -> list[str]:
    return [f"{case.kind}: {case.name}" for case in CASES]
