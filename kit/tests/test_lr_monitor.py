"""What the loggers receive from Lightning's learning-rate monitor, and no TensorBoard placeholder."""

from __future__ import annotations

import csv

import pytest

from projkit.testing import TINY_FIT, fit


@pytest.mark.slow
def test_metrics_csv_has_each_groups_rate_under_its_name_with_the_warmup(workdir):
    fit("classify.yaml", extra=(*TINY_FIT, "--trainer.log_every_n_steps=1"))
    with open(workdir / "runs" / "classify" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert not [name for name in rows[0] if name.startswith("lr-")]
    # Linear warmup over 5 steps from 0 to 0.01, logged before each of the 2 steps, in both groups.
    for group in ("decay", "no_decay"):
        rates = [float(row[f"lr/{group}"]) for row in rows if row[f"lr/{group}"]]
        assert rates == pytest.approx([0.0, 0.01 / 5]), group


@pytest.mark.slow
def test_tensorboard_gets_no_placeholder_hp_metric(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli = fit("classify.yaml", "logger/tensorboard.yaml", extra=(*TINY_FIT, "--trainer.log_every_n_steps=1"))
    events = EventAccumulator(cli.trainer.logger.log_dir)
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"lr/decay", "lr/no_decay", "val/loss"} <= set(scalars)
    assert "hp_metric" not in scalars
