"""Checkpoint writing that never leaves a truncated file behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a checkpoint to a temporary file beside the target, fsyncs it, then renames it over
    the target in one step.

    A process killed mid-save leaves the previous checkpoint intact and at worst a stray temporary
    file. The temporary file sits in the same folder, never in ``$TMPDIR``: a rename is only atomic
    within one filesystem.
    """

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
