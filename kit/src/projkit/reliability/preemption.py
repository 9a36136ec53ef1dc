"""Stop cleanly on SIGTERM or Ctrl-C: finish the step, save, exit non-zero."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from projkit.context import current
from projkit.internals.lightning import (
    clear_received_sigterm,
    keep_ignored_at_teardown,
    stop_sigterm_broadcast,
)
from projkit.lifetime import defer_sigterm_while_starting, requeue_slurm_job, sigterm_while_starting
from projkit.loops import accumulating
from projkit.rundir.naming import run_directory

# How many steps the ranks train between two agreements on a signal when nothing logs.
DEFAULT_EVERY = 50


def distributed(trainer: Trainer) -> bool:
    return trainer.world_size > 1 and torch.distributed.is_initialized()


class Preempted(SystemExit):
    """Raised on every rank once a stop signal is agreed; the exit code is 128 + the signal."""


class Preemption(Callback):
    """On SIGTERM (SLURM preemption, ``kill``, torchrun shutting down) or Ctrl-C, on any or all ranks:
    finish the current step (and a validation or epoch end that follows it), save ``last.ckpt`` on
    every rank's behalf, and exit with 128 + signal. Under gradient accumulation the step is the
    optimizer's: the accumulated gradients are in no checkpoint. Without a ``LastCheckpoint``
    (``last_checkpoint: null``), the resumed run skips a validation that followed the step. A
    signal from the sanity check on stops the run after its first step the same way.

    Lightning's own SIGTERM handler broadcasts from rank 0 inside the signal handler, which hangs when
    only another rank is signalled, and ends the run with exit code 0, so a scheduler records success.
    Here the handler only records the signal, and the ranks agree on it at the end of a training step (a
    max-reduce of a scalar on the CPU) and all stop together: one process stops at the step's end; under
    DDP the ranks agree after the first step, then every ``log_every_n_steps`` steps (where the loggers
    wait for the device anyway), or every fewer where steps are slow, so that they agree at least every
    ``grace_seconds / 4`` (measured at each agreement), and at the end of training. A signalled run so
    trains at most that many steps more, and an ordinary step issues no collective. Lightning's own
    per-step broadcast of its SIGTERM flag is switched off. ``grace_seconds`` after a signal, a process
    that is still alive (stuck in I/O or a collective) exits anyway. Under SLURM the job is requeued
    (``scontrol requeue``) when ``requeue`` is set, unless it was cancelled (``scancel``), and resumes
    with ``--ckpt_path auto``. A second Ctrl-C interrupts at once; a repeated SIGTERM (Slurm signals the
    job's steps and ``srun`` forwards it too) changes nothing. A worker whose launcher dies stops the same
    way. In ``validate``, ``test`` (the one after ``fit`` too) and ``predict`` there is nothing to save:
    the process stops at the next batch with 128 + signal, and the job is requeued, so that the evaluation
    runs again.

    Lightning's SLURM auto-requeue is switched off: on a signal of its own (SIGUSR1) it saves an
    ``hpc_ckpt_*.ckpt`` that ``--ckpt_path last`` does not look for, from inside rank 0's handler,
    and trains on until the requeue it asked for kills the job. One mechanism, this one, serves
    SIGTERM from every source.
    """

    def __init__(self, grace_seconds: float = 120.0, requeue: bool = True) -> None:
        self.grace_seconds = grace_seconds
        self.requeue = requeue
        self._signal = 0
        self._exit_code = 0
        self._previous: dict[int, object] = {}
        self._group: torch.distributed.ProcessGroup | None = None
        self._stop_watching: Callable[[], None] = lambda: None
        # Under DDP, the ranks agree on a signal every this many steps (once after the first step,
        # then as ``_agreed`` says); (time, step) when they last did.
        self._every = 1
        self._last = (0.0, 0)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Before the Trainer registers its signal handlers, which read this same environment object.
        # A parallel strategy's is public; the CLI gives any Trainer one (``without_slurm_requeue``).
        environment = getattr(trainer.strategy, "cluster_environment", None)
        if isinstance(environment, SLURMEnvironment):
            environment.auto_requeue = False
        defer_sigterm_while_starting()  # a SIGTERM from here on stops the run after its first step

    # The handlers go in once Lightning has registered its own, so that these replace them: at the
    # sanity check, or at the start of training where there is none.
    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)
        self._every, self._last = 1, (time.monotonic(), trainer.global_step)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install(trainer)

    def _install(self, trainer: Trainer) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        several = distributed(trainer)
        if several and torch.distributed.get_backend() != "gloo":
            # The ranks agree on a CPU tensor over a gloo side group: a tensor on the GPU would make
            # the host wait for the device's queue to drain at every step.
            self._group = torch.distributed.new_group(backend="gloo")
        self._previous = {s: signal.signal(s, self._record) for s in (signal.SIGTERM, signal.SIGINT)}
        if several:
            # Lightning's training loop broadcasts its SIGTERM flag from rank 0 on every step, a
            # collective and a read of the device per step; its handler, which sets that flag, is
            # replaced above, so the flag stays unset: this agreement does its job.
            stop_sigterm_broadcast(trainer)
        # A SIGTERM that Lightning's handler took (during the restore or the sanity check) would end
        # the run at the next step, or batch of the sanity check, with exit code 0 and nothing saved;
        # one since this run's setup was kept for here (``projkit.lifetime``). Both are read and cleared.
        took, kept = clear_received_sigterm(trainer), sigterm_while_starting()
        if took or kept:
            self._record(signal.SIGTERM, None)
        if "TORCHELASTIC_RUN_ID" in os.environ or trainer.global_rank > 0:
            self._watch_launcher()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A signal since the ranks last agreed: training ended before they would agree again.
        if not self._exit_code and distributed(trainer) and (signum := self._agreed(trainer)):
            self._stop(trainer, signum)
        self._leave()
        self._release()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            self._release()

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._release()

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
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
        if not self._signal:  # once stopping, ``_ignore_repeats`` decided the handlers
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
        if accumulating(trainer):
            return  # the gradients accumulated so far are in no checkpoint: stop once they are applied
        if not distributed(trainer):
            signum = self._signal
        elif trainer.global_step % self._every == 0:
            signum = self._agreed(trainer, self._pace(trainer))
        else:
            return
        if signum:
            self._stop(trainer, signum)

    def _pace(self, trainer: Trainer) -> float:
        """This rank's seconds per step since the ranks last agreed (a validation between counts)."""
        now, step = time.monotonic(), trainer.global_step
        (then, before), self._last = self._last, (now, step)
        return (now - then) / max(step - before, 1) if then else 0.0

    def _agreed(self, trainer: Trainer, pace: float = 0.0) -> int:
        """The signal any rank received, or 0: every rank calls this at the same point. The ranks
        agree on the slowest pace too, and from it on how many steps to train before they agree
        again: ``log_every_n_steps``, fewer where that many would outlast a quarter of
        ``grace_seconds``."""
        signum = self._signal
        if distributed(trainer):
            flag = torch.tensor([float(signum), pace], dtype=torch.float64)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
            signum, pace = int(flag[0]), float(flag[1])
            most = trainer.log_every_n_steps or DEFAULT_EVERY
            self._every = min(most, max(1, int(self.grace_seconds / 4 / pace))) if pace > 0 else most
        return signum

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # in `fit`, the training step's end stops the run
            self._stop_evaluating(trainer)

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        self._stop_evaluating(trainer)

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        self._stop_evaluating(trainer)

    def _stop_evaluating(self, trainer: Trainer) -> None:
        """Lightning's own handler would end the evaluation with exit code 0 (``predict``: finish it),
        a success to a scheduler, with its metrics or predictions never written."""
        if not (signum := self._agreed(trainer)):
            return
        stage = trainer.state.fn.value
        rank_zero_info(
            f"Received {signal.Signals(signum).name} in `{stage}`: stopped before its end, and nothing "
            f"of it is kept. Run the command again (after `fit`: `--ckpt_path last` runs the test)."
        )
        self._requeue(trainer, signum)
        self._ignore_repeats(trainer)
        raise Preempted(128 + signum)

    # Lightning writes the step's row of metrics after ``on_train_batch_end``, so the process leaves
    # at the next batch's start (or the next epoch's, or the end of training). A validation or an
    # epoch's end between the two runs, and the LastCheckpoint saves last.ckpt again after it: a
    # resume from this hook's checkpoint would skip them.
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        self._leave()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._leave()

    def _leave(self) -> None:
        if self._exit_code:
            raise Preempted(self._exit_code)

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
        config = os.path.join(run_directory(trainer), "config.yaml")
        configs = f"--config {config}" if os.path.isfile(config) else "--config <same configs>"
        rank_zero_info(
            f"Received {signal.Signals(signum).name} at step {trainer.global_step}: saved {path}. "
            f"Resume with: {current().command} fit {configs} --ckpt_path {path}"
        )
        self._requeue(trainer, signum)
        self._ignore_repeats(trainer)
        self._exit_code = 128 + signum

    def _requeue(self, trainer: Trainer, signum: int) -> None:
        job = os.environ.get("SLURM_JOB_ID")
        if self.requeue and job and trainer.is_global_zero and signum == signal.SIGTERM:
            requeue_slurm_job(job, rank_zero_info)

    def _ignore_repeats(self, trainer: Trainer) -> None:
        """On its way out with 128 + signal, the process ignores SIGTERM: Slurm signals the job's
        steps and ``srun`` forwards the same signal, and the default handler would end the process
        with -15 instead. Ignoring outlasts both the Trainer's teardown, which restores the handlers
        it found when the run began (the default), and the interpreter's exit, which restores the
        default in place of any Python handler but not in place of an ignore."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            keep_ignored_at_teardown(trainer, signal.SIGTERM)


def without_slurm_requeue(plugins: Any) -> list:
    """The Trainer's ``plugins`` with Lightning's SLURM auto-requeue off (``Preemption`` serves that
    signal): a SLURMEnvironment among them is told so, and where none names a cluster environment and
    Lightning would choose SLURM's (under ``srun`` or ``sbatch``, not torchrun), one is added."""
    listed = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    environments = [plugin for plugin in listed if isinstance(plugin, ClusterEnvironment)]
    for environment in environments:
        if isinstance(environment, SLURMEnvironment):
            environment.auto_requeue = False
    if not environments:
        with warnings.catch_warnings():  # Lightning's own detection, right after, says it once
            warnings.simplefilter("ignore")
            slurm = not TorchElasticEnvironment.detect() and SLURMEnvironment.detect()
        if slurm:
            listed.append(SLURMEnvironment(auto_requeue=False))
    return listed
