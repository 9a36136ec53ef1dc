"""What every task module shares: the network, AdamW with decay-free vectors, the LR schedule."""

from __future__ import annotations

import inspect
import math
import pickle
from pathlib import Path
from typing import IO, Any, Literal, Self

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau

from projkit.checks.checkpoint import load_checkpoint, refused_pickle
from projkit.checks.model import check_optimization, warn_long_warmup, warn_schedule_ends_early
from projkit.errors import ConfigError
from projkit.internals.lightning import step_results
from projkit.internals.torchmetrics import forward_value, set_forward_value
from projkit.moved_classes import warn_of_old_paths, with_new_paths
from projkit.optim import WarmupCosineLR, clips_under_mixed_precision, fused_where_supported, param_groups
from projkit.reliability import loads_weights_only


class TaskModule(LightningModule):
    """Base for the task modules: owns the optimizer and scheduler set-up so each task only writes
    its steps and metrics.

    The optimizer and scheduler are callables (a ``class_path`` in the config), not instances, so
    the module builds them on its own parameter groups once the Trainer knows the number of steps.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: LRSchedulerCallable | None = WarmupCosineLR,
        scheduler_interval: Literal["step", "epoch"] = "step",
        scheduler_monitor: str = "val/loss",
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.net = net
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        self.scheduler_monitor = scheduler_monitor
        self._lr: float | None = None
        self._warmup_steps: int | None = None
        self._on_host: dict[str, torch.Tensor] = {}  # the progress bar's values, copied to the host
        check_optimization(optimizer, scheduler)
        self.compiled = compile
        if compile:
            # In-place compile keeps the parameter names, so checkpoints load with or without it.
            self.net.compile()

    def loss(
        self, logits: torch.Tensor, targets: torch.Tensor, reduction: Literal["mean", "none"] = "mean"
    ) -> torch.Tensor:
        """The task's loss of the network's output against the targets, in one method that training,
        validation and test all call, so that another loss is one overridden method.

        ``"mean"`` is the batch mean that training descends; ``"none"`` one value per sample (or
        token), which validation and test average over the whole split: exact with a short last
        batch and under DDP.
        """
        raise NotImplementedError(f"{type(self).__name__} must define loss(logits, targets, reduction)")

    def example_input(self) -> torch.Tensor | None:
        """A small batch of the network's input, for the model summary's FLOPs and shapes; None
        when the data module has not stated its shape."""
        return None

    def logged_metrics(self) -> set[str]:
        """The names this module's ``self.log`` calls write: what a monitor may name (the
        checkpoint's, early stopping's, ``scheduler_monitor``), checked before a run is made since
        Lightning finds a misspelt one only at the first validation. A subclass that logs more
        adds its names to these."""
        return {"train/loss", "train/grad_norm", "val/loss", "test/loss"}

    def setup(self, stage: str) -> None:
        # The summary runs one forward on it: skipped for a compiled network, where that forward
        # would compile for a shape that training never uses.
        if not self.compiled:
            self.example_input_array = self.example_input()

    def save_plain_hyperparameters(self) -> None:
        """Save the constructor's arguments, keeping only plain values.

        Under the CLI the network, optimizer and scheduler arrive as their config (class paths and
        numbers), which checkpoints can hold and ``load_from_checkpoint`` rebuilds from. Objects
        passed from Python are left out, so a checkpoint never pickles code and always loads with
        ``torch.load(weights_only=True)``; pass them again to ``load_from_checkpoint``.
        """
        self.save_hyperparameters(frame=inspect.currentframe().f_back)
        self.remove_ignored_hparams([k for k, v in self.hparams.items() if not loads_weights_only(v)])

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | Path | IO[bytes],
        map_location: Any = None,
        hparams_file: str | Path | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Self:
        """Lightning's, but always reading with ``weights_only=True``, as the CLI does: left unset,
        Lightning defers to torch, which ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` switches to full
        unpickling, so a crafted file would run its code. This template's checkpoints hold plain
        values only; one that needs more is refused, and ``weights_only=False`` is too."""
        if weights_only is False:
            raise ConfigError(
                "load_from_checkpoint(weights_only=False): this template loads checkpoints with weights "
                "only (its checkpoints hold plain values), so that a crafted file cannot run code. "
                "Leave weights_only out."
            )
        if isinstance(checkpoint_path, (str, Path)) and Path(checkpoint_path).is_file():
            kwargs = {**moved_settings(checkpoint_path), **kwargs}
        try:
            return super().load_from_checkpoint(
                checkpoint_path, map_location, hparams_file, strict, weights_only=True, **kwargs
            )
        except pickle.UnpicklingError as error:
            raise refused_pickle(f"checkpoint '{checkpoint_path}'", error) from None

    @property
    def lr(self) -> float:
        """The learning rate the optimizer starts from (the schedule's peak).

        The finders in ``projkit.callbacks`` set it when asked to apply what they found. The new value
        also goes into the optimizer's hyperparameters, so a checkpoint records the rate the run
        trained with and ``--ckpt_path`` or ``load_from_checkpoint`` rebuild the same optimizer.
        """
        if self._lr is not None:
            return self._lr
        return self.optimizer([torch.nn.Parameter(torch.zeros(1))]).param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = float(value)
        self._record("optimizer", "lr", self._lr)

    @property
    def warmup_steps(self) -> int | None:
        """The warmup of a ``WarmupCosineLR`` schedule in optimizer steps (None for other schedules).

        ``BatchSizeFinder`` sets it when it changes the batch, so that the warmup spans as many
        samples as configured; like ``lr``, the new value goes into the saved hyperparameters.
        """
        if self._warmup_steps is not None:
            return self._warmup_steps
        if self.scheduler is None:
            return None
        trial = self.scheduler(self.optimizer([torch.nn.Parameter(torch.zeros(1))]))
        return trial.warmup_steps if isinstance(trial, WarmupCosineLR) else None

    @warmup_steps.setter
    def warmup_steps(self, value: int) -> None:
        self._warmup_steps = int(value)
        self._record("scheduler", "warmup_steps", self._warmup_steps)

    def _record(self, key: str, name: str, value: float) -> None:
        saved = self.hparams.get(key)
        if isinstance(saved, dict) and isinstance(saved.get("init_args"), dict):
            self.hparams[key] = {**saved, "init_args": {**saved["init_args"], name: value}}

    def configure_optimizers(self) -> Any:
        groups = param_groups(self)
        if self._lr is not None:
            groups = [{**group, "lr": self._lr} for group in groups]
        optimizer = self.optimizer([dict(group) for group in groups])
        if not clips_under_mixed_precision(self):
            optimizer = fused_where_supported(optimizer, groups)
        if self.scheduler is None:
            return optimizer
        scheduler = self.scheduler(optimizer)
        if isinstance(scheduler, WarmupCosineLR):
            if self._warmup_steps is not None:
                scheduler.warmup_steps = self._warmup_steps
            total = self.trainer.estimated_stepping_batches if scheduler.total_steps is None else None
            if total is not None and math.isfinite(total):
                scheduler.total_steps = int(total)
            if scheduler.total_steps and not self.trainer.fast_dev_run:
                warn_long_warmup(scheduler.warmup_steps, scheduler.total_steps)
        # A plateau schedule steps on the epoch's monitored value; Lightning ignores `monitor` for others.
        interval = "epoch" if isinstance(scheduler, ReduceLROnPlateau) else self.scheduler_interval
        # Named so that Lightning's LearningRateMonitor logs lr/decay and lr/no_decay (the groups'
        # names), not lr-AdamW/decay.
        config = {
            "scheduler": scheduler,
            "interval": interval,
            "monitor": self.scheduler_monitor,
            "name": "lr",
        }
        return {"optimizer": optimizer, "lr_scheduler": config}

    def on_train_start(self) -> None:
        # Lightning leaves each module in the mode it was built in (and warns about any in eval
        # mode) rather than calling train(): calling it lets a network keep parts of itself out of
        # training, such as TorchvisionNet's frozen batch norms.
        self.net.train()
        trainer = self.trainer
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        total = trainer.estimated_stepping_batches
        if (
            trainer.ckpt_path
            and schedulers
            and isinstance(schedulers[0], WarmupCosineLR)
            and math.isfinite(total)
        ):
            init_from = "init_from" in inspect.signature(type(self).__init__).parameters
            if schedulers[0].total_steps:
                warn_schedule_ends_early(schedulers[0].total_steps, int(total), self.global_step, init_from)

    def is_logging_step(self) -> bool:
        """Whether the loggers receive what this optimizer step logs.

        Lightning writes on every ``log_every_n_steps``-th step counted from one, and keeps a
        step's value only until the epoch ends: a value logged on another step reaches the
        loggers late, or never when an epoch is shorter than ``log_every_n_steps``.
        """
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step + 1) % every == 0

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Called after AMP unscaling and before clipping, so this is the norm clipping acts on.
        # Measured only on the steps the loggers write: the norm costs a pass over every gradient.
        if not self.is_logging_step():
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning turns each value logged to the progress bar into a number at every batch's end
        # until the epoch ends, a read of the device on every step after the one that logged it.
        # Copied to the host once, on that step (whose metrics Lightning reads right after this), the
        # later steps read the copy. A subclass that overrides this hook calls super() to keep it.
        results = step_results(self.trainer)
        if results is None:
            return
        for key, metric in results.valid_items():
            value = forward_value(metric)
            copied = self._on_host.get(key) is value
            if metric.meta.prog_bar and isinstance(value, torch.Tensor) and not copied:
                self._on_host[key] = value.detach().to("cpu", copy=True)
                set_forward_value(metric, self._on_host[key])


def moved_settings(path: str | Path) -> dict[str, Any]:
    """The hyperparameters of the checkpoint at ``path`` that name a class by its path from before
    the kit's split, by the kit's path and warned of: ``load_from_checkpoint`` builds from them as
    the CLI does (``projkit.moved_classes``)."""
    checkpoint = load_checkpoint(path, "checkpoint_path")
    saved = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not isinstance(saved, dict):
        return {}  # Lightning's own load says what is missing
    found: dict[str, str] = {}
    moved = with_new_paths(saved, found)
    warn_of_old_paths(found)
    return {key: value for key, value in moved.items() if value != saved.get(key)}
