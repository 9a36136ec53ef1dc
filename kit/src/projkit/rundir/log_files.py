"""The files the CSV and TensorBoard loggers write whole, each replaced in one step. Lightning's
``save_hparams_to_yaml`` opens ``hparams.yaml`` for writing, which empties it, and then writes it;
its CSV writer rewrites ``metrics.csv`` in place, every row again, when a metric's column first
appears. A kill or a full disk in between left a resumed run's ``hparams.yaml`` empty, its
``metrics.csv`` cut short, or a TensorBoard run's ``hparams.yaml`` cut for good (it is written only
when missing)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from projkit.internals.lightning import give_csv_writer
from projkit.rundir.atomic import replace_atomic, write_atomic


def save_hparams_atomically(path: Path, hparams: dict[str, Any]) -> None:
    """Lightning's ``save_hparams_to_yaml``, writing beside ``path`` and then taking its place."""
    replace_atomic(path, lambda temporary: save_hparams_to_yaml(temporary, hparams))


class AtomicExperimentWriter(ExperimentWriter):
    """Lightning's CSV experiment writer, whose whole-file writes go to a file beside, which then
    takes the file's place (appended rows are appended, as Lightning does)."""

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.hparams.update(params)
        save_hparams_atomically(Path(self.log_dir) / self.NAME_HPARAMS_FILE, self.hparams)

    def save(self) -> None:
        """Lightning's save, but a new column (which rewrites the file, every row again under the new
        header) writes the whole file beside it first, the new rows with it."""
        path = Path(self.metrics_file_path)
        new = set().union(*self.metrics) - set(self.metrics_keys)
        if not (new and path.is_file()):
            super().save()
            return
        self.metrics_keys[:] = sorted([*self.metrics_keys, *new])
        with path.open(newline="") as file:
            rows = list(csv.DictReader(file))
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.metrics_keys)
        writer.writeheader()
        writer.writerows([*rows, *self.metrics])
        write_atomic(path, text.getvalue())
        self.metrics = []


def write_logs_atomically(logger: Logger) -> None:
    """Have ``logger`` write its whole files in one step, before it opens its folder: any
    ``CSVLogger`` or ``TensorBoardLogger`` a config names, so a project's own logger settings and
    older configs get it too."""
    if isinstance(logger, CSVLogger):
        give_csv_writer(logger, AtomicExperimentWriter)
    elif isinstance(logger, TensorBoardLogger):
        logger.save = TensorBoardSave(logger)


class TensorBoardSave:
    """``TensorBoardLogger.save`` whose ``hparams.yaml``, written when missing, is written whole
    first: Lightning's own save then finds it there."""

    def __init__(self, logger: TensorBoardLogger) -> None:
        self.logger, self.save = logger, logger.save

    def __call__(self) -> None:
        path = Path(self.logger.log_dir) / self.logger.NAME_HPARAMS_FILE
        if path.parent.is_dir() and not path.is_file():
            save_hparams_atomically(path, self.logger.hparams)
        self.save()
