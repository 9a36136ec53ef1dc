"""Checks of what the user typed, made before anything trains: a message that names the field and
the fix beats a traceback from deep inside Lightning or a run that quietly does the wrong thing.

Most run on the parsed config before anything is built; the rest where their facts first exist
(``check_optimization`` in the model's constructor, ``warn_long_warmup`` once the run's steps are
known). None of them changes what a training step computes: a reader following the step may skip
this module.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import itertools
import math
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import Namespace
from jsonargparse._formatters import get_env_var
from lightning.pytorch.cli import (
    LightningArgumentParser,
    LightningCLI,
    LRSchedulerCallable,
    OptimizerCallable,
)
from lightning.pytorch.utilities import rank_zero_warn

from proj.strict_yaml import UnsafeYAML, check_yaml

# seed_everything seeds numpy too, whose seeds are unsigned 32-bit integers.
MAX_SEED = 2**32 - 1


class ConfigError(ValueError):
    """A setting, file or checkpoint the user gave cannot work: the message names it and the fix.

    ``proj.cli.main`` prints it without a traceback (``PROJ_DEBUG=1`` shows one), also when it is
    found only once the run has started, such as a checkpoint that Lightning loads itself.
    """


def check_defaults(path: Path) -> None:
    """The CLI reads the defaults from the repository's configs/ folder: say so when they are missing."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the defaults every experiment starts from are missing. The CLI reads them "
            "from the repository's configs/ folder: run it from the checkout, installed in place "
            "(`make install`), and restore configs/defaults.yaml from git if it was deleted."
        )


def check_config_files(paths: list[str], parser: LightningArgumentParser) -> None:
    """Each ``--config`` file must read as a YAML mapping of keys: name the file and what is wrong,
    where jsonargparse reports "<unicode string>" or a bare ``Unexpected config``."""
    for path in paths:
        if Path(path).is_dir():
            parser.error(f"--config {path}: is a folder, not a config file. Pass a .yaml file in it.")
        if not Path(path).is_file():
            continue  # jsonargparse names a missing file, and takes inline YAML too
        try:
            text = Path(path).read_text(encoding="utf-8")
            check_yaml(text)
            config = yaml.safe_load(text)
        except UnsafeYAML as error:
            parser.error(f"--config {path}: {error}.")
        except UnicodeDecodeError as error:
            parser.error(
                f"--config {path}: not UTF-8 text ({error.reason} at byte {error.start}). Save it as UTF-8."
            )
        except OSError as error:
            parser.error(f"--config {path}: cannot be read ({error.strerror}). Check its permissions.")
        except yaml.YAMLError as error:
            where = f" at line {error.problem_mark.line + 1}" if getattr(error, "problem_mark", None) else ""
            problem = getattr(error, "problem", None) or error
            parser.error(f"--config {path}: not valid YAML{where} ({problem}). Fix the syntax there.")
        if config is None:
            parser.error(f"--config {path}: the file is empty (or comments only). Add settings or drop it.")
        if not isinstance(config, dict):
            parser.error(
                f"--config {path}: holds a YAML {type(config).__name__}, where a config is a mapping of "
                "keys (`trainer:`, `model:`, `data:` ...). Write it as `key: value` lines."
            )


def check_special_files(args: list[str], parser: LightningArgumentParser) -> None:
    """A flag's or ``PL_*`` variable's value that names a FIFO, a device or a socket is refused: the
    parser reads a path given for a class or a mapping as a config file, and reading ``/dev/zero``
    or a FIFO without a writer never ends."""
    values = [
        (arg.split("=", 1)[0], arg.split("=", 1)[1])
        for arg in map(str, args)
        if arg.startswith("--") and "=" in arg
    ]
    values += [(name, value) for name, value in os.environ.items() if name.startswith("PL_")]
    values += [(before, arg) for before, arg in itertools.pairwise(map(str, args)) if before.startswith("--")]
    for name, value in values:
        path = Path(str(value)).expanduser()
        with contextlib.suppress(OSError, ValueError):
            if path.exists() and not (path.is_file() or path.is_dir()):
                parser.error(
                    f"{name}={value}: a FIFO, device or socket, not a file; reading it would never end "
                    "(or fail). Give a regular file or a value."
                )


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


def check_trainer(trainer, parser: LightningArgumentParser, subcommand: str) -> None:
    """Catch trainer settings that Lightning accepts but that cannot work or silently misbehave,
    or refuses only deep inside with a message that does not name the setting."""
    integers = {
        "accumulate_grad_batches": (1, "a positive integer"),
        "max_epochs": (-1, "-1 (no limit), 0 or more"),
        "max_steps": (-1, "-1 (no limit), 0 or more"),
        "check_val_every_n_epoch": (1, "a positive integer or null"),
        "log_every_n_steps": (0, "0 or more"),
    }
    for name, (least, allowed) in integers.items():
        value = trainer.get(name)
        if isinstance(value, int) and value < least:
            parser.error(f"trainer.{name}={value}: must be {allowed}.")
    devices = trainer.get("devices")
    if isinstance(devices, str) and devices.lstrip("-").isdigit():  # "-3" arrives as a string
        devices = int(devices)
    if isinstance(devices, int) and (devices < -1 or devices == 0):
        parser.error(f"trainer.devices={devices}: must be a positive count, -1 or auto (all of them).")
    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        value = trainer.get(name)
        # A float above 1 counts batches when whole (the command line gives 2 as 2.0).
        fraction = isinstance(value, float) and not (0.0 <= value <= 1.0 or value.is_integer())
        if fraction or (isinstance(value, (int, float)) and value < 0):
            parser.error(
                f"trainer.{name}={value}: must be a fraction of the batches in [0.0, 1.0] or a count >= 0."
            )
    interval = trainer.get("val_check_interval")
    if isinstance(interval, (int, float)) and interval <= 0:
        parser.error(
            f"trainer.val_check_interval={interval}: must be a positive count of batches or fraction."
        )
    for unit in ("epochs", "steps"):  # Lightning stops at the maximum and ignores the minimum
        least, most = trainer.get(f"min_{unit}"), trainer.get(f"max_{unit}")
        if isinstance(least, int) and isinstance(most, int) and most != -1 and least > most:
            parser.error(
                f"trainer.min_{unit}={least} exceeds trainer.max_{unit}={most}: the run would stop there "
                f"regardless. Raise trainer.max_{unit} or lower trainer.min_{unit}."
            )
    if subcommand == "fit":
        for name in ("max_steps", "max_epochs", "limit_train_batches"):
            if trainer.get(name) == 0:
                parser.error(
                    f"trainer.{name}={trainer.get(name)}: `fit` would train nothing and then test the "
                    "weights it started with. Give it steps to train, or evaluate a checkpoint with "
                    "`validate` or `test --ckpt_path ...`."
                )
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


def check_seed(config, parser: LightningArgumentParser) -> None:
    """numpy takes seeds in [0, 2**32 - 1] and fails deep inside ``seed_everything`` otherwise."""
    seed = config.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= MAX_SEED:
        parser.error(
            f"seed_everything={seed}: must be an integer from 0 to {MAX_SEED} (numpy's seed range), or "
            "true for a random seed. Pick another seed."
        )


def check_finite(config: Any, parser: LightningArgumentParser, key: str = "") -> None:
    """No setting takes nan or an infinity (``.nan``, ``.inf`` or ``1e400`` in YAML; a string ``nan``
    the parser refuses itself): a learning rate, a dropout or a clipping norm of nan trains on
    garbage without a word. Every number of the parsed config passes here, whatever its key."""
    if isinstance(config, float) and not math.isfinite(config):
        parser.error(f"{key}={config}: must be a finite number. Give a finite value.")
    items = (
        vars(config).items()
        if isinstance(config, Namespace)
        else config.items()
        if isinstance(config, dict)
        else ()
    )
    for name, value in items:
        check_finite(value, parser, f"{key}.{name}" if key else name)
    if isinstance(config, (list, tuple)):
        for index, value in enumerate(config):
            check_finite(value, parser, f"{key}[{index}]")


def check_environment(cli: LightningCLI, subcommand: str) -> None:
    """A ``PL_FIT__...`` variable that names no setting would be ignored without a word.

    The names a subcommand reads come from private API, used here alone since neither library
    exposes them: LightningCLI's ``_subcommand_parsers`` and jsonargparse's ``get_env_var``. The
    misspelt-variable case of ``tests/test_bad_input.py`` fails if either changes.
    """
    parser = cli._subcommand_parsers[subcommand]
    known = {get_env_var(parser, action) for action in parser._actions}
    prefix = f"PL_{subcommand.upper()}__"
    for name in sorted(os.environ):
        if name.startswith(prefix) and name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            parser.error(
                f"environment variable {name} names no setting of `{subcommand}`, so it would be "
                f"ignored.{hint} Fix its name or unset it."
            )


def check_monitors(monitors: dict[str, str | None], model: object) -> None:
    """Each monitored metric (``monitors``: the setting that names it, and the name) must be one the
    model logs (its ``logged_metrics``): Lightning finds a misspelt one only at the first validation,
    after training has begun, with a traceback.

    A name the model does not log is refused when it is under ``val/`` or ``test/``, which only the
    model logs, or when it is a typo away from one it does (``val_loss``, ``train/los``); any other
    name may come from a callback of the user's that logs it, and is left to Lightning.
    """
    logged = getattr(model, "logged_metrics", None)
    if not callable(logged):
        return
    names = sorted(logged())
    for field, name in monitors.items():
        if not isinstance(name, str) or name in names:
            continue
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
        if close or name.startswith(("val/", "test/")):
            hint = f" Did you mean {close[0]}?" if close else ""
            raise ConfigError(
                f"{field}={name}: {type(model).__name__} logs no metric of that name, so Lightning would "
                f"stop the run where it first reads it.{hint} It logs {', '.join(names)}."
            )


def check_weights_only(config, parser: LightningArgumentParser) -> None:
    """Checkpoints load with ``weights_only=True`` always: no switch loads the code one may carry."""
    if config.get("weights_only") is False:
        parser.error(
            "--weights_only=false: this template loads checkpoints with weights only, so that no "
            "checkpoint can run code on this machine; its own checkpoints hold plain values. Drop the "
            "flag. A foreign checkpoint you trust: load it in Python and save its state_dict."
        )


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
    """A run writes into ``<save_dir>/<name>/<version>/`` and nowhere else: each part of that path a
    logger takes from the config must be one plain folder name, and the experiment's folder must lie
    inside ``save_dir`` (a name of ``..``, ``a/b``, ``/tmp/x`` or an empty one, or a config file named
    ``...yaml`` whose stem is the default name, would write elsewhere or beside every experiment)."""
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    loggers = config.trainer.get("logger")
    for spec in loggers if isinstance(loggers, list) else [loggers]:
        class_path = spec.get("class_path") if hasattr(spec, "get") else None
        if not class_path:
            continue
        logger, init_args = _import(class_path), spec.get("init_args") or {}
        if issubclass(logger, MLFlowLogger):  # its folders are named by the store's ids
            continue
        parts = ["project"] if issubclass(logger, WandbLogger) else ["name", "sub_dir"]
        parts.append("version")
        save_dir = init_args.get("save_dir") or config.trainer.get("default_root_dir") or "."
        for part in parts:
            value = init_args.get(part)
            if (value is None and part != "name") or isinstance(value, int):
                continue
            problem = folder_name_problem(value)
            if problem is None:
                continue
            key = f"trainer.logger.init_args.{part}"
            stem = (
                config_files[0]
                if config_files and part == "name" and value == Path(config_files[0]).stem
                else None
            )
            source = f" (the file name of --config {stem})" if stem else ""
            fix = "Rename the file, or set --trainer.logger.init_args.name" if stem else f"Set {key}"
            parser.error(
                f"{key}={value!r}{source}: {problem}, so the run would not write under "
                f"{save_dir}/ alone. {fix} to a plain folder name such as 'digits_small'."
            )
        if "://" in str(save_dir):
            continue
        folder = Path(save_dir) / str(init_args.get("project" if issubclass(logger, WandbLogger) else "name"))
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


def folder_name_problem(value: object) -> str | None:
    """Why ``value`` is no single folder name, or None when it is one."""
    text = "" if value is None else str(value)
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


def read_weights(path: str, field: str, hint: str = "") -> dict[str, Any]:
    """The checkpoint at ``path``, loaded with weights only (never code) and memory-mapped, refused
    with ``field`` and the fix when it is missing, unreadable, carries code, holds no ``state_dict``
    or holds non-finite weights (a diverged run's)."""
    if not Path(path).is_file():
        raise ConfigError(
            f"{field}: no checkpoint file at '{path}'. Pass a .ckpt written by `fit` "
            f"(runs/<experiment>/<version>/checkpoints/){hint}."
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise refused_pickle(f"{field}: '{path}'", error) from None
    except (RuntimeError, zipfile.BadZipFile, EOFError, OSError) as error:
        raise ConfigError(
            f"{field}: '{path}' is not a readable checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0]}). It may be truncated by an interrupted save: pick an "
            "earlier checkpoint from the same folder."
        ) from None
    check_weights(checkpoint, field, path)
    return checkpoint


def refused_pickle(checkpoint: str, error: pickle.UnpicklingError) -> ConfigError:
    """The refusal of a checkpoint (``checkpoint`` names it) that carries pickled objects: code."""
    return ConfigError(
        f"{checkpoint} holds pickled objects that `weights_only=True` refuses to load, so it was not "
        f"loaded ({str(error).splitlines()[0]}). Use a checkpoint written by this template, whose "
        "hyperparameters are plain values."
    )


def check_weights(checkpoint: object, field: str, path: str) -> None:
    """A loaded checkpoint must be a Lightning one (a ``state_dict``) whose weights are finite."""
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    bare = isinstance(checkpoint, dict) and checkpoint and state is None
    if bare and all(isinstance(value, torch.Tensor) for value in checkpoint.values()):
        raise ConfigError(
            f"{field}: '{path}' holds bare weights (a state_dict saved on its own), not a Lightning "
            "checkpoint with the hyperparameters that rebuild its model. Pass a checkpoint written by "
            "`fit` (runs/<experiment>/<version>/checkpoints/)."
        )
    if not isinstance(state, dict) or not isinstance(checkpoint.get("hyper_parameters", {}), dict):
        raise ConfigError(
            f"{field}: '{path}' holds no state_dict, so it is no Lightning checkpoint. Pass a "
            "checkpoint written by `fit` (runs/<experiment>/<version>/checkpoints/)."
        )
    bad = [key for key, value in state.items() if diverged(value)]
    if bad:
        raise ConfigError(
            f"{field}: '{path}' holds non-finite weights (nan or inf in {', '.join(bad[:3])}"
            f"{' …' if len(bad) > 3 else ''}): the run that wrote it diverged. Use an earlier checkpoint."
        )


def check_fits_model(checkpoint: dict, model: torch.nn.Module, field: str, path: str) -> None:
    """The checkpoint's weights must have the shapes of the model the config builds: otherwise
    ``load_state_dict`` fails mid-command with a screen of ``size mismatch`` lines."""
    ours = model.state_dict()
    saved = checkpoint["state_dict"]
    missing = [key for key in ours if key not in saved]
    wrong = [key for key in ours if key in saved and tuple(saved[key].shape) != tuple(ours[key].shape)]
    if wrong or missing:
        key = (wrong or missing)[0]
        what = (
            f"{key}: {tuple(saved[key].shape)} in the checkpoint, {tuple(ours[key].shape)} in the model"
            if wrong
            else f"{key} and {len(missing) - 1} more weight(s) missing from it"
        )
        raise ConfigError(
            f"{field}: '{path}' does not fit this model ({what}): it was trained with other settings. "
            "Use the config it was trained with (its run directory's config.yaml), or another checkpoint."
        )


def diverged(value: object) -> bool:
    """Whether a saved tensor shows a diverged run: any nan, or an inf among weights. A single inf is
    a metric's running best before its first value (``MaxMetric`` starts at -inf), not a weight."""
    if not torch.is_tensor(value) or not value.is_floating_point():
        return False
    return bool(value.isnan().any() or (value.ndim > 0 and value.isinf().any()))


def check_ckpt_path(
    ckpt_path: str, parser: LightningArgumentParser, config=None, checkpoint: dict | None = None
) -> dict:
    """Refuse a missing, truncated, code-carrying, diverged or foreign checkpoint before anything
    is built. ``checkpoint``: the file, when it was read already (it is not read again)."""
    try:
        if checkpoint is None:
            checkpoint = read_weights(ckpt_path, "--ckpt_path", " or 'last' / 'best'")
        else:
            check_weights(checkpoint, "--ckpt_path", ckpt_path)
    except ConfigError as error:
        parser.error(str(error))
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


def check_optimization(optimizer: OptimizerCallable, scheduler: LRSchedulerCallable | None) -> None:
    """Build the optimizer and scheduler once on a stand-in parameter, so a bad setting (a negative
    learning rate, a betas out of range) is refused when the model is built, before any data is
    loaded, with the config field in the message."""
    fix = "Fix its init_args in the config."
    try:
        trial = optimizer([torch.nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as error:
        raise ValueError(f"model.init_args.optimizer: {error}. {fix}") from None
    lr = trial.param_groups[0].get("lr")
    if isinstance(lr, (int, float)) and lr <= 0:
        raise ValueError(f"model.init_args.optimizer: the learning rate is {lr}; it must be positive. {fix}")
    if scheduler is not None:
        try:
            scheduler(trial)
        except (ValueError, TypeError) as error:
            raise ValueError(f"model.init_args.scheduler: {error}. {fix}") from None


def warn_long_warmup(warmup_steps: int, total_steps: int) -> None:
    """A warmup as long as the run never reaches the configured rate: said, not refused, since a
    short trial run (``fast_dev_run``, a few ``limit_train_batches``) keeps the schedule on purpose."""
    if warmup_steps >= total_steps:
        rank_zero_warn(
            f"model.init_args.scheduler: warmup_steps={warmup_steps} is not shorter than the run's "
            f"{total_steps} optimizer steps, so the learning rate never reaches its configured value and "
            "never decays. Lower warmup_steps (--model.init_args.scheduler.init_args.warmup_steps) or "
            "train longer."
        )


def warn_if_normalised_otherwise(net: torch.nn.Module, datamodule: object) -> None:
    """Warn when a network's pretrained weights (``net.mean``, ``net.std``, as ``TorchvisionNet``
    states them) expect another normalisation than the data module applies: nothing fails, the
    weights merely see shifted inputs and fine-tuning starts further from what they learned."""
    wanted = getattr(net, "mean", None), getattr(net, "std", None)
    applied = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
    if None in wanted or None in applied:
        return
    if tuple(map(tuple, wanted)) != tuple(map(tuple, applied)):
        rank_zero_warn(
            f"model.init_args.net: its pretrained weights expect images normalised with mean "
            f"{wanted[0]} and std {wanted[1]}, but {type(datamodule).__name__} normalises with mean "
            f"{applied[0]} and std {applied[1]}. Normalise the data with the network's mean and std "
            "(a data module subclass that sets them does)."
        )
