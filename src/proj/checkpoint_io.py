"""Checkpoint writing that never leaves a truncated file behind, and loading that never runs code."""

from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from proj.preflight import ConfigError


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a checkpoint to a temporary file beside the target, fsyncs it, then renames it over
    the target in one step.

    A process killed mid-save leaves the previous checkpoint intact and at worst a stray temporary
    file. The temporary file sits in the same folder, never in ``$TMPDIR``: a rename is only atomic
    within one filesystem.

    Every checkpoint Lightning loads through it (``--ckpt_path`` including ``hpc``, the best
    checkpoint ``test_after_fit`` follows, the tuners' own) is read with ``weights_only=True``
    whatever asks otherwise (``--weights_only=false``, ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``), so a
    crafted file cannot run code: this template's checkpoints hold plain values only.
    """

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            raise ConfigError(
                f"checkpoint '{path}' holds pickled objects that `weights_only=True` refuses to load, so "
                f"it was not loaded ({str(error).splitlines()[0]}). Use a checkpoint written by this "
                "template, whose hyperparameters are plain values."
            ) from None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as f:
                try:
                    torch.save(checkpoint, f)
                except RuntimeError as error:  # torch's zip writer on a full disk: "unexpected pos"
                    if not any(sign in str(error) for sign in ("unexpected pos", "failed writing")):
                        raise
                    first = str(error).splitlines()[0]
                    raise OSError(errno.ENOSPC, f"no space left ({first})", str(target)) from error
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
