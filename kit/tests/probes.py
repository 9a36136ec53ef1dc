"""Callbacks that record what happens inside a real training process, for tests to compare, and
networks that trouble `export`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from tinyproj.nets import MLP


class SaveGradients(Callback):
    """Writes each rank's weights before training and its gradients as the first optimizer step
    applies them (after DDP's all-reduce, before clipping) to ``folder/rank<r>.pt``."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.weights = {name: p.detach().clone() for name, p in pl_module.named_parameters()}

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.global_step > 0:
            return
        grads = {name: p.grad.detach().clone() for name, p in pl_module.named_parameters()}
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save({"weights": self.weights, "grads": grads}, self.folder / f"rank{trainer.global_rank}.pt")


class BranchingNet(MLP):
    """An MLP whose forward branches on a tensor's value: what ``torch.export`` cannot trace."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return logits if logits.sum() > 0 else -logits


class ExportsOtherwise(MLP):
    """An MLP that computes other logits while it is being exported: what export's check catches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return logits + 1e-3 if torch.compiler.is_exporting() else logits


class RecordSamples(Callback):
    """Appends each training batch's samples to ``folder/rank<r>.txt`` as lines of ``epoch step
    digest``: a sample's digest is its label and pixels (with ``augment`` off, the same wherever
    and whenever it is read), so a test can count which samples an epoch saw, on every rank."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx) -> None:
        images, labels = batch
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"rank{trainer.global_rank}.txt", "a") as f:
            for image, label in zip(images, labels, strict=True):
                digest = hashlib.sha256(image.cpu().numpy().tobytes()).hexdigest()[:16]
                f.write(f"{trainer.current_epoch} {trainer.global_step} {int(label)}-{digest}\n")
