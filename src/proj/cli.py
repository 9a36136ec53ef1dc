"""The command line: ``python -m proj {fit,validate,test,predict} --config A.yaml [--config B.yaml]``.

A thin ``LightningCLI``: model and data are chosen by ``class_path``, the data module's facts are
linked into the model, the resolved config is written into the run's own directory, and ``fit`` can
finish by testing its best checkpoint.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import pickle
import sys
import zipfile
from pathlib import Path

import torch
import yaml
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import (
    ArgsType,
    LightningArgumentParser,
    LightningCLI,
    SaveConfigCallback,
)
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn

from proj.callbacks import ExactResume, Preemption, StopOnDivergence
from proj.checkpoint_io import AtomicCheckpointIO

DEFAULT_SEED = 42
_SPECIAL_CKPT_PATHS = {"last", "best", "hpc", "registry"}


def run_directory(trainer: Trainer) -> str:
    """``<save_dir>/<name>/<version>`` of the first logger: the folder ``ModelCheckpoint`` also
    uses, so a run's config, checkpoints and logs sit together whatever the logger (W&B included)."""
    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


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


def upload_config(logger: WandbLogger, path: Path) -> None:
    """The run's config in W&B twice: as the run's config (each key searchable and comparable across
    runs) and as the file itself, ``run_config.yaml``, which ``fit --config`` repeats the run from.

    W&B keeps its own ``config.yaml`` among the run's files, hence the other name. Resumed, the
    W&B run receives the config that started it, as the run directory holds it.
    """
    text = path.read_text()
    run = logger.experiment
    run.config.update(yaml.safe_load(text), allow_val_change=True)
    copy = Path(run.dir) / "run_config.yaml"
    copy.write_text(text)
    run.save(str(copy), base_path=run.dir, policy="now")


def upload_config_to_mlflow(logger: MLFlowLogger, path: Path) -> None:
    """The run's config in MLflow twice: as the run's params, one per dotted key such as
    ``data.init_args.batch_size`` (the MLflow UI filters and compares runs by them), and as the
    artifact ``config.yaml``, which ``fit --config`` repeats the run from.

    MLflow refuses a param value over its length limit: such a value is cut, ends with a note saying
    so, and is named in a warning; the artifact keeps it whole. Resumed, the run receives the config
    that started it again, as the run directory holds it: MLflow accepts a param logged again only
    with the same value.
    """
    from mlflow.entities import Param
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

    note = " ... [cut: whole in the artifact config.yaml]"
    params = flat_params(yaml.safe_load(path.read_text()))
    if too_long := [key for key, value in params.items() if len(value) > MAX_PARAM_VAL_LENGTH]:
        rank_zero_warn(f"MLflow params cut to {MAX_PARAM_VAL_LENGTH} characters: {', '.join(too_long)}")
    for key in too_long:
        params[key] = params[key][: MAX_PARAM_VAL_LENGTH - len(note)] + note
    entries = [Param(key, value) for key, value in params.items()]
    client, run_id = logger.experiment, logger.run_id
    for start in range(0, len(entries), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=entries[start : start + MAX_PARAMS_TAGS_PER_BATCH])
    client.log_artifact(run_id, str(path))


def flat_params(value: object, key: str = "") -> dict[str, str]:
    """A config as ``{dotted key: text}``: mappings and lists of mappings (the callbacks) are
    opened, so each setting is its own param; other values are written as JSON (``[32, 64]``,
    ``true``, ``null``), strings as they are."""
    if isinstance(value, dict) and value:
        items = value.items()
    elif isinstance(value, list) and any(isinstance(item, dict) for item in value):
        items = enumerate(value)
    else:
        return {key: value if isinstance(value, str) else json.dumps(value, default=str)}
    prefix = f"{key}." if key else ""
    return {k: v for name, item in items for k, v in flat_params(item, f"{prefix}{name}").items()}


class ProjCLI(LightningCLI):
    def __init__(self, args: ArgsType = None, run: bool = True) -> None:
        super().__init__(
            model_class=LightningModule,
            datamodule_class=LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=RunConfigSaver,
            seed_everything_default=DEFAULT_SEED,
            trainer_defaults={"callbacks": [ExactResume(), Preemption(), StopOnDivergence()]},
            parser_kwargs={"default_env": True},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After `fit`, run `test` on the best checkpoint (or the final weights without one).",
        )
        # A link whose source the chosen data module lacks, or whose target the chosen model lacks,
        # is skipped, so image and text tasks share these.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments(
            "data.num_classes", "model.init_args.net.init_args.num_classes", apply_on="instantiate"
        )
        parser.link_arguments(
            "data.input_shape", "model.init_args.net.init_args.input_shape", apply_on="instantiate"
        )
        parser.link_arguments("data.vocab", "model.init_args.vocab", apply_on="instantiate")
        parser.link_arguments(
            "data.vocab_size", "model.init_args.net.init_args.vocab_size", apply_on="instantiate"
        )
        # The context length is stated once, on the network; the data module cuts windows to match.
        parser.link_arguments(
            "model.init_args.net.init_args.block_size", "data.init_args.block_size", apply_on="parse"
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        check_yaml_syntax(sys.argv[1:] if args is None else args, parser)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        check_model_fits_data(self.config[subcommand] if subcommand else self.config, parser)
        if subcommand == "fit":
            resume_into_run(self.config.fit, parser)
        if subcommand:
            check_trainer(self.config[subcommand].trainer, parser)
            check_ckpt_path(self.config[subcommand].get("ckpt_path"), parser, self.config[subcommand])

    def instantiate_trainer(self, **kwargs) -> Trainer:
        config = (self.config_init[self.subcommand] if self.subcommand else self.config_init).trainer
        if config.get("enable_progress_bar") is False and "callbacks" not in kwargs:
            # The experiments configure their progress bar (its refresh rate): switching the bar off
            # drops it, where Lightning would refuse a Trainer without a bar but with one in its callbacks.
            callbacks = config.get("callbacks") or []
            callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
            kwargs["callbacks"] = [c for c in callbacks if not isinstance(c, ProgressBar)]
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def before_fit(self) -> None:
        for callback in self.trainer.callbacks:
            if isinstance(callback, ExactResume):
                callback.keep_logged_metrics(self.trainer)

    def after_fit(self) -> None:
        if not self.config.fit.test_after_fit or self.trainer.interrupted:
            return
        checkpoint = self.trainer.checkpoint_callback
        best = self.trainer.strategy.broadcast(checkpoint.best_model_path if checkpoint is not None else "")
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)


def experiment_dir(config) -> Path | None:
    """``<save_dir>/<name>`` of the configured logger: the folder holding one version per run.

    For W&B that is ``<save_dir>/<project>`` (its ``name`` titles a run), shared by every
    experiment logging to the project; for MLflow, ``<save_dir>/<MLflow experiment id>``.
    """
    logger = config.trainer.get("logger")
    init_args = logger.get("init_args") if hasattr(logger, "get") else None
    if init_args is None:
        return None
    save_dir = init_args.get("save_dir") or config.trainer.get("default_root_dir") or "."
    kind = logger_kind(config)
    if kind == "wandb":
        project = init_args.get("project") or os.environ.get("WANDB_PROJECT", "lightning_logs")
        return Path(save_dir) / project
    if kind == "mlflow":
        return mlflow_experiment_dir(init_args, config.trainer.get("default_root_dir"))
    name = init_args.get("name") or init_args.get("project") or "lightning_logs"
    return Path(save_dir) / str(name)


def mlflow_experiment_dir(init_args, default_root_dir: str | None) -> Path:
    """The folder MLFlowLogger's runs get, as it names it: ``<save_dir>/<experiment id>``, where the
    id is the tracking store's, so the store is asked, and ``save_dir`` is the folder of a ``file:``
    store, else the Trainer's ``default_root_dir``. An experiment not in the store yet has no runs:
    its folder is one that does not exist."""
    from mlflow.tracking import MlflowClient

    uri = init_args.get("tracking_uri") or f"file:{init_args.get('save_dir')}"  # as MLFlowLogger does
    name = init_args.get("experiment_name")
    experiment = MlflowClient(uri).get_experiment_by_name(name)
    save_dir = uri.removeprefix("file:") if uri.startswith("file:") else default_root_dir or "."
    return Path(save_dir) / (experiment.experiment_id if experiment else f"(no MLflow experiment {name})")


def logger_kind(config) -> str | None:
    """``"wandb"`` or ``"mlflow"``: the loggers whose run directories are named by the run's own id
    and share a folder with other experiments' runs; None for the others."""
    logger = config.trainer.get("logger")
    class_path = logger.get("class_path") if hasattr(logger, "get") else None
    if not class_path:
        return None
    cls = _import(class_path)
    return "wandb" if issubclass(cls, WandbLogger) else "mlflow" if issubclass(cls, MLFlowLogger) else None


def same_experiment(run: Path, config) -> bool:
    """Whether a run directory in a shared folder belongs to this experiment, by the config it saved.

    A W&B run carries the experiment's ``name`` (its title). MLFlowLogger takes no name, so the
    experiment's is dropped when the overlay swaps the logger in: an MLflow run belongs if it trains
    the same model, network and data classes.
    """
    kind = logger_kind(config)

    def identity(config: dict) -> tuple:
        if kind == "wandb":
            return (config["trainer"]["logger"]["init_args"].get("name"),)
        net = config["model"].get("init_args", {}).get("net")
        net = net.get("class_path") if isinstance(net, dict) else net
        return config["model"]["class_path"], net, config["data"]["class_path"]

    try:
        return identity(yaml.safe_load((run / "config.yaml").read_text())) == identity(config.as_dict())
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return False


def loadable(path: Path) -> bool:
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        rank_zero_warn(f"Skipping unreadable checkpoint {path} ({type(error).__name__}: {error})")
        return False
    return True


def resume_into_run(config, parser: LightningArgumentParser) -> None:
    """Make ``fit --ckpt_path last`` resume the newest loadable checkpoint of the experiment
    (``auto``: the same, or a fresh start when there is none, for job scripts that requeue), and
    make any resumed checkpoint continue logging into its own run directory (for W&B and MLflow:
    the same run, whose id is the directory's name).

    Lightning's own ``last`` looks only in the new run's empty folder and then silently trains from
    scratch. Here every ``<experiment>/<version>/checkpoints/*.ckpt`` is a candidate, newest first;
    unreadable ones (a truncated save) are skipped with a warning; none at all is an error.
    """
    ckpt_path = config.get("ckpt_path")
    root = None if ckpt_path is None else experiment_dir(config)  # MLflow's asks the tracking store
    if ckpt_path is None or root is None:
        return
    kind = logger_kind(config)
    if ckpt_path in ("last", "auto"):
        candidates = sorted(root.glob("*/checkpoints/*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
        if kind is not None:
            candidates = [p for p in candidates if same_experiment(p.parent.parent, config)]
        found = next((p for p in candidates if loadable(p)), None)
        if found is None and ckpt_path == "auto":
            config.ckpt_path = None
            return
        if found is None:
            parser.error(
                f"--ckpt_path last: no readable checkpoint under {root}/*/checkpoints/. Drop --ckpt_path "
                "to train from scratch (or use --ckpt_path auto: resume if possible, else start), or "
                "pass the path of a .ckpt file to resume from."
            )
        config.ckpt_path = ckpt_path = str(found)
    run = Path(ckpt_path).resolve().parent.parent
    if Path(ckpt_path).parent.name == "checkpoints" and run.parent == root.resolve():
        if kind == "mlflow":  # MLFlowLogger takes the run's id, and no version
            config.trainer.logger.init_args.run_id = run.name
            return
        version = run.name.removeprefix("version_")
        numbered = version.isdigit() and kind is None  # a W&B run id may be all digits
        config.trainer.logger.init_args.version = int(version) if numbered else run.name


def check_yaml_syntax(args: ArgsType, parser: LightningArgumentParser) -> None:
    """Name the file and line of a YAML syntax error (jsonargparse reports "<unicode string>")."""
    if not isinstance(args, (list, tuple)):
        return
    paths = [a.split("=", 1)[1] for a in args if isinstance(a, str) and a.startswith("--config=")]
    paths += [b for a, b in itertools.pairwise(args) if a in ("--config", "-c") and isinstance(b, str)]
    for path in paths:
        if not Path(path).is_file():
            continue
        try:
            yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as error:
            where = f" at line {error.problem_mark.line + 1}" if getattr(error, "problem_mark", None) else ""
            problem = getattr(error, "problem", None) or error
            parser.error(f"--config {path}: not valid YAML{where} ({problem}). Fix the syntax there.")


def check_model_fits_data(config, parser: LightningArgumentParser) -> None:
    """The model's ``data_facts`` (what the CLI links into it) must exist on the data module: an
    image model on text data would otherwise fail deep inside its constructor."""
    model_path, data_path = config.model.get("class_path"), config.data.get("class_path")
    if not (model_path and data_path):
        return
    needs = getattr(_import(model_path), "data_facts", ())
    missing = [fact for fact in needs if not hasattr(_import(data_path), fact)]
    if missing:
        parser.error(
            f"model {model_path} needs {', '.join(missing)} from its data module, which {data_path} "
            "does not provide: the model and the data do not fit together (an overlay for another "
            "experiment?). Stack overlays on the experiment they were written for."
        )


def _import(class_path: str) -> type:
    module, name = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def check_trainer(trainer, parser: LightningArgumentParser) -> None:
    """Catch trainer settings that Lightning accepts but that cannot work or silently misbehave."""
    accelerator, devices = trainer.get("accelerator"), trainer.get("devices")
    if accelerator in ("gpu", "cuda"):
        available = torch.cuda.device_count()
        if available == 0:
            parser.error(
                f"trainer.accelerator={accelerator} but no CUDA GPU is visible on this machine. Use "
                "--trainer.accelerator=auto (or stack configs/trainer/cpu.yaml instead of gpu.yaml)."
            )
        if isinstance(devices, int) and devices > available:
            parser.error(
                f"trainer.devices={devices} but this machine has {available} GPU(s). Use "
                f"--trainer.devices={available} or --trainer.devices=auto."
            )
    clip = trainer.get("gradient_clip_val")
    if clip is not None and clip <= 0:
        parser.error(
            f"trainer.gradient_clip_val={clip}: must be positive (a negative norm would flip the "
            "gradients' sign). Use a value such as 1.0, or null to turn clipping off."
        )


def check_ckpt_path(ckpt_path: str | None, parser: LightningArgumentParser, config=None) -> None:
    """Refuse a missing, truncated, code-carrying or foreign checkpoint before anything is built."""
    if ckpt_path is None or ckpt_path in _SPECIAL_CKPT_PATHS:
        return
    path = Path(ckpt_path)
    if not path.is_file():
        parser.error(
            f"--ckpt_path: no checkpoint file at '{ckpt_path}'. Pass a .ckpt written by `fit` "
            "(runs/<experiment>/<version>/checkpoints/) or 'last' / 'best'."
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        parser.error(
            f"--ckpt_path: '{ckpt_path}' holds pickled objects that `weights_only=True` refuses "
            f"to load, so it was not loaded ({str(error).splitlines()[0]}). Use a checkpoint "
            "written by this template, whose hyperparameters are plain values."
        )
    except (RuntimeError, zipfile.BadZipFile, EOFError, OSError) as error:
        parser.error(
            f"--ckpt_path: '{ckpt_path}' is not a readable checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0]}). It may be truncated by an interrupted save: pick an "
            "earlier checkpoint from the same folder."
        )
    if config is not None:
        check_same_model(checkpoint, config, ckpt_path, parser)


def check_same_model(checkpoint: dict, config, ckpt_path: str, parser: LightningArgumentParser) -> None:
    """A checkpoint's module and network class must be the ones the config builds."""
    saved = checkpoint.get("hyper_parameters") or {}
    wanted = config.model
    pairs = [("model", saved.get("_class_path"), wanted.get("class_path"))]
    saved_net, wanted_net = saved.get("net"), wanted.get("init_args", {}).get("net")
    if isinstance(saved_net, dict) and wanted_net is not None:
        pairs.append(("model.init_args.net", saved_net.get("class_path"), wanted_net.get("class_path")))
    for field, was, now in pairs:
        if was and now and was != now:
            parser.error(
                f"--ckpt_path: '{ckpt_path}' holds a {was} but {field} is {now}. Use the config the "
                "checkpoint was trained with (its run directory's config.yaml) or a checkpoint of this model."
            )


def main(args: ArgsType = None, run: bool = True) -> ProjCLI:
    """Entry point for ``python -m proj`` and for tests and notebooks (``main(["fit", ...])``)."""
    return ProjCLI(args=args, run=run)
