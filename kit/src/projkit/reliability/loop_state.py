"""The loop state a checkpoint saved in a training batch's end hooks gives Lightning, so that a resume
runs the validation that follows that batch, and the epoch's end when it was the epoch's last.

Lightning resumes a checkpoint saved in ``on_train_batch_end`` (a step checkpoint) after that batch,
as if the validation and the epoch's end that follow it had run: their rows, the epoch's train
metrics and the callbacks that act on them (a best checkpoint, early stopping) are lost. It resumes a
checkpoint saved in a validation's first batch (``RESTARTED_MID_EVALUATION``) by running that
validation, then the rest of the epoch or its end. A step checkpoint that a validation follows is
saved in that state: it is the state the loops reach a moment later, with no weight changed between.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.trainer.states import TrainerFn


def validation_follows(trainer: Trainer) -> bool:
    """Whether a checkpoint saved now comes in a training batch's end hooks (the batch not yet
    counted complete) with a validation to run after that batch, one that a resume would run too: not
    one due to a stop request or to the clock, which a checkpoint does not hold."""
    loop = trainer.fit_loop.epoch_loop
    batch = loop.batch_progress.current
    return (
        trainer.state.fn == TrainerFn.FITTING
        and not trainer.sanity_checking
        and not trainer.should_stop
        and getattr(trainer, "_val_check_time_interval", None) is None
        and batch.processed > batch.completed
        and trainer.fit_loop._data_fetcher is not None
        and not loop._skip_next_val
        and loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
    )


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
