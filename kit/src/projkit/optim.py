"""Optimizer parameter groups, torch's fused Adam kernels, and the default learning-rate schedule."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


def param_groups(module: nn.Module) -> list[dict]:
    """Split trainable parameters into a decayed group (matrices, conv kernels, embeddings) and a
    group with ``weight_decay=0`` (biases, norm scales and other vectors).

    Decaying a bias or a LayerNorm gain only pulls it towards zero without regularising anything,
    so AdamW's decoupled decay is applied to parameters with two or more dimensions only. The
    decayed group carries no ``weight_decay`` key, so it gets the optimizer's configured value.
    Frozen parameters (``requires_grad=False``) are left out of the optimizer entirely. The names
    are what Lightning's ``LearningRateMonitor`` logs each group's rate under: ``lr/decay``,
    ``lr/no_decay``.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return [{"params": decay, "name": "decay"}, {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]


# torch's optimizers whose fused kernel the kit picks, and the devices it picks it on.
FUSED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)
FUSED_DEVICES = ("cpu", "cuda")


def fused_where_supported(optimizer: Optimizer, groups: list[dict[str, Any]]) -> Optimizer:
    """``optimizer`` built again on torch's fused kernel, when it is torch's ``Adam`` or ``AdamW``, its
    config chose no implementation (``fused`` and ``foreach`` unset) and every parameter is a plain
    tensor on a CPU or CUDA device; else ``optimizer`` as it is. ``groups``: the groups it was
    built from, unchanged (torch fills in the ones it is given).

    The fused kernel updates every parameter in one pass: on a CPU torch's default updates them one
    after another (the character GPT's update: 6.6 ms against 2.4 ms). The updates agree with the
    default's to rounding; ``fused: false`` (or ``foreach``) in the optimizer's ``init_args`` keeps
    torch's default. Lightning refuses to clip for a fused optimizer under mixed precision, so
    ``TaskModule`` keeps the default there (``clips_under_mixed_precision``)."""
    defaults = optimizer.defaults
    if type(optimizer) not in FUSED_OPTIMIZERS or defaults.get("differentiable"):
        return optimizer
    if defaults.get("fused") is not None or defaults.get("foreach") is not None:
        return optimizer
    params = [p for group in optimizer.param_groups for p in group["params"]]
    plain = all(type(p.data) is torch.Tensor and p.device.type in FUSED_DEVICES for p in params)
    if not params or not plain:
        return optimizer
    accepted = inspect.signature(type(optimizer)).parameters
    settings = {key: value for key, value in defaults.items() if key in accepted}
    try:
        return type(optimizer)(groups, **{**settings, "fused": True})
    except (RuntimeError, ValueError):  # a dtype or device this torch has no fused kernel for
        return optimizer


def clips_under_mixed_precision(module: LightningModule) -> bool:
    """Whether ``module``'s Trainer clips gradients under mixed precision, where Lightning refuses an
    optimizer that unscales gradients itself, as fused ones do (for ``bf16-mixed`` too). False for a
    module attached to no Trainer (its ``configure_optimizers`` called by hand)."""
    try:
        trainer = module.trainer
    except RuntimeError:  # Lightning's "not attached to a `Trainer`"
        return False
    return isinstance(trainer.precision_plugin, MixedPrecision) and bool(trainer.gradient_clip_val)


class WarmupCosineLR(LRScheduler):
    """Linear warmup from ``warmup_start`` × lr to lr, then cosine decay to ``min_lr_ratio`` × lr.

    Stepped once per optimizer step. ``total_steps=None`` lets the training module fill in the
    Trainer's estimate (``trainer.estimated_stepping_batches``), so a config need not repeat
    ``max_epochs`` × batches / accumulation by hand. Past ``total_steps`` the rate stays at the floor.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 100,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.1,
        warmup_start: float = 0.0,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        if not 0.0 <= warmup_start <= 1.0:
            raise ValueError(f"warmup_start must be in [0, 1], got {warmup_start}")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"total_steps must be a positive integer or null (the run's), got {total_steps}")
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        self.warmup_start = warmup_start
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        factor = self.factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup_start + (1.0 - self.warmup_start) * step / self.warmup_steps
        if self.total_steps is None:
            return 1.0
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine
