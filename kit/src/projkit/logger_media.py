"""Pictures, texts and the run's config for the loggers: the one place that knows which logger
shows what.

TensorBoard, W&B and MLflow show both (MLflow: pictures by step, texts as artifact files); the CSV
logger shows neither, so it gets no pictures and the texts go to a file in its run directory
instead. Everything here writes on rank 0 only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from projkit.strict_yaml import load


def takes_pictures(loggers: Sequence[Logger]) -> bool:
    return any(isinstance(logger, (TensorBoardLogger, WandbLogger, MLFlowLogger)) for logger in loggers)


def pixels(figure: Figure) -> np.ndarray:
    """A figure drawn as an (H, W, 3) uint8 array: one picture that every logger takes alike."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


@rank_zero_only
def log_picture(loggers: Sequence[Logger], key: str, figure: Figure, step: int) -> None:
    """Draw ``figure`` and log it under ``key`` to every logger that shows pictures."""
    if not takes_pictures(loggers):
        return
    image = pixels(figure)
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, image, global_step=step, dataformats="HWC")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key, [image], step=step)
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_image(logger.run_id, image, key=key, step=step)


@rank_zero_only
def log_texts(loggers: Sequence[Logger], key: str, texts: Sequence[str], step: int, folder: str) -> None:
    """Log ``texts`` under ``key``; a logger without text support (or none at all) gets them
    appended to ``<key>.txt`` in its log directory, else in ``folder``."""
    for logger in loggers or [None]:
        if isinstance(logger, TensorBoardLogger):
            for i, text in enumerate(texts):
                logger.experiment.add_text(f"{key}/{i}", f"```\n{text}\n```", global_step=step)
        elif isinstance(logger, WandbLogger):
            logger.log_text(key, columns=["step", "text"], data=[[step, t] for t in texts])
        elif isinstance(logger, MLFlowLogger):
            text = "".join(f"--- sample {i} ---\n{t}\n\n" for i, t in enumerate(texts))
            logger.experiment.log_text(logger.run_id, text, f"{key}/step{step:06d}.txt")
        else:
            path = Path(getattr(logger, "log_dir", None) or folder) / f"{key}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(f"--- step {step}, sample {i} ---\n{t}\n\n" for i, t in enumerate(texts))


def upload_config(logger: WandbLogger, path: Path) -> None:
    """The run's config in W&B twice: as the run's config (each key searchable and comparable across
    runs) and as the file itself, ``run_config.yaml``, which ``fit --config`` repeats the run from.

    W&B keeps its own ``config.yaml`` among the run's files, hence the other name. Resumed, the
    W&B run receives the config that started it, as the run directory holds it.
    """
    text = path.read_text()
    run = logger.experiment
    run.config.update(load(text), allow_val_change=True)
    copy = Path(run.dir) / "run_config.yaml"
    copy.write_text(text)
    run.save(str(copy), base_path=run.dir, policy="now")


def upload_config_to_mlflow(logger: MLFlowLogger, path: Path) -> None:
    """The run's config in MLflow twice: as the run's params, one per dotted key such as
    ``data.init_args.batch_size`` (the MLflow UI filters and compares runs by them), and as the
    artifact ``config.yaml``, which ``fit --config`` repeats the run from.

    MLflow refuses a param value over its length limit: such a value is cut, ends with a note saying
    so, and is named in a warning; the artifact keeps it whole. Resumed, the run receives the config
    that started it again, as the run directory holds it: MLflow accepts a param logged again only
    with the same value.
    """
    from mlflow.entities import Param
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

    note = " ... [cut: whole in the artifact config.yaml]"
    params = flat_params(load(path.read_text()))
    if too_long := [key for key, value in params.items() if len(value) > MAX_PARAM_VAL_LENGTH]:
        rank_zero_warn(f"MLflow params cut to {MAX_PARAM_VAL_LENGTH} characters: {', '.join(too_long)}")
    for key in too_long:
        params[key] = params[key][: MAX_PARAM_VAL_LENGTH - len(note)] + note
    entries = [Param(key, value) for key, value in params.items()]
    client, run_id = logger.experiment, logger.run_id
    for start in range(0, len(entries), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=entries[start : start + MAX_PARAMS_TAGS_PER_BATCH])
    client.log_artifact(run_id, str(path))


def flat_params(value: object, key: str = "") -> dict[str, str]:
    """A config as ``{dotted key: text}``: mappings and lists of mappings (the callbacks) are
    opened, so each setting is its own param; other values are written as JSON (``[32, 64]``,
    ``true``, ``null``), strings as they are."""
    if isinstance(value, dict) and value:
        items = value.items()
    elif isinstance(value, list) and any(isinstance(item, dict) for item in value):
        items = enumerate(value)
    else:
        return {key: value if isinstance(value, str) else json.dumps(value, default=str)}
    prefix = f"{key}." if key else ""
    return {k: v for name, item in items for k, v in flat_params(item, f"{prefix}{name}").items()}
