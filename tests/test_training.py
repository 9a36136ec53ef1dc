"""The models learn: accuracy bars on real data, not just a step that runs."""

from __future__ import annotations

import pytest
import torch

from conftest import config
from proj.cli import main
from proj.models import ImageClassifier
from proj.nets import ConvNet


@pytest.mark.slow
def test_digits_default_experiment_reaches_the_accuracy_bar(workdir):
    """`make train`: the shipped config, tested on the best checkpoint."""
    cli = main(["fit", "--config", config("digits.yaml"), "--trainer.enable_progress_bar=false"])
    best = cli.trainer.checkpoint_callback.best_model_path
    assert best and "loss" in best
    assert cli.trainer.callback_metrics["test/acc"] >= 0.97
    assert cli.trainer.callback_metrics["test/f1"] >= 0.97


@pytest.mark.slow
def test_mlp_swapped_in_by_config_alone_learns(workdir):
    cli = main(
        [
            "fit",
            "--config",
            config("digits.yaml"),
            "--model.init_args.net=proj.nets.MLP",
            "--trainer.max_epochs=10",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert type(cli.model.net).__name__ == "MLP"
    assert cli.trainer.callback_metrics["test/acc"] >= 0.93


@pytest.mark.slow
def test_compiled_network_trains_and_keeps_checkpoint_keys(workdir):
    cli = main(
        [
            "fit",
            "--config",
            config("digits.yaml"),
            "--model.init_args.compile=true",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=3",
            "--trainer.limit_val_batches=1",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
        ]
    )
    saved = torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)["state_dict"]
    plain = ImageClassifier(ConvNet(10, (1, 8, 8)), num_classes=10).state_dict()
    assert saved.keys() == plain.keys()
    assert all(torch.isfinite(v).all() for v in saved.values() if v.is_floating_point())
