"""Class paths from before the kit's split (projkit 1.0.0), read as the kit's, with one warning.

The template's runs and checkpoints of that time name the machinery's classes under the project's
own package (``<package>.optim.WarmupCosineLR``, ``<package>.reliability.LastCheckpoint``), which
no longer holds them: ``projkit`` does. The CHANGELOG promises that nothing goes without a
deprecation naming its replacement, so such a path is read as the kit's, and the command says so
once, old and new.

Every config passes through ``read``: each YAML text jsonargparse loads (config files, a run's
``config.yaml``, flags, ``PL_*`` variables: ``install``) and each object the CLI's parser parses
(the hyperparameters LightningCLI takes from a ``--ckpt_path`` checkpoint, ``main({...})``).

Only the kit's old classes are mapped, and only under the project's package as it is named now: a
run from before a ``make rename`` (which rewrote the configs, not ``runs/``) names a package that is
gone, its own model's too, so no alias could load it. A path that still names a class (the owner's
own, as ``<package>.models.ImageClassifier``) is left as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import yaml
from jsonargparse import get_loader, set_loader
from lightning.pytorch.utilities import rank_zero_warn

from projkit.context import current

# The template's modules (package-relative) that held classes a config or a checkpoint can name, and
# the kit's module that holds each of their classes now, under the same name.
MOVED: dict[str, str] = {
    **{
        module: f"projkit.{module}"
        for module in (
            "optim",
            "callbacks",
            "callbacks.prediction_writer",
            "callbacks.pruning",
            "callbacks.throughput",
            "callbacks.tuning",
            "callbacks.validate_at_end",
            "reliability",
            "reliability.checkpoint_io",
            "reliability.divergence",
            "reliability.last_checkpoint",
            "reliability.preemption",
            "reliability.resume",
        )
    },
    "models": "projkit.task",  # TaskModule; the package's other models are the owner's
    "models.task": "projkit.task",
    "nets": "projkit.deploy",  # PixelInput; the other networks are the owner's
    "nets.pixels": "projkit.deploy",
}

# The old class paths this command read, each with the kit's: said once, before anything is built.
_read: dict[str, str] = {}


def new_path(class_path: object) -> str | None:
    """The kit's class path for ``class_path`` where that is an old path of a class the kit took
    over (one of the kit's own, not one a module of it imports) and names nothing today; None for
    any other value."""
    if not isinstance(class_path, str) or class_path.count(".") < 2:
        return None
    package, _, rest = class_path.partition(".")
    module, _, name = rest.rpartition(".")
    if package != project_package() or module not in MOVED or name.startswith("_"):
        return None
    new = f"{MOVED[module]}.{name}"
    kits = getattr(class_of(new), "__module__", "").startswith("projkit.")
    return new if kits and class_of(class_path) is None else None


def project_package() -> str | None:
    """The package the kit's classes were under before the split: the project's (None: none is set,
    as for a parser used outside a command)."""
    try:
        return current().package
    except RuntimeError:
        return None


def class_of(class_path: str) -> type | None:
    """The class ``class_path`` imports as, or None (its module is imported only where it exists)."""
    module, _, name = class_path.rpartition(".")
    try:
        found = importlib.util.find_spec(module) is not None
        value = getattr(importlib.import_module(module), name, None) if found else None
    except (ImportError, ValueError):  # a package above it missing, or no module name at all
        return None
    return value if isinstance(value, type) else None


def with_new_paths(tree: Any, found: dict[str, str] | None = None) -> Any:
    """``tree`` (a config or hyperparameters, as loaded) with every ``class_path`` that ``new_path``
    maps replaced by the kit's, each recorded in ``found``; the given tree is left as it was."""
    if isinstance(tree, list):
        return [with_new_paths(item, found) for item in tree]
    if not isinstance(tree, dict):
        return tree
    tree = {key: with_new_paths(value, found) for key, value in tree.items()}
    old = tree.get("class_path")
    if (new := new_path(old)) is not None:
        tree["class_path"] = new
        if found is not None:
            found[old] = new
    return tree


def read(tree: Any) -> Any:
    """``tree`` as a command reads it: old class paths as the kit's, kept for ``warn_of_old_paths``."""
    return with_new_paths(tree, _read)


def forget() -> None:
    """A new command starts: no old class path read yet."""
    _read.clear()


def warn_of_old_paths(found: dict[str, str] | None = None) -> None:
    """One warning for the old class paths read (``found``, by default those this command read, which
    are then forgotten), naming each with the kit's; none read, no warning."""
    renamed = "; ".join(f"{old} is {new}" for old, new in (_read if found is None else found).items())
    if found is None:
        forget()
    if not renamed:
        return
    rank_zero_warn(
        f"Class paths from before the kit's split (projkit 1.0.0) were read as the kit's: {renamed}. "
        "The old paths are deprecated and go in projkit 2.0: name the new ones in your configs "
        "(checkpoints and run configs written from now on do).",
        category=FutureWarning,
    )


def install() -> None:
    """Read every YAML jsonargparse loads through ``read``, after the loader in place."""
    load = get_loader("yaml")
    if getattr(load, "reads_old_paths", False):
        return

    def reading_load(text: str) -> Any:
        return read(load(text))

    reading_load.reads_old_paths = True
    set_loader("yaml", reading_load, (yaml.YAMLError,))
