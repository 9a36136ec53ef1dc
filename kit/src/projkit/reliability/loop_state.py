"""The loop state a checkpoint saved in a training batch's end hooks gives Lightning, so that a resume
runs what follows that batch in a run never stopped: the validation after it, and the epoch's end
after an epoch's last batch.

Lightning resumes a checkpoint saved in ``on_train_batch_end`` (a step checkpoint) after that batch,
as if the validation and the epoch's end that follow it had run: their rows, the epoch's train
metrics and the callbacks that act on them (a best checkpoint, early stopping) are lost. It resumes a
checkpoint saved in a validation's first batch (``RESTARTED_MID_EVALUATION``) by running that
validation, then the rest of the epoch or its end. A step checkpoint that a validation follows is
saved in that state: it is the state the loops reach a moment later, with no weight changed between.

At an epoch's last batch with no validation after it, no state of Lightning's runs the epoch's end
alone. Such a checkpoint is marked (``epoch_end_follows``); ``ExactResume`` resumes it as the batch
complete, its epoch loop done at once, so that the epoch's end runs. A resume without ``ExactResume``
reads the state Lightning saved.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.trainer.states import TrainerFn

from projkit.internals.lightning import (
    LOGGING_STEP_KEY,
    check_loop_layout,
    data_fetcher,
    end_epoch_loop_at_once,
    next_validation_skipped,
    validation_by_time,
    validation_due,
)
from projkit.loops import accumulating, epoch_batches_done

EPOCH_END_FOLLOWS = "epoch_end_follows"


def after_batch(trainer: Trainer) -> str | None:
    """What follows the training batch in whose end hooks a checkpoint is saved now: a
    ``"validation"`` that a resume would run too (not one due to a stop request or to the clock,
    which a checkpoint does not hold), the ``"epoch_end"`` alone, or None (another batch, or the
    checkpoint is not saved in a batch's end hooks)."""
    batch = trainer.fit_loop.epoch_loop.batch_progress.current
    if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking or batch.processed <= batch.completed:
        return None
    fetcher = data_fetcher(trainer)
    if fetcher is None or next_validation_skipped(trainer) or accumulating(trainer):
        return None
    if not validation_due(trainer, fetcher):
        return "epoch_end" if epoch_batches_done(trainer) else None
    return None if trainer.should_stop or validation_by_time(trainer) else "validation"


def at_validation_start(loops: dict[str, Any]) -> None:
    """Edits a checkpoint's ``loops`` in place: the training batch complete, the validation after it
    begun, none of its batches done. The resume counts the begun batch once more (``recount``)."""
    fit = loops["fit_loop"]
    for part in ("total", "current"):
        progress = fit["epoch_loop.batch_progress"][part]
        progress["completed"] = progress["processed"]
    validation = fit["epoch_loop.val_loop.batch_progress"]
    done = validation["total"]["completed"]
    validation["total"].update(ready=done + 1, started=done + 1, processed=done)
    validation["current"].update(ready=1, started=1, processed=0, completed=0)
    validation["is_last_batch"] = False


def recount(trainer: Trainer) -> None:
    """At a validation's start during ``fit``: a validation resumed in its first batch counts that
    batch as begun in the epoch's totals, and runs it again from the start, counting it once more.
    The totals are set back to the batches done, as in a run never stopped: otherwise every later
    checkpoint of the epoch would read as saved mid-validation, and its resume would validate again."""
    if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
        return
    total = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total
    if total.ready > total.completed:
        total.ready = total.started = total.processed = total.completed


def at_epoch_end(checkpoint: dict[str, Any], trainer: Trainer) -> bool:
    """Edits a checkpoint marked ``epoch_end_follows`` in place: its epoch's last batch complete
    and counted as stepped, as after the batch's last hooks. Whether it did: only a checkpoint of
    that shape is edited (a checkpoint is untrusted), once the running Lightning is known to save
    that shape (a Lightning that no longer does raises)."""
    if checkpoint.get(EPOCH_END_FOLLOWS) is not True:
        return False
    check_loop_layout(trainer)
    try:
        fit = checkpoint["loops"]["fit_loop"]
        batches = fit["epoch_loop.batch_progress"]
        counters = fit["epoch_loop.state_dict"]
        parts = [batches["total"], batches["current"]]
        ok = all(type(p["processed"]) is int and p["processed"] == p["completed"] + 1 for p in parts)
        ok = ok and batches["is_last_batch"] is True and type(counters[LOGGING_STEP_KEY]) is int
    except (KeyError, TypeError):
        return False
    if not ok:
        return False
    for part in parts:
        part["completed"] = part["processed"]
    counters[LOGGING_STEP_KEY] += 1
    return True


def end_epoch_at_once(trainer: Trainer) -> None:
    """At the resumed run's training start: its epoch loop, whose batches are all complete, is done
    without looking for a validation (it would begin the next batch instead)."""
    end_epoch_loop_at_once(trainer)


def epoch_ended(trainer: Trainer) -> None:
    """At that epoch's end: the epoch loop is done restarting, as after an iteration, so the next
    epoch starts afresh."""
    trainer.fit_loop.epoch_loop.on_iteration_done()
