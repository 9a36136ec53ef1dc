"""Checks of a checkpoint file (``--ckpt_path``, ``model.init_from``): there, readable, holding no
code, a Lightning checkpoint, finite, and of the model the config builds."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.utilities import rank_zero_warn
from packaging.version import InvalidVersion, Version

from projkit.errors import ConfigError
from projkit.internals.lightning import CLASS_PATH_KEY
from projkit.moved_classes import with_new_paths


def read_weights(path: str, field: str, hint: str = "") -> dict[str, Any]:
    """The checkpoint at ``path`` (``load_checkpoint``), refused with ``field`` and the fix when it is
    missing, holds no ``state_dict`` or holds non-finite weights (a diverged run's)."""
    if not Path(path).is_file():
        raise ConfigError(
            f"{field}: no checkpoint file at '{path}'. Pass a .ckpt written by `fit` "
            f"(runs/<experiment>/<version>/checkpoints/){hint}."
        )
    checkpoint = load_checkpoint(path, field)
    check_weights(checkpoint, field, path)
    return checkpoint


def load_checkpoint(path: str | Path, field: str) -> Any:
    """The file at ``path`` as ``torch.load`` reads it with weights only (never code) and
    memory-mapped: the one way the kit reads a checkpoint, refused with ``field`` and the fix when it
    carries code or cannot be read."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise refused_pickle(f"{field}: '{path}'", error) from None
    except (RuntimeError, zipfile.BadZipFile, EOFError, OSError) as error:
        raise ConfigError(
            f"{field}: '{path}' is not a readable checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0]}). It may be truncated by an interrupted save: pick an "
            "earlier checkpoint from the same folder."
        ) from None


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


def check_counters(checkpoint: dict, field: str, path: str) -> None:
    """The counters and versions Lightning reads from a checkpoint before any callback could check
    them (the step names the file a resume writes, ``config.from_step_<N>.yaml``) must be what
    Lightning writes: counts, a version, a mapping of callback states. The loops' state is checked
    once the Trainer is built (``projkit.reliability.ContainedState``)."""
    problem = None
    for key in ("global_step", "epoch"):
        if key in checkpoint and not count(checkpoint[key]):
            problem = f"its {key} is {str(checkpoint[key])[:80]!r}, not a count"
    if not isinstance(checkpoint.get("callbacks", {}), dict):
        problem = "its callbacks' state is no mapping"
    # Missing, Lightning takes it for a legacy checkpoint; present, it must parse.
    version = checkpoint.get("pytorch-lightning_version", "0")
    try:
        Version(version) if isinstance(version, str) else Version("not one")
    except InvalidVersion:
        problem = "its pytorch-lightning_version is no version"
    if problem:
        raise ConfigError(
            f"{field}: '{path}' is no checkpoint as Lightning writes it ({problem}): it was edited or made "
            "elsewhere. Use another checkpoint of the run (runs/<experiment>/<version>/checkpoints/)."
        )


def count(value: object) -> bool:
    """A loop counter: a whole number from 0 to what a 64-bit integer holds."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def diverged(value: object) -> bool:
    """Whether a saved tensor shows a diverged run: any nan, or an inf among weights. A single inf is
    a metric's running best before its first value (``MaxMetric`` starts at -inf), not a weight."""
    if not torch.is_tensor(value) or not value.is_floating_point():
        return False
    return bool(value.isnan().any() or (value.ndim > 0 and value.isinf().any()))


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
        check_counters(checkpoint, "--ckpt_path", ckpt_path)
    except ConfigError as error:
        parser.error(str(error))
    if config is not None:
        check_same_model(checkpoint, config, ckpt_path, parser)
    return checkpoint


def check_same_model(checkpoint: dict, config, ckpt_path: str, parser: LightningArgumentParser) -> None:
    """A checkpoint's module and network class must be the ones the config builds (by the kit's
    class path, in a checkpoint from before the kit's split too)."""
    saved = with_new_paths(checkpoint.get("hyper_parameters") or {})
    wanted = config.model
    pairs = [("model", saved.get(CLASS_PATH_KEY), wanted.get("class_path"))]
    saved_net, wanted_net = saved.get("net"), wanted.get("init_args", {}).get("net")
    if isinstance(saved_net, dict) and wanted_net is not None:
        pairs.append(("model.init_args.net", saved_net.get("class_path"), wanted_net.get("class_path")))
    for field, was, now in pairs:
        if was and now and was != now:
            parser.error(
                f"--ckpt_path: '{ckpt_path}' holds a {was} but {field} is {now}. Use the config the "
                "checkpoint was trained with (its run directory's config.yaml) or a checkpoint of this model."
            )


def adopt_saved_classes(checkpoint: dict, model: LightningModule) -> None:
    """The checkpoint's class names, not the data's: output ``i`` means what it meant in training,
    also where the data's folders were renamed since (the CLI links the data's names in first)."""
    saved = (checkpoint.get("hyper_parameters") or {}).get("classes")
    linked = getattr(model, "classes", None)
    if not saved or linked is None or list(linked) == [str(name) for name in saved]:
        return
    model.classes = [str(name) for name in saved]
    rank_zero_warn(
        f"The data's classes ({', '.join(linked)}) are not the checkpoint's ({', '.join(model.classes)}): "
        "outputs are named as the checkpoint names them, and labels read from this data may mean others."
    )
