"""A run writes into ``<save_dir>/<name>/<version>/`` and nowhere else, and into a folder it can
write: checked before the run directory is made, so a bad name or folder leaves nothing behind."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from projkit.rundir.naming import class_of, save_dir_of

# Unicode's control, format (U+200B ZERO WIDTH SPACE, U+202E RIGHT-TO-LEFT OVERRIDE), line and
# paragraph separators, unassigned and private categories: characters a listing does not show.
INVISIBLE = {"Cc", "Cf", "Cn", "Co", "Zl", "Zp"}
NAME_MAX = 255  # bytes in one file name, on Linux's file systems and macOS's


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


def check_run_names(config, parser: LightningArgumentParser, config_files: list[str]) -> None:
    """Each part of the run's path a logger takes from the config must be one plain folder name, and
    the experiment's folder must lie inside ``save_dir`` (a name of ``..``, ``a/b``, ``/tmp/x`` or an
    empty one, or a config file named ``...yaml`` whose stem is the default name, would write
    elsewhere or beside every experiment)."""
    loggers = config.trainer.get("logger")
    for spec in loggers if isinstance(loggers, list) else [loggers]:
        logger = class_of(spec)
        if logger is None or issubclass(logger, MLFlowLogger):  # MLflow's folders: the store's ids
            continue
        init_args = spec.get("init_args") or {}
        experiment = "project" if issubclass(logger, WandbLogger) else "name"
        save_dir = save_dir_of(config, init_args)
        for part in [experiment, *(["sub_dir"] if experiment == "name" else []), "version"]:
            value = init_args.get(part)
            if (value is None and part != "name") or isinstance(value, int):
                continue
            problem = folder_name_problem(value)
            if problem is None:
                continue
            key = f"trainer.logger.init_args.{part}"
            from_file = bool(config_files) and part == "name" and value == Path(config_files[0]).stem
            source = f" (the file name of --config {config_files[0]})" if from_file else ""
            fix = "Rename the file, or set --trainer.logger.init_args.name" if from_file else f"Set {key}"
            parser.error(
                f"{key}={value!r}{source}: {problem}. {fix} to a plain folder name such as "
                f"'digits_small' (the runs are written under {save_dir}/<name>/)."
            )
        if "://" not in str(save_dir):
            check_experiment_folder(save_dir, Path(save_dir) / str(init_args.get(experiment)), parser)


def check_experiment_folder(save_dir: str, folder: Path, parser: LightningArgumentParser) -> None:
    """The experiment's folder must lead to a place inside ``save_dir`` and, if it exists, be writable."""
    inside = Path(os.path.expandvars(folder)).resolve()
    if not inside.is_relative_to(Path(save_dir).resolve()):
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


def check_callback_paths(config, parser: LightningArgumentParser) -> None:
    """A callback's file name (``checkpoint.init_args.filename``) must be one plain name, and a folder
    it is given (``dirpath``) must lie inside ``save_dir``: Lightning writes, and deletes, there."""
    save_dir = Path(save_dir_of(config, (config.trainer.get("logger") or {}).get("init_args") or {}))
    listed = config.trainer.get("callbacks") or []
    listed = listed if isinstance(listed, list) else [listed]
    specs = [(key, spec) for key, spec in vars(config).items() if key not in ("trainer", "model", "data")]
    specs += [(f"trainer.callbacks[{i}]", spec) for i, spec in enumerate(listed)]
    for key, spec in specs:
        init_args = spec.get("init_args") if hasattr(spec, "get") else None
        if not hasattr(init_args, "get"):
            continue
        name = init_args.get("filename")
        # A template's {fields} are the metric's values ({val/loss:.4f} names a metric, not a folder).
        if isinstance(name, str) and (problem := folder_name_problem(re.sub(r"\{[^{}]*\}", "x", name))):
            parser.error(
                f"{key}.init_args.filename={name!r}: {problem}. The checkpoints are written in the run's "
                "folder: give a plain file name such as 'epoch{epoch:03d}'."
            )
        folder = init_args.get("dirpath")
        if folder and (problem := character_problem(str(folder))):
            parser.error(f"{key}.init_args.dirpath={str(folder)!r}: {problem}. Leave it unset (the run's).")
        inside = Path(os.path.expandvars(str(folder))).resolve() if folder else None
        if inside is not None and "://" not in str(folder) and not inside.is_relative_to(save_dir.resolve()):
            parser.error(
                f"{key}.init_args.dirpath={str(folder)!r}: leads to {inside}, outside {save_dir}/, where "
                "the run's checkpoints belong (and where Lightning deletes the ones it no longer keeps). "
                "Leave it unset (the run's own folder), or give a folder inside it."
            )


def character_problem(text: str) -> str | None:
    """A character no name of a run's file may hold, or None."""
    if hidden := [char for char in text if unicodedata.category(char) in INVISIBLE]:
        code = f"U+{ord(hidden[0]):04X}"
        what = unicodedata.name(hidden[0], "a control character")
        return f"it holds an invisible or control character ({code} {what}), which no listing would show"
    if any(unicodedata.category(char) == "Cs" for char in text):
        return "it holds a byte that is not UTF-8, which no config can hold"
    return None


def folder_name_problem(value: object) -> str | None:
    """Why ``value`` is no single folder name, or None when it is one."""
    text = "" if value is None else str(value)
    if problem := character_problem(text):
        return problem
    if (size := len(text.encode("utf-8"))) > NAME_MAX:
        return f"it is {size} bytes long, more than a file name may be ({NAME_MAX})"
    if text.strip() in ("", "."):
        return "an empty name puts the runs of every experiment in one folder"
    if os.path.isabs(text) or text.startswith("~"):
        return "an absolute path leads out of the runs folder"
    if ".." in Path(text).parts or text.strip(". ") == "":
        return "'..' leads out of the runs folder"
    if "/" in text or "\\" in text or "\0" in text:
        return "a path separator makes it several folders"
    if "$" in text and os.path.expandvars(text) != text:
        return "a $VARIABLE in it would be expanded into a path"
    return None
