"""Pictures and texts for the loggers: the one place that knows which logger shows what.

TensorBoard, W&B and MLflow show both (MLflow: pictures by step, texts as artifact files); the CSV
logger shows neither, so it gets no pictures and the texts go to a file in its run directory
instead. Everything here writes on rank 0 only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


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
