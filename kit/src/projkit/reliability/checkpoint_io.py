"""Checkpoints written without ever leaving a truncated file behind, and read without ever running
code they might carry."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.strategies import Strategy


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a checkpoint to a temporary file beside the target, fsyncs it, then renames it over
    the target in one step.

    A process killed mid-save leaves the previous checkpoint intact and at worst a stray temporary
    file. The temporary file sits in the same folder, never in ``$TMPDIR``: a rename is only atomic
    within one filesystem.
    """

    def load_checkpoint(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        # The CLI passes Lightning's `weights_only=True` to fit/validate/test/predict; Lightning's
        # finders restore their own checkpoint without it, which TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
        # would then read with full unpickling.
        return super().load_checkpoint(path, **{**kwargs, "weights_only": True})

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            try:
                with open(temporary, "wb") as f:
                    torch.save(checkpoint, f)
                    f.flush()
                    os.fsync(f.fileno())
            except RuntimeError as error:  # torch's zip writer on a full disk: "unexpected pos"
                if not any(sign in str(error) for sign in ("unexpected pos", "failed writing")):
                    raise
                first = str(error).splitlines()[0]
                raise OSError(errno.ENOSPC, f"no space left ({first})", str(target)) from error
            except OSError as error:
                # A checkpoint small enough for the file's buffer meets a full disk in flush() or
                # close(), whose error names no file: named here, as the one that could not be written.
                if error.filename is not None:
                    raise
                raise OSError(error.errno, error.strerror or str(error), str(target)) from error
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def guard_checkpoints(strategy: Strategy, io: CheckpointIO | None) -> None:
    """Write this command's checkpoints with ``io`` (``checkpoint_io``, ``AtomicCheckpointIO`` by
    default), but only in place of Lightning's default: a strategy's own (FSDP, DeepSpeed) or one
    given in ``trainer.plugins`` is kept."""
    if io is not None and type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = io


def loads_weights_only(value: object) -> bool:
    """Whether a hyperparameter is plain data (numbers, strings, lists and mappings of them), which
    ``torch.load(weights_only=True)`` reads back: a checkpoint holding only such values never
    pickles code."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(loads_weights_only(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and loads_weights_only(v) for k, v in value.items())
    return False
