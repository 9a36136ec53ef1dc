"""Every name that becomes part of a run's path, checked in one place before anything is written:
each logger's settings (``LOGGER_FIELDS``) and the W&B variables that stand in for them,
``trainer.default_root_dir``, the experiment's name (by default its config file's stem) and a
callback's ``filename`` and ``dirpath``. A refusal names the setting and the fix, so a bad name
leaves nothing behind: no folder, no ``.lock``."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import Logger, MLFlowLogger, WandbLogger

from projkit.rundir.naming import class_of, save_dir_of

# Unicode's control, format (U+200B ZERO WIDTH SPACE, U+202E RIGHT-TO-LEFT OVERRIDE), line and
# paragraph separators, unassigned and private categories: characters a listing does not show.
INVISIBLE = {"Cc", "Cf", "Cn", "Co", "Zl", "Zp"}
NAME_MAX = 255  # bytes in one file name, on Linux's file systems and macOS's

# A FOLDER is one folder of the run's path: <save_dir>/<name>/<version> (CSV, TensorBoard),
# <save_dir>/<project>/<id> (W&B), <default_root_dir>/<experiment id>/<run_id> (MLflow). A PATH is
# where a logger writes or keeps its store, anywhere. A TITLE is text that logs and listings show
# and no path holds (W&B's run name and group, MLflow's experiment and run names, which may hold /).
FOLDER, PATH, TITLE = "folder", "path", "title"
LOGGER_FIELDS: dict[type, dict[str, str]] = {
    WandbLogger: {
        **{"save_dir": PATH, "dir": PATH, "project": FOLDER, "id": FOLDER, "version": FOLDER},
        **{"name": TITLE, "group": TITLE, "job_type": TITLE},
    },
    MLFlowLogger: {
        **{"save_dir": PATH, "tracking_uri": PATH, "artifact_location": PATH, "run_id": FOLDER},
        **{"experiment_name": TITLE, "run_name": TITLE},
    },
    Logger: {"save_dir": PATH, "name": FOLDER, "version": FOLDER, "sub_dir": FOLDER},  # CSV, TensorBoard
}
# What W&B reads when its setting is unset, which becomes the same folder.
WANDB_VARIABLES = {"project": "WANDB_PROJECT", "id": "WANDB_RUN_ID"}


def check_names(config, parser: LightningArgumentParser, config_files: list[str]) -> None:
    """Each name and path a logger, the Trainer or a callback makes of the config: refused in one
    line, naming its setting and the fix, when it would write elsewhere or cannot be shown."""
    root = config.trainer.get("default_root_dir")
    if isinstance(root, str) and (problem := path_problem(root)):
        parser.error(f"trainer.default_root_dir={root!r}: {problem}. Set it to a folder without it.")
    loggers = config.trainer.get("logger")
    listed = isinstance(loggers, list)
    for index, spec in enumerate(loggers if listed else [loggers]):
        logger = class_of(spec)
        if logger is not None:
            prefix = f"trainer.logger{f'[{index}]' if listed else ''}"
            save_dir = save_dir_of(config, spec.get("init_args") or {})
            check_logger_names(logger, spec, prefix, save_dir, config_files, parser)
            if issubclass(logger, WandbLogger):
                check_wandb_variables(spec, parser)
    check_callback_paths(config, parser)


def check_logger_names(
    logger: type,
    spec: Any,
    prefix: str,
    save_dir: str,
    config_files: list[str],
    parser: LightningArgumentParser,
) -> None:
    """The settings of one logger that ``LOGGER_FIELDS`` lists, wherever the config gives them: in
    ``init_args``, or in ``dict_kwargs`` for those a logger passes on (W&B's ``group``). A ``name``
    that is the first config file's stem (the default) is said to be so: the fix is renaming it."""
    fields = next(fields for base, fields in LOGGER_FIELDS.items() if issubclass(logger, base))
    init_args, dict_kwargs = spec.get("init_args") or {}, spec.get("dict_kwargs") or {}
    for field, kind in fields.items():
        where = "dict_kwargs" if field in dict_kwargs else "init_args"
        value = dict_kwargs.get(field) if where == "dict_kwargs" else init_args.get(field)
        required = kind == FOLDER and field == "name"  # CSV's and TensorBoard's experiment folder
        if (value is None and not required) or isinstance(value, (int, float)) or hasattr(value, "get"):
            continue
        problem = field_problem(value, kind)
        if problem is None:
            continue
        key = f"{prefix}.{where}.{field}"
        if required and config_files and value == Path(config_files[0]).stem:
            parser.error(
                f"{key}={value!r} (the file name of --config {config_files[0]}): {problem}. Rename the "
                f"file, or set --{key} to a plain folder name such as 'digits_small'."
            )
        parser.error(f"{key}={value!r}: {problem}. {FIX[kind].format(key=key, save_dir=save_dir)}.")


FIX = {
    FOLDER: "Set --{key} to a plain folder name such as 'digits_small' (one folder of the run's path, "
    "under {save_dir}/)",
    PATH: "Set --{key} to a folder or URL without it",
    TITLE: "Set --{key} to text without it",
}


def check_wandb_variables(spec: Any, parser: LightningArgumentParser) -> None:
    """W&B takes its project and run id from the environment when the config leaves them unset:
    the same folders of the run's path, which the same check refuses."""
    init_args = spec.get("init_args") or {}
    for field, variable in WANDB_VARIABLES.items():
        value = os.environ.get(variable)
        unset = init_args.get(field) is None and (field != "id" or init_args.get("version") is None)
        if value is not None and unset and (problem := folder_name_problem(value)):
            parser.error(
                f"environment variable {variable}={value!r}: {problem}. Set it to a plain folder name "
                "such as 'digits_small', or unset it."
            )


def field_problem(value: object, kind: str) -> str | None:
    """Why ``value`` cannot be a setting of ``kind``, or None."""
    if kind == FOLDER:
        return folder_name_problem(value)
    return path_problem(str(value)) if kind == PATH else character_problem(str(value))


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
        if folder and (problem := path_problem(str(folder))):
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


def path_problem(text: str) -> str | None:
    """Why ``text`` is no path a run's files can be written under (any folder, or a store's URL)."""
    if problem := character_problem(text):
        return problem
    if longest := max((part for part in text.split("/") if len(part.encode("utf-8")) > NAME_MAX), default=""):
        return f"a part of it is {len(longest.encode('utf-8'))} bytes long, more than a file name may be"
    return None


def folder_name_problem(value: object) -> str | None:
    """Why ``value`` is no single folder name, or None when it is one. A name that Unicode's
    compatibility normalisation (NFKC, which some file systems, archives and web interfaces apply)
    turns into a separator or ``..`` (U+FF0F FULLWIDTH SOLIDUS, U+2025 TWO DOT LEADER) is none either."""
    text = "" if value is None else str(value)
    if problem := plain_name_problem(text):
        return problem
    normal = unicodedata.normalize("NFKC", text)
    if normal != text and (problem := plain_name_problem(normal)):
        return f"it reads as {normal!r} once Unicode is normalised (NFKC), and then {problem}"
    return None


def plain_name_problem(text: str) -> str | None:
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
