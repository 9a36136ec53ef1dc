"""The callbacks a project's tests put into a run: a kill at a chosen step (``KillAtStep``), so that a
test can resume the run and compare it with an uninterrupted one (a data module of your own resumes
exactly, say), and a count of what would hold up a GPU in each step (``SyncCounter``). Each is named
in an overlay or a flag by class path, as ``projkit.testing`` exports it::

    trainer:
      callbacks+:
        - class_path: projkit.testing.KillAtStep
          init_args: {step: 30}
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer

from projkit.step_syncs import Event, Watch, Window


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


class SyncCounter(Callback):
    """Counts, in each training batch, what would hold up a GPU: the host's reads of device values
    (``Tensor.item``, ``bool``, ``float``, ``.tolist()``, ``.cpu()``, ``nonzero``, a boolean mask...)
    and the collectives issued from Python, on any device, the CPU included
    (``projkit.step_syncs`` says how). ``ordinary()`` gives those of the ordinary steps, the ones that
    neither log nor validate nor checkpoint nor end an epoch nor are the first: what every step
    pays. A project's test runs a few steps of its config with this callback
    (``--trainer.callbacks+=projkit.testing.SyncCounter``) and asserts that they pay nothing.

    ``path``: where each rank writes its ordinary steps' events as JSON when training ends
    (``{rank}`` in it is replaced by the rank), for a test that runs the training in processes of
    its own (DDP). ``cuda``: on a GPU, count the synchronisations CUDA itself reports
    (``torch.cuda.set_sync_debug_mode("warn")``), each one whatever made the value.
    """

    def __init__(self, path: str | None = None, cuda: bool = False) -> None:
        self.path = path
        self.cuda = cuda
        self.windows: list[Window] = []
        self._watch: Watch | None = None

    def _record(self, event: Event) -> None:
        if self.windows:
            self.windows[-1].events.append(event)

    def _mark(self, reason: str) -> None:
        if self.windows:
            self.windows[-1].special.add(reason)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.windows = []
        self._watch = Watch(self._record, self.cuda).__enter__()
        modules = [vars(module) for module in pl_module.modules()]
        self._watch.values.mark([*pl_module.parameters(), *pl_module.buffers()], modules)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int
    ) -> None:
        self.windows.append(Window(len(self.windows), trainer.global_step))
        if len(self.windows) == 1:
            self._mark("first")
        if self._watch is not None:
            self._watch.values.mark(batch)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        every, step = trainer.log_every_n_steps, trainer.global_step
        if step != self.windows[-1].global_step and every > 0 and step % every == 0:
            self._mark("logs")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._mark("validates")

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._mark("checkpoints")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._mark("ends an epoch")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._mark("ends training")
        self._stop()
        if self.path is not None:
            path = Path(self.path.replace("{rank}", str(trainer.global_rank)))
            events = {window.batch: [asdict(e) for e in window.events] for window in self.ordinary()}
            path.write_text(json.dumps(events, indent=1))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self._watch = None

    def ordinary(self) -> list[Window]:
        """The windows of the ordinary steps, each with its events."""
        return [window for window in self.windows if not window.special]
