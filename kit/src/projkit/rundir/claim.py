"""A command taking its run directory over as it starts: held for this process, cleared of what a
killed process left half-done, and with every row of its ``metrics.csv`` carried over."""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from projkit.rundir.lock import RunLock
from projkit.rundir.log_files import write_logs_atomically
from projkit.rundir.metrics import restore_metrics, take_metrics_aside
from projkit.rundir.naming import run_directory

# In the run directory: the batch job that trains it (Slurm's job id, which a requeued job keeps), so
# that the job's `--ckpt_path auto` resumes its own run and no other.
JOB_FILE = ".job"


def job_id() -> str | None:
    """The batch job this process runs in: Slurm's ``SLURM_JOB_ID`` (each array task has its own; a
    requeue keeps it), None outside a job."""
    return os.environ.get("SLURM_JOB_ID") or None


def claim_run_directory(trainer: Trainer, training: bool = False) -> None:
    """Hold the run directory for this process, clear what a killed process left half-done there,
    carry every row of its ``metrics.csv`` over, which the CSV logger would delete, have the CSV
    logger write its whole files in one step, and record the batch job that trains in it
    (``training``: the command is a ``fit``)."""
    if not trainer.is_global_zero or trainer.fast_dev_run or not trainer.loggers:
        return
    if trainer.loggers[0].version is None:  # a new W&B run: its own fresh id, nothing to keep
        return
    run = Path(run_directory(trainer))
    RunLock.acquire(run)
    remove_stale_temporaries(run)
    if training and (job := job_id()) is not None:
        (run / JOB_FILE).write_text(f"{job}\n")
    # The CSV logger's writer deletes the metrics.csv it finds: the rows are set aside first.
    aside = take_metrics_aside(run) if isinstance(trainer.logger, CSVLogger) else None
    for logger in trainer.loggers:
        write_logs_atomically(logger)
    if aside is not None:
        restore_metrics(trainer.logger, aside)
    rank_zero_info(f"Run directory: {run}")


def remove_stale_temporaries(run: Path) -> None:
    """Files that a killed process left half-written: checkpoint saves (``AtomicCheckpointIO``'s
    ``.<name>.<pid>.tmp``), predictions and rewritten ``metrics.csv`` (the same names, in the run
    directory). Only called while holding the run's lock, so no write is under way."""
    for stale in [*run.glob(".*.tmp"), *(run / "checkpoints").glob(".*.tmp")]:
        stale.unlink(missing_ok=True)
