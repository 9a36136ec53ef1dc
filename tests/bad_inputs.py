"""The table of bad input: what a user may type, point at or load, and what the CLI must answer.

Each row is one command line (after ``python -m proj``) with what it needs written first, the words
its message must hold (the first is the message's key, which docs/errors.md quotes with its fix) and
the exit code. ``test_bad_input.py`` runs every row; a test there checks the FAQ against the keys.
Arguments may hold ``{digits}``, ``{text}`` (the text experiment's config), ``{corpus}`` (the tests'
play, ``conftest.CORPUS``), ``{ckpt}`` (the baseline run's last checkpoint) and ``{dir}`` (the
working folder).
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


def save(name: str, make: Callable[[dict], object]) -> Callable[[Path, Path], None]:
    """A checkpoint ``name`` made by ``make`` from the baseline's."""

    def setup(workdir: Path, ckpt: Path) -> None:
        checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(make(checkpoint), path)

    return setup


def with_nan(checkpoint: dict) -> dict:
    state = dict(checkpoint["state_dict"])
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key] = torch.full_like(state[key], float("nan"))
    return {**checkpoint, "state_dict": state}


def with_wrong_shape(checkpoint: dict) -> dict:
    state = dict(checkpoint["state_dict"])
    state[next(iter(state))] = torch.zeros(3, 3)
    return {**checkpoint, "state_dict": state}


def with_net(class_path: str) -> Callable[[dict], dict]:
    """The checkpoint as if trained with the network ``class_path`` (of the same weights)."""

    def make(checkpoint: dict) -> dict:
        hparams = checkpoint["hyper_parameters"]
        net = {**hparams["net"], "class_path": class_path}
        return {**checkpoint, "hyper_parameters": {**hparams, "net": net}}

    return make


def with_payload(checkpoint: dict) -> dict:
    return {**checkpoint, "hyper_parameters": {**checkpoint["hyper_parameters"], "extra": Payload()}}


def text_checkpoint(make: Callable[[str], object]) -> Callable[[Path, Path], None]:
    """A text checkpoint ``init.ckpt`` of the corpus's characters, made by ``make(vocab)``."""

    def setup(workdir: Path, ckpt: Path) -> None:
        vocab = "".join(sorted(set(CORPUS.read_text())))
        torch.save(make(vocab), workdir / "init.ckpt")

    return setup


def hpc_payload(workdir: Path, ckpt: Path) -> None:
    """Lightning's `--ckpt_path hpc` loads the newest runs/hpc_ckpt_N.ckpt (trainer.default_root_dir)."""
    save("runs/hpc_ckpt_1.ckpt", with_payload)(workdir, ckpt)


def best_points_at_payload(workdir: Path, ckpt: Path) -> None:
    """A run whose last checkpoint records, as its best, a crafted file that `test_after_fit` follows."""
    run = workdir / "runs" / "crafted" / "version_0" / "checkpoints"
    run.mkdir(parents=True)
    torch.save(with_payload(torch.load(ckpt, weights_only=True)), workdir / "crafted_best.ckpt")
    checkpoint = torch.load(ckpt, weights_only=True)
    for state in checkpoint["callbacks"].values():
        if isinstance(state, dict) and "best_model_path" in state:
            crafted, score = str(workdir / "crafted_best.ckpt"), torch.tensor(-1e9)  # nothing beats it
            state.update(
                best_model_path=crafted,
                best_model_score=score,
                dirpath=str(run.relative_to(workdir)),  # as the callback names its folder: restored
                kth_best_model_path=crafted,
                kth_value=score,
                best_k_models={crafted: score},
            )
    torch.save(checkpoint, run / "last.ckpt")


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
    # Config files
    Case(
        "config",
        "yaml list",
        digits("fit", "--config", "list.yaml"),
        ("where a config is a mapping of keys", "list.yaml", "list"),
        setup=write("list.yaml", "- a\n- b\n"),
    ),
    Case(
        "config",
        "yaml scalar",
        digits("fit", "--config", "scalar.yaml"),
        ("where a config is a mapping of keys", "scalar.yaml", "str"),
        setup=write("scalar.yaml", "max_epochs\n"),
    ),
    Case(
        "config",
        "empty overlay",
        digits("fit", "--config", "empty.yaml"),
        ("the file is empty (or comments only)", "empty.yaml"),
        setup=write("empty.yaml", ""),
    ),
    Case(
        "config",
        "comments only",
        digits("fit", "--config", "notes.yaml"),
        ("the file is empty (or comments only)", "notes.yaml"),
        setup=write("notes.yaml", "# nothing yet\n"),
    ),
    Case(
        "config",
        "folder as config",
        digits("fit", "--config", "configs_dir"),
        ("is a folder, not a config file", "configs_dir"),
        setup=make_folder("configs_dir"),
    ),
    Case(
        "config",
        "binary config",
        digits("fit", "--config", "bin.yaml"),
        ("not UTF-8 text", "--config bin.yaml"),
        setup=write("bin.yaml", b"\xff\xfe\x00trainer"),
    ),
    Case(
        "config",
        "yaml syntax",
        digits("fit", "--config", "broken.yaml"),
        ("not valid YAML at line", "broken.yaml", "line 3", "Fix the syntax"),
        setup=write("broken.yaml", "trainer:\n  max_epochs: [3\n"),
    ),
    Case(
        "config",
        "missing file",
        ("fit", "--config", "configs/nope.yaml"),
        ("File does not exist", "nope.yaml"),
    ),
    Case(
        "config",
        "misspelt key in file",
        digits("fit", "--config", "mine.yaml"),
        ("does not accept option", "max_epocs", "Did you mean trainer.max_epochs?"),
        setup=write("mine.yaml", "trainer:\n  max_epocs: 3\n"),
    ),
    Case(
        "config",
        "misspelt key of a class in a flag",
        digits("fit", "--data.init_args.batchsize=8"),
        (
            "does not accept option",
            "data.init_args.batchsize: proj.data.DigitsDataModule",
            "Did you mean data.init_args.batch_size?",
        ),
    ),
    Case(
        "config",
        "misspelt key deep in a file",
        digits("test", "--config", "deep.yaml"),
        ("does not accept option", "Did you mean model.init_args.net.init_args.channels?"),
        setup=write("deep.yaml", "model:\n  init_args:\n    net:\n      init_args:\n        chanels: [8]\n"),
    ),
    Case(
        "config",
        "misspelt key of a listed callback",
        digits("fit", "--config", "callbacks.yaml"),
        (
            "does not accept option",
            "trainer.callbacks[0].init_args.monitr: lightning.pytorch.callbacks.EarlyStopping",
            "Did you mean trainer.callbacks[0].init_args.monitor?",
        ),
        setup=write(
            "callbacks.yaml",
            "trainer:\n  callbacks:\n  - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
            "    init_args: {monitr: val/loss}\n",
        ),
    ),
    Case(
        "config",
        "unknown top-level key",
        digits("fit", "--config", "top.yaml"),
        ("does not accept option", "colour"),
        setup=write("top.yaml", "colour: red\n"),
    ),
    Case(
        "config",
        "overlay for another experiment",
        text("fit", "--config", "image_data.yaml"),
        (
            "from its data module, which",
            "proj.models.LanguageModel needs vocab, vocab_size",
            "DigitsDataModule",
        ),
        setup=write("image_data.yaml", "data:\n  class_path: proj.data.DigitsDataModule\n"),
    ),
    Case(
        "config",
        "misspelt flag",
        digits("fit", "--trainer.max_epocs=3"),
        ("unrecognized arguments", "max_epocs", "Did you mean --trainer.max_epochs?"),
    ),
    Case(
        "config", "wrong type", digits("fit", "--data.batch_size=lots"), ("Expected a <class 'int'>", "lots")
    ),
    Case(
        "config",
        "unknown class path",
        digits("fit", "--model.net=proj.nets.NoSuchNet"),
        ("has no attribute", "NoSuchNet"),
    ),
    # Trainer numbers
    Case(
        "trainer",
        "accumulate 0",
        digits("fit", "--trainer.accumulate_grad_batches=0"),
        ("must be a positive integer", "trainer.accumulate_grad_batches=0"),
    ),
    Case(
        "trainer",
        "accumulate -2",
        digits("fit", "--trainer.accumulate_grad_batches=-2"),
        ("must be a positive integer", "trainer.accumulate_grad_batches=-2"),
    ),
    Case(
        "trainer",
        "max_epochs -3",
        digits("fit", "--trainer.max_epochs=-3"),
        ("must be -1 (no limit), 0 or more", "trainer.max_epochs=-3"),
    ),
    Case(
        "trainer",
        "max_steps -5",
        digits("fit", "--trainer.max_steps=-5"),
        ("must be -1 (no limit), 0 or more", "trainer.max_steps=-5"),
    ),
    Case(
        "trainer",
        "min_epochs above max_epochs",
        digits("fit", "--trainer.min_epochs=5", "--trainer.max_epochs=2"),
        ("the run would stop there regardless", "trainer.min_epochs=5", "trainer.max_epochs=2"),
    ),
    Case(
        "trainer",
        "min_steps above max_steps",
        digits("fit", "--trainer.min_steps=10", "--trainer.max_steps=5"),
        ("the run would stop there regardless", "trainer.min_steps=10", "trainer.max_steps=5"),
    ),
    Case(
        "trainer",
        "devices 0",
        digits("fit", "--trainer.devices=0"),
        ("must be a positive count, -1 or auto", "trainer.devices=0"),
    ),
    Case(
        "trainer",
        "devices -3",
        digits("fit", "--trainer.devices=-3"),
        ("must be a positive count, -1 or auto", "trainer.devices=-3"),
    ),
    Case(
        "trainer",
        "max_steps 0",
        digits("fit", "--trainer.max_steps=0"),
        ("`fit` would train nothing", "trainer.max_steps=0"),
    ),
    Case(
        "trainer",
        "max_epochs 0",
        digits("fit", "--trainer.max_epochs=0"),
        ("`fit` would train nothing", "trainer.max_epochs=0"),
    ),
    Case(
        "trainer",
        "limit_train_batches 0",
        digits("fit", "--trainer.limit_train_batches=0"),
        ("`fit` would train nothing", "trainer.limit_train_batches=0"),
    ),
    Case(
        "trainer",
        "limit_train_batches 0.0, no test",
        digits("fit", "--trainer.limit_train_batches=0.0", "--test_after_fit=false"),
        ("`fit` would train nothing", "trainer.limit_train_batches=0.0"),
    ),
    Case(
        "trainer",
        "limit_val_batches -1",
        digits("fit", "--trainer.limit_val_batches=-1"),
        ("must be a fraction of the batches in [0.0, 1.0] or a count", "trainer.limit_val_batches=-1"),
    ),
    Case(
        "trainer",
        "limit_test_batches 1.5",
        digits("fit", "--trainer.limit_test_batches=1.5"),
        ("must be a fraction of the batches in [0.0, 1.0] or a count", "trainer.limit_test_batches=1.5"),
    ),
    Case(
        "trainer",
        "val_check_interval 0",
        digits("fit", "--trainer.val_check_interval=0"),
        ("must be a positive count of batches or fraction", "trainer.val_check_interval=0"),
    ),
    Case(
        "trainer",
        "val_check_interval above an epoch",
        digits("fit", "--trainer.val_check_interval=10000"),
        ("Lightning refused it", "trainer.val_check_interval:", "(10000) must be less than or equal"),
    ),
    Case(
        "trainer",
        "early stopping on a misspelt metric",
        digits("fit", "--early_stopping.monitor=val/los"),
        ("logs no metric of that name", "early_stopping.init_args.monitor=val/los", "Did you mean val/loss?"),
    ),
    Case(
        "trainer",
        "checkpoint on a metric spelt the other way",
        digits("fit", "--checkpoint.monitor=val_acc"),
        ("logs no metric of that name", "checkpoint.init_args.monitor=val_acc", "Did you mean val/acc?"),
    ),
    Case(
        "trainer",
        "a plateau schedule on a metric not logged",
        text(
            "fit",
            "--model.init_args.scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau",
            "--model.init_args.scheduler_monitor=val/perplexity",
        ),
        ("logs no metric of that name", "model.init_args.scheduler_monitor=val/perplexity", "val/ppl"),
    ),
    Case(
        "trainer",
        "a listed checkpoint on a misspelt metric",
        digits("fit", "--config", "extra.yaml"),
        ("logs no metric of that name", "trainer.callbacks[0] (ModelCheckpoint).monitor=val/f", "val/f1"),
        setup=write(
            "extra.yaml",
            "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
            "      init_args: {monitor: val/f, mode: max}\n",
        ),
    ),
    Case(
        "trainer",
        "check_val_every_n_epoch 0",
        digits("fit", "--trainer.check_val_every_n_epoch=0"),
        ("must be a positive integer or null", "trainer.check_val_every_n_epoch=0"),
    ),
    Case(
        "trainer",
        "log_every_n_steps -1",
        digits("fit", "--trainer.log_every_n_steps=-1"),
        ("must be 0 or more", "trainer.log_every_n_steps=-1"),
    ),
    Case(
        "trainer",
        "negative clip",
        digits("fit", "--trainer.gradient_clip_val=-1"),
        ("must be positive (a negative norm", "trainer.gradient_clip_val=-1.0"),
    ),
    Case(
        "trainer",
        "gpu without one",
        digits("fit", "--config", str(CONFIGS / "trainer" / "gpu.yaml")),
        ("but no CUDA GPU is visible", "trainer.accelerator=gpu", "cpu.yaml"),
        cpu_only=True,
    ),
    # Seeds
    Case(
        "seed",
        "seed -1",
        digits("fit", "--seed_everything=-1"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-1"),
    ),
    Case(
        "seed",
        "seed 2**32",
        digits("fit", "--seed_everything=4294967296"),
        ("must be an integer from 0 to 4294967295", "seed_everything=4294967296"),
    ),
    Case(
        "seed",
        "seed 2**40",
        digits("fit", "--seed_everything=1099511627776"),
        ("must be an integer from 0 to 4294967295", "seed_everything=1099511627776"),
    ),
    Case(
        "seed",
        "seed from env",
        digits("fit"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-7"),
        env={"PL_FIT__SEED_EVERYTHING": "-7"},
    ),
    Case(
        "seed",
        "seed in a config file",
        digits("fit", "--config", "seed.yaml"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-2"),
        setup=write("seed.yaml", "seed_everything: -2\n"),
    ),
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
        "net lacks an argument",
        digits("fit", "--model.init_args.net=torch.nn.Linear"),
        ("the following arguments are required", "torch.nn.Linear", "in_features"),
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
    # Schedules and optimizers
    Case(
        "schedule",
        "warmup longer than the run",
        digits("fit", "--model.init_args.scheduler.init_args.warmup_steps=500"),
        ("is not shorter than the run's", "warmup_steps=500", "2 optimizer steps"),
        code=0,
        slow=True,
    ),
    Case(
        "schedule",
        "min_lr_ratio 1.5",
        digits("fit", "--model.init_args.scheduler.init_args.min_lr_ratio=1.5"),
        ("min_lr_ratio must be in [0, 1]", "model.init_args.scheduler", "1.5"),
    ),
    Case(
        "schedule",
        "min_lr_ratio -0.1",
        digits("fit", "--model.init_args.scheduler.init_args.min_lr_ratio=-0.1"),
        ("min_lr_ratio must be in [0, 1]", "model.init_args.scheduler", "-0.1"),
    ),
    Case(
        "schedule",
        "warmup -3",
        digits("fit", "--model.init_args.scheduler.init_args.warmup_steps=-3"),
        ("warmup_steps must be >= 0", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "warmup_start 2",
        digits("fit", "--model.init_args.scheduler.init_args.warmup_start=2"),
        ("warmup_start must be in [0, 1]", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "total_steps 0",
        digits("fit", "--model.init_args.scheduler.init_args.total_steps=0"),
        ("total_steps must be a positive integer or null", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "lr 0",
        digits("fit", "--model.init_args.optimizer.init_args.lr=0"),
        ("it must be positive", "model.init_args.optimizer: the learning rate is 0.0"),
    ),
    Case(
        "schedule",
        "lr negative",
        digits("fit", "--model.init_args.optimizer.init_args.lr=-0.001"),
        ("Invalid learning rate", "model.init_args.optimizer"),
    ),
    Case(
        "schedule",
        "betas out of range",
        digits("fit", "--model.init_args.optimizer.init_args.betas=[0.9,1.5]"),
        ("Invalid beta parameter", "model.init_args.optimizer"),
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
    Case(
        "data",
        "predict_path missing",
        digits("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=nope"),
        ("data.predict_path: no folder at", "nope"),
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
    # Checkpoints
    Case(
        "checkpoint",
        "missing",
        digits("test", "--ckpt_path=runs/none.ckpt"),
        ("no checkpoint file at", "--ckpt_path", "runs/none.ckpt", "'last'"),
    ),
    Case(
        "checkpoint",
        "truncated",
        digits("test", "--ckpt_path=broken.ckpt"),
        ("is not a readable checkpoint", "--ckpt_path: 'broken.ckpt'", "earlier checkpoint"),
        setup=write("broken.ckpt", b"PK\x03\x04 truncated"),
    ),
    Case(
        "checkpoint",
        "a folder",
        digits("test", "--ckpt_path=runs"),
        ("no checkpoint file at", "--ckpt_path", "'runs'"),
    ),
    Case(
        "checkpoint",
        "wrong shapes",
        digits("test", "--ckpt_path=shapes.ckpt"),
        ("does not fit this model", "--ckpt_path: 'shapes.ckpt'", "(3, 3) in the checkpoint", "config.yaml"),
        setup=save("shapes.ckpt", with_wrong_shape),
    ),
    Case(
        "checkpoint",
        "weights missing",
        digits("test", "--ckpt_path=few.ckpt"),
        ("does not fit this model", "--ckpt_path: 'few.ckpt'", "missing from it"),
        setup=save("few.ckpt", lambda c: {**c, "state_dict": {}}),
    ),
    Case(
        "checkpoint",
        "no state_dict",
        digits("test", "--ckpt_path=plain.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'plain.ckpt'"),
        setup=save("plain.ckpt", lambda c: {"epoch": 1}),
    ),
    Case(
        "checkpoint",
        "a list",
        digits("test", "--ckpt_path=list.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'list.ckpt'"),
        setup=save("list.ckpt", lambda c: [c]),
    ),
    Case(
        "checkpoint",
        "hyper_parameters a list",
        digits("test", "--ckpt_path=hp.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'hp.ckpt'"),
        setup=save("hp.ckpt", lambda c: {**c, "hyper_parameters": [1]}),
    ),
    Case(
        "checkpoint",
        "non-finite weights",
        digits("test", "--ckpt_path=nan.ckpt"),
        ("holds non-finite weights", "--ckpt_path: 'nan.ckpt'"),
        setup=save("nan.ckpt", with_nan),
    ),
    Case(
        "checkpoint",
        "another network",
        digits("test", "--ckpt_path={ckpt}", "--model.init_args.net=proj.nets.MLP"),
        ("holds a proj.nets.ConvNet but model.init_args.net is proj.nets.MLP", "config.yaml"),
    ),
    Case("checkpoint", "no ckpt_path", digits("test"), ("without --ckpt_path would use untrained weights",)),
    # Export: the first row refuses before anything is built, the others once the model is.
    Case(
        "export",
        "no checkpoint",
        digits("export"),
        ("`export` without --ckpt_path would use untrained weights", "--ckpt_path last"),
    ),
    Case(
        "export",
        "untrained on purpose",
        digits("export", "--allow_untrained=true"),
        ("`export` needs --ckpt_path",),
        slow=True,
    ),
    Case(
        "export",
        "bare weights",
        digits("export", "--ckpt_path=weights.pt"),
        ("holds bare weights", "--ckpt_path: 'weights.pt'", "checkpoints/"),
        setup=save("weights.pt", lambda c: c["state_dict"]),
    ),
    Case(
        "export",
        "untraceable network",
        digits("export", "--model.init_args.net=probes.BranchingNet", "--ckpt_path=branching.ckpt"),
        ("torch.export cannot trace its forward", "model.init_args.net (probes.BranchingNet)", "torch.cond"),
        setup=save("branching.ckpt", with_net("probes.BranchingNet")),
        slow=True,
    ),
    Case(
        "export",
        "unknown format",
        digits("export", "--ckpt_path={ckpt}", "--formats=onnx,tflite"),
        ("is no export format", "--formats: 'tflite'", "onnx, pt2"),
        slow=True,
    ),
    Case(
        "checkpoint",
        "last of no run",
        ("test", "--config", "{digits}", "--ckpt_path=last", "--trainer.logger.init_args.name=nothing"),
        ("no readable checkpoint under", "--ckpt_path last"),
    ),
    # Code in checkpoints
    Case(
        "unsafe",
        "pickled object",
        digits("test", "--ckpt_path=crafted.ckpt"),
        ("holds pickled objects that `weights_only=True` refuses", "--ckpt_path: 'crafted.ckpt'"),
        setup=save("crafted.ckpt", with_payload),
    ),
    Case(
        "unsafe",
        "hpc with weights_only=false",
        digits("fit", "--ckpt_path=hpc", "--weights_only=false"),
        ("this template loads checkpoints with weights only", "--weights_only=false"),
        setup=hpc_payload,
    ),
    Case(
        "unsafe",
        "hpc",
        digits("fit", "--ckpt_path=hpc"),
        ("holds pickled objects that `weights_only=True` refuses", "hpc_ckpt_1.ckpt'"),
        setup=hpc_payload,
    ),
    Case(
        "unsafe",
        "hpc, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        digits("fit", "--ckpt_path=hpc"),
        ("holds pickled objects that `weights_only=True` refuses", "hpc_ckpt_1.ckpt'"),
        setup=hpc_payload,
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    Case(
        "unsafe",
        "a finder's own checkpoint, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        digits(
            "fit",
            "--trainer.callbacks+=faults.CodeInCheckpoints",
            "--trainer.callbacks+=proj.callbacks.LearningRateFinder",
            "--trainer.callbacks.init_args.num_training_steps=2",
        ),
        ("holds pickled objects that `weights_only=True` refuses", ".lr_find_"),
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    Case(
        "unsafe",
        "init_from with code",
        text("fit", "--model.init_args.init_from=init.ckpt"),
        ("holds pickled objects that `weights_only=True` refuses", "model.init_from: 'init.ckpt'"),
        setup=text_checkpoint(lambda vocab: {"state_dict": {}, "hyper_parameters": {"vocab": Payload()}}),
    ),
    Case(
        "unsafe",
        "best_model_path at a crafted file",
        (
            "fit",
            "--config",
            "{digits}",
            *QUICK,
            "--trainer.max_epochs=2",
            "--trainer.logger.init_args.name=crafted",
            "--ckpt_path=last",
        ),
        ("holds pickled objects that `weights_only=True` refuses", "crafted_best.ckpt'"),
        setup=best_points_at_payload,
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
        slow=True,
        new_run=True,
    ),
    # Where runs write: one folder under runs/, whatever the name
    Case(
        "runs",
        "name with ..",
        digits("fit", "--trainer.logger.init_args.name=../../escape"),
        ("leads out of the runs folder", "trainer.logger.init_args.name='../../escape'"),
    ),
    Case(
        "runs",
        "absolute name",
        digits("fit", "--trainer.logger.init_args.name=/tmp/proj-escape"),
        ("an absolute path leads out of the runs folder", "name='/tmp/proj-escape'"),
    ),
    Case(
        "runs",
        "empty name",
        digits("fit", "--trainer.logger.init_args.name="),
        ("an empty name puts the runs of every experiment in one folder", "name=''"),
    ),
    Case(
        "runs",
        "config named ...yaml",
        ("fit", "--config", "...yaml", *QUICK),
        ("'..' leads out of the runs folder", "(the file name of --config ...yaml)", "Rename the file"),
        setup=lambda workdir, ckpt: shutil.copy(CONFIGS / "digits.yaml", workdir / "...yaml"),
    ),
    Case(
        "runs",
        "version with ..",
        digits("fit", "--trainer.logger.init_args.version=../x"),
        ("leads out of the runs folder", "trainer.logger.init_args.version='../x'"),
    ),
    Case(
        "runs",
        "TensorBoard name with a separator",
        digits(
            "fit",
            "--config",
            str(CONFIGS / "logger" / "tensorboard.yaml"),
            "--trainer.logger.init_args.name=a/b",
        ),
        ("a path separator makes it several folders", "name='a/b'"),
    ),
    Case(
        "runs",
        "W&B project ..",
        digits(
            "fit", "--config", str(CONFIGS / "logger" / "wandb.yaml"), "--trainer.logger.init_args.project=.."
        ),
        ("leads out of the runs folder", "trainer.logger.init_args.project='..'"),
    ),
    Case(
        "runs",
        "experiment folder a link outside",
        digits("fit", "--trainer.logger.init_args.name=elsewhere"),
        ("outside runs/ (a link?)", "runs/elsewhere"),
        setup=lambda workdir, ckpt: (
            (workdir / "outside").mkdir(),
            (workdir / "runs" / "elsewhere").symlink_to(workdir / "outside"),
        ),
    ),
    # YAML that cannot be meant, from files, flags and variables
    Case(
        "yaml",
        "duplicate key",
        digits("fit", "--config", "dup.yaml"),
        ("is given twice", "key 'max_epochs' under 'trainer'", "lines 2 and 3", "--config dup.yaml"),
        setup=write("dup.yaml", "trainer:\n  max_epochs: 3\n  max_epochs: 5\n"),
    ),
    Case(
        "yaml",
        "nested aliases",
        digits("fit", "--config", "bomb.yaml"),
        ("expand to more than 100,000 values", "--config bomb.yaml"),
        setup=write(
            "bomb.yaml",
            "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)),
        ),
    ),
    Case(
        "yaml",
        "duplicate key in a flag",
        digits("fit", "--trainer={{max_epochs: 1, max_epochs: 2}}"),
        ("is given twice", "trainer: cannot read"),
    ),
    Case(
        "yaml",
        "PL_FIT__TRAINER not YAML",
        digits("fit"),
        ("trainer (from PL_FIT__TRAINER): cannot read '{{{' as YAML", "while parsing a flow node"),
        env={"PL_FIT__TRAINER": "{{{"},
    ),
    Case(
        "yaml",
        "a FIFO for a class",
        digits("fit", "--trainer.strategy={dir}/fifo"),
        ("a FIFO, device or socket, not a file", "--trainer.strategy="),
        setup=lambda workdir, ckpt: os.mkfifo(workdir / "fifo"),
    ),
    # Numbers: finite, and integers that fit
    Case(
        "number",
        "lr nan",
        digits("fit", "--model.init_args.optimizer.init_args.lr=nan"),
        ("must be a finite number", "model.init_args.optimizer.init_args.lr='nan'"),
    ),
    Case(
        "number",
        "lr .nan in a config file",
        digits("fit", "--config", "lr.yaml"),
        ("must be a finite number", "model.init_args.optimizer.init_args.lr=nan"),
        setup=write("lr.yaml", "model:\n  init_args:\n    optimizer:\n      init_args:\n        lr: .nan\n"),
    ),
    Case(
        "number",
        "weight_decay inf",
        digits("fit", "--model.init_args.optimizer.init_args.weight_decay=inf"),
        ("must be a finite number", "weight_decay"),
    ),
    Case(
        "number",
        "dropout nan",
        digits("fit", "--model.init_args.net.init_args.dropout=nan"),
        ("must be a finite number", "model.init_args.net.init_args.dropout"),
    ),
    Case(
        "number",
        "gradient_clip_val 1e400",
        digits("fit", "--trainer.gradient_clip_val=1e400"),
        ("must be a finite number", "trainer.gradient_clip_val=inf"),
    ),
    Case(
        "number",
        "val_check_interval .nan",
        digits("fit", "--trainer.val_check_interval=.nan"),
        ("must be a finite number", "trainer.val_check_interval=nan"),
    ),
    Case(
        "number",
        "max_epochs 1e400",
        digits("fit", "--trainer.max_epochs=1e400"),
        ("too large for an integer", "trainer.max_epochs"),
    ),
    Case(
        "number",
        "max_epochs nan",
        digits("fit", "--trainer.max_epochs=nan"),
        ("must be a finite number", "trainer.max_epochs"),
    ),
    # Environment and disk
    Case(
        "environment",
        "misspelt PL_FIT variable",
        digits("fit"),
        ("names no setting of", "PL_FIT__TRAINER__MAX_EPOCS", "PL_FIT__TRAINER__MAX_EPOCHS"),
        env={"PL_FIT__TRAINER__MAX_EPOCS": "3"},
    ),
    Case(
        "environment",
        "misspelt key in a PL_FIT variable's value",
        digits("fit"),
        (
            "does not accept option",
            "data.init_args.batchsize (from PL_FIT__DATA)",
            "Did you mean data.init_args.batch_size?",
        ),
        env={"PL_FIT__DATA": "{class_path: proj.data.DigitsDataModule, init_args: {batchsize: 8}}"},
    ),
    Case(
        "environment",
        "PL_TEST variable for fit's key",
        digits("test", "--ckpt_path={ckpt}"),
        ("names no setting of", "PL_TEST__TRAINER__MAX_EPOCHSS"),
        env={"PL_TEST__TRAINER__MAX_EPOCHSS": "3"},
    ),
    Case(
        "environment",
        "PL_FIT variable of wrong type",
        digits("fit"),
        ("Expected a <class 'int'>", "trainer.max_epochs"),
        env={"PL_FIT__TRAINER__MAX_EPOCHS": "many"},
    ),
    Case(
        "environment",
        "save_dir under a file",
        digits("fit", "--trainer.logger.init_args.save_dir=afile/runs"),
        ("is not a folder", "save_dir: 'afile/runs'"),
        setup=write("afile", "x"),
    ),
    Case(
        "environment",
        "save_dir a file",
        digits("fit", "--trainer.logger.init_args.save_dir=afile"),
        ("is not a folder", "save_dir: 'afile'"),
        setup=write("afile", "x"),
    ),
]


def ids() -> list[str]:
    return [f"{case.kind}: {case.name}" for case in CASES]
