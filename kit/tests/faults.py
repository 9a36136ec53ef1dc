"""Faults injected into real training processes by the reliability tests, and what they record there
(imported by class_path)."""

from __future__ import annotations

import os
import signal
import signal as signal_module
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint

from projkit.callbacks import ClassPredictionWriter


class StallSaveAtStep(Callback):
    """Holds its process inside the first checkpoint write at optimizer step ``step``, for a test to
    kill it there: that checkpoint carries a value whose pickling, which ``torch.save`` does with the
    file already open, creates ``path`` and then waits."""

    def __init__(self, step: int, path: str) -> None:
        self.step = step
        self.path = path

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        if trainer.global_step == self.step:
            checkpoint["stall"] = Stall(self.path)


class Stall:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        Path(self.path).touch()
        time.sleep(300)
        raise RuntimeError("the test never killed the stalled save")


class SignalAtStep(Callback):
    """Sends ``signal`` to its own process at optimizer step ``step``, on rank ``rank`` only."""

    def __init__(self, step: int, signal: str = "SIGTERM", rank: int = 0) -> None:
        self.step = step
        self.signum = getattr(signal_module, signal)
        self.rank = rank

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signum)


class SignalBeforeTraining(Callback):
    """Sends SIGTERM to its own process in ``hook`` (``on_sanity_check_start`` or
    ``on_train_start``), before the first training step."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.hook == "on_sanity_check_start":
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.hook == "on_train_start":
            os.kill(os.getpid(), signal.SIGTERM)


class SignalInSetup(Callback):
    """Sends SIGTERM to its own process in its ``setup`` hook, as the run sets up, before any step (in a
    Slurm job's first start only, its ``SLURM_RESTART_COUNT`` unset or 0)."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
            os.kill(os.getpid(), signal.SIGTERM)


class SignalInStage(Callback):
    """Sends ``signal`` to its own process as the first batch of ``stage`` (test or predict) begins:
    a job stopped in an evaluation, or in the test that follows ``fit``."""

    def __init__(self, stage: str, signal: str = "SIGTERM") -> None:
        self.stage = stage
        self.signum = getattr(signal_module, signal)

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if self.stage == "test":
            os.kill(os.getpid(), self.signum)

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if self.stage == "predict":
            os.kill(os.getpid(), self.signum)


class TouchAtStep(Callback):
    """Creates ``path`` once training reaches ``step``: tells a test the run is under way."""

    def __init__(self, step: int, path: str) -> None:
        self.step = step
        self.path = path

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            open(self.path, "w").close()


class KillWhileWriting(ClassPredictionWriter):
    """Writes half of ``predictions.csv``, flushes it, then SIGKILLs its own process: ``predict``
    killed mid-write."""

    def write(self, trainer: Trainer, file, rows: list[tuple[int, int, float]]) -> None:
        super().write(trainer, file, rows[: len(rows) // 2])
        file.flush()
        os.kill(os.getpid(), signal.SIGKILL)


class SlowFirstStart(Callback):
    """Sleeps ``seconds`` after each training step of a Slurm job's first start (its
    ``SLURM_RESTART_COUNT`` unset or 0): a run that its time limit catches mid-way, and whose requeued
    start finishes quickly."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
            time.sleep(self.seconds)


class CodeInCheckpoints(Callback):
    """Puts code into every checkpoint this run saves (``projkit.testing.bad_input.Payload``:
    unpickled, it writes ``payload_ran`` into the working folder), as if each file were swapped for a
    crafted one between its save and its load: a finder's own checkpoint, which it restores moments
    later."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        from projkit.testing.bad_input import Payload

        checkpoint["extra"] = Payload()


class RecordThreads(Callback):
    """Writes the torch threads the run computes with to ``path`` when fitting begins."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_fit_start(self, trainer, pl_module) -> None:
        Path(self.path).write_text(str(torch.get_num_threads()))


class KillAtEvent(Checkpoint):
    """SIGKILLs its own process at the ``event``-th hook of training it sees (0: never), counting
    batch starts and ends, validations, epoch starts and ends, checkpoint saves and the end: a kill
    drawn over a whole run. A ``Checkpoint``, so Lightning calls it after the run's checkpoint
    callbacks: a kill right after an epoch's checkpoints is among the draws. ``hook`` and ``step``:
    instead, at that hook's first call at optimizer step ``step``. ``count_to``: a file where it
    writes how many it saw, at the end of an uninterrupted run."""

    HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_validation_start", "on_validation_end",
             "on_train_epoch_start", "on_train_epoch_end", "on_save_checkpoint", "on_train_end")  # fmt: skip

    def __init__(self, event: int = 0, count_to: str | None = None, hook: str = "", step: int = 0) -> None:
        self.event = event
        self.hook, self.step = hook, step
        self.count_to = count_to
        self.seen = 0
        for hook in self.HOOKS:
            setattr(self, hook, self.counted(hook))

    def counted(self, hook: str):
        def call(trainer: Trainer, *args) -> None:
            if trainer.sanity_checking:
                return
            self.seen += 1
            if self.seen == self.event or (hook == self.hook and trainer.global_step == self.step):
                os.kill(os.getpid(), signal.SIGKILL)
            if hook == "on_train_end" and self.count_to:
                Path(self.count_to).write_text(str(self.seen))

        return call


class KillInHparamsWrite(Callback):
    """Gives the run's logged hyperparameters a value that SIGKILLs the process as Lightning writes
    ``hparams.yaml``: a kill in the middle of that write."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        pl_module._hparams_initial["killer"] = KillOnSecondDump()


class KillOnSecondDump:
    """SIGKILLs its process the second time YAML represents it: Lightning's ``save_hparams_to_yaml``
    tries each value on its own, then opens the file (emptying it) and writes them all."""

    def __init__(self) -> None:
        self.dumps = 0

    def __deepcopy__(self, memo: dict) -> KillOnSecondDump:
        return self

    def __reduce_ex__(self, protocol: int):
        self.dumps += 1
        if self.dumps == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return (KillOnSecondDump, ())
