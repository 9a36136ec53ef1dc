"""The command line: ``python -m <package> {fit,validate,test,predict,export,optimize} --config A.yaml``,
with more ``--config`` files stacked after it.

A thin ``LightningCLI``: every command starts from the project's defaults file (the standard callbacks
are keys of their own there, so a config changes one setting without restating a list), model and
data are chosen by ``class_path``, the data module's facts are linked into the model, the resolved
config is written into the run's own directory, and ``fit`` can finish by testing its best checkpoint.
``export`` (``projkit.export``) turns a checkpoint into files a deployment runs without the template;
``optimize`` writes the data as streaming chunks (``projkit.data.streaming``)."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import torch
from jsonargparse import Namespace
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
)
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from projkit import moved_classes
from projkit.callbacks import OptunaPruning, ValidateAtEnd
from projkit.callbacks.kit_version import KitVersion
from projkit.checks.checkpoint import adopt_saved_classes, check_fits_model, refused_pickle
from projkit.checks.config import (
    check_config_files,
    check_credentials,
    check_defaults,
    check_finite,
    check_model_fits_data,
    check_seed,
    check_special_files,
    check_weights_only,
)
from projkit.checks.environment import check_environment, check_environment_names
from projkit.checks.model import check_monitors
from projkit.checks.names import check_names
from projkit.checks.save_dir import check_experiment_folders, check_save_dir
from projkit.checks.trainer import check_trainer
from projkit.context import current
from projkit.data.facts import NET, link_data_facts, use_checkpoint_facts
from projkit.errors import named_refusals, reported_errors
from projkit.export import ExportingTrainer
from projkit.internals.jsonargparse import subcommands_action
from projkit.internals.lightning import keep_hparams_from_loggers
from projkit.internals.stdlib import choice_help_actions
from projkit.layout import KIT_DEFAULTS
from projkit.lifetime import requeue_while_starting
from projkit.outcome import (
    NOTHING_TO_TRAIN,
    TESTED_ALREADY,
    print_metrics,
    say_how_fit_ended,
    tested_at,
    tested_marker,
)
from projkit.parser_errors import ShortErrorParser
from projkit.reliability import ContainedState, Preemption, guard_checkpoints
from projkit.reliability.preemption import without_slurm_requeue
from projkit.rundir.ckpt_path import ignored_model_settings, resolve_checkpoint
from projkit.rundir.claim import claim_run_directory
from projkit.rundir.config_file import RunConfigSaver
from projkit.rundir.lock import RunLock
from projkit.rundir.metrics import KeptMetrics
from projkit.rundir.naming import logger_kind
from projkit.strict_yaml import install as check_every_yaml

DEFAULT_SEED = 42
# Seconds between W&B's writes of the run's .wandb file (wandb.Settings.x_transaction_log_flush_interval),
# which is what a killed run's history loses at most. Set it to choose another.
WANDB_FLUSH_INTERVAL = "WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL"

# The logger the run's name is a default for; the defaults files, read after, give the rest of it
# (or another logger, which keeps the name where it takes one).
DEFAULT_LOGGER = "lightning.pytorch.loggers.CSVLogger"


# The callbacks every experiment gets, each under a key of its own (settings in projkit/defaults.yaml),
# so that a config or a flag changes one setting (`--early_stopping.patience=4`) without restating a
# list, and `null` drops one. The base class says what may replace each.
STANDARD_CALLBACKS: dict[str, type[Callback]] = {
    "checkpoint": ModelCheckpoint,
    "last_checkpoint": ModelCheckpoint,
    "early_stopping": EarlyStopping,
    "lr_monitor": LearningRateMonitor,
    "progress_bar": ProgressBar,
    "throughput": Callback,
    # projkit.reliability: what keeps a killed, preempted or diverging run's work safe.
    "exact_resume": Callback,
    "preemption": Callback,
    "stop_on_divergence": Callback,
}

# One line each for `python -m <package> --help` (Lightning's are the first line of the Trainer method's
# docstring, which for test and predict ends mid-sentence), and what the whole command does.
SUBCOMMANDS = {
    "fit": "Train, then test the best checkpoint.",
    "validate": "Evaluate a checkpoint on the validation set.",
    "test": "Evaluate a checkpoint on the test set.",
    "predict": "Predict with a checkpoint into predictions.csv.",
    "export": "Export a checkpoint: ONNX, torch.export, model.json.",
    "optimize": "Write the data as streaming chunks (LitData).",
    "sweep": "Run an Optuna sweep; each trial is a fit.",
    "serve": "Serve an export over HTTP: answers as predict does.",
}
# Started by projkit.project before Lightning is imported; listed in --help with the others.
OWN_SUBCOMMANDS = ("sweep", "serve")
DESCRIPTION_OF_PROG = (
    "Train, evaluate, export, sweep and serve models. `{prog} SUBCOMMAND --help` lists its options."
)

check_every_yaml()  # no key twice, no alias bomb, an empty init_args: as none
moved_classes.install()  # a class path from before the kit's split (<package>.optim.…) as the kit's


class ProjectCLI(LightningCLI):
    def __init__(self, args: ArgsType = None, run: bool = True) -> None:
        self.command_line = sys.argv[1:] if args is None else args
        moved_classes.forget()  # what an earlier command of this process read
        self.config_files = config_paths(self.command_line)
        try:
            super().__init__(
                model_class=LightningModule,
                datamodule_class=LightningDataModule,
                trainer_class=ExportingTrainer,
                subclass_mode_model=True,
                subclass_mode_data=True,
                save_config_callback=RunConfigSaver,
                parser_class=ShortErrorParser,
                seed_everything_default=DEFAULT_SEED,
                trainer_defaults={
                    # What Lightning writes without a logger (fast_dev_run's checkpoints, finder
                    # checkpoints) lands under runs/ too, never in the working folder.
                    "default_root_dir": "runs",
                    # ContainedState: a resumed checkpoint's state names files of its own run only.
                    "callbacks": [ValidateAtEnd(), ContainedState(), KitVersion()],
                },
                parser_kwargs={
                    "prog": current().command,
                    "description": DESCRIPTION_OF_PROG.format(prog=current().command),
                    "default_env": True,
                    **defaults_for(self.subcommands() if run else None),
                },
                auto_configure_optimizers=False,
                args=args,
                run=run,
            )
        except pickle.UnpicklingError as error:
            # Lightning's own loads (`--ckpt_path hpc`, the best checkpoint `test_after_fit` tests, a
            # finder's restore) refused by `weights_only=True`: the one it was loading, named.
            loading = getattr(getattr(self, "trainer", None), "ckpt_path", None)
            if loading is None:
                raise
            raise refused_pickle(f"checkpoint '{loading}'", error) from None
        finally:
            if run:  # the checkpoint's facts are this command's (with run=False: until the next one)
                use_checkpoint_facts(None)

    def subcommands(self) -> dict[str, set[str]]:
        """Only the subcommand the command line starts with, when it starts with one: building a
        subcommand's parser reads every class signature it may take (a tenth of a second each), and
        a command runs one. ``--help``, a misspelt subcommand or an option first get them all."""
        every = {**LightningCLI.subcommands(), **{c: {"model", "datamodule"} for c in ("export", "optimize")}}
        first = self.command_line[:1] if isinstance(self.command_line, (list, tuple)) else []
        return {name: every[name] for name in first if name in every} or every

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        """Each subcommand with its line of ``SUBCOMMANDS``, and ``sweep`` with the others when all are
        built (``--help``): ``__main__`` runs it before Lightning is imported."""
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if not add_subcommands:
            return
        subcommands = subcommands_action(self.parser)
        for choice in choice_help_actions(subcommands):
            choice.help = SUBCOMMANDS.get(choice.dest, choice.help)
        if len(subcommands.choices) == len(SUBCOMMANDS) - len(OWN_SUBCOMMANDS):
            # Here only: the sweep module imports Optuna and SQLAlchemy, which a `fit` never needs.
            from projkit import serve, sweep

            for name, module in (("sweep", sweep), ("serve", serve)):
                parser = module.add_arguments(ShortErrorParser(description=module.DESCRIPTION))
                subcommands.add_subcommand(name, parser, help=SUBCOMMANDS[name])

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for key, base in STANDARD_CALLBACKS.items():
            parser.add_subclass_arguments(base, key, fail_untyped=False, required=False)
        parser.add_subclass_arguments(CheckpointIO, "checkpoint_io", fail_untyped=False, required=False)
        if self.config_files:
            # Runs are filed under the experiment's name, by default the file name of its config, so a
            # copied config logs apart from its original. A logger `name` in any config or flag wins.
            logger = {"class_path": DEFAULT_LOGGER, "init_args": {"name": Path(self.config_files[0]).stem}}
            parser.set_defaults({"trainer.logger": logger})
        after_fit = "After `fit`, run `test` on the best checkpoint (or the final weights without one)."
        parser.add_argument("--test_after_fit", type=bool, default=False, help=after_fit)
        untrained = "Let `validate`, `test` and `predict` run without --ckpt_path, on the weights the "
        untrained += "model is built with (untrained unless model.init_from loads some)."
        parser.add_argument("--allow_untrained", type=bool, default=False, help=untrained)
        link_data_facts(parser)
        # The context length is stated once, on the network; the data module cuts windows to match.
        parser.link_arguments(f"{NET}.block_size", "data.init_args.block_size", apply_on="parse")

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        check_config_files(self.config_files, parser)
        command_line = self.command_line if isinstance(self.command_line, (list, tuple)) else []
        check_special_files(command_line, parser)
        check_environment_names(command_line, self.subcommands(), parser)
        if args is None:  # the command line: Lightning parses sys.argv
            super().parse_arguments(parser, args)
        else:
            # `<package>.main([...])`, from Python on purpose (a notebook, a test), where sys.argv holds
            # the kernel's or pytest's own flags: parsed as Lightning 2.6.6 does, without its warning
            # that "args" and sys.argv are both given.
            parse = parser.parse_object if isinstance(args, (dict, Namespace)) else parser.parse_args
            self.config = parse(args)
        subcommand = self.config.get("subcommand")
        if subcommand in OWN_SUBCOMMANDS:
            example = "sweep --config SWEEP.yaml" if subcommand == "sweep" else "serve EXPORT_FOLDER"
            parser.error(f"{subcommand}: start the command with it, as `{current().command} {example}`.")
        if subcommand:
            check_environment(self, subcommand)
        config = self.config[subcommand] if subcommand else self.config
        self.check_config(config, parser, subcommand)
        if subcommand and logger_kind(config) == "wandb":
            # W&B's service writes the run's .wandb file every 15 s by default, and a killed run
            # loses what it had not written (a run killed in its first 15 s: all of it).
            os.environ.setdefault(WANDB_FLUSH_INTERVAL, "1")

    def check_config(self, config, parser: LightningArgumentParser, subcommand: str | None) -> None:
        """Every check of a parsed config made before anything is built (tests/test_fuzz.py runs
        them on each value it tries, after parsing it alone)."""
        check_finite(config, parser)
        check_model_fits_data(config, parser)
        check_seed(config, parser)
        self.checkpoint = None  # --ckpt_path's file, read once here for the checks
        self.resumed_step = None  # the optimizer step a resumed `fit` starts from
        if subcommand:
            check_trainer(config.trainer, parser, subcommand)
            check_weights_only(config, parser)
            if "weights_only" in config:  # Lightning's argument, so that a crafted file cannot run code
                config.weights_only = True
            check_credentials(config, parser)
            check_names(config, parser, self.config_files)  # every name that becomes a path
            check_save_dir(config, parser)
            check_experiment_folders(config, parser)
            self.checkpoint = resolve_checkpoint(config, subcommand, parser)
            if subcommand == "fit" and self.checkpoint is not None:
                self.resumed_step = self.checkpoint.get("global_step")
        use_checkpoint_facts(self.checkpoint)
        # What the configs and flags say of the model, before Lightning replaces it by the
        # checkpoint's hyperparameters.
        self.given_model = config.model.clone() if self.checkpoint is not None else None

    def before_instantiate_classes(self) -> None:
        """All is read (the configs, the checkpoint): one warning for any class path of the kit's from
        before its split among it."""
        moved_classes.warn_of_old_paths()

    def instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self.given_model is not None:
            ignored = ignored_model_settings(self.given_model, config.model, self.subcommand)
            if ignored:
                rank_zero_warn(ignored)
        if self.subcommand == "export" and "compile" in config.model.get("init_args", {}):
            # torch.export traces the network's own code; compiling is how training runs it, and the
            # in-place compile keeps parameter names, so the checkpoint loads either way.
            config.model.init_args.compile = False
        with named_refusals(config):
            super().instantiate_classes()
        check_monitors(self.monitors(), self.model)
        if self.subcommand in ("validate", "test", "predict"):
            # The run's hparams.yaml (and a W&B or MLflow run's config) keep what `fit` trained with:
            # an evaluation's own data settings (a batch size, a predict path) are no run's.
            keep_hparams_from_loggers(self.model)
            if self.datamodule is not None:
                keep_hparams_from_loggers(self.datamodule)
        checkpoint, self.checkpoint = self.checkpoint, None
        if checkpoint is not None:
            check_fits_model(checkpoint, self.model, "--ckpt_path", config.ckpt_path)
            adopt_saved_classes(checkpoint, self.model)
        if self.subcommand in ("fit", "validate", "test", "predict"):
            # Each command that runs the Trainer takes its run directory over here, once all it was
            # given is checked and before its loggers open the folder (the CSV logger deletes an
            # existing metrics.csv as it opens); the run's config is saved there at setup. (`export`
            # locks the checkpoint's run itself.)
            claim_run_directory(self.trainer, training=self.subcommand == "fit")

    def monitors(self) -> dict[str, str | None]:
        """Each metric the command's callbacks and scheduler monitor, under the setting naming it."""
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        found = {
            f"{key}.init_args.monitor": getattr(config.get(key), "monitor", None)
            for key in STANDARD_CALLBACKS
        }
        listed = config.trainer.get("callbacks") or []
        for index, callback in enumerate(listed if isinstance(listed, list) else [listed]):
            name = f"trainer.callbacks[{index}] ({type(callback).__name__}).monitor"
            found[name] = getattr(callback, "monitor", None)
        found["model.init_args.scheduler_monitor"] = getattr(self.model, "scheduler_monitor", None)
        if self.subcommand == "fit" and (pruning := OptunaPruning.from_environment()) is not None:
            found["metric (of the sweep config)"] = pruning.metric  # a misspelt one: refused at trial 0
        return found

    def instantiate_trainer(self, **kwargs) -> Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        listed = config.trainer.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        # The standard callbacks first, then what trainer.callbacks adds: the order of a single list.
        callbacks = [config[key] for key in STANDARD_CALLBACKS if config.get(key) is not None] + listed
        # A trial of `python -m <package> sweep` reports to its study; not in the config, so that the saved
        # config.yaml repeats the trial alone.
        if self.subcommand == "fit" and (pruning := OptunaPruning.from_environment()) is not None:
            callbacks.append(pruning)
        if config.trainer.get("enable_progress_bar") is False:
            # Switching the bar off drops the configured one, where Lightning would refuse a Trainer
            # without a bar but with one in its callbacks.
            callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
        preemption = next((c for c in callbacks if isinstance(c, Preemption)), None)
        requeue_while_starting(None if preemption is None else preemption.requeue)
        if preemption is not None:
            kwargs.setdefault("plugins", without_slurm_requeue(config.trainer.get("plugins")))
        trainer = super().instantiate_trainer(**{"callbacks": callbacks, **kwargs})
        guard_checkpoints(trainer.strategy, config.get("checkpoint_io"))
        return trainer

    def validate(self, verbose: bool = True, **kwargs) -> None:
        """Lightning's ``validate``, its metrics printed by ``print_metrics``."""
        print_metrics(self.trainer.validate(verbose=False, **kwargs), "Validation", verbose)

    def test(self, verbose: bool = True, **kwargs) -> None:
        """Lightning's ``test``, its metrics printed by ``print_metrics``."""
        print_metrics(self.trainer.test(verbose=False, **kwargs), "Test", verbose)

    def after_fit(self) -> None:
        """Say where the checkpoints are and why training stopped, then test the best checkpoint,
        unless this resume had nothing to train and its test ran already."""
        trainer = self.trainer
        trained_nothing = trainer.global_step == self.resumed_step
        if trained_nothing:
            rank_zero_info(NOTHING_TO_TRAIN.format(step=trainer.global_step))
        best = say_how_fit_ended(trainer)
        if not self.config.fit.test_after_fit or trainer.interrupted:
            return
        marker = tested_marker(trainer)
        if trained_nothing and trainer.strategy.broadcast(tested_at(marker, trainer.global_step)):
            rank_zero_info(TESTED_ALREADY)
            return
        self.test(model=self.model, datamodule=self.datamodule, ckpt_path=best or None, weights_only=True)
        if marker is not None and trainer.is_global_zero:
            marker.write_text(f"{trainer.global_step}\n")


def defaults_for(subcommands: dict | None) -> dict:
    """``parser_kwargs`` under which each subcommand's parser (or, without subcommands, the one
    parser) reads the kit's defaults, then the project's (configs/defaults.yaml), before anything
    else: a key the kit adds reaches every project, and the project's settings win."""
    defaults = current().defaults
    check_defaults(defaults)
    files = {"default_config_files": [str(KIT_DEFAULTS), str(defaults)]}
    return files if subcommands is None else {name: files for name in subcommands}


def config_paths(args: ArgsType) -> list[str]:
    """The files (or, by mistake, folders) a command line passes as ``--config``, in order."""
    if not isinstance(args, (list, tuple)):
        return []
    paths = []
    for before, arg in zip([None, *args], map(str, args), strict=False):
        if before in ("--config", "-c") or arg.startswith("--config="):
            paths.append(arg.removeprefix("--config="))
    return [path for path in paths if Path(path).exists()]


def main(args: ArgsType = None, run: bool = True) -> ProjectCLI:
    """The command line for the current project (``projkit.project``): its package's ``run`` and
    ``main`` call this."""
    failed = True
    try:
        with reported_errors():
            cli = ProjectCLI(args=args, run=run)
        failed = False
        return cli
    finally:
        KeptMetrics.settle(failed)
        RunLock.release_all()
        # Torn down here rather than by the interpreter's exit, where gloo's threads can abort
        # the process ("terminate called without an active exception") after a finished run.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
