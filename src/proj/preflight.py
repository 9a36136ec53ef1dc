"""Checks of what the user typed, made before anything is built: a message that names the field
and the fix beats a traceback from deep inside Lightning or a run that quietly does the wrong thing.
"""

from __future__ import annotations

import importlib
import pickle
import zipfile
from pathlib import Path

import torch
import yaml
from lightning.pytorch.cli import LightningArgumentParser


def check_yaml_syntax(paths: list[str], parser: LightningArgumentParser) -> None:
    """Name the file and line of a YAML syntax error (jsonargparse reports "<unicode string>")."""
    for path in paths:
        try:
            yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as error:
            where = f" at line {error.problem_mark.line + 1}" if getattr(error, "problem_mark", None) else ""
            problem = getattr(error, "problem", None) or error
            parser.error(f"--config {path}: not valid YAML{where} ({problem}). Fix the syntax there.")


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


def check_trainer(trainer, parser: LightningArgumentParser) -> None:
    """Catch trainer settings that Lightning accepts but that cannot work or silently misbehave."""
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


def check_ckpt_path(ckpt_path: str, parser: LightningArgumentParser, config=None) -> dict:
    """Refuse a missing, truncated, code-carrying or foreign checkpoint before anything is built."""
    path = Path(ckpt_path)
    if not path.is_file():
        parser.error(
            f"--ckpt_path: no checkpoint file at '{ckpt_path}'. Pass a .ckpt written by `fit` "
            "(runs/<experiment>/<version>/checkpoints/) or 'last' / 'best'."
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
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
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        parser.error(
            f"--ckpt_path: '{ckpt_path}' holds no state_dict, so it is no Lightning checkpoint. Pass a "
            "checkpoint written by `fit` (runs/<experiment>/<version>/checkpoints/)."
        )
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
