"""Two task modules on ``projkit.task.TaskModule``, with the metrics and outputs the kit's callbacks,
writers and ``export`` work with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch import Callback
from torch import nn
from torch.nn import functional as F
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from projkit.callbacks.prediction_writer import (
    ClassPredictionWriter,
    TextPredictionWriter,
    writer_when_predicting,
)
from projkit.deploy import Deployable, pixel_classifier, token_model
from projkit.reliability import gather
from projkit.task import TaskModule


class Classifier(TaskModule):
    """Cross-entropy over ``num_classes``; logs ``<stage>/loss`` and ``<stage>/acc`` and
    ``val/acc_best``; ``predict`` writes ``predictions.csv``."""

    data_facts = ("num_classes", "input_shape")

    def __init__(self, net: nn.Module, num_classes: int, classes: Sequence[str] | None = None, **kwargs: Any):
        super().__init__(net, **kwargs)
        self.save_plain_hyperparameters()
        self.classes = None if classes is None else [str(name) for name in classes]
        # ModuleDict keys: "train" would shadow Module.train.
        stages = ("train_", "val_", "test_")
        self.accuracy = nn.ModuleDict(
            {key: MulticlassAccuracy(num_classes, average="micro") for key in stages}
        )
        self.losses = nn.ModuleDict({key: MeanMetric(nan_strategy="disable") for key in ("val_", "test_")})
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # a resumed run still knows the best before it
        self._resumed_train_accuracy: list[dict[str, Any]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(logits, targets, reduction=reduction)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every rank's training accuracy of the epoch so far: train/acc of an epoch resumed from a
        # checkpoint taken mid-epoch still covers the whole epoch, as an exact resume needs.
        accuracy = self.accuracy["train_"]
        state = {name: value.cpu() for name, value in accuracy.metric_state.items()}
        mine = {"state": state, "updates": accuracy._update_count}
        checkpoint["train_accuracy"] = gather(self.trainer, mine)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_train_accuracy = checkpoint.get("train_accuracy")

    def on_train_start(self) -> None:
        super().on_train_start()
        if self._resumed_train_accuracy is not None:
            saved = self._resumed_train_accuracy[self.global_rank]
            accuracy = self.accuracy["train_"]
            for name, value in saved["state"].items():
                setattr(accuracy, name, value.to(self.device))
            accuracy._update_count = saved["updates"]
            self._resumed_train_accuracy = None

    def logged_metrics(self) -> set[str]:
        return super().logged_metrics() | {"train/acc", "val/acc", "test/acc", "val/acc_best"}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = self.loss(logits, y)
        self.accuracy["train_"].update(logits.detach(), y)
        if self.is_logging_step():
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        self.log("train/acc", self.accuracy["train_"].compute())
        self.accuracy["train_"].reset()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_acc_best(self.accuracy["val_"].compute())
            self.log("val/acc_best", self.val_acc_best.compute())

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.evaluate(batch, "test")

    def evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> None:
        x, y = batch
        logits = self(x)
        self.losses[f"{stage}_"].update(self.loss(logits, y, reduction="none"))
        self.accuracy[f"{stage}_"].update(logits, y)
        self.log(f"{stage}/loss", self.losses[f"{stage}_"], prog_bar=True)
        self.log(f"{stage}/acc", self.accuracy[f"{stage}_"], prog_bar=True)

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        probs = self(x).softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}

    def configure_callbacks(self) -> list[Callback]:
        return writer_when_predicting(self, ClassPredictionWriter)

    def example_input(self) -> torch.Tensor | None:
        shape = getattr(self.trainer.datamodule, "input_shape", None)
        return torch.zeros(2, *shape) if shape else None

    def deployable(self, datamodule: Any) -> Deployable:
        return pixel_classifier(self.net, datamodule, self.hparams.num_classes, self.classes)


class LanguageModel(TaskModule):
    """Next-character cross-entropy; logs ``<stage>/loss``; ``predict`` continues each prompt greedily
    by ``predict_tokens`` characters into ``predictions.jsonl``."""

    data_facts = ("vocab", "vocab_size")

    def __init__(self, net: nn.Module, vocab: str, predict_tokens: int = 8, **kwargs: Any) -> None:
        super().__init__(net, **kwargs)
        self.save_plain_hyperparameters()
        self.remove_ignored_hparams(["predict_tokens"])
        self.vocab = vocab
        self.predict_tokens = predict_tokens
        self.losses = nn.ModuleDict({key: MeanMetric(nan_strategy="disable") for key in ("val_", "test_")})

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(idx)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss(self(x), y)
        if self.is_logging_step():
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.evaluate(batch, "test")

    def evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> None:
        x, y = batch
        self.losses[f"{stage}_"].update(self.loss(self(x), y, reduction="none"))
        self.log(f"{stage}/loss", self.losses[f"{stage}_"], prog_bar=True)

    def generate(self, prompt: str, tokens: int) -> str:
        """The prompt and ``tokens`` more characters, each the most likely."""
        idx = torch.tensor([[self.vocab.index(c) for c in prompt]], device=self.device)
        with torch.inference_mode():
            for _ in range(tokens):
                logits = self.net(idx[:, -self.net.block_size :])[:, -1]
                idx = torch.cat((idx, logits.argmax(dim=-1, keepdim=True)), dim=1)
        return "".join(self.vocab[i] for i in idx[0].tolist())

    def predict_step(self, batch: list[str], batch_idx: int) -> list[str]:
        return [self.generate(prompt, self.predict_tokens) for prompt in batch]

    def configure_callbacks(self) -> list[Callback]:
        return writer_when_predicting(self, TextPredictionWriter)

    def deployable(self, datamodule: Any) -> Deployable:
        return token_model(self.net, self.vocab, self.net.block_size)
