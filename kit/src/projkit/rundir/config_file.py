"""The run's ``config.yaml``: the resolved config that repeats the run, written once into its run
directory, and beside it the config of each resume that trained with other settings."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from projkit.context import current
from projkit.logger_media import upload_config, upload_config_to_mlflow
from projkit.moved_classes import with_new_paths
from projkit.rundir.atomic import write_atomic
from projkit.rundir.naming import run_directory
from projkit.strict_yaml import load

# What a resume sets itself: the checkpoint, and the logger's way back into the run. The model is
# the checkpoint's (``ckpt_path.ignored_model_settings`` names the flags it overrides).
SET_BY_RESUME = (
    "ckpt_path",
    "model",
    "trainer.logger.init_args.version",
    "trainer.logger.init_args.run_id",
    "trainer.logger.init_args.purge_step",
)


class RunConfigSaver(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run directory, once per run, and hands it
    to W&B or MLflow when the run logs there.

    Lightning's own callback writes to ``trainer.log_dir``, which for W&B is the shared ``save_dir``:
    a second run there collides with the first. The run directory is decided on rank 0 and
    broadcast, so under DDP every rank agrees and only rank 0 writes.
    """

    resumed_run: Path | None = None  # the config.yaml of the run a `fit` resumes, on rank 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        run_dir = trainer.strategy.broadcast(run_directory(trainer))
        path = Path(run_dir) / self.config_filename
        # A resumed run continues in its own directory: the config that started it stays.
        if trainer.is_global_zero:
            # Resumed into its own run, with checkpoints: a run whose config.yaml is gone gets none
            # claiming this resume's settings for every step, only its config.from_step_<N>.yaml.
            run_has_checkpoints = any(path.parent.glob("checkpoints/*"))
            if stage == "fit" and self.config.get("ckpt_path") and run_has_checkpoints:
                self.resumed_run = path  # compared once the checkpoint is restored, if it trains on
            elif not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                self.save_config(path)
            for logger in trainer.loggers if path.exists() else []:
                if isinstance(logger, WandbLogger):
                    upload_config(logger, path)
                elif isinstance(logger, MLFlowLogger):
                    upload_config_to_mlflow(logger, path)
        self.already_saved = True

    def save_config(self, path: Path) -> None:
        if self.multifile:
            self.parser.save(self.config, path, skip_unset=False, multifile=True)
        else:  # in one step: a kill leaves no empty config.yaml
            write_atomic(path, self.parser.dump(self.config, skip_unset=False))

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.resumed_run is not None:
            self.save_resume(self.resumed_run, trainer.global_step)

    def save_resume(self, path: Path, step: int) -> None:
        """A resume whose settings differ from those the run last trained with (its ``config.yaml``,
        or the newest resume's config) trains on with them from optimizer step ``step``: said,
        setting by setting, and its config saved beside as ``config.from_step_<N>.yaml``, so the
        run's folder says how each step was trained. A requeued job resuming with the same settings
        again says nothing, and a resume with nothing left to train (no training starts) nothing."""
        in_effect, saved = settings_in_effect(path, step)
        config = self.parser.dump(self.config, skip_unset=False)
        changed = differences(yaml.safe_load(config), saved) if isinstance(saved, dict) else [saved]
        if not changed:
            return
        resumed = path.with_name(f"{path.stem}.from_step_{step}.yaml")
        header = (
            f"# The settings this run trained with from step {step} on ({path.name}: those it began with)"
        )
        write_atomic(resumed, f"{header}\n{config}")
        back = f"; to resume it with the earlier ones: {current().command} fit --config {in_effect} "
        back += "--ckpt_path last"
        rank_zero_warn(
            f"Resuming {path.parent} with other settings than its {in_effect.name}: {'; '.join(changed)}. "
            f"The run trains on with these (saved in {resumed})" + (back if in_effect.exists() else ".")
        )


def settings_in_effect(path: Path, step: int) -> tuple[Path, dict | str]:
    """The config a resume from optimizer step ``step`` trained on before (the newest
    ``config.from_step_<N>.yaml`` at or before ``step``, else ``config.yaml``) and its settings, or
    why there are none to compare with: deleted, edited by hand, emptied by a kill under kit 1.0."""
    resumes = [p.stem.rpartition("_")[2] for p in path.parent.glob(f"{path.stem}.from_step_*.yaml")]
    earlier = [int(n) for n in resumes if n.isdigit() and int(n) <= step]
    in_effect = path.with_name(f"{path.stem}.from_step_{max(earlier)}.yaml") if earlier else path
    if not in_effect.exists():
        return in_effect, f"{path.name} is missing, so the settings before step {step} are unknown"
    try:
        saved = load(in_effect.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as error:
        return in_effect, f"{in_effect.name} cannot be read ({type(error).__name__})"
    if not isinstance(saved, dict):
        what = "empty" if saved is None else type(saved).__name__
        return in_effect, f"{in_effect.name} holds no settings ({what})"
    return in_effect, with_new_paths(saved)  # a run from before the kit's split: the same classes


def differences(now: object, saved: object, key: str = "") -> list[str]:
    """``key=<now> (was <saved>)`` for each setting that differs, down to the init_args of
    the same class at the same place (a list item added or another class: the whole entry, by its
    class)."""
    if key in SET_BY_RESUME:
        return []
    if isinstance(now, dict) and isinstance(saved, dict) and now.get("class_path") == saved.get("class_path"):
        names = sorted(set(now) | set(saved))
        return [
            d
            for name in names
            for d in differences(now.get(name), saved.get(name), f"{key}.{name}".lstrip("."))
        ]
    if isinstance(now, list) and isinstance(saved, list) and len(now) == len(saved):
        return [
            d
            for i, pair in enumerate(zip(now, saved, strict=True))
            for d in differences(*pair, f"{key}[{i}]")
        ]
    return [] if now == saved else [f"{key}={short(now)} (was {short(saved)})"]


def short(value: object) -> str:
    """A setting as the warning shows it: a class by its class path, a list item by item, the rest as
    a flag takes it (``false``, ``null``)."""
    if isinstance(value, list):
        return f"[{', '.join(map(short, value))}]"
    if isinstance(value, dict) and "class_path" in value:
        return str(value["class_path"])
    return json.dumps(value, default=str)
