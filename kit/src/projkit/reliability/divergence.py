"""Stop a diverging run at the first non-finite loss, and never checkpoint what came after it."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from projkit.errors import DivergenceError
from projkit.internals.torch import foreach_mul_, foreach_norm
from projkit.loops import accumulating

CAUSES = (
    "Usual causes: a learning rate too high for this model (lower "
    "model.init_args.optimizer.init_args.lr or lengthen the warmup), an overflow in reduced precision "
    "(trainer.precision is {precision}; 32-true rules it out), or bad input data (NaN/inf values, wrong "
    "normalisation). Stack configs/debug/anomaly.yaml to find the first operation that produced it, "
    "and resume from a good checkpoint with --ckpt_path last."
)
# Steps kept between two looks at most: a run that neither logs nor checkpoints nor ends an epoch
# for this many steps is looked at once per this many, one read of the device each time.
MOST_KEPT = 1000


class StopOnDivergence(Callback):
    """Stops the run (``DivergenceError``, exit code 1) when the training loss or its gradients
    become NaN or infinite; no such step reaches the weights, the optimizer's state or a checkpoint.

    The check stays on the device, so that an ordinary step never waits for the GPU. On each
    optimizer step a flag is computed there (every loss of the step and the gradients' total norm
    finite) and, where it is false, the gradients are zeroed before the optimizer steps: the
    optimizer then takes a step without that gradient (its momentum and weight decay still apply,
    finite). The host reads the flags only where it reads the device anyway: on the steps the
    loggers write (every ``log_every_n_steps``), before a validation, as a checkpoint is saved, at
    an epoch's end and at the end of training (and once per 1,000 steps where none of these comes).
    There the run stops, naming the first bad step and its loss: at most ``log_every_n_steps - 1``
    optimizer steps after it, each without its gradient, and before any checkpoint, validation or
    test of a later step. Under ``16-mixed`` the gradient scaler skips steps with non-finite
    gradients itself (that is how it finds its scale), so only the loss is checked there.

    Weights can also overflow from a finite gradient (one huge update): every checkpoint's weights
    are checked as it is saved, and one with a non-finite weight is refused, so it never replaces
    the last good one.
    """

    def __init__(self) -> None:
        self._finite: torch.Tensor | None = None  # every loss of this step so far finite (device)
        self._loss: torch.Tensor | None = None  # this step's first non-finite loss, or its last
        # (flag, loss, step, epoch, batch) of each optimizer step since the host last looked.
        self._steps: list[tuple[torch.Tensor, torch.Tensor, int, int, int]] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finite, self._loss, self._steps = None, None, []

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        loss = loss.detach()
        if self._finite is None or self._loss is None:
            self._finite, self._loss = torch.isfinite(loss), loss
        else:
            self._loss = torch.where(self._finite, loss, self._loss)
            self._finite = self._finite & torch.isfinite(loss)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        finite, loss = self._finite, self._loss
        self._finite = self._loss = None
        if finite is None or loss is None:  # no backward through this hook's Trainer: nothing to check
            return
        if getattr(trainer.precision_plugin, "scaler", None) is None:
            groups = gradient_groups(optimizer)
            for grads in groups.values():
                norms = torch.stack(foreach_norm(grads))
                finite = finite & on(finite.device, torch.isfinite(norms).all())
            keep = finite.to(torch.int8)
            for grads in groups.values():
                zero_unless(grads, on(grads[0].device, keep))
        batch = trainer.fit_loop.epoch_loop.batch_progress.current.ready - 1
        self._steps.append((finite, loss, trainer.global_step, trainer.current_epoch, batch))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        every = trainer.log_every_n_steps
        logs = every > 0 and trainer.global_step % every == 0 and not accumulating(trainer)
        if logs or len(self._steps) >= MOST_KEPT:
            self._look(trainer)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._look(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._look(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._look(trainer)

    def _look(self, trainer: Trainer) -> None:
        """Raise if a step kept since the last look was not finite: one read of the device."""
        if not self._steps:
            return
        flags = torch.stack([on(self._steps[0][0].device, flag) for flag, *_ in self._steps])
        if bool(flags.all()):
            self._steps = []
            return
        _, loss, step, epoch, batch = self._steps[flags.tolist().index(False)]
        self._steps = []
        value = loss.item()
        grads = ", with non-finite gradients" if math.isfinite(value) else ""
        raise DivergenceError(
            f"The training loss is {value} at step {step} (epoch {epoch}, batch {batch}){grads}; its "
            f"gradients were not applied, the run stopped at step {trainer.global_step}, and no checkpoint "
            "of a later step was written. " + CAUSES.format(precision=trainer.precision)
        )

    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._look(trainer)
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


# Integer types as wide as each floating type, by bytes per element: a gradient seen as one of them.
SAME_WIDTH_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def gradient_groups(optimizer: torch.optim.Optimizer) -> dict[tuple, list[torch.Tensor]]:
    """The optimizer's gradients by device and width: each group goes through one multi-tensor
    operation, a few kernels for any number of parameters, rather than one per parameter."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                groups.setdefault((param.grad.device, param.grad.element_size()), []).append(param.grad)
    return groups


def zero_unless(grads: list[torch.Tensor], keep: torch.Tensor) -> None:
    """Each of ``grads`` (one device, one width) as it is where ``keep`` (an integer on their device)
    is 1, all zeros where it is 0, with no read by the host: their bits multiplied by ``keep``, as
    integers of the same width. A float multiplied by 0 would leave a NaN or an infinity NaN."""
    bits = SAME_WIDTH_INTEGERS[grads[0].element_size()]
    foreach_mul_([grad.view(bits) for grad in grads], keep)


def on(device: torch.device, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on ``device`` (a model split across devices), itself when it is there already."""
    return tensor if tensor.device == device else tensor.to(device, non_blocking=True)
