"""The tuning overlays: Lightning's learning-rate and batch-size finders from the command line,
reporting what they find and leaving the run as configured, or, with apply: true, training with it,
the schedule following, and kept through checkpoints and resumes."""

from __future__ import annotations

import contextlib
import csv
import logging
from functools import partial
from pathlib import Path

import pytest
import torch

from projkit import testing
from projkit.callbacks import BatchSizeFinder, LearningRateFinder
from projkit.callbacks.tuning import suggest_lr
from tinyproj.models import Classifier
from tinyproj.nets import MLP

QUICK = (
    "--trainer.max_epochs=1",
    "--trainer.limit_val_batches=1",
    "--test_after_fit=false",
    "--trainer.enable_progress_bar=false",
)


# Set after an overlay, a callback's init_args flag reaches the callback the overlay appended last.
APPLY = "--trainer.callbacks.init_args.apply=true"
# What classify.yaml's run does, its 5 epochs of 14 steps: enough for the LR search's 40 steps.
SHORT_RUN = ("--trainer.max_epochs=5", "--trainer.enable_progress_bar=false")


def fit(*configs: str, extra: tuple[str, ...] = ()):
    return testing.fit(*configs, extra=(*QUICK, *extra))


def callback(cli, kind: type):
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, kind))


def scheduler(cli):
    return cli.trainer.lr_scheduler_configs[0].scheduler


@contextlib.contextmanager
def lightning_messages(caplog: pytest.LogCaptureFixture):
    """Lightning's info messages, which its logger keeps from the root logger that caplog reads."""
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def test_lr_is_the_optimizers_rate_and_a_new_one_builds_the_optimizer():
    optimizer = partial(torch.optim.AdamW, lr=0.01)
    model = Classifier(MLP(4, (1, 4, 4)), num_classes=4, optimizer=optimizer, scheduler=None)
    assert model.lr == 0.01  # what Lightning's LearningRateFinder looks for, by that name
    model.lr = 0.002
    assert model.lr == 0.002
    assert [group["lr"] for group in model.configure_optimizers().param_groups] == [0.002, 0.002]


def test_suggested_lr_is_a_tenth_of_the_lowest_loss_inside_the_range():
    lrs = [10 ** (-6 + i / 10) for i in range(60)]
    falling_then_rising = [3.0 - i / 30 if i < 40 else 1.7 + (i - 40) / 5 for i in range(60)]
    assert suggest_lr(lrs, falling_then_rising) == float(f"{lrs[39] / 10:.3g}")
    # Still falling where the search stopped, or never falling: no minimum, no suggestion.
    assert suggest_lr(lrs, [3.0 - i / 30 for i in range(60)]) is None
    assert suggest_lr(lrs, [1.0 + i / 30 for i in range(60)]) is None
    assert suggest_lr(lrs[:12], falling_then_rising[:12]) is None  # too few steps past the skipped ones


def final_weights(cli) -> dict[str, torch.Tensor]:
    last = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    return torch.load(last, weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def default_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of the classify run without an overlay, shared by the overlays' comparisons."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(tmp_path_factory.mktemp("default"))
        return final_weights(testing.fit("classify.yaml", extra=SHORT_RUN))


@pytest.mark.slow
@pytest.mark.parametrize("overlay", ["tune/lr_find.yaml", "tune/batch_size.yaml"])
def test_shipped_overlay_reports_and_trains_exactly_as_the_default(overlay, default_weights, workdir, caplog):
    with lightning_messages(caplog):
        tuned = testing.fit("classify.yaml", overlay, extra=SHORT_RUN)
    weights = final_weights(tuned)
    assert weights.keys() == default_weights.keys()
    changed = [name for name in weights if not torch.equal(weights[name], default_weights[name])]
    assert not changed, f"the search changed the run: {changed}"
    # The configured rate and batch stay (5 epochs of 14 batches of 16); the suggestion is printed
    # with the line that sets it.
    assert tuned.model.lr == scheduler(tuned).base_lrs[0] == 0.01
    assert tuned.datamodule.batch_size == 16
    assert scheduler(tuned).total_steps == tuned.trainer.global_step == 5 * 14
    if overlay == "tune/lr_find.yaml":
        found = callback(tuned, LearningRateFinder).suggested_lr
        assert found is not None and found != 0.01
        assert f"set model.init_args.optimizer.init_args.lr: {found:.3g} in the config" in caplog.text
        run = workdir / "runs" / "classify" / "version_0"
        assert (run / "lr_find.png").stat().st_size > 0
        with open(run / "lr_find.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 40 and float(rows[0]["lr"]) == pytest.approx(1e-4)
    else:
        # 224 training images: 64 is the largest doubling of 4 that leaves 3 steps an epoch.
        assert callback(tuned, BatchSizeFinder).optimal_batch_size == 64
        assert (
            "set data.init_args.batch_size: 64, model.init_args.optimizer.init_args.lr: 0.02 "
            "(square-root scaling from 16) and model.init_args.scheduler.init_args.warmup_steps: 1"
        ) in caplog.text


@pytest.mark.slow
def test_applied_lr_is_trained_with_and_checkpoints_keep_it(workdir):
    # Five epochs hold the search's 40 steps; the training after it stops at step 3.
    short = (APPLY, "--trainer.max_epochs=5")
    cli = fit("classify.yaml", "tune/lr_find.yaml", extra=(*short, "--trainer.max_steps=3"))
    found = callback(cli, LearningRateFinder).suggested_lr
    assert found is not None and found != 0.01
    optimizer = cli.trainer.optimizers[0]
    assert [group["initial_lr"] for group in optimizer.param_groups] == [found, found]
    assert scheduler(cli).base_lrs == [found, found]
    assert scheduler(cli).total_steps == cli.trainer.global_step == 3
    assert optimizer.param_groups[0]["lr"] == pytest.approx(found * scheduler(cli).factor(3))
    assert cli.model.lr == found

    # The checkpoint records the rate trained with, so loading or resuming rebuilds that optimizer.
    last = workdir / "runs" / "classify" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["hyper_parameters"]
    assert saved["optimizer"]["init_args"]["lr"] == found
    assert Classifier.load_from_checkpoint(last, weights_only=True).lr == found

    # Resumed, the finder does not search again, and training continues at the found rate.
    resumed = fit(
        "classify.yaml", "tune/lr_find.yaml", extra=(*short, "--trainer.max_steps=6", f"--ckpt_path={last}")
    )
    assert callback(resumed, LearningRateFinder).optimal_lr is None
    assert scheduler(resumed).base_lrs == [found, found]
    assert resumed.trainer.global_step == 6


@pytest.mark.slow
def test_applied_batch_size_brings_its_rate_warmup_and_schedule_length(workdir):
    cli = fit("classify.yaml", "tune/batch_size.yaml", extra=(APPLY, "--trainer.max_epochs=3"))
    assert callback(cli, BatchSizeFinder).optimal_batch_size == 64
    assert cli.datamodule.batch_size == cli.trainer.train_dataloader.batch_size == 64
    assert cli.datamodule.hparams.batch_size == 64  # what checkpoints and loggers record
    # Square-root scaling from 16, and the warmup over as many images as the configured 5 steps.
    assert cli.model.lr == scheduler(cli).base_lrs[0] == 0.02
    assert cli.model.hparams.optimizer["init_args"]["lr"] == 0.02
    assert cli.model.warmup_steps == scheduler(cli).warmup_steps == 1
    assert cli.model.hparams.scheduler["init_args"]["warmup_steps"] == 1
    # The schedule spans the run's real optimizer steps: 3 epochs of ceil(224 / 64) = 4.
    assert scheduler(cli).total_steps == cli.trainer.global_step == 12

    cli.trainer.save_checkpoint("tuned.ckpt")
    with pytest.raises(ValueError, match=r"Resume with --data.init_args.batch_size=64\."):
        fit("classify.yaml", "tune/batch_size.yaml", extra=("--ckpt_path=tuned.ckpt",))
