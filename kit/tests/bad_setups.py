"""What the rows of the kit's bad-input table (bad_inputs.py) are made of: the command lines of
tinyproj's two experiments, and the files, folders and checkpoints a row writes before it runs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from conftest import CONFIGS
from projkit.testing import write_png
from projkit.testing.bad_input import MARKER, QUICK, Payload

# The placeholders of the rows' arguments: tinyproj's two experiments.
VALUES = {"classify": str(CONFIGS / "classify.yaml"), "lm": str(CONFIGS / "lm.yaml")}


def classify(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    """A row's command on tinyproj's image experiment, a few steps long."""
    return (subcommand, "--config", "{classify}", *QUICK, *args)


def lm(subcommand: str = "fit", *args: str) -> tuple[str, ...]:
    """A row's command on tinyproj's text experiment, a few steps long."""
    return (subcommand, "--config", "{lm}", *QUICK, *args)


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
