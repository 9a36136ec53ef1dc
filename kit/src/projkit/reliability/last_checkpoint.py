"""``last.ckpt`` that always holds the newest state of the run."""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn


class LastCheckpoint(ModelCheckpoint):
    """Writes ``last.ckpt`` every ``every_n_train_steps`` optimizer steps, after every validation, at
    each epoch's end and when ``fit`` ends, so resuming never repeats more than those steps and the
    final weights are on disk whatever the monitored metric did.

    Lightning's own ``save_last`` rewrites ``last.ckpt`` only on steps where its callback saved a
    top-k file: after a validation that did not improve, or at the end of a run whose metric had
    worsened, ``last.ckpt`` stays behind. This callback saves no other file; a ``ModelCheckpoint``
    with a ``monitor`` beside it keeps the best ones. It writes into the same ``checkpoints/``
    folder, found the same way (``dirpath``), and like Lightning writes nothing during the sanity
    check, ``fast_dev_run`` or the evaluating commands.
    """

    def __init__(self, dirpath: str | None = None, every_n_train_steps: int | None = None) -> None:
        super().__init__(
            dirpath=dirpath, save_top_k=0, save_last=True, every_n_train_steps=every_n_train_steps
        )
        self.steps = every_n_train_steps or 0
        self._saved_at: int | None = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if self.steps and trainer.global_step % self.steps == 0:
            self.write_last(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A validation after an epoch's last batch is followed by the epoch's end, saved below.
        if not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self.write_last(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # After the epoch's end, where Lightning's ModelCheckpoint saves the best: last.ckpt stays
        # the newest file (this callback comes after it) and holds the finished epoch, also when
        # this step was saved already.
        self.write_last(trainer, again=True)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.write_last(trainer)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A resume from a newer file than last.ckpt (a kill came after an epoch's best checkpoint,
        # before last.ckpt) with nothing left to train starts no training: last.ckpt catches up.
        resumed = trainer.ckpt_path and os.path.basename(trainer.ckpt_path) != os.path.basename(
            self.last_name()
        )
        if resumed and self._saved_at is None:
            self.write_last(trainer)

    def last_name(self) -> str:
        return os.path.join(self.dirpath, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)

    def write_last(self, trainer: Trainer, again: bool = False) -> None:
        if (
            trainer.fast_dev_run
            or trainer.sanity_checking
            or trainer.state.fn != TrainerFn.FITTING
            or trainer.global_step == 0
            or (trainer.global_step == self._saved_at and not again)
        ):
            return
        path = self.last_name()
        # Set before saving: the path is part of this callback's state inside the checkpoint.
        self.last_model_path = path
        trainer.save_checkpoint(path, weights_only=False)
        self._saved_at = trainer.global_step
