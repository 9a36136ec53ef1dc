"""This project's pictures in W&B, offline: the image classifier's confusion matrix and misclassified
examples reach the W&B overlay's run as media files. The overlay itself is the kit's
(kit/tests/test_wandb.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from projkit.testing import config, launch

QUICK = (
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--test_after_fit=false",
    "--trainer.enable_progress_bar=false",
)


def offline_runs(save_dir: Path) -> list[Path]:
    """The ``wandb/offline-run-*`` folders under a logger's ``save_dir``, oldest first."""
    return sorted((save_dir / "wandb").glob("offline-run-*"))


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short epoch of digits logged to W&B offline, in a separate process, as a user runs it."""
    folder = tmp_path_factory.mktemp("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": "unused", "WANDB_INIT_TIMEOUT": "300"}
    env.pop("WANDB_SERVICE", None)
    command = ["fit", "--config", config("digits.yaml"), "--config", config("logger/wandb.yaml"), *QUICK]
    result = launch.run(command, folder, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


@pytest.mark.slow
def test_wandb_receives_the_pictures_as_media_files(wandb_runs):
    for run in offline_runs(wandb_runs / "runs"):
        media = run / "files" / "media" / "images" / "val"
        assert len(list(media.glob("confusion_matrix_*.png"))) == 1
        assert len(list(media.glob("misclassified_*.png"))) == 1
