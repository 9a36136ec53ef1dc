"""The debug overlays of configs/debug/ do what their names say, as their files state it, and write
nothing outside runs/."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from projkit.testing import config, fit
from projkit.testing.configs import stack

SAVE_DIR = "trainer.logger.init_args.save_dir"


def overlay(name: str) -> dict:
    """What the overlay file states, by dotted key: the effect a test checks is the file's own."""
    return stack([config(name)])


def debug_run(workdir: Path, name: str) -> Path:
    """The digits run the overlay ``name`` logs, in the folder of runs it states."""
    return workdir / overlay(name)[SAVE_DIR] / "digits" / "version_0"


def logged(run, name: str) -> list[float]:
    with open(run / "metrics.csv", newline="") as f:
        return [float(row[name]) for row in csv.DictReader(f) if row.get(name)]


@pytest.mark.slow
def test_overfit_drives_the_training_loss_near_zero(workdir):
    cli = fit("digits.yaml", "debug/overfit.yaml", extra=("--trainer.enable_progress_bar=false",))
    said = overlay("debug/overfit.yaml")
    losses = logged(debug_run(workdir, "debug/overfit.yaml"), "train/loss")
    steps = said["trainer.max_epochs"] * said["trainer.overfit_batches"]
    assert cli.trainer.global_step == steps and len(losses) == steps // said["trainer.log_every_n_steps"]
    assert losses[0] > 1.0 and losses[-1] < 0.05, losses
    assert "test/loss" not in cli.trainer.callback_metrics  # no test after fitting one batch
    assert sorted(p.name for p in workdir.iterdir()) == ["runs"]


@pytest.mark.slow
def test_limit_runs_a_few_batches_and_profile_writes_its_report_into_the_run(workdir):
    cli = fit(
        "digits.yaml",
        "debug/limit.yaml",
        "debug/profile.yaml",
        extra=("--trainer.enable_progress_bar=false",),
    )
    said = overlay("debug/limit.yaml")
    run = debug_run(workdir, "debug/limit.yaml")
    assert cli.trainer.global_step == said["trainer.max_epochs"] * said["trainer.limit_train_batches"]
    assert len(logged(run, "val/loss")) == said["trainer.max_epochs"] and len(logged(run, "test/loss")) == 1
    report = (run / "fit-profile.txt").read_text()
    assert "run_training_epoch" in report and "Total time (s)" in report
    assert (run / "test-profile.txt").is_file()
    assert sorted(p.name for p in workdir.iterdir()) == ["runs"]


@pytest.mark.slow
def test_a_debug_run_logs_apart_and_last_resumes_the_real_run(workdir, capsys):
    """A run of the experiment, then a debug run of it: `--ckpt_path last` on the experiment resumes
    the real run, never the debug one (which, resumed, trained hundreds of steps at the schedule's
    floor), and the debug overlay's own `last` finds its own."""
    quick = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--test_after_fit=false",
             "--trainer.enable_progress_bar=false")  # fmt: skip
    real = fit("digits.yaml", extra=quick).trainer.log_dir
    debug = debug_run(workdir, "debug/limit.yaml")
    fit("digits.yaml", "debug/limit.yaml", extra=("--trainer.enable_progress_bar=false",))
    assert (debug / "checkpoints" / "last.ckpt").is_file() and Path(real) != debug.relative_to(workdir)
    assert not (workdir / Path(real).parent / "version_1").exists()
    resumed = fit("digits.yaml", extra=(*quick, "--trainer.max_epochs=2", "--ckpt_path", "last"))
    assert resumed.trainer.log_dir == real
    again = fit("digits.yaml", "debug/limit.yaml", extra=("--ckpt_path", "last", "--trainer.max_epochs=3"))
    assert Path(again.trainer.log_dir) == debug.relative_to(workdir)
