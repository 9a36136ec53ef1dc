"""What a command says when it ends: each metric to the digits a float32 holds, where the
checkpoints are and why training stopped, and whether the test after ``fit`` ran for this step."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info

from projkit.rundir.naming import run_directory

# Significant digits of each metric printed after validate and test. Lightning's table printed each
# float32 as the float64 it converts to (0.9554317593574524), digits that a float32 does not hold.
METRIC_DIGITS = 4

# In the run directory: the step whose weights the test after `fit` tested. A resumed run with
# nothing left to train tests only when that test never ended (a job stopped in it).
TESTED = ".tested_step"
# Said first, so that a resume that trained nothing (a finished run resumed) never reads as training.
NOTHING_TO_TRAIN = (
    "Nothing to train: the checkpoint is where this run ends (step {step}), so this command trained no "
    "step. Raise trainer.max_epochs (or trainer.max_steps) to train further."
)
TESTED_ALREADY = (
    "Nothing to train, and its test ran, so it is not tested again; `test --ckpt_path best` tests its "
    "best checkpoint again."
)


def say_how_fit_ended(trainer: Trainer) -> str:
    """Print the best and last checkpoints and why early stopping ended the run; returns the best
    checkpoint's path (empty without one), the same on every rank."""
    best = trainer.strategy.broadcast(
        next((c.best_model_path for c in trainer.checkpoint_callbacks if c.best_model_path), "")
    )
    lasts = {c.last_model_path for c in trainer.checkpoint_callbacks if getattr(c, "last_model_path", "")}
    if best:
        rank_zero_info(f"Best checkpoint: {best}")
    for last in sorted(lasts):
        rank_zero_info(f"Last checkpoint: {last}")
    for stopped in early_stops(trainer):
        rank_zero_info(stopped)
    return best


def tested_marker(trainer: Trainer) -> Path | None:
    """Where the run directory records the step its test after ``fit`` ran for (None without a run
    directory of its own)."""
    return Path(run_directory(trainer)) / TESTED if trainer.loggers and not trainer.fast_dev_run else None


def tested_at(marker: Path | None, step: int) -> bool:
    return marker is not None and marker.is_file() and marker.read_text().strip() == str(step)


def print_metrics(results: list[dict[str, float]], stage: str, verbose: bool = True) -> None:
    """One line per dataloader: each metric to ``METRIC_DIGITS`` significant digits (``1.000``)."""
    if not verbose:
        return
    for index, metrics in enumerate(results):
        loader = f" (dataloader {index})" if len(results) > 1 else ""
        said = ", ".join(f"{name} {value:#.{METRIC_DIGITS}g}" for name, value in sorted(metrics.items()))
        rank_zero_info(f"{stage} metrics{loader}: {said}")


def early_stops(trainer: Trainer) -> list[str]:
    """Why early stopping ended this ``fit``, and where: Lightning says so only with ``verbose``,
    which also prints every improvement."""
    if not trainer.should_stop:
        return []
    lines = []
    for callback in trainer.early_stopping_callbacks:
        if not callback.stopping_reason_message:
            continue
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            where = (
                f"in epoch {callback.stopped_epoch + 1} of {trainer.max_epochs} (step {trainer.global_step})"
            )
        else:
            where = f"at step {trainer.global_step} of {trainer.max_steps}"
        reason = callback.stopping_reason_message.removesuffix(" Signaling Trainer to stop.")
        lines.append(
            f"Early stopping: {reason} Stopped {where}; --early_stopping.patience sets how many "
            "validations it waits for an improvement."
        )
    return lines
