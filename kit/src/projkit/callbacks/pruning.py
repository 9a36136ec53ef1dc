"""A sweep trial's side of the study: report the metric after each validation, stop when pruned."""

from __future__ import annotations

import json
import os
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from projkit import TRIAL_ENV
from projkit.rundir.naming import run_directory


class OptunaPruning(Callback):
    """Reports the sweep's metric to the trial after each validation, at the optimizer step it was
    measured, and stops the run (as early stopping does) once the study's pruner says so.

    Optuna's own ``PyTorchLightningPruningCallback`` raises inside ``fit``; here the run ends as any
    stopped run does, with its checkpoints, its test and a clean exit, and records the step it was
    pruned at in the trial, from which the sweep's worker marks the trial pruned. The trial runs in a
    process the worker started, so it reaches the study through the storage, as a worker on another
    machine would. Under DDP rank 0 talks to the study and the decision is broadcast.
    """

    def __init__(self, storage: str, study: str, trial: int, metric: str, pruner: dict[str, Any]) -> None:
        self.storage, self.study_name, self.trial_number = storage, study, trial
        self.metric, self.pruner = metric, pruner
        self.trial = None

    @classmethod
    def from_environment(cls) -> OptunaPruning | None:
        """The callback of the trial a sweep started this process for (``projkit.TRIAL_ENV``; an
        environment variable rather than a config, so that a trial's saved config.yaml repeats the
        trial alone, without reporting to the study again)."""
        spec = os.environ.get(TRIAL_ENV)
        return cls(**json.loads(spec)) if spec else None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero or self.trial is not None:
            return
        import optuna

        from projkit.sweep import build_pruner, storage_for

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = storage_for(self.storage)
        study = optuna.load_study(
            study_name=self.study_name,
            storage=storage,
            sampler=optuna.samplers.RandomSampler(),  # the worker samples; this process only reports
            pruner=build_pruner(self.pruner, f"the sweep of study '{self.study_name}'"),
        )
        study_id = storage.get_study_id_from_name(self.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.trial_number)
        self.trial = optuna.trial.Trial(study, trial_id)
        self.trial.set_user_attr("run_dir", run_directory(trainer))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        prune = False
        if trainer.is_global_zero:
            value = trainer.callback_metrics.get(self.metric)
            if value is None:
                logged = ", ".join(sorted(trainer.callback_metrics)) or "nothing"
                raise ValueError(
                    f"The sweep's metric '{self.metric}' is not logged; this run logs {logged}. "
                    "Set the sweep config's `metric:` to one of them."
                )
            step = trainer.global_step
            self.trial.report(float(value), step)
            prune = self.trial.should_prune()
            if prune:
                self.trial.set_user_attr("pruned_at_step", step)
                rank_zero_info(
                    f"Sweep: the pruner stops this trial at step {step} ({self.metric} {float(value):.4f})"
                )
        if trainer.strategy.broadcast(prune):
            trainer.should_stop = True
