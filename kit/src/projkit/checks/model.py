"""Checks of what a model is built with, made where those facts first exist: its optimizer and
schedule as it is constructed, its monitored metrics and its network's normalisation once the
model and the data are built."""

from __future__ import annotations

import difflib

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn

from projkit.errors import ConfigError


def check_optimization(optimizer: OptimizerCallable, scheduler: LRSchedulerCallable | None) -> None:
    """Build the optimizer and scheduler once on a stand-in parameter, so a bad setting (a negative
    learning rate, a betas out of range) is refused when the model is built, before any data is
    loaded, with the config field in the message."""
    fix = "Fix its init_args in the config."
    try:
        trial = optimizer([torch.nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as error:
        raise ValueError(f"model.init_args.optimizer: {error}. {fix}") from None
    lr = trial.param_groups[0].get("lr")
    if isinstance(lr, (int, float)) and lr <= 0:
        raise ValueError(f"model.init_args.optimizer: the learning rate is {lr}; it must be positive. {fix}")
    if scheduler is not None:
        try:
            scheduler(trial)
        except (ValueError, TypeError) as error:
            raise ValueError(f"model.init_args.scheduler: {error}. {fix}") from None


def warn_long_warmup(warmup_steps: int, total_steps: int) -> None:
    """A warmup as long as the run never reaches the configured rate: said, not refused, since a
    short trial run (``fast_dev_run``, a few ``limit_train_batches``) keeps the schedule on purpose."""
    if warmup_steps >= total_steps:
        rank_zero_warn(
            f"model.init_args.scheduler: warmup_steps={warmup_steps} is not shorter than the run's "
            f"{total_steps} optimizer steps, so the learning rate never reaches its configured value and "
            "never decays. Lower warmup_steps (--model.init_args.scheduler.init_args.warmup_steps) or "
            "train longer."
        )


def warn_schedule_ends_early(scheduled: int, run: int, step: int, init_from: bool) -> None:
    """A resumed run that trains longer than its schedule was sized for (``scheduled`` optimizer
    steps, ``run`` now): the resumed scheduler keeps its length, so from ``scheduled`` on the rate
    stays at its floor. Said, with the ways to a schedule that follows."""
    if run <= scheduled:
        return
    start_anew = (
        "start a new run from these weights (--model.init_args.init_from=<its last.ckpt>, without "
        "--ckpt_path), whose schedule spans the run it trains"
        if init_from
        else "start a new run (this model has no init_from to start from saved weights)"
    )
    rank_zero_warn(
        f"--ckpt_path: the learning-rate schedule of the resumed run was sized for {scheduled} optimizer "
        f"steps and this run trains to step {run} (from step {step}): steps {scheduled}-{run} train at the "
        f"schedule's floor rate. To train them at a rate that follows, {start_anew}; or resume with the "
        "run's own length."
    )


def check_monitors(monitors: dict[str, str | None], model: object) -> None:
    """Each monitored metric (``monitors``: the setting that names it, and the name) must be one the
    model logs (its ``logged_metrics``): Lightning finds a misspelt one only at the first validation,
    after training has begun, with a traceback.

    A name the model does not log is refused when it is under ``val/`` or ``test/``, which only the
    model logs, or when it is a typo away from one it does (``val_loss``, ``train/los``); any other
    name may come from a callback of the user's that logs it, and is left to Lightning.
    """
    logged = getattr(model, "logged_metrics", None)
    if not callable(logged):
        return
    names = sorted(logged())
    for field, name in monitors.items():
        if not isinstance(name, str) or name in names:
            continue
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
        if close or name.startswith(("val/", "test/")):
            hint = f" Did you mean {close[0]}?" if close else ""
            raise ConfigError(
                f"{field}={name}: {type(model).__name__} logs no metric of that name, so Lightning would "
                f"stop the run where it first reads it.{hint} It logs {', '.join(names)}."
            )


def warn_if_normalised_otherwise(net: torch.nn.Module, datamodule: object) -> None:
    """Warn when a network's pretrained weights (``net.mean``, ``net.std``, as ``TorchvisionNet``
    states them) expect another normalisation than the data module applies: nothing fails, the
    weights merely see shifted inputs and fine-tuning starts further from what they learned."""
    wanted = getattr(net, "mean", None), getattr(net, "std", None)
    applied = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
    if None in wanted or None in applied:
        return
    if tuple(map(tuple, wanted)) != tuple(map(tuple, applied)):
        rank_zero_warn(
            f"model.init_args.net: its pretrained weights expect images normalised with mean "
            f"{wanted[0]} and std {wanted[1]}, but {type(datamodule).__name__} normalises with mean "
            f"{applied[0]} and std {applied[1]}. Normalise the data with the network's mean and std "
            "(a data module subclass that sets them does)."
        )
