"""A run writes into ``<save_dir>/<name>/<version>/`` and nowhere else, and into a folder it can
write: checked before the run directory is made, so a bad folder leaves nothing behind (its names:
``checks.names``)."""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from projkit.rundir.naming import class_of, save_dir_of


def check_save_dir(config, parser: LightningArgumentParser) -> None:
    """The folder runs are written under must be (or be creatable as) a writable folder."""
    logger = config.trainer.get("logger")
    init_args = logger.get("init_args") if hasattr(logger, "get") else None
    save_dir = (init_args or {}).get("save_dir") or config.trainer.get("default_root_dir")
    if not save_dir or "://" in str(save_dir):
        return
    folder = Path(save_dir)
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        parser.error(
            f"trainer.logger.init_args.save_dir: '{save_dir}' is not a folder ('{existing}' is a file). "
            "Point save_dir (or trainer.default_root_dir) at a folder."
        )
    if not os.access(existing, os.W_OK):
        parser.error(
            f"trainer.logger.init_args.save_dir: '{existing}' is not writable (a read-only disk or "
            "folder?). Point save_dir at a folder you can write to."
        )


def check_experiment_folders(config, parser: LightningArgumentParser) -> None:
    """Each logger's experiment folder (its names checked by ``checks.names``) must lie inside its
    ``save_dir`` once links are followed, and be writable where it exists. MLflow's folders are the
    store's ids."""
    loggers = config.trainer.get("logger")
    for spec in loggers if isinstance(loggers, list) else [loggers]:
        logger = class_of(spec)
        if logger is None or issubclass(logger, MLFlowLogger):
            continue
        init_args = spec.get("init_args") or {}
        save_dir = save_dir_of(config, init_args)
        experiment = init_args.get("project" if issubclass(logger, WandbLogger) else "name")
        if "://" not in str(save_dir):
            check_experiment_folder(save_dir, Path(save_dir) / str(experiment), parser)


def check_experiment_folder(save_dir: str, folder: Path, parser: LightningArgumentParser) -> None:
    """The experiment's folder must lead to a place inside ``save_dir`` and, if it exists, be writable."""
    inside = Path(os.path.expandvars(folder)).resolve()
    if not inside.is_relative_to(Path(os.path.expandvars(save_dir)).resolve()):
        parser.error(
            f"trainer.logger.init_args: the experiment's folder '{folder}' leads to {inside}, outside "
            f"{save_dir}/ (a link?). Use another name, or remove the link."
        )
    if folder.is_dir() and not os.access(folder, os.W_OK):  # os.access sees chattr +i, also as root
        parser.error(
            f"trainer.logger.init_args: the experiment's folder '{folder}' is not writable, so no run "
            "can be made in it (chattr +i, a read-only mount, its permissions?). Make it writable "
            "(`chattr -i`, `chmod u+w`), or set another save_dir or name."
        )
