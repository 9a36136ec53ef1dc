"""The run's ``config.yaml``: the resolved config that repeats the run, written once into its run
directory."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from proj.logger_media import upload_config, upload_config_to_mlflow
from proj.rundir.naming import run_directory


class RunConfigSaver(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run directory, once per run, and hands it
    to W&B or MLflow when the run logs there.

    Lightning's own callback writes to ``trainer.log_dir``, which for W&B is the shared ``save_dir``:
    a second run there collides with the first. The run directory is decided on rank 0 and
    broadcast, so under DDP every rank agrees and only rank 0 writes.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        run_dir = trainer.strategy.broadcast(run_directory(trainer))
        path = Path(run_dir) / self.config_filename
        # A resumed run continues in its own directory: the config that started it stays.
        if trainer.is_global_zero:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                self.parser.save(self.config, path, skip_unset=False, multifile=self.multifile)
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    upload_config(logger, path)
                elif isinstance(logger, MLFlowLogger):
                    upload_config_to_mlflow(logger, path)
        self.already_saved = True
