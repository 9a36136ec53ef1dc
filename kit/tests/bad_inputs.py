"""The kit's table of bad input: what a user may type, point at or load, and what the CLI must answer,
whatever the project (its command line and config files, trainer settings, seeds, schedules and
optimizers, checkpoints, export, run names, YAML, numbers, environment variables), run on the
tests' tiny project.

Each row is one command line (after ``python -m tinyproj``) with what it needs written first, the
words its message must hold (the first is the message's key, which kit/docs/errors.md quotes with its
fix) and the exit code. ``test_bad_input.py`` runs every row; a test there checks the FAQ against the
keys. Arguments may hold ``{classify}``, ``{lm}`` (tinyproj's two experiments), ``{ckpt}`` (the
baseline run's last checkpoint) and ``{dir}`` (the working folder).

A project's own modules refuse their own bad input (its networks', data modules' and models'
arguments and files): the project tests those in a table of its own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from conftest import CONFIGS, write_png

# A few optimizer steps and test batches: a row that trains (today or by mistake) ends in seconds.
QUICK = (
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=1",
    "--trainer.enable_progress_bar=false",
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
            "classify": str(CONFIGS / "classify.yaml"),
            "lm": str(CONFIGS / "lm.yaml"),
            "ckpt": str(ckpt),
            "dir": str(workdir),
        }
        return [arg.format(**values) for arg in self.args]


def classify(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    return (subcommand, "--config", "{classify}", *QUICK, *args)


def lm(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    return (subcommand, "--config", "{lm}", *QUICK, *args)


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


def bad_predict_folder(workdir: Path, ckpt: Path) -> None:
    """A folder to predict on (``data.predict_path``) of one good PNG and three bad files beside it:
    a truncated PNG, an empty one and a note saved under an image's name."""
    folder = workdir / "preds"
    write_png(folder / "good.png", np.full((4, 4), 200))
    good = (folder / "good.png").read_bytes()
    (folder / "cut.png").write_bytes(good[: len(good) // 2])
    (folder / "empty.png").write_bytes(b"")
    (folder / "note.png").write_text("remember to label these\n")


def special_predict_folder(workdir: Path, ckpt: Path) -> None:
    """A folder to predict on of one good PNG, a FIFO and a link to nothing."""
    folder = workdir / "preds"
    write_png(folder / "good.png", np.full((4, 4), 200))
    os.mkfifo(folder / "fifo")
    (folder / "gone.png").symlink_to(folder / "nothing.png")


# A sweep config of the classify experiment, as configs/sweeps/ holds one; rows change its text.
SWEEP = """configs: [{classify}]
metric: val/loss
direction: minimize
n_trials: 1
space:
  model.init_args.optimizer.init_args.lr: {{type: float, low: 1.0e-4, high: 1.0e-2, log: true}}
"""
# A tag that runs a command when a loader that builds Python objects reads it.
PAYLOAD_TAG = f"sampler: !!python/object/apply:os.system [touch {MARKER}]\n"
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
)


def sweep(name: str, change: Callable[[str], str | bytes] = str) -> Callable[[Path, Path], None]:
    """The sweep config ``name``, ``change`` applied to ``SWEEP``'s text."""

    def setup(workdir: Path, ckpt: Path) -> None:
        text = change(SWEEP.format(classify=CONFIGS / "classify.yaml"))
        (workdir / name).write_bytes(text if isinstance(text, bytes) else text.encode())

    return setup


def bombed_run(workdir: Path, ckpt: Path) -> None:
    """A copy of the baseline run whose config.yaml ends in nested aliases (a "billion laughs")."""
    run = workdir / "runs" / "bombed" / "version_0"
    shutil.copytree(ckpt.parent.parent, run)
    with open(run / "config.yaml", "a") as file:
        file.write(BOMB)


# Overlays of other loggers, as a project's configs/logger/ holds them.
TENSORBOARD = (
    "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.TensorBoardLogger\n"
    "    init_args:\n      default_hp_metric: false\n"
)
WANDB = (
    "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.WandbLogger\n"
    "    init_args:\n      project: tiny\n      log_model: false\n"
)
GPU = "trainer:\n  accelerator: gpu\n  devices: 1\n"


CASES: list[Case] = [
    # Config files
    Case(
        "config",
        "yaml list",
        classify("fit", "--config", "list.yaml"),
        ("where a config is a mapping of keys", "list.yaml", "list"),
        setup=write("list.yaml", "- a\n- b\n"),
    ),
    Case(
        "config",
        "yaml scalar",
        classify("fit", "--config", "scalar.yaml"),
        ("where a config is a mapping of keys", "scalar.yaml", "str"),
        setup=write("scalar.yaml", "max_epochs\n"),
    ),
    Case(
        "config",
        "empty overlay",
        classify("fit", "--config", "empty.yaml"),
        ("the file is empty (or comments only)", "empty.yaml"),
        setup=write("empty.yaml", ""),
    ),
    Case(
        "config",
        "comments only",
        classify("fit", "--config", "notes.yaml"),
        ("the file is empty (or comments only)", "notes.yaml"),
        setup=write("notes.yaml", "# nothing yet\n"),
    ),
    Case(
        "config",
        "folder as config",
        classify("fit", "--config", "configs_dir"),
        ("is a folder, not a config file", "configs_dir"),
        setup=make_folder("configs_dir"),
    ),
    Case(
        "config",
        "binary config",
        classify("fit", "--config", "bin.yaml"),
        ("not UTF-8 text", "--config bin.yaml"),
        setup=write("bin.yaml", b"\xff\xfe\x00trainer"),
    ),
    Case(
        "config",
        "yaml syntax",
        classify("fit", "--config", "broken.yaml"),
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
        classify("fit", "--config", "mine.yaml"),
        ("does not accept option", "max_epocs", "Did you mean trainer.max_epochs?"),
        setup=write("mine.yaml", "trainer:\n  max_epocs: 3\n"),
    ),
    Case(
        "config",
        "misspelt key of a class in a flag",
        classify("fit", "--data.init_args.batchsize=8"),
        (
            "does not accept option",
            "data.init_args.batchsize: tinyproj.data.Blobs",
            "Did you mean data.init_args.batch_size?",
        ),
    ),
    Case(
        "config",
        "misspelt key deep in a file",
        classify("test", "--config", "deep.yaml"),
        ("does not accept option", "Did you mean model.init_args.net.init_args.hidden?"),
        setup=write("deep.yaml", "model:\n  init_args:\n    net:\n      init_args:\n        hiden: 8\n"),
    ),
    Case(
        "config",
        "misspelt key of a listed callback",
        classify("fit", "--config", "callbacks.yaml"),
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
        classify("fit", "--config", "top.yaml"),
        ("does not accept option", "colour"),
        setup=write("top.yaml", "colour: red\n"),
    ),
    Case(
        "config",
        "overlay for another experiment",
        lm("fit", "--config", "image_data.yaml"),
        (
            "from its data module, which",
            "tinyproj.models.LanguageModel needs vocab, vocab_size",
            "tinyproj.data.Blobs",
        ),
        setup=write("image_data.yaml", "data:\n  class_path: tinyproj.data.Blobs\n"),
    ),
    Case(
        "config",
        "misspelt flag",
        classify("fit", "--trainer.max_epocs=3"),
        ("unrecognized arguments", "max_epocs", "Did you mean --trainer.max_epochs?"),
    ),
    Case(
        "config",
        "wrong type",
        classify("fit", "--data.batch_size=lots"),
        ("Expected a <class 'int'>", "lots"),
    ),
    Case(
        "config",
        "unknown class path",
        classify("fit", "--model.net=tinyproj.nets.NoSuchNet"),
        ("has no attribute", "NoSuchNet"),
    ),
    # Trainer numbers
    Case(
        "trainer",
        "accumulate 0",
        classify("fit", "--trainer.accumulate_grad_batches=0"),
        ("must be a positive integer", "trainer.accumulate_grad_batches=0"),
    ),
    Case(
        "trainer",
        "accumulate -2",
        classify("fit", "--trainer.accumulate_grad_batches=-2"),
        ("must be a positive integer", "trainer.accumulate_grad_batches=-2"),
    ),
    Case(
        "trainer",
        "max_epochs -3",
        classify("fit", "--trainer.max_epochs=-3"),
        ("Lightning refused it", "trainer.max_epochs", "must be a non-negative integer or -1", "-3"),
    ),
    Case(
        "trainer",
        "max_steps -5",
        classify("fit", "--trainer.max_steps=-5"),
        ("Lightning refused it", "trainer.max_steps", "must be a non-negative integer or -1", "-5"),
    ),
    Case(
        "trainer",
        "min_epochs above max_epochs",
        classify("fit", "--trainer.min_epochs=5", "--trainer.max_epochs=2"),
        ("the run would stop there regardless", "trainer.min_epochs=5", "trainer.max_epochs=2"),
    ),
    Case(
        "trainer",
        "min_steps above max_steps",
        classify("fit", "--trainer.min_steps=10", "--trainer.max_steps=5"),
        ("the run would stop there regardless", "trainer.min_steps=10", "trainer.max_steps=5"),
    ),
    Case(
        "trainer",
        "devices 0",
        classify("fit", "--trainer.devices=0"),
        ("must be a positive count, -1 or auto", "trainer.devices=0"),
    ),
    Case(
        "trainer",
        "devices -3",
        classify("fit", "--trainer.devices=-3"),
        ("must be a positive count, -1 or auto", "trainer.devices=-3"),
    ),
    Case(
        "trainer",
        "max_steps 0",
        classify("fit", "--trainer.max_steps=0"),
        ("`fit` would train nothing", "trainer.max_steps=0"),
    ),
    Case(
        "trainer",
        "max_epochs 0",
        classify("fit", "--trainer.max_epochs=0"),
        ("`fit` would train nothing", "trainer.max_epochs=0"),
    ),
    Case(
        "trainer",
        "limit_train_batches 0",
        classify("fit", "--trainer.limit_train_batches=0"),
        ("`fit` would train nothing", "trainer.limit_train_batches=0"),
    ),
    Case(
        "trainer",
        "limit_train_batches 0.0, no test",
        classify("fit", "--trainer.limit_train_batches=0.0", "--test_after_fit=false"),
        ("`fit` would train nothing", "trainer.limit_train_batches=0.0"),
    ),
    Case(
        "trainer",
        "limit_val_batches -1",
        classify("fit", "--trainer.limit_val_batches=-1"),
        ("Lightning refused it", "trainer.limit_val_batches", "it has to be in [0.0, 1.0] or an int", "-1"),
    ),
    Case(
        "trainer",
        "limit_test_batches 1.5",
        classify("fit", "--trainer.limit_test_batches=1.5"),
        ("Lightning refused it", "trainer.limit_test_batches", "it has to be in [0.0, 1.0] or an int", "1.5"),
    ),
    Case(
        "trainer",
        "val_check_interval 0",
        classify("fit", "--trainer.val_check_interval=0"),
        ("must be a positive count of batches or fraction", "trainer.val_check_interval=0"),
    ),
    Case(
        "trainer",
        "val_check_interval above an epoch",
        classify("fit", "--trainer.val_check_interval=10000"),
        ("Lightning refused it", "trainer.val_check_interval:", "(10000) must be less than or equal"),
    ),
    Case(
        "trainer",
        "early stopping on a misspelt metric",
        classify("fit", "--early_stopping.monitor=val/los"),
        ("logs no metric of that name", "early_stopping.init_args.monitor=val/los", "Did you mean val/loss?"),
    ),
    Case(
        "trainer",
        "checkpoint on a metric spelt the other way",
        classify("fit", "--checkpoint.monitor=val_acc"),
        ("logs no metric of that name", "checkpoint.init_args.monitor=val_acc", "Did you mean val/acc?"),
    ),
    Case(
        "trainer",
        "a plateau schedule on a metric not logged",
        lm(
            "fit",
            "--model.init_args.scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau",
            "--model.init_args.scheduler_monitor=val/perplexity",
        ),
        ("logs no metric of that name", "model.init_args.scheduler_monitor=val/perplexity", "val/loss"),
    ),
    Case(
        "trainer",
        "a listed checkpoint on a misspelt metric",
        classify("fit", "--config", "extra.yaml"),
        (
            "logs no metric of that name",
            "trainer.callbacks[0] (ModelCheckpoint).monitor=val/f",
            "val/acc_best",
        ),
        setup=write(
            "extra.yaml",
            "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
            "      init_args: {monitor: val/f, mode: max}\n",
        ),
    ),
    Case(
        "trainer",
        "check_val_every_n_epoch 0",
        classify("fit", "--trainer.check_val_every_n_epoch=0"),
        ("must be a positive integer or null", "trainer.check_val_every_n_epoch=0"),
    ),
    Case(
        "trainer",
        "log_every_n_steps -1",
        classify("fit", "--trainer.log_every_n_steps=-1"),
        ("must be 0 or more", "trainer.log_every_n_steps=-1"),
    ),
    Case(
        "trainer",
        "negative clip",
        classify("fit", "--trainer.gradient_clip_val=-1"),
        ("must be 0 or more (a negative norm", "trainer.gradient_clip_val=-1"),
    ),
    Case(
        "trainer",
        "a CSV logger flushed every 0 steps",
        classify("fit", "--trainer.logger.init_args.flush_logs_every_n_steps=0"),
        ("must be a positive number of steps", "trainer.logger.init_args.flush_logs_every_n_steps=0"),
    ),
    Case(
        "trainer",
        "gpu without one",
        classify("fit", "--config", "gpu.yaml"),
        ("but no CUDA GPU is visible", "trainer.accelerator=gpu", "cpu.yaml"),
        setup=write("gpu.yaml", GPU),
        cpu_only=True,
    ),
    # Seeds
    Case(
        "seed",
        "seed -1",
        classify("fit", "--seed_everything=-1"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-1"),
    ),
    Case(
        "seed",
        "seed 2**32",
        classify("fit", "--seed_everything=4294967296"),
        ("must be an integer from 0 to 4294967295", "seed_everything=4294967296"),
    ),
    Case(
        "seed",
        "seed 2**40",
        classify("fit", "--seed_everything=1099511627776"),
        ("must be an integer from 0 to 4294967295", "seed_everything=1099511627776"),
    ),
    Case(
        "seed",
        "seed from env",
        classify("fit"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-7"),
        env={"PL_FIT__SEED_EVERYTHING": "-7"},
    ),
    Case(
        "seed",
        "seed in a config file",
        classify("fit", "--config", "seed.yaml"),
        ("must be an integer from 0 to 4294967295", "seed_everything=-2"),
        setup=write("seed.yaml", "seed_everything: -2\n"),
    ),
    # Networks: a class that refuses its arguments, or that lacks some
    Case(
        "network",
        "constructor raises (a check of its own)",
        classify("fit", "--model.init_args.net.init_args.hidden=0"),
        ("model.init_args.net (", "tinyproj.nets.MLP", "net.hidden must be a positive width"),
    ),
    Case(
        "network",
        "constructor raises (torch's dropout)",
        classify("fit", "--model.init_args.net.init_args.dropout=1.5"),
        ("model.init_args.net (", "tinyproj.nets.MLP", "dropout probability has to be between 0 and 1"),
    ),
    Case(
        "network",
        "net lacks an argument",
        classify("fit", "--model.init_args.net=torch.nn.Linear"),
        ("the following arguments are required", "torch.nn.Linear", "in_features"),
    ),
    # Schedules and optimizers
    Case(
        "schedule",
        "warmup longer than the run",
        classify("fit", "--model.init_args.scheduler.init_args.warmup_steps=500"),
        ("is not shorter than the run's", "warmup_steps=500", "2 optimizer steps"),
        code=0,
        slow=True,
    ),
    Case(
        "schedule",
        "min_lr_ratio 1.5",
        classify("fit", "--model.init_args.scheduler.init_args.min_lr_ratio=1.5"),
        ("min_lr_ratio must be in [0, 1]", "model.init_args.scheduler", "1.5"),
    ),
    Case(
        "schedule",
        "min_lr_ratio -0.1",
        classify("fit", "--model.init_args.scheduler.init_args.min_lr_ratio=-0.1"),
        ("min_lr_ratio must be in [0, 1]", "model.init_args.scheduler", "-0.1"),
    ),
    Case(
        "schedule",
        "warmup -3",
        classify("fit", "--model.init_args.scheduler.init_args.warmup_steps=-3"),
        ("warmup_steps must be >= 0", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "warmup_start 2",
        classify("fit", "--model.init_args.scheduler.init_args.warmup_start=2"),
        ("warmup_start must be in [0, 1]", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "total_steps 0",
        classify("fit", "--model.init_args.scheduler.init_args.total_steps=0"),
        ("total_steps must be a positive integer or null", "model.init_args.scheduler"),
    ),
    Case(
        "schedule",
        "lr 0",
        classify("fit", "--model.init_args.optimizer.init_args.lr=0"),
        ("it must be positive", "model.init_args.optimizer: the learning rate is 0.0"),
    ),
    Case(
        "schedule",
        "lr negative",
        classify("fit", "--model.init_args.optimizer.init_args.lr=-0.001"),
        ("Invalid learning rate", "model.init_args.optimizer"),
    ),
    Case(
        "schedule",
        "betas out of range",
        classify("fit", "--model.init_args.optimizer.init_args.betas=[0.9,1.5]"),
        ("Invalid beta parameter", "model.init_args.optimizer"),
    ),
    # Data: the kit's checks of loader settings and of the image files to predict on
    Case(
        "data",
        "predict_path missing",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=nope"),
        ("data.predict_path: no folder at", "nope"),
    ),
    Case(
        "data",
        "predict_path of no files",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=preds"),
        ("holds no files", "data.predict_path: 'preds'", "(subfolders are not searched)"),
        setup=make_folder("preds/sub"),
    ),
    Case(
        "data",
        "predict_path with unreadable files",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=preds"),
        (
            "cannot be read as images",
            "data.predict_path: 3 file(s) under 'preds'",
            "'cut.png' is truncated",
            "'empty.png' is empty (0 bytes)",
            "'note.png' is a text file, not an image",
        ),
        setup=bad_predict_folder,
    ),
    Case(
        "data",
        "predict_path with a FIFO and a broken link",
        classify("predict", "--ckpt_path={ckpt}", "--data.init_args.predict_path=preds"),
        (
            "cannot be read as images",
            "data.predict_path: 2 file(s) under 'preds'",
            "'fifo' is not a regular file",
            "'gone.png' is a link to nothing",
        ),
        setup=special_predict_folder,
    ),
    Case(
        "data",
        "a network too large for any machine",
        classify("fit", "--model.init_args.net.init_args.hidden=10000000000000"),
        ("GB of memory, more than this machine can give", "model.init_args.net (tinyproj.nets.MLP): build"),
    ),
    Case(
        "data",
        "batch_size 0",
        classify("fit", "--data.init_args.batch_size=0"),
        ("must be a positive integer", "data.batch_size"),
    ),
    Case(
        "data",
        "num_workers -1",
        classify("fit", "--data.init_args.num_workers=-1"),
        ("must be >= 0", "data.num_workers"),
    ),
    Case(
        "data",
        "train_fraction 1",
        lm("fit", "--data.init_args.train_fraction=1"),
        ("must be in (0, 1)", "data.train_fraction"),
    ),
    # Checkpoints
    Case(
        "checkpoint",
        "missing",
        classify("test", "--ckpt_path=runs/none.ckpt"),
        ("no checkpoint file at", "--ckpt_path", "runs/none.ckpt", "'last'"),
    ),
    Case(
        "checkpoint",
        "truncated",
        classify("test", "--ckpt_path=broken.ckpt"),
        ("is not a readable checkpoint", "--ckpt_path: 'broken.ckpt'", "earlier checkpoint"),
        setup=write("broken.ckpt", b"PK\x03\x04 truncated"),
    ),
    Case(
        "checkpoint",
        "a folder",
        classify("test", "--ckpt_path=runs"),
        ("no checkpoint file at", "--ckpt_path", "'runs'"),
    ),
    Case(
        "checkpoint",
        "wrong shapes",
        classify("test", "--ckpt_path=shapes.ckpt"),
        ("does not fit this model", "--ckpt_path: 'shapes.ckpt'", "(3, 3) in the checkpoint", "config.yaml"),
        setup=save("shapes.ckpt", with_wrong_shape),
    ),
    Case(
        "checkpoint",
        "weights missing",
        classify("test", "--ckpt_path=few.ckpt"),
        ("does not fit this model", "--ckpt_path: 'few.ckpt'", "missing from it"),
        setup=save("few.ckpt", lambda c: {**c, "state_dict": {}}),
    ),
    Case(
        "checkpoint",
        "no state_dict",
        classify("test", "--ckpt_path=plain.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'plain.ckpt'"),
        setup=save("plain.ckpt", lambda c: {"epoch": 1}),
    ),
    Case(
        "checkpoint",
        "a list",
        classify("test", "--ckpt_path=list.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'list.ckpt'"),
        setup=save("list.ckpt", lambda c: [c]),
    ),
    Case(
        "checkpoint",
        "hyper_parameters a list",
        classify("test", "--ckpt_path=hp.ckpt"),
        ("holds no state_dict", "--ckpt_path: 'hp.ckpt'"),
        setup=save("hp.ckpt", lambda c: {**c, "hyper_parameters": [1]}),
    ),
    Case(
        "checkpoint",
        "non-finite weights",
        classify("test", "--ckpt_path=nan.ckpt"),
        ("holds non-finite weights", "--ckpt_path: 'nan.ckpt'"),
        setup=save("nan.ckpt", with_nan),
    ),
    Case(
        "checkpoint",
        "another network",
        classify("test", "--ckpt_path={ckpt}", "--model.init_args.net=probes.BranchingNet"),
        (
            "but model.init_args.net is",
            "holds a tinyproj.nets.MLP but model.init_args.net is probes.BranchingNet",
            "config.yaml",
        ),
    ),
    Case(
        "checkpoint", "no ckpt_path", classify("test"), ("without --ckpt_path would use untrained weights",)
    ),
    # Export: the first row refuses before anything is built, the others once the model is.
    Case(
        "export",
        "no checkpoint",
        classify("export"),
        ("`export` without --ckpt_path would use untrained weights", "--ckpt_path last"),
    ),
    Case(
        "export",
        "untrained on purpose",
        classify("export", "--allow_untrained=true"),
        ("`export` needs --ckpt_path",),
        slow=True,
    ),
    Case(
        "export",
        "bare weights",
        classify("export", "--ckpt_path=weights.pt"),
        ("holds bare weights", "--ckpt_path: 'weights.pt'", "checkpoints/"),
        setup=save("weights.pt", lambda c: c["state_dict"]),
    ),
    Case(
        "export",
        "untraceable network",
        classify("export", "--model.init_args.net=probes.BranchingNet", "--ckpt_path=branching.ckpt"),
        ("torch.export cannot trace its forward", "model.init_args.net (probes.BranchingNet)", "torch.cond"),
        setup=save("branching.ckpt", with_net("probes.BranchingNet")),
        slow=True,
    ),
    Case(
        "export",
        "unknown format",
        classify("export", "--ckpt_path={ckpt}", "--formats=onnx,tflite"),
        ("is no export format", "--formats: 'tflite'", "onnx, pt2"),
        slow=True,
    ),
    Case(
        "checkpoint",
        "last of no run",
        ("test", "--config", "{classify}", "--ckpt_path=last", "--trainer.logger.init_args.name=nothing"),
        ("no readable checkpoint under", "--ckpt_path last"),
    ),
    # Code in checkpoints
    Case(
        "unsafe",
        "pickled object",
        classify("test", "--ckpt_path=crafted.ckpt"),
        ("holds pickled objects that `weights_only=True` refuses", "--ckpt_path: 'crafted.ckpt'"),
        setup=save("crafted.ckpt", with_payload),
    ),
    Case(
        "unsafe",
        "hpc with weights_only=false",
        classify("fit", "--ckpt_path=hpc", "--weights_only=false"),
        ("this template loads checkpoints with weights only", "--weights_only=false"),
        setup=hpc_payload,
    ),
    Case(
        "unsafe",
        "hpc",
        classify("fit", "--ckpt_path=hpc"),
        ("holds pickled objects that `weights_only=True` refuses", "hpc_ckpt_1.ckpt'"),
        setup=hpc_payload,
    ),
    Case(
        "unsafe",
        "hpc, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        classify("fit", "--ckpt_path=hpc"),
        ("holds pickled objects that `weights_only=True` refuses", "hpc_ckpt_1.ckpt'"),
        setup=hpc_payload,
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    Case(
        "unsafe",
        "a finder's own checkpoint, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        classify(
            "fit",
            "--trainer.callbacks+=faults.CodeInCheckpoints",
            "--trainer.callbacks+=projkit.callbacks.LearningRateFinder",
            "--trainer.callbacks.init_args.num_training_steps=2",
        ),
        ("holds pickled objects that `weights_only=True` refuses", ".lr_find_"),
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    Case(
        "unsafe",
        "best_model_path at a crafted file",
        (
            "fit",
            "--config",
            "{classify}",
            *QUICK,
            "--trainer.max_epochs=2",
            "--trainer.logger.init_args.name=crafted",
            "--ckpt_path=last",
        ),
        # The crafted file is outside the run's checkpoints/: dropped from the state, never loaded.
        ("The checkpoint's state of ModelCheckpoint", "crafted_best.ckpt'", "dropped"),
        code=0,
        setup=best_points_at_payload,
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
        slow=True,
        new_run=True,
    ),
    # Where runs write: one folder under runs/, whatever the name
    Case(
        "runs",
        "name with ..",
        classify("fit", "--trainer.logger.init_args.name=../../escape"),
        ("leads out of the runs folder", "trainer.logger.init_args.name='../../escape'"),
    ),
    Case(
        "runs",
        "absolute name",
        classify("fit", "--trainer.logger.init_args.name=/tmp/tiny-escape"),
        ("an absolute path leads out of the runs folder", "name='/tmp/tiny-escape'"),
    ),
    Case(
        "runs",
        "empty name",
        classify("fit", "--trainer.logger.init_args.name="),
        ("an empty name puts the runs of every experiment in one folder", "name=''"),
    ),
    Case(
        "runs",
        "config named ...yaml",
        ("fit", "--config", "...yaml", *QUICK),
        ("'..' leads out of the runs folder", "(the file name of --config ...yaml)", "Rename the file"),
        setup=lambda workdir, ckpt: shutil.copy(CONFIGS / "classify.yaml", workdir / "...yaml"),
    ),
    Case(
        "runs",
        "version with ..",
        classify("fit", "--trainer.logger.init_args.version=../x"),
        ("leads out of the runs folder", "trainer.logger.init_args.version='../x'"),
    ),
    Case(
        "runs",
        "TensorBoard name with a separator",
        classify("fit", "--config", "tensorboard.yaml", "--trainer.logger.init_args.name=a/b"),
        ("a path separator makes it several folders", "name='a/b'"),
        setup=write("tensorboard.yaml", TENSORBOARD),
    ),
    Case(
        "runs",
        "W&B project ..",
        classify("fit", "--config", "wandb.yaml", "--trainer.logger.init_args.project=.."),
        ("leads out of the runs folder", "trainer.logger.init_args.project='..'"),
        setup=write("wandb.yaml", WANDB),
    ),
    Case(
        "runs",
        "a checkpoint file name that leads out",
        classify("fit", "--checkpoint.init_args.filename=../../x"),
        ("filename='../../x': '..' leads out of the runs folder", "The checkpoints are written in the run's"),
    ),
    Case(
        "runs",
        "a checkpoint folder outside runs/",
        classify("fit", "--last_checkpoint.init_args.dirpath={dir}/elsewhere"),
        ("where the run's checkpoints belong", "last_checkpoint.init_args.dirpath=", "outside runs/"),
    ),
    Case(
        "runs",
        "a zero-width space in the run's name",
        classify("fit", "--trainer.logger.init_args.name=digits\u200b"),
        ("holds an invisible or control character", "(U+200B ZERO WIDTH SPACE)", "init_args.name="),
    ),
    Case(
        "runs",
        "a newline in the run's version",
        classify("fit", "--trainer.logger.init_args.version=v\n1"),
        ("holds an invisible or control character", "(U+000A", "trainer.logger.init_args.version="),
    ),
    Case(
        "runs",
        "a name too long for a file name",
        classify("fit", "--trainer.logger.init_args.name=" + "n" * 300),
        ("more than a file name may be (255)", "it is 300 bytes long"),
    ),
    Case(
        "runs",
        "experiment folder a link outside",
        classify("fit", "--trainer.logger.init_args.name=elsewhere"),
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
        classify("fit", "--config", "dup.yaml"),
        ("is given twice", "key 'max_epochs' under 'trainer'", "lines 2 and 3", "--config dup.yaml"),
        setup=write("dup.yaml", "trainer:\n  max_epochs: 3\n  max_epochs: 5\n"),
    ),
    Case(
        "yaml",
        "nested aliases",
        classify("fit", "--config", "bomb.yaml"),
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
        classify("fit", "--trainer={{max_epochs: 1, max_epochs: 2}}"),
        ("is given twice", "trainer: cannot read"),
    ),
    Case(
        "yaml",
        "PL_FIT__TRAINER not YAML",
        classify("fit"),
        ("trainer (from PL_FIT__TRAINER): cannot read '{{{' as YAML", "while parsing a flow node"),
        env={"PL_FIT__TRAINER": "{{{"},
    ),
    Case(
        "yaml",
        "a FIFO for a class",
        classify("fit", "--trainer.strategy={dir}/fifo"),
        ("a FIFO, device or socket, not a file", "--trainer.strategy="),
        setup=lambda workdir, ckpt: os.mkfifo(workdir / "fifo"),
    ),
    Case(
        "yaml",
        "nested aliases in a resumed run's config.yaml",
        classify(
            "fit", "--trainer.max_epochs=2", "--trainer.logger.init_args.name=bombed", "--ckpt_path=last"
        ),
        ("cannot be read (UnsafeYAML)", "config.yaml cannot be read", "Resuming runs/bombed/version_0"),
        code=0,
        setup=bombed_run,
        slow=True,
        new_run=True,
    ),
    # Sweep configs: read as strictly as configs, their storage refused in one line
    Case(
        "sweep",
        "a tab in a sweep config",
        ("sweep", "--config", "tab.yaml"),
        ("not valid YAML at line", "tab.yaml: not valid YAML at line 6", "not tabs"),
        setup=sweep("tab.yaml", lambda text: text.replace("\n  model.", "\n\tmodel.")),
    ),
    Case(
        "sweep",
        "a !!python tag in a sweep config",
        ("sweep", "--config", "tag.yaml"),
        ("asks for an object", "tag.yaml: line 7", "!!python/object/apply:os.system"),
        setup=sweep("tag.yaml", lambda text: text + PAYLOAD_TAG),
    ),
    Case(
        "sweep",
        "a Latin-1 byte in a sweep config",
        ("sweep", "--config", "latin.yaml"),
        ("not UTF-8 text", "latin.yaml", "Save it as UTF-8"),
        setup=sweep("latin.yaml", lambda text: f"# tuned by Andr\xe9\n{text}".encode("latin-1")),
    ),
    Case(
        "sweep",
        "a nan bound",
        ("sweep", "--config", "nan.yaml"),
        ("must be a finite number", "space.model.init_args.optimizer.init_args.lr: `low`", "nan"),
        setup=sweep("nan.yaml", lambda text: text.replace("low: 1.0e-4", "low: .nan")),
    ),
    Case(
        "sweep",
        "an infinite bound",
        ("sweep", "--config", "inf.yaml"),
        ("must be a finite number", "space.model.init_args.optimizer.init_args.lr: `high`", "inf"),
        setup=sweep("inf.yaml", lambda text: text.replace("high: 1.0e-2", "high: .inf")),
    ),
    Case(
        "sweep",
        "a key given twice in a sweep config",
        ("sweep", "--config", "twice.yaml"),
        ("is given twice", "twice.yaml: key 'metric'", "lines 2 and 7"),
        setup=sweep("twice.yaml", lambda text: f"{text}metric: val/acc\n"),
    ),
    Case(
        "sweep",
        "nested aliases in a sweep config",
        ("sweep", "--config", "bomb.yaml"),
        ("expand to more than 100,000 values", "bomb.yaml"),
        setup=sweep("bomb.yaml", lambda text: text + BOMB),
    ),
    Case(
        "sweep",
        "an SQLite study in memory",
        ("sweep", "--config", "mem.yaml", "--storage", "sqlite:///:memory:"),
        ("an SQLite database in memory lives in this worker alone", "--storage sqlite:///:memory:"),
        setup=sweep("mem.yaml"),
    ),
    Case(
        "sweep",
        "a database driver that is not installed",
        ("sweep", "--config", "driver.yaml", "--storage", "mysql+mysqldb://user@127.0.0.1/db"),
        ("its database driver, the Python package 'MySQLdb', is not installed", "uv add mysqlclient"),
        setup=sweep("driver.yaml"),
    ),
    # Numbers: finite, and integers that fit
    Case(
        "number",
        "lr nan",
        classify("fit", "--model.init_args.optimizer.init_args.lr=nan"),
        ("must be a finite number", "model.init_args.optimizer.init_args.lr='nan'"),
    ),
    Case(
        "number",
        "lr .nan in a config file",
        classify("fit", "--config", "lr.yaml"),
        ("must be a finite number", "model.init_args.optimizer.init_args.lr=nan"),
        setup=write("lr.yaml", "model:\n  init_args:\n    optimizer:\n      init_args:\n        lr: .nan\n"),
    ),
    Case(
        "number",
        "weight_decay inf",
        classify("fit", "--model.init_args.optimizer.init_args.weight_decay=inf"),
        ("must be a finite number", "weight_decay"),
    ),
    Case(
        "number",
        "dropout nan",
        classify("fit", "--model.init_args.net.init_args.dropout=nan"),
        ("must be a finite number", "model.init_args.net.init_args.dropout"),
    ),
    Case(
        "number",
        "gradient_clip_val 1e400",
        classify("fit", "--trainer.gradient_clip_val=1e400"),
        ("must be a finite number", "trainer.gradient_clip_val=inf"),
    ),
    Case(
        "number",
        "val_check_interval .nan",
        classify("fit", "--trainer.val_check_interval=.nan"),
        ("must be a finite number", "trainer.val_check_interval=nan"),
    ),
    Case(
        "number",
        "max_epochs 1e400",
        classify("fit", "--trainer.max_epochs=1e400"),
        ("too large for an integer", "trainer.max_epochs"),
    ),
    Case(
        "number",
        "batch_size beyond 64 bits",
        classify("fit", "--data.init_args.batch_size=99999999999999999999"),
        ("too large for a 64-bit integer", "data.init_args.batch_size=99999999999999999999"),
    ),
    Case(
        "number",
        "max_epochs nan",
        classify("fit", "--trainer.max_epochs=nan"),
        ("must be a finite number", "trainer.max_epochs"),
    ),
    # Environment and disk
    Case(
        "environment",
        "misspelt PL_FIT variable",
        classify("fit"),
        ("names no setting of", "PL_FIT__TRAINER__MAX_EPOCS", "PL_FIT__TRAINER__MAX_EPOCHS"),
        env={"PL_FIT__TRAINER__MAX_EPOCS": "3"},
    ),
    Case(
        "environment",
        "misspelt key in a PL_FIT variable's value",
        classify("fit"),
        (
            "does not accept option",
            "data.init_args.batchsize (from PL_FIT__DATA)",
            "Did you mean data.init_args.batch_size?",
        ),
        env={"PL_FIT__DATA": "{class_path: tinyproj.data.Blobs, init_args: {batchsize: 8}}"},
    ),
    Case(
        "environment",
        "PL_TEST variable for fit's key",
        classify("test", "--ckpt_path={ckpt}"),
        ("names no setting of", "PL_TEST__TRAINER__MAX_EPOCHSS"),
        env={"PL_TEST__TRAINER__MAX_EPOCHSS": "3"},
    ),
    Case(
        "environment",
        "PL_FIT variable of wrong type",
        classify("fit"),
        ("Expected a <class 'int'>", "trainer.max_epochs"),
        env={"PL_FIT__TRAINER__MAX_EPOCHS": "many"},
    ),
    Case(
        "environment",
        "a lower-case PL_FIT variable",
        classify("fit"),
        (
            "the CLI reads only upper-case names",
            "environment variable pl_fit__trainer__max_epochs",
            "PL_FIT__TRAINER__MAX_EPOCHS",
        ),
        env={"pl_fit__trainer__max_epochs": "3"},
    ),
    Case(
        "environment",
        "a config file in PL_FIT__CONFIG",
        classify("fit"),
        ("config files are given with --config", "PL_FIT__CONFIG=two.yaml", "--config two.yaml"),
        setup=write("two.yaml", "trainer:\n  max_epochs: 2\n"),
        env={"PL_FIT__CONFIG": "two.yaml"},
    ),
    Case(
        "environment",
        "save_dir under a file",
        classify("fit", "--trainer.logger.init_args.save_dir=afile/runs"),
        ("is not a folder", "save_dir: 'afile/runs'"),
        setup=write("afile", "x"),
    ),
    Case(
        "environment",
        "save_dir a file",
        classify("fit", "--trainer.logger.init_args.save_dir=afile"),
        ("is not a folder", "save_dir: 'afile'"),
        setup=write("afile", "x"),
    ),
]


def ids() -> list[str]:
    return [f"{case.kind}: {case.name}" for case in CASES]
