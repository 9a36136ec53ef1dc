"""The debug overlays of configs/debug/ do what their names say, and write nothing outside runs/."""

from __future__ import annotations

import csv

import pytest
from projkit.testing import fit


def logged(run, name: str) -> list[float]:
    with open(run / "metrics.csv", newline="") as f:
        return [float(row[name]) for row in csv.DictReader(f) if row.get(name)]


@pytest.mark.slow
def test_overfit_drives_the_training_loss_near_zero(workdir):
    cli = fit("digits.yaml", "debug/overfit.yaml", extra=("--trainer.enable_progress_bar=false",))
    run = workdir / "runs" / "debug" / "digits" / "version_0"
    losses = logged(run, "train/loss")
    assert cli.trainer.global_step == 100 and len(losses) == 10
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
    run = workdir / "runs" / "debug" / "digits" / "version_0"
    assert cli.trainer.global_step == 8  # 2 epochs of 4 batches
    assert len(logged(run, "val/loss")) == 2 and len(logged(run, "test/loss")) == 1
    report = (run / "fit-profile.txt").read_text()
    assert "run_training_epoch" in report and "Total time (s)" in report
    assert (run / "test-profile.txt").is_file()
    assert sorted(p.name for p in workdir.iterdir()) == ["runs"]


def test_a_debug_run_logs_apart_and_last_resumes_the_real_run(workdir, capsys):
    """A run of the experiment, then a debug run of it: `--ckpt_path last` on the experiment resumes
    the real run, never the debug one (which, resumed, trained hundreds of steps at the schedule's
    floor), and the debug overlay's own `last` finds its own."""
    quick = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--test_after_fit=false",
             "--trainer.enable_progress_bar=false")  # fmt: skip
    fit("digits.yaml", extra=quick)
    fit("digits.yaml", "debug/limit.yaml", extra=("--trainer.enable_progress_bar=false",))
    assert (workdir / "runs" / "debug" / "digits" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert not (workdir / "runs" / "digits" / "version_1").exists()
    resumed = fit("digits.yaml", extra=(*quick, "--trainer.max_epochs=2", "--ckpt_path", "last"))
    assert resumed.trainer.log_dir == "runs/digits/version_0"
    again = fit("digits.yaml", "debug/limit.yaml", extra=("--ckpt_path", "last", "--trainer.max_epochs=3"))
    assert again.trainer.log_dir == "runs/debug/digits/version_0"
