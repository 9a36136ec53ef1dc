"""What the loggers receive from the learning-rate monitor, and no TensorBoard placeholder."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor as LightningMonitor

from conftest import TINY_FIT, fit
from proj.callbacks import LearningRateMonitor


def test_lightning_still_gathers_what_its_hooks_log_in_extract_stats():
    # The one private method the monitor overrides: if Lightning renames it, this fails first.
    assert LearningRateMonitor._extract_stats is not LightningMonitor._extract_stats
    assert "_extract_stats" in LightningMonitor.on_train_batch_start.__code__.co_names


@pytest.mark.slow
def test_metrics_csv_has_one_lr_column_with_the_warmup(workdir):
    fit("digits.yaml", extra=(*TINY_FIT, "--trainer.log_every_n_steps=1"))
    with open(workdir / "runs" / "digits" / "version_0" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert not [name for name in rows[0] if name.startswith("lr-")]
    # Linear warmup over 50 steps from 0 to 0.003, logged before each of the 2 steps.
    assert [float(row["lr"]) for row in rows if row["lr"]] == pytest.approx([0.0, 0.003 / 50])


def test_groups_at_different_rates_are_logged_under_their_names():
    monitor = LearningRateMonitor()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(
        [
            {"params": [model.weight], "name": "decay"},
            {"params": [model.bias], "name": "no_decay", "lr": 0.5},
        ],
        lr=0.1,
    )

    # What _extract_stats reads of a Trainer.
    trainer = SimpleNamespace(
        optimizers=[optimizer],
        lr_scheduler_configs=[],
        callback_metrics={},
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )
    monitor.lrs = {"lr-AdamW/decay": [], "lr-AdamW/no_decay": []}
    assert monitor._extract_stats(trainer, "step") == {"lr/decay": 0.1, "lr/no_decay": 0.5}
    assert set(trainer.callback_metrics) == {"lr/decay", "lr/no_decay"}


@pytest.mark.slow
def test_tensorboard_gets_no_placeholder_hp_metric(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli = fit("digits.yaml", "logger/tensorboard.yaml", extra=(*TINY_FIT, "--trainer.log_every_n_steps=1"))
    events = EventAccumulator(cli.trainer.logger.log_dir)
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert "lr" in scalars and "val/loss" in scalars
    assert "hp_metric" not in scalars
