"""The tuning overlays: Lightning's learning-rate and batch-size finders from the command line,
their results applied to the run and kept through checkpoints and resumes."""

from __future__ import annotations

import csv
import math
from functools import partial

import pytest
import torch

import conftest
from proj.callbacks import BatchSizeFinder, LearningRateFinder
from proj.models import ImageClassifier
from proj.nets import MLP

QUICK = (
    "--trainer.max_epochs=1",
    "--trainer.limit_val_batches=1",
    "--test_after_fit=false",
    "--trainer.enable_progress_bar=false",
)


def fit(*configs: str, extra: tuple[str, ...] = ()):
    return conftest.fit(*configs, extra=(*QUICK, *extra))


def callback(cli, kind: type):
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, kind))


def scheduler(cli):
    return cli.trainer.lr_scheduler_configs[0].scheduler


def test_lr_is_the_optimizers_rate_and_a_new_one_builds_the_optimizer():
    optimizer = partial(torch.optim.AdamW, lr=0.01)
    model = ImageClassifier(MLP(10, (1, 8, 8)), num_classes=10, optimizer=optimizer, scheduler=None)
    assert model.lr == 0.01  # what Lightning's LearningRateFinder looks for, by that name
    model.lr = 0.002
    assert model.lr == 0.002
    assert [group["lr"] for group in model.configure_optimizers().param_groups] == [0.002, 0.002]


@pytest.mark.slow
def test_lr_finder_trains_with_the_rate_it_suggests_and_checkpoints_keep_it(workdir):
    # Five epochs of 3 batches cut the search short (15 of its 100 steps), enough for a suggestion;
    # the training after it stops at the end of its first epoch, step 3.
    short = ("--trainer.max_epochs=5", "--trainer.limit_train_batches=3")
    cli = fit("digits.yaml", "tune/lr_find.yaml", extra=(*short, "--trainer.max_steps=3"))
    finder = callback(cli, LearningRateFinder)
    found = finder.optimal_lr.suggestion()
    assert found is not None and not math.isclose(found, 0.003)
    optimizer = cli.trainer.optimizers[0]
    assert [group["initial_lr"] for group in optimizer.param_groups] == [found, found]
    assert scheduler(cli).base_lrs == [found, found]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(found * scheduler(cli).factor(3))
    assert cli.model.lr == found

    run = workdir / "runs" / "digits" / "version_0"
    assert (run / "lr_find.png").stat().st_size > 0
    with open(run / "lr_find.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(row["lr"]) for row in rows] == finder.optimal_lr.results["lr"]
    assert [float(row["loss"]) for row in rows] == finder.optimal_lr.results["loss"]
    assert float(rows[0]["lr"]) == pytest.approx(1e-6)

    # The checkpoint records the rate trained with, so loading or resuming rebuilds that optimizer.
    last = run / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["hyper_parameters"]
    assert saved["optimizer"]["init_args"]["lr"] == found
    assert ImageClassifier.load_from_checkpoint(last, weights_only=True).lr == found

    # Resumed, the finder does not search again, and training continues at the found rate.
    resumed = fit(
        "digits.yaml", "tune/lr_find.yaml", extra=(*short, "--trainer.max_epochs=2", f"--ckpt_path={last}")
    )
    assert callback(resumed, LearningRateFinder).optimal_lr is None
    assert scheduler(resumed).base_lrs == [found, found]
    assert resumed.trainer.global_step == 6


@pytest.mark.slow
def test_batch_size_finder_trains_with_the_size_it_finds(workdir):
    cli = fit("digits.yaml", "tune/batch_size.yaml")
    size = callback(cli, BatchSizeFinder).optimal_batch_size
    # On a CPU nothing runs out of memory: doubling from init_val (32) ends once a batch holds
    # the whole training set.
    assert size == 32 * 2 ** math.ceil(math.log2(len(cli.datamodule.splits["train"]) / 32))
    assert cli.datamodule.batch_size == cli.trainer.train_dataloader.batch_size == size
    assert cli.datamodule.hparams.batch_size == size  # what checkpoints and loggers record
    # The schedule was built again for the new number of steps (1 per epoch instead of 21).
    assert scheduler(cli).total_steps == cli.trainer.num_training_batches == 1

    cli.trainer.save_checkpoint("tuned.ckpt")
    with pytest.raises(ValueError, match=rf"Resume with --data.init_args.batch_size={size}\."):
        fit("digits.yaml", "tune/batch_size.yaml", extra=("--ckpt_path=tuned.ckpt",))
