"""The W&B overlay, offline: what the run records (config, checkpoints as artifacts), resuming into
the same W&B run, and no secret written anywhere."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import yaml

import wandb_log
from projkit.testing import config, launch

SECRET = "secret-key-that-must-not-be-written-0123456789"
QUICK = (
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--test_after_fit=false",
    "--trainer.enable_progress_bar=false",
)


def fit(folder: Path, *args: str) -> None:
    """A separate process, as a user runs it: W&B's own process has written and closed its files
    when the run's process has exited."""
    # W&B starts a service process of its own; on a busy machine that can take longer than its default.
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": SECRET, "WANDB_INIT_TIMEOUT": "300"}
    # A test that used W&B in this process left its service's address here: a fit connecting to that
    # service finds the run it resumes still registered there ("run ID ... is in use").
    env.pop("WANDB_SERVICE", None)
    wandb = ["--config", config("logger/wandb.yaml")]
    result = launch.run(["fit", "--config", config("classify.yaml"), *wandb, *QUICK, *args], folder, env)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch of classify logged to W&B with ``log_model``, then resumed for a second epoch with
    ``--ckpt_path last`` while a newer checkpoint of another experiment sits in the same project."""
    folder = tmp_path_factory.mktemp("wandb")
    fit(folder, "--trainer.max_epochs=1", "--trainer.logger.init_args.log_model=true")
    [run] = (folder / "runs" / "tinyproj").iterdir()
    other = folder / "runs" / "tinyproj" / "other01"
    shutil.copytree(run, other)
    saved = yaml.safe_load((other / "config.yaml").read_text())
    saved["trainer"]["logger"]["init_args"]["name"] = "lm"
    (other / "config.yaml").write_text(yaml.safe_dump(saved))
    (other / "checkpoints" / "last.ckpt").touch()  # the newest checkpoint in runs/tinyproj
    fit(folder, "--trainer.max_epochs=2", "--ckpt_path=last")
    return folder


@pytest.mark.slow
def test_resumed_training_continues_the_same_wandb_run(wandb_runs):
    first, resumed = wandb_log.offline_runs(wandb_runs / "runs")
    run_id = wandb_log.run_id(first)
    assert wandb_log.run_id(resumed) == run_id
    run = wandb_runs / "runs" / "tinyproj" / run_id
    assert sorted(p.name for p in run.parent.iterdir()) == sorted([run_id, "other01"])
    assert "epoch001" in " ".join(p.name for p in (run / "checkpoints").iterdir())
    assert not any("epoch001" in p.name for p in (run.parent / "other01" / "checkpoints").iterdir())


@pytest.mark.slow
def test_wandb_receives_the_run_config_as_values_and_as_the_file(wandb_runs):
    [run_dir] = (wandb_runs / "runs" / "tinyproj").glob("*/checkpoints/epoch001*")
    text = (run_dir.parent.parent / "config.yaml").read_text()
    saved = yaml.safe_load(text)
    assert saved["trainer"]["logger"]["init_args"]["log_model"] is True
    for run in wandb_log.offline_runs(wandb_runs / "runs"):
        recorded = wandb_log.config(run)
        assert {key: recorded[key] for key in saved} == saved
        assert (run / "files" / "run_config.yaml").read_text() == text


@pytest.mark.slow
def test_log_model_uploads_the_best_and_last_checkpoints_as_an_artifact(wandb_runs):
    first, resumed = wandb_log.offline_runs(wandb_runs / "runs")
    artifacts = wandb_log.artifacts(first)
    assert {a.name for a in artifacts} == {f"model-{wandb_log.run_id(first)}"}
    assert {a.type for a in artifacts} == {"model"}
    assert {alias for a in artifacts for alias in a.aliases} == {"best", "latest"}
    assert all([entry.path for entry in a.manifest.contents] == ["model.ckpt"] for a in artifacts)
    assert wandb_log.artifacts(resumed) == []  # log_model is off in the resumed command


@pytest.mark.slow
def test_no_secret_is_written(wandb_runs):
    written = [p for p in wandb_runs.rglob("*") if p.is_file()]
    assert len(written) > 20
    assert not any(SECRET.encode() in p.read_bytes() for p in written)


@pytest.mark.slow
def test_a_killed_run_keeps_its_history_up_to_a_second_before_the_kill(tmp_path):
    """W&B's service writes the .wandb file every WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL seconds
    (15 by default, 1 in this template) and loses the rest with a killed run: with W&B's default,
    a run killed seconds after it started keeps no history at all."""
    overlay = tmp_path / "killed.yaml"
    kill = "    - class_path: projkit.testing.KillAtStep\n      init_args: {step: 3, wait: 2}\n"
    overlay.write_text("trainer:\n  max_steps: 14\n  log_every_n_steps: 1\n  callbacks+:\n" + kill)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": SECRET, "WANDB_INIT_TIMEOUT": "300"}
    env.pop("WANDB_SERVICE", None)
    env.pop("WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL", None)
    env["PYTHONPATH"] = str(Path(__file__).parent)
    command = ["fit", "--config", config("classify.yaml"), "--config", config("logger/wandb.yaml"),
               "--config", str(overlay), *QUICK]  # fmt: skip
    killed = launch.run(command, tmp_path, env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    [run] = wandb_log.offline_runs(tmp_path / "runs")
    # Up to step 3 itself, whose learning rate is logged as its batch starts, before the kill.
    assert sorted(set(wandb_log.logged_steps(run))) == list(range(4)), "every step up to the kill"
