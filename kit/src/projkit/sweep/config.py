"""The sweep config: read, typed and checked before any trial runs, and a trial's command built from it."""

from __future__ import annotations

import inspect
import json
import math
import re
import warnings
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, Literal

import optuna
from jsonargparse import ArgumentError, ArgumentParser, Namespace
from jsonargparse.typing import NotEmptyStr, PositiveInt, restricted_string_type
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from projkit import strict_yaml

SWEEPS_ROOT = Path("runs") / "sweeps"


DISTRIBUTIONS = {"float": FloatDistribution, "int": IntDistribution, "categorical": CategoricalDistribution}


# The fields of a sweep config besides the sampler and the pruner: each one's type, and its fix.
FIELDS: dict[str, tuple[Any, str]] = {
    "configs": (str | list[str], "list the experiment's config files, e.g. `configs: [configs/digits.yaml]`"),
    "flags": (list[restricted_string_type("Flag", "^--")], "flags such as `--trainer.max_epochs=10`, a list"),
    "metric": (NotEmptyStr, "the logged metric to optimise, e.g. `metric: val/loss`"),
    "direction": (Literal["minimize", "maximize"], "write `minimize` (a loss) or `maximize` (an accuracy)"),
    "n_trials": (PositiveInt, "the number of trials to finish, a positive integer"),
    "space": (
        dict[str, Any],
        "map each dotted CLI key to a distribution, e.g. "
        "`model.init_args.optimizer.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}`",
    ),
}


class SweepConfigError(ValueError):
    """The sweep config is wrong; the message names the field and the fix."""


@dataclass
class Sweep:
    """A sweep config, validated (see ``configs/sweeps/digits_optuna.yaml`` for every field)."""

    path: Path
    name: str
    configs: list[str]
    flags: list[str]
    metric: str
    direction: str
    n_trials: int
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    space: dict[str, BaseDistribution]

    @property
    def folder(self) -> Path:
        """``runs/sweeps/<name>/``: the SQLite study, the trials' run directories and the results."""
        return SWEEPS_ROOT / self.name


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep config, so that a mistake stops the sweep before any trial runs."""
    path = Path(path)
    if not path.is_file():
        raise SweepConfigError(
            f"{path}: no such file. Pass the sweep config, e.g. configs/sweeps/digits_optuna.yaml"
        )
    try:
        spec = strict_yaml.read(path) or {}
    except strict_yaml.YAMLFileError as error:
        raise SweepConfigError(f"{path}: {error}") from None
    except OSError as error:
        raise SweepConfigError(f"{path}: cannot be read ({error.strerror}). Check its permissions.") from None
    if not isinstance(spec, dict):
        raise SweepConfigError(f"{path}: a sweep config is a mapping of fields (configs, space, metric, ...)")
    if "method" in spec or "command" in spec:
        raise SweepConfigError(
            f"{path}: this is a W&B sweep spec; run it with `wandb sweep {path}` (see kit/docs/sweeps.md)."
        )

    def fail(field: str, problem: str) -> SweepConfigError:
        return SweepConfigError(f"{path}: {field}: {problem}")

    if unknown := sorted(set(spec) - set(FIELDS) - {"sampler", "pruner"}):
        raise fail(
            unknown[0], f"unknown field; the fields are {', '.join(sorted([*FIELDS, 'sampler', 'pruner']))}"
        )
    fields = parse_fields(spec, fail)
    configs = [fields.configs] if isinstance(fields.configs, str) else fields.configs
    for config in configs:
        if not Path(config).is_file():
            raise fail(
                "configs", f"no file '{config}' (paths are relative to the folder the sweep starts in)"
            )
    sweep = Sweep(
        path=path,
        name=path.stem,
        configs=configs,
        flags=[str(flag) for flag in fields.flags],
        metric=fields.metric,
        direction=fields.direction,
        n_trials=fields.n_trials,
        sampler=spec.get("sampler") or {"class_path": "TPESampler"},
        pruner=spec.get("pruner") or {"class_path": "NopPruner"},
        space={key: distribution(f"space.{key}", entry, fail) for key, entry in fields.space.items()},
    )
    check_sampler(sweep)  # an unknown class or argument, or a package it lacks: here, not in a trial
    build_pruner(sweep.pruner, str(path))
    return sweep


def check_sampler(sweep: Sweep) -> None:
    """Build the sampler and draw two points of the space in a study held in memory: some of Optuna's
    samplers import a package of their own only when they first sample from a finished trial
    (QMCSampler SciPy, CmaEsSampler cmaes), which the project does not install."""
    sampler = build_sampler(sweep)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the probe's study is not the user's
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.create_study(sampler=sampler, direction=sweep.direction)
            study.tell(study.ask(sweep.space), 0.0)
            study.ask(sweep.space)
    except ModuleNotFoundError as error:
        raise SweepConfigError(
            f"{sweep.path}: sampler: {type(sampler).__name__} needs the package '{error.name}', which is "
            f"not installed. Install it (`uv add {error.name}`) or choose another sampler, e.g. TPESampler."
        ) from None
    finally:
        optuna.logging.set_verbosity(verbosity)


def parse_fields(spec: dict[str, Any], fail) -> Namespace:
    """The fields of ``FIELDS``, typed by jsonargparse; a wrong or missing one refused with its fix."""
    parser = ArgumentParser(exit_on_error=False)
    for field, (kind, _) in FIELDS.items():
        parser.add_argument(f"--{field}", type=kind, default=[] if field == "flags" else None)
    given = {field: value for field, value in spec.items() if field in FIELDS and value is not None}
    try:
        fields = parser.parse_object(given)
    except ArgumentError as error:
        named = re.search(r'key "(\w+)"', str(error))
        field = named.group(1) if named else next(iter(given))
        raise fail(field, f"'{given.get(field)}': {FIELDS[field][1]}") from None
    if missing := [field for field in FIELDS if field != "flags" and fields[field] in (None, "", [], {})]:
        raise fail(missing[0], f"missing: {FIELDS[missing[0]][1]}")
    return fields


def distribution(field: str, spec: Any, fail) -> BaseDistribution:
    """One search-space entry as Optuna's own distribution, which refuses a range it cannot sample:
    ``{type: float|int, low, high, log?, step?}`` or ``{type: categorical, choices: [...]}``."""
    kind = spec.get("type") if isinstance(spec, dict) else spec
    if not isinstance(spec, dict) or kind not in DISTRIBUTIONS:
        raise fail(
            field,
            f"unknown distribution '{kind}'; give `type:` float (with `log: true` for a log "
            "scale), int or categorical",
        )
    settings = {name: value for name, value in spec.items() if name != "type"}
    if text := [f"`{bound}`" for bound in ("low", "high") if isinstance(settings.get(bound), str)]:
        raise fail(field, f"{' and '.join(text)} must be numbers (YAML reads 1e-4 as text: write 1.0e-4)")
    numbers = [(name, settings.get(name)) for name in ("low", "high", "step")]
    if kind == "categorical":
        numbers += [(f"choices[{i}]", choice) for i, choice in enumerate(settings.get("choices") or ())]
    for name, value in numbers:
        if isinstance(value, float) and not math.isfinite(value):
            raise fail(field, f"`{name}` must be a finite number, got {value}. Give a finite value")
    cls = DISTRIBUTIONS[kind]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Optuna only warns of choices its storage cannot hold
            return cls(**settings)
    except TypeError:
        raise fail(
            field, f"a {kind} takes {', '.join(inspect.signature(cls).parameters)}, got {spec}"
        ) from None
    except (ValueError, UserWarning) as error:
        raise fail(field, str(error).splitlines()[0]) from None


def component(spec: Any, base: type, field: str, source: str) -> Any:
    """The sampler or pruner a ``{class_path, init_args}`` entry names (a bare class name is one of
    ``optuna.samplers`` or ``optuna.pruners``), parsed and built by jsonargparse."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument(f"--{field}", type=base)
    try:
        return parser.instantiate(parser.parse_object({field: spec}))[field]
    except (ArgumentError, TypeError, ValueError) as error:
        module = import_module(f"optuna.{field}s")
        names = ", ".join(n for n in module.__all__ if n[0].isupper() and not n.startswith("Base"))
        lines = [line.strip() for line in str(error).splitlines()[1:3]] or [str(error)]
        problem = " ".join(lines if lines[0].endswith(":") else lines[:1])  # jsonargparse's reason
        raise SweepConfigError(
            f"{source}: {field}: {problem}. Give `class_path:`, one of {module.__name__}: {names}, "
            "and its `init_args:`"
        ) from None


def build_sampler(sweep: Sweep, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
    """The sweep's sampler. ``seed_offset`` moves a configured seed, so that workers sharing a study
    do not all sample the same values."""
    init_args = dict(sweep.sampler.get("init_args") or {}) if isinstance(sweep.sampler, dict) else {}
    if seed_offset and init_args.get("seed") is not None:
        init_args["seed"] = (init_args["seed"] + seed_offset) % 2**32
    spec = {**sweep.sampler, "init_args": init_args} if isinstance(sweep.sampler, dict) else sweep.sampler
    return component(spec, optuna.samplers.BaseSampler, "sampler", str(sweep.path))


def build_pruner(spec: dict[str, Any], source: str) -> optuna.pruners.BasePruner:
    """The sweep's pruner (the worker's and, rebuilt from the same entry, its trials')."""
    return component(spec, optuna.pruners.BasePruner, "pruner", source)


def suggest(trial: optuna.Trial, space: dict[str, BaseDistribution]) -> dict[str, Any]:
    """The trial's values, one per key of the search space."""
    values = {}
    for key, d in space.items():
        if isinstance(d, CategoricalDistribution):
            values[key] = trial.suggest_categorical(key, d.choices)
        else:
            suggest_number = trial.suggest_int if isinstance(d, IntDistribution) else trial.suggest_float
            values[key] = suggest_number(key, d.low, d.high, step=d.step, log=d.log)
    return values


def trial_flags(values: dict[str, Any]) -> list[str]:
    """``--key=value`` for each value: strings as they are, the rest as JSON (``true``, ``null``)."""
    return [
        f"--{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in values.items()
    ]


def trial_args(sweep: Sweep, values: dict[str, Any], number: int) -> list[str]:
    """The trial's ``fit``: the sweep's configs and flags, the trial's values, and a
    run directory under ``runs/sweeps/<name>/trial_<number>/`` (the logger's ``save_dir`` and ``name``, so
    that repeating its config.yaml writes the next version beside it)."""
    command = ["fit"]
    for config in sweep.configs:
        command += ["--config", config]
    return [
        *command,
        *sweep.flags,
        *trial_flags(values),
        f"--trainer.logger.init_args.save_dir={sweep.folder}",
        f"--trainer.logger.init_args.name=trial_{number}",
    ]
