"""Stop a diverging run at the first non-finite loss, and never checkpoint non-finite weights."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from projkit.errors import DivergenceError

CAUSES = (
    "Usual causes: a learning rate too high for this model (lower "
    "model.init_args.optimizer.init_args.lr or lengthen the warmup), an overflow in reduced precision "
    "(trainer.precision is {precision}; 32-true rules it out), or bad input data (NaN/inf values, wrong "
    "normalisation). Stack configs/debug/anomaly.yaml to find the first operation that produced it, "
    "and resume from a good checkpoint with --ckpt_path last."
)


class StopOnDivergence(Callback):
    """Checks the loss before backward on every step, and every checkpoint before it is written.

    A NaN loss stops the run before backward, so that step never reaches the weights or the
    optimizer state. Weights can also overflow from a finite loss (one huge update); then the save
    is refused, so no checkpoint of a diverged model replaces the last good one. Under
    ``bf16-mixed`` there is no gradient scaler to skip such steps, so without this the NaN would
    be applied. The cost is one device-to-host sync of a scalar per step.
    """

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if bool(torch.isfinite(loss.detach())):
            return
        batch = trainer.fit_loop.epoch_loop.batch_progress.current.ready - 1
        raise DivergenceError(
            f"The training loss is {loss.item()} at step {trainer.global_step} (epoch "
            f"{trainer.current_epoch}, batch {batch}); the run stopped before applying it. "
            + CAUSES.format(precision=trainer.precision)
        )

    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # The weights: parameters and buffers. Metric states, such as a running maximum that
        # starts at -inf, may be non-finite by design.
        weights = {name for name, _ in pl_module.named_parameters()} | {
            n for n, _ in pl_module.named_buffers()
        }
        bad = [
            name
            for name, value in checkpoint["state_dict"].items()
            if name in weights and value.is_floating_point() and not bool(torch.isfinite(value).all())
        ]
        if bad:
            raise DivergenceError(
                f"The weights became non-finite by step {trainer.global_step} ({', '.join(bad[:3])}"
                f"{', …' if len(bad) > 3 else ''}); the checkpoint was not written, so the ones on disk "
                "are from earlier steps. " + CAUSES.format(precision=trainer.precision)
            )
