"""This project's pictures in MLflow: the image classifier's confusion matrices and misclassified
examples reach the MLflow overlay's run as artifacts by step. The overlay itself is the kit's
(kit/tests/test_mlflow.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from projkit.testing import TINY_FIT, config, launch


@pytest.fixture(scope="module")
def mlflow_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One short epoch of digits logged to MLflow, in a separate process, as a user runs it: MLflow
    keeps the tracking URI and a store per URI for the rest of a process."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow")
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    command = ["fit", "--config", config("digits.yaml"), "--config", config("logger/mlflow.yaml"), *TINY_FIT]
    result = launch.run(command, folder, env)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{folder}/runs/mlflow/mlflow.db")
    experiment = client.get_experiment_by_name("proj")
    [run] = client.search_runs([experiment.experiment_id])
    return SimpleNamespace(client=client, run=run)


@pytest.mark.slow
def test_mlflow_receives_the_pictures_by_step(mlflow_run):
    names = [a.path for a in mlflow_run.client.list_artifacts(mlflow_run.run.info.run_id, "images")]
    for key in ("val~confusion_matrix", "val~misclassified", "test~confusion_matrix"):
        assert any(name.startswith(f"images/{key}+step+") and name.endswith(".png") for name in names), key
