"""Make a resumed run continue exactly where the checkpoint left it."""

from __future__ import annotations

import csv
import os
import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger


class ExactResume(Callback):
    """Saves every RNG the training step draws from, per rank, and restores it on resume; keeps the
    run's ``metrics.csv`` continuous across the interruption.

    Lightning restores weights, optimizer, scheduler, scaler and loop counters but no RNG state, so
    dropout and augmentation after a resume would differ from an uninterrupted run. The states are
    stored as tensors and plain tuples, so checkpoints still load with ``weights_only=True``; they
    are restored in ``on_train_start``, after the sanity check (whose sampling must not shift them).

    The CSV logger deletes an existing ``metrics.csv`` when it reopens a run directory; rows up to
    the checkpoint's step are read before that (``keep_logged_metrics``) and written again, later
    rows (logged after the checkpoint by the run that died) are dropped, since the resumed run logs
    those steps anew. Loggers are flushed at every checkpoint so no row older than the checkpoint
    is lost with the process.
    """

    def __init__(self) -> None:
        self._rng_states: list[dict[str, Any]] | None = None
        self._csv_rows: list[dict[str, str]] | None = None

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        # Called on every rank while the checkpoint is assembled, so the collective gather is safe.
        checkpoint["rng_states"] = _gather(trainer, rng_states())
        for logger in trainer.loggers:
            logger.save()

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._rng_states = checkpoint.get("rng_states")

    def keep_logged_metrics(self, trainer: Trainer) -> None:
        """Read the run's ``metrics.csv`` before the CSV logger opens (and empties) its directory.

        Call it before ``trainer.fit``; the CLI does. A fresh run has no file and keeps nothing.
        """
        logger = trainer.logger
        if isinstance(logger, CSVLogger) and trainer.is_global_zero:
            path = os.path.join(logger.log_dir, "metrics.csv")
            if os.path.isfile(path):
                with open(path, newline="") as f:
                    self._csv_rows = list(csv.DictReader(f))

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._rng_states is not None:
            states = self._rng_states
            set_rng_states(states[trainer.global_rank] if len(states) > trainer.global_rank else states[0])
            self._rng_states = None
        if self._csv_rows is not None and isinstance(trainer.logger, CSVLogger):
            resumed_at = trainer.fit_loop.epoch_loop._batches_that_stepped
            kept = [row for row in self._csv_rows if int(row["step"]) < resumed_at]
            writer = trainer.logger.experiment
            writer.metrics[:0] = [{k: v for k, v in row.items() if v != ""} for row in kept]
            writer.save()
            self._csv_rows = None


def rng_states() -> dict[str, Any]:
    """The state of every RNG a training step may use, as tensors and tuples of numbers."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _gather(trainer: Trainer, state: dict[str, Any]) -> list[dict[str, Any]]:
    if trainer.world_size == 1 or not torch.distributed.is_initialized():
        return [state]
    gathered: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(gathered, state)
    return gathered
