"""Make a resumed run continue exactly where the checkpoint left it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from projkit.internals.lightning import logging_step, logs_this_step, metrics_to_log
from projkit.loops import accumulating
from projkit.reliability.loop_state import (
    EPOCH_END_FOLLOWS,
    after_batch,
    at_epoch_end,
    at_validation_start,
    end_epoch_at_once,
    epoch_ended,
    recount,
)
from projkit.rundir.metrics import has_row, rewrite_rows, rows_before, without_repeats


class ExactResume(Callback):
    """Saves every RNG the training step draws from, per rank, and restores it on resume.

    Lightning restores weights, optimizer, scheduler, scaler and loop counters but no RNG state, so
    dropout and augmentation after a resume would differ from an uninterrupted run. The states are
    stored as tensors and plain tuples, so checkpoints still load with ``weights_only=True``; they
    are restored in ``on_train_start``, after the sanity check (whose sampling must not shift them).

    Loggers are flushed at every checkpoint, so no row older than the checkpoint is lost with the
    process. A resumed run keeps the rows of ``metrics.csv`` logged before its checkpoint's step
    and logs the later ones again; of the rows at that very step it keeps one copy each. A
    checkpoint saved before Lightning logs the row of its step or of its epoch's end (a step
    checkpoint, ``last.ckpt`` at an epoch's end) holds that row, and a resume writes it if the killed
    run had not: the resume starts after it, and would never log it. A checkpoint saved at a batch
    that a validation or an epoch's end follows (a step checkpoint at an epoch's last batch) resumes
    by running them (``loop_state``): their rows, and the epoch's, are not lost.
    """

    def __init__(self) -> None:
        self._rng_states: list[dict[str, Any]] | None = None
        self._resumed_at: int | None = None
        self._pending_row: dict[str, Any] | None = None
        self._epoch_end_follows = False

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        # Called on every rank while the checkpoint is assembled, so the collective gather is safe.
        checkpoint["rng_states"] = gather(trainer, rng_states())
        checkpoint["pending_row"] = pending_row(trainer)
        follows = after_batch(trainer)
        if follows == "validation":
            at_validation_start(checkpoint["loops"])
        checkpoint[EPOCH_END_FOLLOWS] = follows == "epoch_end"
        for logger in trainer.loggers:
            logger.save()
        self._drop_repeats(trainer)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._rng_states = checkpoint.get("rng_states")
        self._resumed_at = checkpoint.get("global_step")
        self._pending_row = checkpoint.get("pending_row")
        self._epoch_end_follows = trainer.state.fn == TrainerFn.FITTING and at_epoch_end(checkpoint, trainer)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Also for a resume with nothing left to train, which starts no training.
        row, self._pending_row = self._pending_row, None
        if (
            self._writes_csv(trainer)
            and valid_row(row)
            and not has_row(trainer.logger, row["step"], row["metrics"])
        ):
            trainer.logger.log_metrics(row["metrics"], step=row["step"])
            trainer.logger.save()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._epoch_end_follows:
            end_epoch_at_once(trainer)
        if self._rng_states is not None:
            restore_rng_states(self._rng_states, trainer.global_rank)
            self._rng_states = None
        # Only once training resumes: a resume that fails to start keeps every row.
        if self._resumed_at is not None and self._writes_csv(trainer):
            rewrite_rows(trainer.logger, rows_before(self._resumed_at))

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        recount(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._epoch_end_follows:
            epoch_ended(trainer)
            self._epoch_end_follows = False

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._writes_csv(trainer):
            trainer.logger.save()
        self._drop_repeats(trainer)
        self._resumed_at = None

    def _drop_repeats(self, trainer: Trainer) -> None:
        if self._resumed_at is not None and self._writes_csv(trainer):
            rewrite_rows(trainer.logger, without_repeats(self._resumed_at - 1))

    @staticmethod
    def _writes_csv(trainer: Trainer) -> bool:
        return isinstance(trainer.logger, CSVLogger) and trainer.is_global_zero


def pending_row(trainer: Trainer) -> dict[str, Any] | None:
    """The row Lightning logs once the hooks a checkpoint is saved in are done, as it will log it;
    None when it logs none there. In ``on_train_batch_end`` (the batch not yet counted complete):
    the step's row, on a logging step. Among an epoch's end hooks (the epoch processed, not yet
    completed): the epoch's row, at the step of its last batch."""
    epoch = trainer.fit_loop.epoch_progress.current
    batch = trainer.fit_loop.epoch_loop.batch_progress.current
    if epoch.processed > epoch.completed:
        step = logging_step(trainer) - 1
    elif batch.processed > batch.completed and logs_this_step(trainer) and not accumulating(trainer):
        step = logging_step(trainer)
    else:
        return None
    logged = metrics_to_log(trainer)
    if not logged:
        return None
    metrics = {name: float(value) for name, value in logged.items()}
    metrics.setdefault("epoch", trainer.current_epoch)  # as Lightning's logger connector adds it
    return {"step": step, "metrics": metrics}


def valid_row(row: Any) -> bool:
    """Whether a checkpoint's pending row is what ``pending_row`` writes (a checkpoint is untrusted)."""
    return (
        isinstance(row, dict)
        and type(row.get("step")) is int
        and 0 <= row["step"] < 2**63
        and isinstance(row.get("metrics"), dict)
        and all(isinstance(k, str) and type(v) in (int, float) for k, v in row["metrics"].items())
    )


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


def restore_rng_states(states: Any, rank: int) -> None:
    """Set rank ``rank``'s saved states; a checkpoint whose states cannot be set (edited, or made
    elsewhere) is said, and the run trains on with the RNGs as they are."""
    try:
        set_rng_states(states[rank] if len(states) > rank else states[0])
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError, AttributeError) as error:
        rank_zero_warn(
            f"The checkpoint's RNG states cannot be restored ({type(error).__name__}: "
            f"{str(error)[:200]}): the resumed run draws other random numbers than an uninterrupted one."
        )


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def gather(trainer: Trainer, state: Any) -> list[Any]:
    """``state`` of every rank, in rank order (a collective: call it on every rank)."""
    if trainer.world_size == 1 or not torch.distributed.is_initialized():
        return [state]
    gathered: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(gathered, state)
    return gathered
