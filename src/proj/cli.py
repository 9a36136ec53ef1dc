"""The command line: ``python -m proj {fit,validate,test,predict} --config A.yaml [--config B.yaml]``.

A thin ``LightningCLI``: model and data are chosen by ``class_path``, the data module's facts are
linked into the model, the resolved config is written into the run's own directory, and ``fit`` can
finish by testing its best checkpoint.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.cli import (
    ArgsType,
    LightningArgumentParser,
    LightningCLI,
    SaveConfigCallback,
)

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
    """Saves the resolved config as ``config.yaml`` in the run directory, once per run.

    Lightning's own callback writes to ``trainer.log_dir``, which for W&B is the shared ``save_dir``:
    a second run there collides with the first. The run directory is decided on rank 0 and
    broadcast, so under DDP every rank agrees and only rank 0 writes.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        run_dir = trainer.strategy.broadcast(run_directory(trainer))
        if trainer.is_global_zero:
            path = Path(run_dir) / self.config_filename
            path.parent.mkdir(parents=True, exist_ok=True)
            self.parser.save(
                self.config,
                path,
                skip_none=False,
                overwrite=self.overwrite,
                multifile=self.multifile,
            )
        self.already_saved = True


class ProjCLI(LightningCLI):
    def __init__(self, args: ArgsType = None, run: bool = True) -> None:
        super().__init__(
            model_class=LightningModule,
            datamodule_class=LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=RunConfigSaver,
            seed_everything_default=DEFAULT_SEED,
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
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:
            check_ckpt_path(self.config[subcommand].get("ckpt_path"), parser)

    def after_fit(self) -> None:
        if not self.config.fit.test_after_fit or self.trainer.interrupted:
            return
        checkpoint = self.trainer.checkpoint_callback
        best = checkpoint.best_model_path if checkpoint is not None else ""
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)


def check_ckpt_path(ckpt_path: str | None, parser: LightningArgumentParser) -> None:
    """Refuse a missing, truncated or code-carrying checkpoint before anything is built."""
    if ckpt_path is None or ckpt_path in _SPECIAL_CKPT_PATHS:
        return
    path = Path(ckpt_path)
    if not path.is_file():
        parser.error(
            f"--ckpt_path: no checkpoint file at '{ckpt_path}'. Pass a .ckpt written by `fit` "
            "(runs/<experiment>/<version>/checkpoints/) or 'last' / 'best'."
        )
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
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


def main(args: ArgsType = None, run: bool = True) -> ProjCLI:
    """Entry point for ``python -m proj`` and for tests and notebooks (``main(["fit", ...])``)."""
    return ProjCLI(args=args, run=run)
