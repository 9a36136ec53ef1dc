"""The CSV logger's ``hparams.yaml``, replaced in one step: Lightning's ``save_hparams_to_yaml``
opens the file for writing, which empties it, and then writes it, so a kill or a full disk in
between left a resumed run's ``hparams.yaml`` empty or cut short."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from projkit.rundir.atomic import replace_atomic


class AtomicHparamsWriter(ExperimentWriter):
    """Lightning's CSV experiment writer, whose ``hparams.yaml`` Lightning's own function writes
    beside the file, and which then takes the file's place."""

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.hparams.update(params)
        path = Path(self.log_dir) / self.NAME_HPARAMS_FILE
        replace_atomic(path, lambda temporary: save_hparams_to_yaml(temporary, self.hparams))


def write_hparams_atomically(logger: CSVLogger) -> None:
    """Give ``logger`` that writer, before it opens its folder: any ``CSVLogger`` a config names, so
    a project's own logger settings and older configs get it too."""
    # A subclass that makes a writer of its own keeps it.
    if logger._experiment is None and type(logger).experiment is CSVLogger.experiment:
        # As Lightning's CSVLogger.experiment makes its writer.
        logger._fs.makedirs(logger.root_dir, exist_ok=True)
        logger._experiment = AtomicHparamsWriter(log_dir=logger.log_dir)
