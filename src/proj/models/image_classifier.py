from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MaxMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from proj.models.task import TaskModule
from proj.optim import WarmupCosineLR


class ImageClassifier(TaskModule):
    """Trains any image network with cross-entropy; logs accuracy and macro-F1 per stage.

    Metric names follow ``<stage>/<metric>`` (``train/loss``, ``val/acc``, ``test/f1``) plus
    ``val/acc_best``, the best validation accuracy so far, which checkpointing can monitor.
    ``num_classes`` is linked from the data module by the CLI.
    """

    data_facts = ("num_classes", "input_shape")

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: LRSchedulerCallable | None = WarmupCosineLR,
        scheduler_interval: Literal["step", "epoch"] = "step",
        scheduler_monitor: str = "val/loss",
        label_smoothing: float = 0.0,
        compile: bool = False,
    ) -> None:
        super().__init__(net, optimizer, scheduler, scheduler_interval, scheduler_monitor, compile)
        self.save_plain_hyperparameters()
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        metrics = MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes, average="micro"),
                "f1": MulticlassF1Score(num_classes, average="macro"),
            }
        )
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.val_acc_best = MaxMetric()
        # The epoch's training predictions, given to the training metrics in one update at the end
        # of the epoch: an update per step costs a dozen small operations and, on a GPU, the host
        # sync of their input checks (a quarter of a millisecond per step on a CPU).
        self._train_preds: list[torch.Tensor] = []
        self._train_targets: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_start(self) -> None:
        # The sanity-check validation ran on an untrained model: it must not count as a best.
        self.val_acc_best.reset()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = self.criterion(logits, y)
        self._train_preds.append(logits.detach().argmax(dim=-1))
        self._train_targets.append(y)
        # Only where the loggers receive it: each self.log call costs Python time on every step.
        if self.is_logging_step():
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        if not self._train_preds:
            return
        self.train_metrics.update(torch.cat(self._train_preds), torch.cat(self._train_targets))
        self._train_preds.clear()
        self._train_targets.clear()
        self.log_dict(self.train_metrics.compute())
        self.train_metrics.reset()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_metrics["acc"].compute())
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_metrics)

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        probs = self(x).softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}

    def _evaluate(
        self, batch: tuple[torch.Tensor, torch.Tensor], stage: str, metrics: MetricCollection
    ) -> None:
        x, y = batch
        logits = self(x)
        # Synced so every DDP rank agrees on the monitored value (and so on the best checkpoint).
        self.log(f"{stage}/loss", self.criterion(logits, y), prog_bar=True, sync_dist=True)
        metrics.update(logits, y)
        self.log_dict(metrics, prog_bar=True)
