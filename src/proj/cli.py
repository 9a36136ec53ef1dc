"""The command line: ``python -m proj {fit,validate,test,predict} --config A.yaml [--config B.yaml]``.

A thin ``LightningCLI``: every command starts from ``configs/defaults.yaml`` (the standard callbacks
are keys of their own there, so a config changes one setting without restating a list), model and
data are chosen by ``class_path``, the data module's facts are linked into the model, the resolved
config is written into the run's own directory, and ``fit`` can finish by testing its best checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
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
)
from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import rank_zero_info

from proj.callbacks import OptunaPruning, ValidateAtEnd
from proj.preflight import (
    ConfigError,
    check_config_files,
    check_environment,
    check_fits_model,
    check_model_fits_data,
    check_save_dir,
    check_seed,
    check_trainer,
    check_weights_only,
    read_weights,
)
from proj.runs import (
    RunConfigSaver,
    RunInUseError,
    RunLock,
    claim_run_directory,
    resolve_checkpoint,
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
    # proj.reliability: what keeps a killed, preempted or diverging run's work safe.
    "exact_resume": Callback,
    "preemption": Callback,
    "stop_on_divergence": Callback,
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


# Set to 1, a user error shows its traceback too (and is raised as it was), as for a bug.
DEBUG_VARIABLE = "PROJ_DEBUG"
# What the operating system says when the disk cannot take a file: said as such, not as a traceback.
# (A save_dir that is no folder, or not writable, is refused before the run: preflight.check_save_dir.)
DISK_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}


def debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").lower() in ("1", "true", "yes")


class ProjArgumentParser(LightningArgumentParser):
    """Errors in what was typed, said in a few lines: the message without jsonargparse's dumps of
    the whole parsed value (``Given value: Namespace(...)``, a screen long) or the usage of every
    option, which ``--help`` shows."""

    def error(self, message: str, ex: Exception | None = None) -> None:
        if debugging() or not self.exit_on_error:
            super().error(message, ex)
        lines = [line for line in message.splitlines() if not line.strip().startswith("Given value")]
        sys.stderr.write("error: " + "\n".join(lines) + "\n(--help lists the options.)\n")
        raise SystemExit(2)


class ProjCLI(LightningCLI):
    def __init__(self, args: ArgsType = None, run: bool = True) -> None:
        self.config_files = config_paths(sys.argv[1:] if args is None else args)
        super().__init__(
            model_class=LightningModule,
            datamodule_class=LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=RunConfigSaver,
            parser_class=ProjArgumentParser,
            seed_everything_default=DEFAULT_SEED,
            trainer_defaults={
                # What Lightning writes without a logger (fast_dev_run's checkpoints, finder
                # checkpoints) lands under runs/ too, never in the working folder.
                "default_root_dir": "runs",
                "callbacks": [ValidateAtEnd()],
            },
            parser_kwargs={"default_env": True, **defaults_for(self.subcommands() if run else None)},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for key, base in STANDARD_CALLBACKS.items():
            parser.add_subclass_arguments(base, key, fail_untyped=False, required=False)
        parser.add_subclass_arguments(CheckpointIO, "checkpoint_io", fail_untyped=False, required=False)
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
        check_config_files(self.config_files, parser)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        check_model_fits_data(config, parser)
        check_seed(config, parser)
        if subcommand:
            check_environment(self._subcommand_parsers[subcommand], subcommand)
            check_trainer(config.trainer, parser, subcommand)
            check_weights_only(config, parser)
            check_save_dir(config, parser)
            resolve_checkpoint(config, subcommand, parser)

    def instantiate_classes(self) -> None:
        """Build the classes, turning a constructor's refusal into a ``ConfigError`` that names the
        config key and class it came from (jsonargparse gives neither)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        try:
            super().instantiate_classes()
        except Exception as error:
            if debugging() or isinstance(error, ConfigError):
                raise
            raise ConfigError(refusal(error, config)) from error
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and Path(ckpt_path).is_file():
            check_fits_model(read_weights(ckpt_path, "--ckpt_path"), self.model, "--ckpt_path", ckpt_path)

    def instantiate_trainer(self, **kwargs) -> Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        listed = config.trainer.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        # The standard callbacks first, then what trainer.callbacks adds: the order of a single list.
        callbacks = [config[key] for key in STANDARD_CALLBACKS if config.get(key) is not None] + listed
        # A trial of `python -m proj sweep` reports to its study; not in the config, so that the saved
        # config.yaml repeats the trial alone.
        if self.subcommand == "fit" and (pruning := OptunaPruning.from_environment()) is not None:
            callbacks.append(pruning)
        if config.trainer.get("enable_progress_bar") is False:
            # Switching the bar off drops the configured one, where Lightning would refuse a Trainer
            # without a bar but with one in its callbacks.
            callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
        trainer = super().instantiate_trainer(**{"callbacks": callbacks, **kwargs})
        # Only in place of the default: a strategy's own (FSDP, DeepSpeed) or one given in
        # trainer.plugins is kept.
        io = config.get("checkpoint_io")
        if io is not None and type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = io
        load_weights_only(trainer.strategy)
        return trainer

    def before_fit(self) -> None:
        claim_run_directory(self.trainer)

    def before_validate(self) -> None:
        claim_run_directory(self.trainer)

    def before_test(self) -> None:
        claim_run_directory(self.trainer)

    def before_predict(self) -> None:
        claim_run_directory(self.trainer)

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


def load_weights_only(strategy: Strategy) -> None:
    """Every checkpoint Lightning loads for this command (``--ckpt_path`` including ``hpc``, the best
    checkpoint ``test_after_fit`` follows, the tuners' own) is read with ``weights_only=True``,
    whatever asks otherwise (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``, a strategy's default), so a
    crafted file cannot run code: this template's checkpoints hold plain values only. Wrapped on
    the strategy, which every load goes through, whatever its checkpoint IO."""
    load = strategy.load_checkpoint

    def load_checkpoint(checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        try:
            return load(checkpoint_path, weights_only=True)
        except pickle.UnpicklingError as error:
            raise ConfigError(
                f"checkpoint '{checkpoint_path}' holds pickled objects that `weights_only=True` refuses "
                f"to load, so it was not loaded ({str(error).splitlines()[0]}). Use a checkpoint written "
                "by this template, whose hyperparameters are plain values."
            ) from None

    strategy.load_checkpoint = load_checkpoint


def refusal(error: BaseException, config) -> str:
    """What a constructor refused, as ``"<key> (<class path>): <its message>"`` for the class from the
    config that raised it, found on the traceback of ``error`` or of the error it wraps (jsonargparse
    wraps it in a dump of every subtype it tried). The key is left out when the message starts
    with it already, and is unknown when no class of the config raised ``error``."""
    classes = {}
    for key in ("model", "model.init_args.net", "data"):
        spec = config
        for part in key.split("."):
            spec = spec.get(part) if hasattr(spec, "get") else None
        class_path = spec.get("class_path") if hasattr(spec, "get") else None
        if class_path:
            module, name = class_path.rsplit(".", 1)
            with contextlib.suppress(ImportError, AttributeError):
                classes[getattr(importlib.import_module(module), name)] = (key, class_path)
    cause: BaseException | None = error
    while cause is not None:
        frame = cause.__traceback__
        while frame is not None:
            code = frame.tb_frame.f_code
            built = frame.tb_frame.f_locals.get("self") if code.co_name == "__init__" else None
            if type(built) in classes:
                key, class_path = classes[type(built)]
                named = str(cause).startswith((f"{key}.", f"{key}:"))
                return str(cause) if named else f"{key} ({class_path}): {cause}"
            frame = frame.tb_next
        cause = cause.__cause__ or cause.__context__
    return str(error)


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
    """The files (or, by mistake, folders) a command line passes as ``--config``, in order."""
    if not isinstance(args, (list, tuple)):
        return []
    paths = []
    for index, arg in enumerate(args):
        before = args[index - 1] if index else None
        if isinstance(arg, str) and arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
        elif before in ("--config", "-c") and isinstance(arg, str):
            paths.append(arg)
    return [path for path in paths if Path(path).exists()]


def main(args: ArgsType = None, run: bool = True) -> ProjCLI:
    """Entry point for ``python -m proj`` and for tests and notebooks (``main(["fit", ...])``)."""
    try:
        return ProjCLI(args=args, run=run)
    except RunInUseError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ConfigError, OSError) as error:
        message = user_error(error)
        if message is None or debugging():
            raise
        RunLock.remove_new_runs()
        print(f"error: {message}\n({DEBUG_VARIABLE}=1 shows where it was raised.)", file=sys.stderr)
        raise SystemExit(2) from None
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
        # Torn down here rather than by the interpreter's exit, where gloo's threads can abort
        # the process ("terminate called without an active exception") after a finished run.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def user_error(error: BaseException) -> str | None:
    """The message for an error in what the user gave (a setting, a file, a checkpoint) or a disk
    that cannot take the run's files; None for anything else, which keeps its traceback."""
    if isinstance(error, ConfigError):
        return str(error)
    if isinstance(error, OSError) and error.errno in DISK_ERRORS:
        where = f"'{error.filename}'" if error.filename else "the run's files"
        return (
            f"cannot write {where}: {error.strerror or error}. Free disk space, or point "
            "trainer.logger.init_args.save_dir at a writable folder with room."
        )
    return None


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank died (``kill -9``, a lost node)."""
    if not torch.distributed.is_available():
        return False
    text = str(error)
    return isinstance(error, torch.distributed.DistError) or any(
        sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )
