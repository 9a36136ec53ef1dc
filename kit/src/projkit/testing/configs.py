"""What the config files of a command say, for tests that check a config's effect rather than a value:
an owner edits ``seed_everything`` or ``early_stopping.patience`` in their defaults, and a test that
compares the built trainer with what the files say still holds, where one that compares it with
``42`` or ``5`` fails on the edit. The files are those the command read, in order (the defaults files
the CLI stacks first, the kit's and the project's, then each ``--config``), so a test holds whichever
file a setting moves to::

    cli = main(["--config", config("my_experiment.yaml")], run=False)
    said = stated(cli)
    assert cli.trainer.gradient_clip_val == said["trainer.gradient_clip_val"]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The dotted keys of a nested mapping and their values (a list, a scalar or ``None``), as the
    CLI's flags name them: ``{"trainer": {"precision": "32-true"}}`` is ``trainer.precision``."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def stack(paths: Iterable[str | Path]) -> dict[str, Any]:
    """Each dotted key the YAML files ``paths`` state, with the value of the last file that states it;
    a key a later file sets whole (``early_stopping: null``) replaces what earlier files said inside it.
    A setting given to a class without ``init_args`` (``early_stopping: {patience: 2}``, which the CLI
    reads as the class's argument) is named as its ``init_args`` one."""
    said: dict[str, Any] = {}
    for path in paths:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        flat = flatten(loaded)
        classes = {key.removesuffix(".class_path") for key in [*said, *flat] if key.endswith(".class_path")}
        for key, value in flat.items():
            key = as_init_arg(key, classes)
            inside = [k for k in said if k.startswith(f"{key}.") or key.startswith(f"{k}.")]
            for k in inside:
                del said[k]
            said[key] = value
    return said


def as_init_arg(key: str, classes: set[str]) -> str:
    """``key`` with ``init_args`` put after each part that names a class (in ``classes``) where the key
    goes straight on to one of the class's arguments."""
    parts, named = key.split("."), []
    for part in parts:
        if ".".join(named) in classes and part not in ("class_path", "init_args", "dict_kwargs"):
            named.append("init_args")
        named.append(part)
    return ".".join(named)


def config_files(cli: Any) -> list[Path]:
    """The config files a built command read, in order: the defaults files its parser stacks first,
    then each ``--config`` of its command line."""
    kwargs = cli.parser_kwargs
    subcommand = getattr(cli, "subcommand", None)
    if subcommand and subcommand in kwargs:
        kwargs = kwargs[subcommand]
    defaults = kwargs.get("default_config_files") or []
    return [Path(path).resolve() for path in [*defaults, *getattr(cli, "config_files", [])]]


def stated(cli: Any) -> dict[str, Any]:
    """Each dotted key the config files of the built command ``cli`` state, with the value of the
    last file that states it: what its resolved config must hold where no flag overrode it."""
    return stack(config_files(cli))


def resolved(cli: Any) -> Any:
    """The command's resolved config (its subcommand's, for one built to run)."""
    subcommand = getattr(cli, "subcommand", None)
    return cli.config[subcommand] if subcommand else cli.config


def callbacks_of(cli: Any, key: str) -> list[Any]:
    """The trainer's callbacks of exactly the class the command's standard-callback ``key``
    (``early_stopping``, ``checkpoint``, ...) resolved to; none where the key is ``null``."""
    import importlib

    spec = resolved(cli)[key]
    if spec is None:
        return []
    module, name = spec.class_path.rsplit(".", 1)
    kind = getattr(importlib.import_module(module), name)
    return [callback for callback in cli.trainer.callbacks if type(callback) is kind]


def unlike_stated(cli: Any, key: str, callback: Any) -> dict[str, tuple[Any, Any]]:
    """Each argument the config files state for the standard callback ``key`` that the built
    ``callback`` does not hold (as an attribute of that name, or of it with a leading underscore):
    ``{argument: (stated, held)}``, empty where the files had their effect."""
    missing = object()
    unlike = {}
    prefix = f"{key}.init_args."
    for name, value in stated(cli).items():
        if name.startswith(prefix) and "." not in name[len(prefix) :]:
            argument = name[len(prefix) :]
            held = getattr(callback, argument, getattr(callback, f"_{argument}", missing))
            if held is missing or held != value:
                unlike[argument] = (value, None if held is missing else held)
    return unlike
