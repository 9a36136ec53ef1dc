"""Stop cleanly on SIGTERM or Ctrl-C: finish the step, save, exit non-zero."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from types import FrameType

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn


class Preempted(SystemExit):
    """Raised on every rank once a stop signal is agreed; the exit code is 128 + the signal."""


class Preemption(Callback):
    """On SIGTERM (SLURM preemption, ``kill``, torchrun shutting down) or Ctrl-C, on any or all ranks:
    finish the current step, save ``last.ckpt`` on every rank's behalf, and exit with 128 + signal.

    Lightning's own SIGTERM handler broadcasts from rank 0 inside the signal handler, which hangs
    when only another rank is signalled, and ends the run with exit code 0, so a scheduler records
    success. Here the handler only records the signal; at the end of each training step the ranks
    agree (one max-reduce of a scalar on the CPU) and all stop together. ``grace_seconds`` after a
    signal, a process that is still alive (stuck in I/O or a collective) exits anyway. Under SLURM
    the job is requeued (``scontrol requeue``) when ``requeue`` is set, and resumes with
    ``--ckpt_path auto``. A second Ctrl-C interrupts at once. A worker whose launcher dies stops
    the same way.
    """

    def __init__(self, grace_seconds: float = 120.0, requeue: bool = True) -> None:
        self.grace_seconds = grace_seconds
        self.requeue = requeue
        self._signal = 0
        self._previous: dict[int, object] = {}
        self._group: torch.distributed.ProcessGroup | None = None
        self._stop_watching: Callable[[], None] = lambda: None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Installed here, after Lightning registered its handlers, so these replace them.
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._record) for s in (signal.SIGTERM, signal.SIGINT)}
            if "TORCHELASTIC_RUN_ID" in os.environ or trainer.global_rank > 0:
                self._watch_launcher()
        distributed = trainer.world_size > 1 and torch.distributed.is_initialized()
        if distributed and torch.distributed.get_backend() != "gloo":
            # The ranks agree on a CPU tensor over a gloo side group: a tensor on the GPU would make
            # the host wait for the device's queue to drain at every step.
            self._group = torch.distributed.new_group(backend="gloo")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._release()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._release()

    def _watch_launcher(self) -> None:
        """Stop as on SIGTERM when the process that launched this one dies (``kill -9`` of the
        torchrun agent, or of rank 0, which launches the other ranks): an orphaned worker would
        otherwise train on into a run directory that a requeued job resumes."""
        parent, stopped = os.getppid(), threading.Event()

        def watch() -> None:
            while not stopped.wait(1.0):
                if os.getppid() != parent:
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
        self._stop_watching = stopped.set

    def _release(self) -> None:
        self._stop_watching()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._group is not None:
            torch.distributed.destroy_process_group(self._group)
            self._group = None

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self._signal and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self._signal:
            self._signal = signum
            watchdog = threading.Timer(self.grace_seconds, os._exit, args=(128 + signum,))
            watchdog.daemon = True
            watchdog.start()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        signum = self._signal
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            flag = torch.tensor([signum])
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
            signum = int(flag.item())
        if signum:
            self._stop(trainer, signum)

    def _stop(self, trainer: Trainer, signum: int) -> None:
        checkpoint = trainer.checkpoint_callback
        folder = getattr(checkpoint, "dirpath", None) or trainer.default_root_dir
        path = os.path.join(folder, "last.ckpt")
        # Claimed by every ModelCheckpoint of that folder (in the saved state too), so after the
        # resume they overwrite this last.ckpt instead of starting a last-v1.ckpt beside it.
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath == folder:
                callback.last_model_path = path
        trainer.save_checkpoint(path, weights_only=False)
        name = signal.Signals(signum).name
        rank_zero_warn(
            f"Received {name} at step {trainer.global_step}: saved {path}. "
            "Resume with `fit --config <same configs> --ckpt_path last`."
        )
        job = os.environ.get("SLURM_JOB_ID")
        if self.requeue and job and trainer.is_global_zero and signum == signal.SIGTERM:
            subprocess.run(["scontrol", "requeue", job], check=False)
        raise Preempted(128 + signum)
