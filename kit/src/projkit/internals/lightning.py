"""What the kit takes from Lightning's internals, where Lightning has no public API for it.

Checked with lightning 2.6.0 to 2.6.6 (``make test-compat`` runs the kit's tests at both ends of its
range); ``kit/tests/test_internals.py`` tests each function's effect on a real Trainer. A name that is
gone raises ``LibraryChanged``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger

from projkit.internals import LibraryChanged, existing, replace

LIGHTNING = "lightning"
# The key of the epoch loop's saved state that holds the step the loggers log at (the count of the
# batches an optimizer stepped after): a checkpoint of an epoch's end is edited there.
LOGGING_STEP_KEY = "_batches_that_stepped"
# The key LightningCLI adds to a module's saved hyperparameters: the class the config built.
CLASS_PATH_KEY = "_class_path"
# What each use serves, as a refusal names it.
PER_STEP = "skip a per-step collective"
EARLY_SIGTERM = "take over a SIGTERM received early"
TEARDOWN = "keep a signal ignored at teardown"
AFTER_BATCH = "tell what follows a training batch"
ROWS = "know the step a row is logged at"
EPOCH_END = "resume at an epoch's end"
LOADERS = "rebuild the loaders at a found batch size"
MFU = "measure MFU"
PROG_BAR = "read the progress bar's values once per step"
HPARAMS = "keep an evaluation's settings out of the run's hparams"
ENV = "check the PL_<SUBCOMMAND>__ variables"
CSV = "write metrics.csv atomically"


def _epoch_loop(trainer: Trainer) -> Any:
    return trainer.fit_loop.epoch_loop


def stop_sigterm_broadcast(trainer: Trainer) -> None:
    """No per-step broadcast of Lightning's SIGTERM flag under DDP: a collective and a read of the
    device in every step, for a flag that the kit's Preemption (which replaces the handler that sets
    it) agrees on every few seconds instead. Upstream: Lightning-AI/pytorch-lightning#21487 (the
    overhead measured), PR #21640 (``broadcast_sigterm_every_n_steps``, open); the broadcast came
    with #20825. If the method is renamed, every step would broadcast again, so it must exist."""
    loop = _epoch_loop(trainer)
    if not callable(getattr(type(loop), "_broadcast_sigterm_tensor", None)):
        raise LibraryChanged(LIGHTNING, "_TrainingEpochLoop._broadcast_sigterm_tensor", PER_STEP)
    loop._broadcast_sigterm_tensor = lambda: None


def clear_received_sigterm(trainer: Trainer) -> bool:
    """Whether Lightning's SIGTERM handler had recorded a signal (``trainer.received_sigterm``, public),
    which is then cleared: the kit takes that signal over, and Lightning would otherwise end the run
    at the next step with exit code 0 and nothing saved. No public setter exists."""
    if not trainer.received_sigterm:
        return False
    connector = existing(trainer, "_signal_connector", LIGHTNING, EARLY_SIGTERM)
    replace(connector, "received_sigterm", False, LIGHTNING, EARLY_SIGTERM)
    return True


def keep_ignored_at_teardown(trainer: Trainer, signum: int) -> None:
    """The handler Lightning restores for ``signum`` when the Trainer tears down becomes "ignore": a
    process on its way out with 128 + signal must not be ended by the scheduler's repeat signal."""
    connector = existing(trainer, "_signal_connector", LIGHTNING, TEARDOWN)
    handlers = existing(connector, "_original_handlers", LIGHTNING, TEARDOWN)
    if not isinstance(handlers, dict):
        raise LibraryChanged(LIGHTNING, "_SignalConnector._original_handlers", TEARDOWN)
    handlers[signum] = signal.SIG_IGN


def data_fetcher(trainer: Trainer) -> Any:
    """The running fit loop's data fetcher (None outside one), which says whether a validation is due."""
    return existing(trainer.fit_loop, "_data_fetcher", LIGHTNING, AFTER_BATCH)


def next_validation_skipped(trainer: Trainer) -> bool:
    """Whether the epoch loop skips the validation it would run next (after a resume mid-epoch)."""
    value = existing(_epoch_loop(trainer), "_skip_next_val", LIGHTNING, AFTER_BATCH)
    if not isinstance(value, bool):
        raise LibraryChanged(LIGHTNING, "_TrainingEpochLoop._skip_next_val", AFTER_BATCH)
    return value


def validation_due(trainer: Trainer, fetcher: Any) -> bool:
    """Whether a validation runs after the current training batch, by Lightning's own rule (the
    interval in batches, ``check_val_every_n_epoch``, the epoch's end)."""
    due = existing(_epoch_loop(trainer), "_should_check_val_fx", LIGHTNING, AFTER_BATCH)
    return bool(due(fetcher))


def validation_by_time(trainer: Trainer) -> bool:
    """Whether ``val_check_interval`` is a time (Lightning 2.6's time-based validation), which the
    Trainer keeps only parsed, in seconds; a validation due to the clock is no checkpoint's state."""
    interval = existing(trainer, "_val_check_time_interval", LIGHTNING, AFTER_BATCH)
    return interval is not None


def logging_step(trainer: Trainer) -> int:
    """The step Lightning logs metrics at: the batches an optimizer stepped after, which is
    ``global_step`` only with one optimizer (each of several counts in ``global_step``)."""
    step = existing(_epoch_loop(trainer), LOGGING_STEP_KEY, LIGHTNING, ROWS)
    if type(step) is not int:
        raise LibraryChanged(LIGHTNING, f"_TrainingEpochLoop.{LOGGING_STEP_KEY}", ROWS)
    return step


def check_loop_layout(trainer: Trainer) -> None:
    """The running Lightning saves the fit loop as the kit edits it: the epoch loop's batch progress,
    and its logging step under ``LOGGING_STEP_KEY``. A checkpoint that lacks them is then not the
    library's doing but the file's (a checkpoint is untrusted)."""
    state = trainer.fit_loop.state_dict()
    counters = state.get("epoch_loop.state_dict", {})
    if "epoch_loop.batch_progress" not in state or LOGGING_STEP_KEY not in counters:
        raise LibraryChanged(
            LIGHTNING,
            f"fit_loop's saved {LOGGING_STEP_KEY}",
            EPOCH_END,
        )


def logs_this_step(trainer: Trainer) -> bool:
    """Whether the loggers write a row at the end of the current training step."""
    connector = existing(trainer, "_logger_connector", LIGHTNING, ROWS)
    return bool(existing(connector, "should_update_logs", LIGHTNING, ROWS))


def metrics_to_log(trainer: Trainer) -> dict[str, Any]:
    """The metrics the loggers would write now (``trainer.logged_metrics`` holds those written)."""
    connector = existing(trainer, "_logger_connector", LIGHTNING, ROWS)
    metrics = existing(connector, "metrics", LIGHTNING, ROWS)
    if not isinstance(metrics, dict) or "log" not in metrics:
        raise LibraryChanged(LIGHTNING, "_LoggerConnector.metrics['log']", ROWS)
    return metrics["log"]


def end_epoch_loop_at_once(trainer: Trainer) -> None:
    """The epoch loop, whose batches are all complete, counts its validation as run: it ends at once
    instead of beginning another batch."""
    replace(trainer.fit_loop.epoch_loop.val_loop, "_has_run", True, LIGHTNING, EPOCH_END)


def rebuild_loaders(trainer: Trainer) -> None:
    """The running loop's loaders built again at the batch size just set on the module, as
    Lightning's own batch size finder does after each size it tries (no public way to do it)."""
    from lightning.pytorch.tuner import batch_size_scaling

    existing(batch_size_scaling, "_reset_dataloaders", LIGHTNING, LOADERS)(trainer)


def compute_dtype(trainer: Trainer) -> torch.dtype:
    """The dtype the precision plugin computes in (Lightning's ThroughputMonitor asks the same way)."""
    from lightning.pytorch.callbacks import throughput_monitor

    ask = existing(throughput_monitor, "_plugin_to_compute_dtype", LIGHTNING, MFU)
    return ask(trainer.precision_plugin)


def step_results(trainer: Trainer) -> Any:
    """What the running loop's ``self.log`` calls logged (None outside one): its ``valid_items()``
    are the (key, result metric) pairs, each with ``meta.prog_bar``."""
    return existing(trainer, "_results", LIGHTNING, PROG_BAR)


def keep_hparams_from_loggers(module: LightningModule) -> None:
    """The module's (or data module's) hyperparameters go to no logger: ``save_hyperparameters(logger=
    False)`` says so, but only in the module's own ``__init__``, which the owner writes."""
    replace(module, "_log_hyperparams", False, LIGHTNING, HPARAMS)


def subcommand_parser(cli: Any, subcommand: str) -> Any:
    """LightningCLI's parser of one subcommand (``cli.parser`` is the parser of them all)."""
    parsers = existing(cli, "_subcommand_parsers", LIGHTNING, ENV)
    return parsers[subcommand]


def give_csv_writer(logger: CSVLogger, make_writer: Callable[[str], Any]) -> None:
    """``logger``'s experiment writer made by ``make_writer(log_dir)``, as Lightning's
    ``CSVLogger.experiment`` makes its own, unless it has one already or a subclass makes its own: a
    config naming Lightning's CSVLogger (a project's, an older kit's) gets it too."""
    if type(logger).experiment is not CSVLogger.experiment:
        return
    if existing(logger, "_experiment", LIGHTNING, CSV) is None:
        existing(logger, "_fs", LIGHTNING, CSV).makedirs(logger.root_dir, exist_ok=True)
        logger._experiment = make_writer(logger.log_dir)
