"""Contract tests of the seams (``projkit.internals``): each private name the kit takes from a library
still does what the kit relies on, tested on the real library's effect, so that a release that moves
or changes one fails here, naming it. The loop state the kit reads through public names
(``projkit.loops``) is held equal to Lightning's own answer at every batch."""

from __future__ import annotations

import csv
import itertools
import signal
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from projkit.internals import LibraryChanged, existing, replace
from projkit.internals import lightning as seam
from projkit.internals.torchmetrics import forward_value, set_forward_value
from projkit.loops import accumulating, epoch_batches_done
from projkit.rundir.log_files import AtomicExperimentWriter

BATCHES = 10  # an epoch of 10 batches, accumulated 3 at a time: the epoch's last step is uneven


class Line(LightningModule):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(BATCHES, 2), torch.randn(BATCHES, 1)), batch_size=1)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(2, 2), torch.randn(2, 1)), batch_size=1)


class Recorder(Callback):
    """What the seam and Lightning say at each training batch's end, and what happened next."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.batches: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.step_before = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches.append(
            {
                "accumulating": accumulating(trainer),
                "lightning_accumulates": trainer.fit_loop._should_accumulate(),
                "stepped": trainer.global_step > self.step_before,
                "epoch_done": epoch_batches_done(trainer),
                "lightning_epoch_done": trainer.fit_loop.epoch_loop._num_ready_batches_reached(),
                "validation_due": seam.validation_due(trainer, seam.data_fetcher(trainer)),
                "skipped": seam.next_validation_skipped(trainer),
                "logging_step": seam.logging_step(trainer),
                "logs": seam.logs_this_step(trainer),
                "to_log": {k: float(v) for k, v in seam.metrics_to_log(trainer).items()},
            }
        )
        self.events.append(("batch", len(self.batches) - 1))

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.events.append(("validation",))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two epochs: accumulation over 3 batches, a validation every 4 batches, a row every 2 steps."""
    folder = tmp_path_factory.mktemp("internals")
    seed_everything(0)
    recorder = Recorder()
    trainer = Trainer(
        accelerator="cpu", max_epochs=2, accumulate_grad_batches=3, val_check_interval=4, log_every_n_steps=2,
        logger=CSVLogger(folder, name="", version=""), callbacks=[recorder], enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=folder,
    )  # fmt: skip
    trainer.fit(Line())
    return trainer, recorder, folder


def test_public_loop_state_equals_lightnings_own_at_every_batch(run):
    _, recorder, _ = run
    assert len(recorder.batches) == 2 * BATCHES
    for batch in recorder.batches:
        assert batch["accumulating"] == batch["lightning_accumulates"] == (not batch["stepped"])
        assert batch["epoch_done"] == batch["lightning_epoch_done"]
    assert [b["epoch_done"] for b in recorder.batches[:BATCHES]] == [False] * (BATCHES - 1) + [True]
    assert not recorder.batches[BATCHES - 1]["accumulating"]  # the uneven last step is taken


def test_validation_due_is_when_a_validation_follows_the_batch(run):
    _, recorder, _ = run
    events = recorder.events
    followed = {
        e[1] for e, after in itertools.pairwise(events) if e[0] == "batch" and after[0] == "validation"
    }
    due = {i for i, batch in enumerate(recorder.batches) if batch["validation_due"]}
    assert due == followed and len(due) >= 4
    assert not any(batch["skipped"] for batch in recorder.batches)


def test_the_logging_step_and_metrics_are_the_rows_the_logger_writes(run):
    _, recorder, folder = run
    with open(folder / "metrics.csv", newline="") as file:
        rows = {int(row["step"]): row for row in csv.DictReader(file) if row["loss"]}
    expected = {
        b["logging_step"]: b["to_log"]["loss"]
        for b in recorder.batches
        if b["logs"] and not b["accumulating"]
    }
    assert expected and {step: pytest.approx(float(rows[step]["loss"])) for step in expected} == expected


def test_the_saved_loop_layout_holds_the_logging_step(run):
    trainer, _, folder = run
    seam.check_loop_layout(trainer)
    checkpoint = torch.load(next(folder.rglob("*.ckpt")), weights_only=True)
    counters = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]
    assert counters[seam.LOGGING_STEP_KEY] == checkpoint["global_step"] > 0  # one optimizer: the same count


def test_validation_by_time_is_a_time_interval():
    assert not seam.validation_by_time(Trainer(accelerator="cpu", logger=False, val_check_interval=4))
    assert seam.validation_by_time(
        Trainer(accelerator="cpu", logger=False, val_check_interval=timedelta(seconds=5))
    )


@pytest.mark.parametrize(("precision", "dtype"), [("32-true", torch.float32), ("bf16-mixed", torch.bfloat16)])
def test_compute_dtype(precision, dtype):
    assert seam.compute_dtype(Trainer(accelerator="cpu", precision=precision, logger=False)) == dtype


class Signals(Callback):
    """Sends this process SIGTERM at training's start, which Lightning's handler records; the seam
    takes it back. At training's end the handler to restore becomes "ignore"."""

    def on_train_start(self, trainer, pl_module):
        signal.raise_signal(signal.SIGTERM)
        self.took_back = seam.clear_received_sigterm(trainer)
        self.after = trainer.received_sigterm

    def on_train_end(self, trainer, pl_module):
        seam.keep_ignored_at_teardown(trainer, signal.SIGTERM)


def test_a_sigterm_lightning_recorded_is_taken_back_and_a_signal_stays_ignored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    signals = Signals()
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=3, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, callbacks=[signals], default_root_dir=tmp_path,
    )  # fmt: skip
    try:
        trainer.fit(Line())
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
    assert signals.took_back and not signals.after
    assert trainer.global_step == 3  # not stopped by the taken-back signal


class ProgressBarValue(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 0:
            (_, metric), *_ = [(k, m) for k, m in seam.step_results(trainer).valid_items() if m.meta.prog_bar]
            assert torch.equal(forward_value(metric), outputs["loss"].detach())
            set_forward_value(metric, torch.tensor(123.0))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 1:
            self.shown = trainer.progress_bar_metrics["loss"]


def test_a_steps_logged_value_is_read_and_replaced_where_the_progress_bar_reads_it(tmp_path):
    bar = ProgressBarValue()
    trainer = Trainer(
        accelerator="cpu", max_steps=2, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, callbacks=[bar], default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Line())
    assert bar.shown == 123.0


def test_hparams_kept_from_loggers_are_not_written(tmp_path):
    for kept in (False, True):
        model = Line(lr=0.5)
        if kept:
            seam.keep_hparams_from_loggers(model)
        logger = CSVLogger(tmp_path, name=str(kept), version="")
        Trainer(accelerator="cpu", logger=logger, limit_val_batches=1, enable_progress_bar=False).validate(
            model
        )
        hparams = Path(logger.log_dir) / "hparams.yaml"
        assert ("lr: 0.5" in hparams.read_text() if hparams.exists() else False) is not kept


def test_a_csv_loggers_writer_is_the_kits_and_a_new_column_keeps_every_row(tmp_path):
    logger = CSVLogger(tmp_path, name="", version="")
    seam.give_csv_writer(logger, AtomicExperimentWriter)
    assert type(logger.experiment) is AtomicExperimentWriter
    logger.log_metrics({"a": 1.0}, step=0)
    logger.save()
    logger.log_metrics({"a": 2.0, "b": 3.0}, step=1)
    logger.save()
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert rows == [{"a": "1.0", "b": "", "step": "0"}, {"a": "2.0", "b": "3.0", "step": "1"}]


def test_a_restarted_epoch_loop_whose_batches_are_done_ends_once_told_its_validation_ran():
    trainer = Trainer(accelerator="cpu", logger=False, max_steps=5)
    loop = trainer.fit_loop.epoch_loop
    loop.batch_progress.is_last_batch = True
    loop.restarting = True
    assert not loop.done  # a restarted loop looks for the validation first
    seam.end_epoch_loop_at_once(trainer)
    assert loop.done


class Rebuild(Callback):
    def on_fit_start(self, trainer, pl_module):
        pl_module.batch_size = 5
        seam.rebuild_loaders(trainer)

    def on_train_start(self, trainer, pl_module):
        self.batch_size = trainer.train_dataloader.batch_size


class Sized(Line):
    batch_size = 1

    def train_dataloader(self):
        return DataLoader(
            TensorDataset(torch.randn(BATCHES, 2), torch.randn(BATCHES, 1)), batch_size=self.batch_size
        )


def test_rebuilt_loaders_take_the_batch_size_just_set(tmp_path):
    rebuild = Rebuild()
    Trainer(
        accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, callbacks=[rebuild], default_root_dir=tmp_path,
    ).fit(Sized())  # fmt: skip
    assert rebuild.batch_size == 5


def test_the_sigterm_broadcast_is_what_each_ddp_step_calls_and_stops():
    import inspect

    trainer = Trainer(accelerator="cpu", logger=False)
    loop = trainer.fit_loop.epoch_loop
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(type(loop).advance)
    seam.stop_sigterm_broadcast(trainer)
    assert loop._broadcast_sigterm_tensor() is None and callable(type(loop)._broadcast_sigterm_tensor)


def test_a_name_that_is_gone_is_refused_by_name_and_version():
    with pytest.raises(
        LibraryChanged, match=r"^lightning 2\.\d+\.\d+\S* changed `Trainer._gone`, which projkit"
    ):
        existing(Trainer(logger=False), "_gone", "lightning", "do something")
    with pytest.raises(LibraryChanged, match=r"Trainer\._gone"):
        replace(Trainer(logger=False), "_gone", 1, "lightning", "do something")
