"""The command line: ``python -m proj {fit,validate,test,predict} --config A.yaml [--config B.yaml]``.

A thin ``LightningCLI``: every command starts from ``configs/defaults.yaml`` (the standard callbacks
are keys of their own there, so a config changes one setting without restating a list), model and
data are chosen by ``class_path``, the data module's facts are linked into the model, the resolved
config is written into the run's own directory, and ``fit`` can finish by testing its best checkpoint.
"""

from __future__ import annotations

import importlib
import json
import logging
import pickle
import sys
import warnings
import zipfile
from pathlib import Path

import torch
import yaml
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
)
from lightning.pytorch.cli import (
    ArgsType,
    LightningArgumentParser,
    LightningCLI,
    SaveConfigCallback,
)
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, WandbLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from proj.callbacks import ExactResume, Preemption, StopOnDivergence, ValidateAtEnd
from proj.checkpoint_io import AtomicCheckpointIO
from proj.runs import (
    RunInUseError,
    RunLock,
    best_of_run,
    experiment_dir,
    logger_kind,
    newest_checkpoint,
    remove_stale_temporaries,
    restore_metrics,
    run_directory,
    take_metrics_aside,
    version_of,
)

DEFAULT_SEED = 42

# What every experiment starts from, read before any --config: the repository's configs/defaults.yaml.
DEFAULTS = Path(__file__).resolve().parents[2] / "configs" / "defaults.yaml"
# The logger the run's name is a default for; configs/defaults.yaml, read after, gives the rest of it
# (or another logger, which keeps the name where it takes one).
DEFAULT_LOGGER = "lightning.pytorch.loggers.CSVLogger"

# The callbacks every experiment gets, each under a key of its own (settings in configs/defaults.yaml),
# so that a config or a flag changes one setting (`--early_stopping.patience=4`) without restating a
# list, and `null` drops one. The base class says what may replace each.
STANDARD_CALLBACKS: dict[str, type[Callback]] = {
    "checkpoint": ModelCheckpoint,
    "last_checkpoint": ModelCheckpoint,
    "early_stopping": EarlyStopping,
    "lr_monitor": LearningRateMonitor,
    "progress_bar": ProgressBar,
    "throughput": Callback,
}

# What a run prints is what the user can act on. These say nothing actionable: an advert for a
# hosted service, a deprecation inside Lightning's own code, and the CSV logger's notice that it
# will delete metrics.csv, which the CLI moves aside and writes back before the logger opens it.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")


class _NoTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(_NoTips())


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
        self.config_files = config_paths(sys.argv[1:] if args is None else args)
        super().__init__(
            model_class=LightningModule,
            datamodule_class=LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=RunConfigSaver,
            seed_everything_default=DEFAULT_SEED,
            trainer_defaults={
                # What Lightning writes without a logger (fast_dev_run's checkpoints, finder
                # checkpoints) lands under runs/ too, never in the working folder.
                "default_root_dir": "runs",
                "callbacks": [ExactResume(), Preemption(), StopOnDivergence(), ValidateAtEnd()],
            },
            parser_kwargs={"default_env": True, **defaults_for(self.subcommands() if run else None)},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for key, base in STANDARD_CALLBACKS.items():
            parser.add_subclass_arguments(base, key, fail_untyped=False, required=False)
        if self.config_files:
            # Runs are filed under the experiment's name, by default the file name of its config, so a
            # copied config logs apart from its original. A logger `name` in any config or flag wins.
            logger = {"class_path": DEFAULT_LOGGER, "init_args": {"name": Path(self.config_files[0]).stem}}
            parser.set_defaults({"trainer.logger": logger})
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After `fit`, run `test` on the best checkpoint (or the final weights without one).",
        )
        parser.add_argument(
            "--allow_untrained",
            type=bool,
            default=False,
            help="Let `validate`, `test` and `predict` run without --ckpt_path, on the weights the "
            "model is built with (untrained unless model.init_from loads some).",
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
        check_yaml_syntax(self.config_files, parser)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        check_model_fits_data(config, parser)
        if subcommand:
            check_trainer(config.trainer, parser)
            resolve_checkpoint(config, subcommand, parser)

    def instantiate_trainer(self, **kwargs) -> Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        listed = config.trainer.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        # The standard callbacks first, then what trainer.callbacks adds: the order of a single list.
        callbacks = [config[key] for key in STANDARD_CALLBACKS if config.get(key) is not None] + listed
        if config.trainer.get("enable_progress_bar") is False:
            # Switching the bar off drops the configured one, where Lightning would refuse a Trainer
            # without a bar but with one in its callbacks.
            callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
        trainer = super().instantiate_trainer(**{"callbacks": callbacks, **kwargs})
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def claim_run_directory(self) -> None:
        """Hold the run directory for this process, clear what a killed process left half-done there,
        and carry every row of its ``metrics.csv`` over, which the CSV logger would delete."""
        trainer = self.trainer
        if not trainer.is_global_zero or trainer.fast_dev_run or not trainer.loggers:
            return
        if trainer.loggers[0].version is None:  # a new W&B run: its own fresh id, nothing to keep
            return
        run = Path(run_directory(trainer))
        RunLock.acquire(run)
        remove_stale_temporaries(run)
        if isinstance(trainer.logger, CSVLogger):
            aside = take_metrics_aside(run)
            if aside is not None:
                restore_metrics(trainer.logger, aside)
        rank_zero_info(f"Run directory: {run}")

    def before_fit(self) -> None:
        self.claim_run_directory()

    def before_validate(self) -> None:
        self.claim_run_directory()

    def before_test(self) -> None:
        self.claim_run_directory()

    def before_predict(self) -> None:
        self.claim_run_directory()

    def after_fit(self) -> None:
        trainer = self.trainer
        best = trainer.strategy.broadcast(
            next((c.best_model_path for c in trainer.checkpoint_callbacks if c.best_model_path), "")
        )
        lasts = {c.last_model_path for c in trainer.checkpoint_callbacks if getattr(c, "last_model_path", "")}
        if best:
            rank_zero_info(f"Best checkpoint: {best}")
        for last in sorted(lasts):
            rank_zero_info(f"Last checkpoint: {last}")
        if not self.config.fit.test_after_fit or trainer.interrupted:
            return
        trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)


def resolve_checkpoint(config, subcommand: str, parser: LightningArgumentParser) -> None:
    """Turn ``--ckpt_path`` into the file the command loads, check it, and point the logger at that
    checkpoint's own run directory (for W&B and MLflow: the same run, whose id is the folder's name).

    ``last`` is the experiment's newest readable checkpoint over all its runs (``auto`` in ``fit``:
    the same, or a fresh start when there is none, for job scripts that requeue); ``best`` is the
    best checkpoint of that newest run. Lightning's own ``last`` and ``best`` look only in the new
    run's empty folder and then quietly fall back to untrained weights. ``validate``, ``test`` and
    ``predict`` never evaluate untrained weights unless ``--allow_untrained`` says so.
    """
    ckpt_path = config.get("ckpt_path")
    evaluating = subcommand != "fit"
    if ckpt_path is None:
        if evaluating and not config.get("allow_untrained") and not config.model.init_args.get("init_from"):
            parser.error(
                f"`{subcommand}` without --ckpt_path would use untrained weights. Pass --ckpt_path last "
                "(the experiment's newest checkpoint), --ckpt_path best (the best of its newest run) or "
                "the path of a .ckpt file; to evaluate untrained weights on purpose, --allow_untrained=true."
            )
        return
    if ckpt_path in ("hpc", "registry") or str(ckpt_path).startswith("registry:"):
        return
    root = experiment_dir(config)
    if ckpt_path in ("last", "auto", "best"):
        if root is None:
            parser.error(
                f"--ckpt_path {ckpt_path}: the config has no logger, so there is no "
                "runs/<experiment>/ folder to look in. Pass the path of a .ckpt file instead."
            )
        found = newest_checkpoint(config, root, resumable=not evaluating)
        if found is None and ckpt_path == "auto" and not evaluating:
            config.ckpt_path = None
            return
        if found is None:
            parser.error(
                f"--ckpt_path {ckpt_path}: no readable checkpoint under {root}/*/checkpoints/. "
                + (
                    "Run `fit` first, or pass the path of a .ckpt file."
                    if evaluating
                    else "Drop --ckpt_path to train from scratch (or use --ckpt_path auto: resume if "
                    "possible, else start), or pass the path of a .ckpt file to resume from."
                )
            )
        path, checkpoint = found
        if ckpt_path == "best":
            best = best_of_run(path, checkpoint)
            if best is None:
                parser.error(
                    f"--ckpt_path best: the newest run, {path.parent.parent}, recorded no best checkpoint "
                    "(no monitored ModelCheckpoint saved one). Use --ckpt_path last, or a .ckpt path."
                )
            path = best
        config.ckpt_path = ckpt_path = str(path)
    checkpoint = check_ckpt_path(ckpt_path, parser, config)
    if not evaluating and "optimizer_states" not in checkpoint:
        parser.error(
            f"--ckpt_path: '{ckpt_path}' holds weights only, no optimizer state, so `fit` cannot resume "
            "from it. To start training from these weights, use model.init_args.init_from where the "
            "model has it; to evaluate them, use `test` or `validate`."
        )
    run = Path(ckpt_path).resolve().parent.parent
    if root is not None and Path(ckpt_path).parent.name == "checkpoints":
        kind = logger_kind(config)
        version = version_of(run, root, numbered=kind is None)
        if version is not None and kind == "mlflow":  # MLFlowLogger takes the run's id, and no version
            config.trainer.logger.init_args.run_id = version
        elif version is not None:
            config.trainer.logger.init_args.version = version


def defaults_for(subcommands: dict | None) -> dict:
    """``parser_kwargs`` under which each subcommand's parser (or, without subcommands, the one
    parser) reads configs/defaults.yaml before anything else."""
    if not DEFAULTS.is_file():
        raise FileNotFoundError(
            f"{DEFAULTS}: the defaults every experiment starts from are missing. The CLI reads them "
            "from the repository's configs/ folder: run it from the checkout, installed in place "
            "(`make install`), and restore configs/defaults.yaml from git if it was deleted."
        )
    if subcommands is None:
        return {"default_config_files": [str(DEFAULTS)]}
    return {name: {"default_config_files": [str(DEFAULTS)]} for name in subcommands}


def config_paths(args: ArgsType) -> list[str]:
    """The files a command line passes as ``--config``, in order."""
    if not isinstance(args, (list, tuple)):
        return []
    paths = []
    for index, arg in enumerate(args):
        before = args[index - 1] if index else None
        if isinstance(arg, str) and arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
        elif before in ("--config", "-c") and isinstance(arg, str):
            paths.append(arg)
    return [path for path in paths if Path(path).is_file()]


def check_yaml_syntax(paths: list[str], parser: LightningArgumentParser) -> None:
    """Name the file and line of a YAML syntax error (jsonargparse reports "<unicode string>")."""
    for path in paths:
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


def check_ckpt_path(ckpt_path: str, parser: LightningArgumentParser, config=None) -> dict:
    """Refuse a missing, truncated, code-carrying or foreign checkpoint before anything is built."""
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
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        parser.error(
            f"--ckpt_path: '{ckpt_path}' holds no state_dict, so it is no Lightning checkpoint. Pass a "
            "checkpoint written by `fit` (runs/<experiment>/<version>/checkpoints/)."
        )
    if config is not None:
        check_same_model(checkpoint, config, ckpt_path, parser)
    return checkpoint


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
    try:
        return ProjCLI(args=args, run=run)
    except RunInUseError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except RuntimeError as error:
        if not lost_a_peer(error):
            raise
        print(
            f"error: another process of this distributed job stopped ({str(error).splitlines()[0]}). "
            "Its checkpoints are intact: resume with `fit --config <same configs> --ckpt_path last`.",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    finally:
        RunLock.release_all()


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank died (``kill -9``, a lost node)."""
    if not torch.distributed.is_available():
        return False
    text = str(error)
    return isinstance(error, torch.distributed.DistError) or any(
        sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )
