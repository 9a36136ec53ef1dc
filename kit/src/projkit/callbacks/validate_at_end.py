"""Every ``fit`` ends with a validation."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class ValidateAtEnd(Callback):
    """Validates after the last optimizer step when the schedule would not: a run that stops at
    ``max_steps`` between two ``val_check_interval`` points would otherwise end with no validation
    of its final weights, no best checkpoint and (for the language model) no sample.

    It asks the Trainer to stop after the last step (``trainer.should_stop``), which is how
    Lightning's own early stopping gets a last validation run before the loop ends.
    """

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if 0 < trainer.max_steps <= trainer.global_step and trainer.enable_validation:
            trainer.should_stop = True
