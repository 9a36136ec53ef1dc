"""The MLflow overlay, read back with MLflow's own client: a local store under runs/mlflow/, the
resolved config as params and as a file, the metrics, the best checkpoint and a language model's
samples as artifacts, and a resumed fit continuing the same MLflow run."""

from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from projkit.logger_media import flat_params
from projkit.testing import TINY_FIT, config, launch

LIMIT = 6000  # MLflow's longest param value
LONG_TAG = "x" * (LIMIT + 1000)  # a tag MLflow takes (up to 8000) whose param is too long


def fit(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """A separate process, as a user runs it: MLflow keeps the tracking URI and a store per URI for
    the rest of a process, and the overlay's URI is relative to the working folder."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    mlflow = ["--config", config("logger/mlflow.yaml")]
    result = launch.run(["fit", "--config", config("classify.yaml"), *mlflow, *TINY_FIT, *args], folder, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def mlflow_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One epoch of classify logged to MLflow, then resumed for a second epoch with ``--ckpt_path
    last`` while a newer checkpoint of another experiment (the text task) sits in the same MLflow
    experiment."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow")
    first = fit(folder, f'--trainer.logger.init_args.tags={{"note": "{LONG_TAG}"}}')
    uri = f"sqlite:///{folder}/runs/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tinyproj")
    [run] = client.search_runs([experiment.experiment_id])
    first_points = len(client.get_metric_history(run.info.run_id, "val/loss"))
    run_dir = folder / "runs" / "mlflow" / experiment.experiment_id / run.info.run_id
    other = run_dir.parent / "0123456789abcdef0123456789abcdef"
    shutil.copytree(run_dir, other)
    saved = yaml.safe_load((other / "config.yaml").read_text())
    saved["data"]["class_path"] = "tinyproj.data.Chars"
    (other / "config.yaml").write_text(yaml.safe_dump(saved))
    (other / "checkpoints" / "last.ckpt").touch()  # the newest checkpoint of the MLflow experiment
    fit(
        folder,
        "--trainer.max_epochs=2",
        "--ckpt_path=last",
        "--test_after_fit=false",
        "--model.init_args.net.init_args.dropout=0.0",  # a model flag unlike the first run's: params stay
    )
    return SimpleNamespace(
        folder=folder,
        uri=uri,
        client=client,
        experiment=experiment,
        run=client.get_run(run.info.run_id),
        run_dir=run_dir,
        other=other,
        first_points=first_points,
        first_stderr=first.stderr,
    )


@pytest.mark.slow
def test_the_store_and_the_run_directory_are_under_runs(mlflow_run):
    assert sorted(p.name for p in mlflow_run.folder.iterdir()) == ["runs"]
    assert mlflow_run.run.info.status == "FINISHED"
    assert Path(mlflow_run.run.info.artifact_uri).is_relative_to(mlflow_run.folder / "runs" / "mlflow")
    assert (mlflow_run.run_dir / "config.yaml").is_file()
    assert (mlflow_run.run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_resumed_training_continues_the_same_mlflow_run(mlflow_run):
    runs = mlflow_run.client.search_runs([mlflow_run.experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [mlflow_run.run.info.run_id]
    assert any(p.name.startswith("epoch001") for p in (mlflow_run.run_dir / "checkpoints").iterdir())
    assert not any(p.name.startswith("epoch001") for p in (mlflow_run.other / "checkpoints").iterdir())
    history = mlflow_run.client.get_metric_history(mlflow_run.run.info.run_id, "val/loss")
    assert len(history) > mlflow_run.first_points
    assert [m.step for m in history] == sorted(m.step for m in history)


@pytest.mark.slow
def test_params_are_the_run_directorys_config_and_the_file_an_artifact(mlflow_run):
    text = (mlflow_run.run_dir / "config.yaml").read_text()
    expected = flat_params(yaml.safe_load(text))
    params = mlflow_run.run.data.params
    assert params["data.init_args.batch_size"] == "16"
    assert params["model.class_path"] == "tinyproj.models.Classifier"
    assert params["model.init_args.net.init_args.dropout"] == "0.1"
    assert params["checkpoint.init_args.monitor"] == "val/loss"
    cut = "trainer.logger.init_args.tags.note"
    whole = {key: value for key, value in expected.items() if key != cut}
    assert {key: params[key] for key in whole} == whole
    assert len(params[cut]) == LIMIT and params[cut].startswith("xxx") and "config.yaml" in params[cut]
    assert f"MLflow params cut to {LIMIT} characters: {cut}" in mlflow_run.first_stderr
    local = mlflow_run.client.download_artifacts(mlflow_run.run.info.run_id, "config.yaml")
    assert Path(local).read_text() == text


@pytest.mark.slow
def test_metrics_have_finite_histories(mlflow_run):
    for key in ("val/loss", "val/acc", "train/acc", "test/acc", "test/loss"):
        history = mlflow_run.client.get_metric_history(mlflow_run.run.info.run_id, key)
        assert history and all(math.isfinite(m.value) for m in history), key


@pytest.mark.slow
def test_log_model_uploads_the_best_checkpoint_as_an_artifact(mlflow_run):
    [best] = (mlflow_run.run_dir / "checkpoints").glob("epoch*.ckpt")  # save_top_k=1 on val/loss
    client, run_id = mlflow_run.client, mlflow_run.run.info.run_id
    assert best.stem in {a.path for a in client.list_artifacts(run_id)}
    folder = Path(client.download_artifacts(run_id, best.stem))
    assert "best" in (folder / "aliases.txt").read_text()
    data = (folder / best.name).read_bytes()
    assert data == best.read_bytes()
    assert "state_dict" in torch.load(io.BytesIO(data), weights_only=True)


def test_flat_params_opens_mappings_and_lists_of_mappings():
    config = {"a": {"b": 1, "c": [1, 2], "d": None, "e": True, "f": "text", "g": {}}, "h": [{"i": 0.5}]}
    assert flat_params(config) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "a.d": "null",
        "a.e": "true",
        "a.f": "text",
        "a.g": "{}",
        "h.0.i": "0.5",
    }


@pytest.mark.slow
def test_language_model_samples_go_to_mlflow_as_text_artifacts(mlflow_run, tmp_path, monkeypatch):
    """Last in the file: it adds an artifact to the shared run (a new store would take seconds)."""
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking._tracking_service import utils

    from projkit.logger_media import log_texts

    uri = mlflow_run.uri
    # The logger sets MLflow's tracking URI for the whole process: put it back afterwards.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(utils, "_tracking_uri", None)
    logger = MLFlowLogger(tracking_uri=uri, run_id=mlflow_run.run.info.run_id)
    log_texts([logger], "samples", ["ROMEO: a", "ROMEO: b"], step=30, folder=str(tmp_path / "unused"))
    text = Path(logger.experiment.download_artifacts(logger.run_id, "samples/step000030.txt")).read_text()
    assert "ROMEO: a" in text and "ROMEO: b" in text
    assert not (tmp_path / "unused").exists()
