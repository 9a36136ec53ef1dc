"""What a project's own tests use to try the kit's promises on their code: a kill at a chosen step,
so that a test can resume the run and compare it with an uninterrupted one (a data module of your
own resumes exactly, say). Named in an overlay by class path::

    trainer:
      callbacks+:
        - class_path: projkit.testing.KillAtStep
          init_args: {step: 30}
"""

from __future__ import annotations

import os
import signal
import time

from lightning.pytorch import Callback, LightningModule, Trainer


class KillAtStep(Callback):
    """SIGKILLs its own process (``group``: its whole process group, every DDP rank; ``rank``: on
    that rank only) as the batch after optimizer step ``step`` begins: no handler runs, nothing is
    flushed, as when a node dies or the OOM killer strikes. ``wait`` seconds pass first: time for
    what runs beside training (a logger's own process) to do its periodic work."""

    def __init__(self, step: int, group: bool = False, rank: int | None = None, wait: float = 0.0) -> None:
        self.step = step
        self.group = group
        self.rank = rank
        self.wait = wait

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            time.sleep(self.wait)
            if self.group:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
