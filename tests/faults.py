"""Faults injected into real training processes by the reliability tests (imported by class_path)."""

from __future__ import annotations

import os
import signal

from lightning.pytorch import Callback, LightningModule, Trainer


class KillAtStep(Callback):
    """SIGKILLs its own process as the batch after optimizer step ``step`` begins: no handler runs,
    nothing is flushed, as when a node dies or the OOM killer strikes."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
