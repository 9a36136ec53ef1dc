"""Which folder a run writes into, as each logger names it: ``<save_dir>/<name>/version_<n>`` for
CSV and TensorBoard, ``<save_dir>/<project>/<run id>`` for W&B, ``<save_dir>/<experiment id>/<run
id>`` for MLflow."""

from __future__ import annotations

import os
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

import yaml
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from projkit.strict_yaml import load


def run_directory(trainer: Trainer) -> str:
    """``<save_dir>/<name>/<version>`` of the first logger: the folder ``ModelCheckpoint`` also
    uses, so a run's config, checkpoints and logs sit together whatever the logger (W&B included)."""
    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


def experiment_dir(config: Any) -> Path | None:
    """``<save_dir>/<name>`` of the configured logger: the folder holding one version per run.

    For W&B that is ``<save_dir>/<project>`` (its ``name`` titles a run), shared by every
    experiment logging to the project; for MLflow, ``<save_dir>/<MLflow experiment id>``.
    """
    logger = config.trainer.get("logger")
    init_args = logger.get("init_args") if hasattr(logger, "get") else None
    if init_args is None:
        return None
    save_dir = save_dir_of(config, init_args)
    kind = logger_kind(config)
    if kind == "wandb":
        project = init_args.get("project") or os.environ.get("WANDB_PROJECT", "lightning_logs")
        return Path(save_dir) / project
    if kind == "mlflow":
        return mlflow_experiment_dir(init_args, config.trainer.get("default_root_dir"))
    name = init_args.get("name") or init_args.get("project") or "lightning_logs"
    return Path(save_dir) / str(name)


def save_dir_of(config: Any, init_args: Any) -> str:
    """The folder a logger's experiments go under: its ``save_dir``, else the Trainer's."""
    return init_args.get("save_dir") or config.trainer.get("default_root_dir") or "."


def mlflow_experiment_dir(init_args, default_root_dir: str | None) -> Path:
    """The folder MLFlowLogger's runs get, as it names it: ``<save_dir>/<experiment id>``, where the
    id is the tracking store's, so the store is asked, and ``save_dir`` is the folder of a ``file:``
    store, else the Trainer's ``default_root_dir``. An experiment not in the store yet has no runs:
    its folder is one that does not exist."""
    from mlflow.tracking import MlflowClient

    uri = init_args.get("tracking_uri") or f"file:{init_args.get('save_dir')}"  # as MLFlowLogger does
    name = init_args.get("experiment_name")
    experiment = MlflowClient(uri).get_experiment_by_name(name)
    save_dir = uri.removeprefix("file:") if uri.startswith("file:") else default_root_dir or "."
    return Path(save_dir) / (experiment.experiment_id if experiment else f"(no MLflow experiment {name})")


def logger_kind(config) -> str | None:
    """``"wandb"`` or ``"mlflow"``: the loggers whose run directories are named by the run's own id
    and share a folder with other experiments' runs; None for the others."""
    cls = class_of(config.trainer.get("logger"))
    if cls is None:
        return None
    return "wandb" if issubclass(cls, WandbLogger) else "mlflow" if issubclass(cls, MLFlowLogger) else None


def class_of(spec: Any) -> type | None:
    """The class a config entry's ``class_path`` names (a logger's, a model's), None without one."""
    class_path = spec.get("class_path") if hasattr(spec, "get") else None
    return resolve_name(class_path) if class_path else None


def same_experiment(run: Path, config) -> bool:
    """Whether a run directory in a shared folder belongs to this experiment, by the config it saved.

    A W&B run carries the experiment's ``name`` (its title). MLFlowLogger takes no name, so the
    experiment's is dropped when the overlay swaps the logger in: an MLflow run belongs if it trains
    the same model, network and data classes.
    """
    kind = logger_kind(config)

    def identity(config: dict) -> tuple:
        if kind == "wandb":
            return (config["trainer"]["logger"]["init_args"].get("name"),)
        net = config["model"].get("init_args", {}).get("net")
        net = net.get("class_path") if isinstance(net, dict) else net
        return config["model"]["class_path"], net, config["data"]["class_path"]

    try:
        return identity(load((run / "config.yaml").read_text(encoding="utf-8"))) == identity(config.as_dict())
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return False


def version_of(run: Path, root: Path, numbered: bool) -> int | str | None:
    """The logger ``version`` (or run id) that writes into ``run``, when ``run`` is one of
    ``root``'s runs. ``numbered``: the logger counts ``version_N`` folders (W&B and MLflow name
    them by run id, which may be all digits)."""
    if run.parent.resolve() != root.resolve():
        return None
    number = run.name.removeprefix("version_")
    return int(number) if numbered and number.isdigit() and run.name.startswith("version_") else run.name
