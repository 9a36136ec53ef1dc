"""Lightning's learning-rate and batch-size finders, made safe to leave on when a run is resumed.

Both finders train a few steps in ``on_fit_start`` and then restore a checkpoint of their own,
which on a resumed run would overwrite the resumed sampler position and RNG states; and a rate or
batch size searched again mid-run would change the run. So each searches in a fresh run only and
keeps what it found in the checkpoint.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BatchSizeFinder as _BatchSizeFinder
from lightning.pytorch.callbacks import LearningRateFinder as _LearningRateFinder
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.parsing import lightning_getattr
from matplotlib.figure import Figure


class _FreshRunsOnly(Callback):
    """Knows, by ``on_fit_start``, whether this fit resumes a trained checkpoint.

    ``trainer.ckpt_path`` cannot tell: a finder that ran before points it at its own checkpoint.
    A finder's checkpoint is taken before any step, so a step count above zero means a resume.
    """

    resuming = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.resuming = False

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self.resuming = self.resuming or checkpoint.get("global_step", 0) > 0


class LearningRateFinder(_FreshRunsOnly, _LearningRateFinder):
    """Lightning's learning-rate range test: the suggested rate replaces the configured one.

    Besides, it writes the curve into the run directory (``lr_find.png``, and ``lr_find.csv`` with
    the rate and smoothed loss of every step) and prints the value to put in the config. A resumed
    run does not search: its optimizer state, restored from the checkpoint, holds the rate.
    """

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.resuming:
            rank_zero_info("LearningRateFinder: resuming, so the checkpoint's learning rate stays.")
            return
        super().on_fit_start(trainer, pl_module)
        found = self.optimal_lr.suggestion() if self.optimal_lr is not None else None
        if found is None or not trainer.is_global_zero:
            return
        from proj.cli import run_directory  # the CLI imports the callbacks

        run = Path(run_directory(trainer))
        run.mkdir(parents=True, exist_ok=True)
        with open(run / "lr_find.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["lr", "loss"])
            results = self.optimal_lr.results
            writer.writerows(zip(results["lr"], results["loss"], strict=False))
        figure = Figure()
        self.optimal_lr.plot(suggest=True, ax=figure.subplots())
        figure.savefig(run / "lr_find.png", dpi=100)
        rank_zero_info(
            f"LearningRateFinder: training with lr={found:.3g} (curve in {run / 'lr_find.png'}). To keep it "
            f"without searching, set model.init_args.optimizer.init_args.lr: {found:.3g} in the config."
        )


class BatchSizeFinder(_FreshRunsOnly, _BatchSizeFinder):
    """Lightning's batch-size search (the largest size that fits in memory, capped by the data and
    ``max_val``), run once at the start of ``fit`` only: Lightning's searches again at the start of
    ``validate``, ``test`` and ``predict``, where the batch size changes nothing but the time.

    The size found is saved in checkpoints. A resumed run does not search again; it must use the
    size the run trained with (the sampler's position is counted in batches), and stops with the
    flag to pass when it does not.
    """

    optimal_batch_size: int | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.resuming:
            super().on_fit_start(trainer, pl_module)
            size, name = self.optimal_batch_size, self._batch_arg_name
            if size is not None:
                rank_zero_info(
                    f"BatchSizeFinder: training with batch size {size}. To keep it without searching, "
                    f"set data.init_args.{name}: {size} in the config."
                )
            return
        current = lightning_getattr(pl_module, self._batch_arg_name)
        if self.optimal_batch_size is not None and current != self.optimal_batch_size:
            raise ValueError(
                f"--ckpt_path: this run trained with the batch size {self.optimal_batch_size} that "
                f"BatchSizeFinder found, but {self._batch_arg_name} is {current} now. Resume with "
                f"--data.init_args.{self._batch_arg_name}={self.optimal_batch_size}."
            )

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        return

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        return

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        return

    def state_dict(self) -> dict[str, Any]:
        return {"optimal_batch_size": self.optimal_batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimal_batch_size = state_dict.get("optimal_batch_size")
