"""Where the training loop stands, from the Trainer's public counters: Lightning's own answers are
private (``_should_accumulate``, ``_num_ready_batches_reached``), and ``kit/tests/test_internals.py``
holds these equal to them at every batch of a run that accumulates over an uneven epoch."""

from __future__ import annotations

from lightning.pytorch import Trainer


def epoch_batches_done(trainer: Trainer) -> bool:
    """Whether the current training batch is the epoch's last."""
    ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    return ready == trainer.num_training_batches or trainer.is_last_batch


def accumulating(trainer: Trainer) -> bool:
    """Whether the current training batch only accumulates gradients, with no optimizer step after it:
    Lightning steps every ``accumulate_grad_batches`` batches and at an epoch's last (unless the
    strategy accumulates on its own)."""
    ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    if ready % trainer.accumulate_grad_batches == 0:
        return False
    return trainer.strategy.handles_gradient_accumulation or not epoch_batches_done(trainer)
