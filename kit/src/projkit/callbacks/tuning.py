"""Lightning's learning-rate and batch-size finders, reporting what they find unless asked to apply
it, and safe to leave on when a run is resumed.

Applied blindly, both can make a run worse: on the digits Lightning's LR suggestion (3.6e-5) cost
10 points of test accuracy, and its batch size (the whole training set, one step an epoch) cost 12.
So by default each prints its suggestion and leaves the configured value alone; ``apply: true``
trains with it, with the schedule kept consistent.

Both finders train a few steps in ``on_fit_start`` and then restore a checkpoint of their own,
which on a resumed run would overwrite the resumed sampler position and RNG states; and a rate or
batch size searched again mid-run would change the run. So each searches in a fresh run only and
keeps what it applied in the checkpoint.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BatchSizeFinder as _BatchSizeFinder
from lightning.pytorch.callbacks import LearningRateFinder as _LearningRateFinder
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_setattr
from lightning.pytorch.utilities.seed import isolate_rng
from matplotlib.figure import Figure

from projkit.internals.lightning import rebuild_loaders
from projkit.rundir.naming import run_directory

LR_KEY = "model.init_args.optimizer.init_args.lr"
WARMUP_KEY = "model.init_args.scheduler.init_args.warmup_steps"


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


def suggest_lr(lrs: list[float], losses: list[float], skip_begin: int = 10) -> float | None:
    """A tenth of the rate at the lowest smoothed loss (fastai's ``lr_min / 10``), rounded to three
    significant digits so that the printed config line reproduces it exactly.

    Lightning's rule, the steepest fall per unit of rate, favours the low end of an exponential
    range (3.6e-5 on the digits, where 0.003 is tuned: test accuracy 0.886 against 0.992); the
    minimum's tenth gives 0.0219 there, within two of 359 test images of the tuned rate. The
    first ``skip_begin`` points are left out, as Lightning does: its smoothing starts from zero
    and reads low there. None when the minimum is at either end of what is left: the loss did
    not fall, or was still falling when the search stopped, so there is no minimum to take a
    tenth of.
    """
    points = [
        (loss, lr)
        for lr, loss in zip(lrs[skip_begin:], losses[skip_begin:], strict=True)
        if math.isfinite(loss)
    ]
    if len(points) < 3:
        return None
    lowest = min(range(len(points)), key=lambda i: points[i][0])
    if lowest in (0, len(points) - 1):
        return None
    return float(f"{points[lowest][1] / 10:.3g}")


class LearningRateFinder(_FreshRunsOnly, _LearningRateFinder):
    """Lightning's learning-rate range test, with a safer suggestion (``suggest_lr``) that the run
    uses only when ``apply`` is true.

    It writes the curve into the run directory (``lr_find.png`` with the suggestion marked, and
    ``lr_find.csv`` with the rate and smoothed loss of every step) and prints the value to put in
    the config. The search runs under ``isolate_rng`` and restores the weights, so a run that
    does not apply the suggestion trains exactly as it would without the finder. A resumed run
    does not search: its optimizer state, restored from the checkpoint, holds the rate.
    """

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1.0,
        num_training_steps: int = 100,
        mode: Literal["exponential", "linear"] = "exponential",
        early_stop_threshold: float | None = 4.0,
        apply: bool = False,
    ) -> None:
        super().__init__(min_lr, max_lr, num_training_steps, mode, early_stop_threshold, update_attr=False)
        self.apply = apply
        self.suggested_lr: float | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.resuming:
            rank_zero_info("LearningRateFinder: resuming, so the checkpoint's learning rate stays.")
            return
        super().on_fit_start(trainer, pl_module)
        if self.optimal_lr is None:  # fast_dev_run skips the search
            return
        results = self.optimal_lr.results
        self.suggested_lr = suggest_lr(results["lr"], results["loss"])
        if self.apply and self.suggested_lr is not None:
            lightning_setattr(pl_module, "lr", self.suggested_lr)
            trainer.strategy.setup_optimizers(trainer)  # built before this hook, with the old rate
        if trainer.is_global_zero:
            self.report(trainer, pl_module)

    def report(self, trainer: Trainer, pl_module: LightningModule) -> None:
        run = Path(run_directory(trainer))
        run.mkdir(parents=True, exist_ok=True)
        results = self.optimal_lr.results
        with open(run / "lr_find.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["lr", "loss"])
            writer.writerows(zip(results["lr"], results["loss"], strict=False))
        figure = Figure()
        ax = figure.subplots()
        self.optimal_lr.plot(suggest=False, ax=ax)
        found = self.suggested_lr
        if found is not None:
            ax.axvline(found, color="red", linestyle="--", label=f"suggested lr={found:.3g}")
            ax.legend()
        figure.savefig(run / "lr_find.png", dpi=100)
        curve = run / "lr_find.png"
        if found is None:
            rank_zero_warn(
                f"LearningRateFinder: no suggestion, the smoothed loss has no minimum inside the "
                f"{len(results['lr'])} steps searched (curve in {curve}); the configured rate stays. Widen "
                f"min_lr..max_lr, or give the search more steps (trainer.max_epochs, limit_train_batches)."
            )
        elif self.apply:
            rank_zero_info(
                f"LearningRateFinder: training with lr={found:.3g} (curve in {curve}). To keep it without "
                f"searching, set {LR_KEY}: {found:.3g} in the config."
            )
        else:
            rank_zero_info(
                f"LearningRateFinder: suggests lr={found:.3g} (curve in {curve}); this run keeps "
                f"lr={lightning_getattr(pl_module, 'lr'):.3g}. To train with it, set {LR_KEY}: {found:.3g} "
                f"in the config (or apply: true on the finder)."
            )


class BatchSizeFinder(_FreshRunsOnly, _BatchSizeFinder):
    """Lightning's batch-size search (the largest size that fits in memory), capped so that an
    epoch keeps ``min_steps_per_epoch`` optimizer steps, and used only when ``apply`` is true.

    The cap matters where memory is no limit (a CPU, a small data set): Lightning then ends on a
    batch holding the whole training set, one optimizer step an epoch. A batch that changes takes
    the rest of the schedule with it, applied or printed: the learning rate scales with the square
    root of the batch ratio, the rule for Adam-type optimizers (Malladi et al., 2022; linear
    scaling, Goyal et al., 2017, is for SGD and overshoots with AdamW at large ratios), and the
    warmup keeps its number of samples. The optimizer and schedule are built again, so the
    cosine's length follows the new number of steps (``TaskModule.configure_optimizers``).

    It searches once, at the start of ``fit`` (Lightning's searches again at the start of
    ``validate``, ``test`` and ``predict``, where the batch size changes nothing but the time),
    under ``isolate_rng``, so a run that does not apply the size trains exactly as without the
    finder. An applied size is saved in checkpoints; a resumed run does not search again, must use
    that size (the sampler's position is counted in batches), and stops with the flag to pass when
    it does not.
    """

    def __init__(
        self,
        mode: Literal["power", "binsearch"] = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
        min_steps_per_epoch: int = 10,
        apply: bool = False,
    ) -> None:
        if min_steps_per_epoch < 1:
            raise ValueError(
                f"BatchSizeFinder.min_steps_per_epoch must be at least 1, got {min_steps_per_epoch}."
            )
        super().__init__(mode, steps_per_trial, init_val, max_trials, batch_arg_name, margin, max_val)
        self.batch_arg_name = batch_arg_name
        self.min_steps_per_epoch = min_steps_per_epoch
        self.apply = apply
        self.trained_batch_size: int | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        name = self.batch_arg_name
        if self.resuming:
            self.check_resumed_size(lightning_getattr(pl_module, name))
            return
        configured = lightning_getattr(pl_module, name)
        with isolate_rng():
            super().on_fit_start(trainer, pl_module)
        if self.optimal_batch_size is None:  # fast_dev_run skips the search
            return
        fits = self.optimal_batch_size
        samples = len(trainer.train_dataloader.sampler)
        limit = max(1, samples // (self.min_steps_per_epoch * trainer.accumulate_grad_batches))
        size = fits
        while size > limit:
            size //= 2
        self.optimal_batch_size = size
        used = size if self.apply else configured
        if lightning_getattr(pl_module, name) != used:
            lightning_setattr(pl_module, name, used)
            rebuild_loaders(trainer)
        lr, warmup = self.scaled_schedule(pl_module, configured, size)
        if self.apply:
            self.trained_batch_size = size
            if size != configured:
                lightning_setattr(pl_module, "lr", lr)
                if warmup is not None:
                    pl_module.warmup_steps = warmup
                # Built before this hook, for the configured batch: the rate, the warmup and the
                # cosine's length (the run's number of steps) all change with the size.
                trainer.strategy.setup_optimizers(trainer)
        if size != fits:
            found = f"{fits} fits, capped at {size} so that an epoch keeps {self.min_steps_per_epoch} steps"
        else:
            found = f"{size} fits"
        settings = f"data.init_args.{name}: {size}"
        if size != configured:
            settings += f", {LR_KEY}: {lr:.3g} (square-root scaling from {configured})"
            if warmup is not None:
                settings += f" and {WARMUP_KEY}: {warmup}"
        if self.apply:
            rank_zero_info(
                f"BatchSizeFinder: batch size {found}; training with it. To keep it without searching, "
                f"set {settings} in the config."
            )
        else:
            rank_zero_info(
                f"BatchSizeFinder: batch size {found}; this run keeps {configured}. To train with it, set "
                f"{settings} in the config (or apply: true on the finder)."
            )

    def scaled_schedule(
        self, pl_module: LightningModule, configured: int, size: int
    ) -> tuple[float, int | None]:
        """The peak rate and warmup that go with ``size`` instead of the ``configured`` batch.

        The warmup keeps its number of samples, so it spans the same share of the run as configured.
        """
        lr = float(f"{lightning_getattr(pl_module, 'lr') * math.sqrt(size / configured):.3g}")
        warmup = getattr(pl_module, "warmup_steps", None)
        return lr, None if warmup is None else round(warmup * configured / size)

    def check_resumed_size(self, current: int) -> None:
        if self.trained_batch_size is not None and current != self.trained_batch_size:
            name = self.batch_arg_name
            raise ValueError(
                f"--ckpt_path: this run trained with the batch size {self.trained_batch_size} that "
                f"BatchSizeFinder applied, but {name} is {current} now. Resume with "
                f"--data.init_args.{name}={self.trained_batch_size}."
            )

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        return

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        return

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        return

    def state_dict(self) -> dict[str, Any]:
        return {"trained_batch_size": self.trained_batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.trained_batch_size = state_dict.get("trained_batch_size")
