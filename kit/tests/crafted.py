"""Checkpoints of plain strings crafted to make a command delete or write outside its run, and what
the tests compare to find out whether it did: every file of the folder around the run."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch

from projkit.testing import TINY_FIT, fit

RUN = Path("runs/classify/version_0")
CHECKPOINTS = RUN / "checkpoints"
# What a crafted checkpoint aims at: a folder beside runs/ (and one outside the working folder).
VICTIM = Path("victim/folder")
# The state keys of the classify experiment's checkpoint callbacks.
BEST = "ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}"  # noqa: E501
LAST = "LastCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 100, 'every_n_epochs': 0, 'train_time_interval': None}"  # noqa: E501
# The worst score a min-mode checkpoint can have: the resumed run's first validation beats it, and
# Lightning then deletes the k-th best file the state names.
WORST = torch.tensor(1e9)


def base_run(folder: Path) -> Path:
    """A finished one-epoch classify run in ``folder`` (its working folder); returns ``folder``."""
    previous = os.getcwd()
    os.chdir(folder)
    try:
        fit("classify.yaml", extra=(*TINY_FIT, "--test_after_fit=false"))
    finally:
        os.chdir(previous)
    return folder


def working_copy(base: Path, into: Path) -> Path:
    """``base``'s runs/ copied into ``into``/work, with victim folders beside it and beside ``into``;
    returns the working folder."""
    work = into / "work"
    shutil.copytree(base / "runs", work / "runs", symlinks=True)
    for victim in (work / VICTIM, into / "outside" / "folder"):
        victim.mkdir(parents=True)
        (victim / "precious.txt").write_text("keep me\n")
        (victim / "model.ckpt").write_text("not a checkpoint of this run\n")
    return work


def links(work: Path) -> None:
    """Links inside the run's checkpoints/ folder to the victims: a folder and a file."""
    (work / CHECKPOINTS / "linkdir").symlink_to((work / VICTIM).resolve(), target_is_directory=True)
    (work / CHECKPOINTS / "link.ckpt").symlink_to((work / VICTIM / "model.ckpt").resolve())


def everything_but_the_run(root: Path) -> dict[str, str]:
    """Each file under ``root`` outside the run directory, with its content's digest (a link: its
    target): what a command on the run must leave as it was."""
    run = (root / "work" / RUN).resolve()
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = f"-> {os.readlink(path)}"
        elif path.is_file() and run not in path.resolve().parents and path.name != ".lock":
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def aimed_at(path: str) -> dict:
    """The state of the monitoring ModelCheckpoint naming ``path`` as its only, k-th and best file,
    at the worst score: the first better validation deletes it."""
    return {
        "best_k_models": {path: WORST},
        "kth_best_model_path": path,
        "kth_value": WORST,
        "best_model_path": path,
        "best_model_score": WORST,
        "last_model_path": path,
    }


def craft(checkpoint_file: Path, changes: dict[tuple, object]) -> dict:
    """Rewrite ``checkpoint_file`` (plain values only, as `fit` writes it) with each value of
    ``changes`` set at its key path (``("callbacks", BEST, "dirpath")``); returns the new checkpoint."""
    checkpoint = torch.load(checkpoint_file, weights_only=True)
    for keys, value in changes.items():
        holder = checkpoint
        for key in keys[:-1]:
            holder = holder[key]
        holder[keys[-1]] = value
    torch.save(checkpoint, checkpoint_file)
    return checkpoint
