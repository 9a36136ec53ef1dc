from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import Callback
from matplotlib.figure import Figure
from projkit.callbacks.prediction_writer import ClassPredictionWriter, writer_when_predicting
from projkit.checks.model import warn_if_normalised_otherwise
from projkit.deploy import Deployable, pixel_classifier
from projkit.logger_media import log_picture, takes_pictures
from projkit.reliability import gather
from projkit.task import TaskModule
from torch import nn
from torch.nn import functional as F
from torchmetrics import MaxMetric, MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from proj.data.image import adopt_network_normalisation

MISCLASSIFIED_SHOWN = 32


class MacroF1Score(MulticlassF1Score):
    """torchmetrics' macro F1, never above 1: the mean of the per-class scores of the classes seen
    (with a sample or a prediction), as there, but summed before it is divided. torchmetrics divides
    each score by the number of classes first, and ten perfect scores of 0.1 each add up to
    1.0000001 in float32."""

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes, average="none")

    def compute(self) -> torch.Tensor:
        scores = super().compute()
        seen = (self.tp + self.fp + self.fn > 0).to(scores.dtype)
        return (scores * seen).sum() / seen.sum().clamp(min=1)


class ImageClassifier(TaskModule):
    """Trains any image network with cross-entropy; logs accuracy and macro-F1 per stage.

    Metric names follow ``<stage>/<metric>`` (``train/loss``, ``val/acc``, ``test/f1``) plus
    ``val/acc_best``, the best validation accuracy so far, which checkpointing can monitor.
    ``num_classes`` is linked from the data module by the CLI, and so are the class names,
    ``classes``, where the data module has them (folder names for ``ImageFolderDataModule``): the
    checkpoint keeps them, so ``predict`` and ``export`` name the classes without the data.

    Two methods are meant to be overridden, so that a variant is a subclass of a few lines rather
    than a copy: ``loss`` (every stage's loss: a focal loss is one method) and ``configure_metrics``
    (the metrics each stage reports).

    With ``log_pictures``, each validation and test ends with two pictures for the loggers that show
    them (TensorBoard, W&B): ``<stage>/confusion_matrix``, counted over every process, and
    ``<stage>/misclassified``, a grid of up to 32 misclassified images with their true and predicted
    classes, drawn from rank 0's share. Class names and un-normalised pixels come from the data
    module (``classes``, ``to_pixels``) when it has them. Training steps are untouched.

    ``predict`` writes ``predictions.csv`` (``projkit.callbacks.ClassPredictionWriter``) in the run
    directory: each sample's index or file name, its predicted class and that class's probability.
    """

    data_facts = ("num_classes", "input_shape")

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        label_smoothing: float = 0.0,
        log_pictures: bool = True,
        classes: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``kwargs``: ``TaskModule``'s settings (optimizer, scheduler, compile, ...), which the CLI and
        ``--help`` list too."""
        super().__init__(net, **kwargs)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"model.label_smoothing must be in [0, 1] (0: none), got {label_smoothing}")
        if classes is not None and len(classes) != num_classes:
            raise ValueError(f"model.classes names {len(classes)} classes but num_classes is {num_classes}")
        self.save_plain_hyperparameters()
        # What to show is no property of the weights, and a checkpoint's hyperparameters override
        # the command line, so it stays out: `test --model.init_args.log_pictures=false` works.
        self.remove_ignored_hparams(["log_pictures"])
        self.log_pictures = log_pictures
        self.label_smoothing = label_smoothing
        self.classes = None if classes is None else [str(name) for name in classes]
        metrics = self.configure_metrics()
        self.train_metrics, self.val_metrics, self.test_metrics = (
            metrics.clone(prefix=f"{stage}/") for stage in ("train", "val", "test")
        )
        # Kept in checkpoints, so a resumed run still knows the best accuracy from before.
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)
        # Per-sample losses averaged over the whole split, so a short last batch or an uneven DDP
        # shard weighs what it holds (``nan_strategy="disable"`` spares a host sync per batch).
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")
        self.val_confusion = MulticlassConfusionMatrix(num_classes)
        self.test_confusion = MulticlassConfusionMatrix(num_classes)
        self._pictures = False
        self._misclassified: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        # The epoch's training predictions, given to the training metrics in one update at the end
        # of the epoch: an update per step costs a dozen small operations and, on a GPU, the host
        # sync of their input checks (a quarter of a millisecond per step on a CPU).
        self._train_preds: list[torch.Tensor] = []
        self._train_targets: list[torch.Tensor] = []
        self._resumed_train_outputs: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(
        self, logits: torch.Tensor, targets: torch.Tensor, reduction: Literal["mean", "none"] = "mean"
    ) -> torch.Tensor:
        """Cross-entropy with ``label_smoothing``, per sample for ``reduction="none"`` (see
        ``TaskModule.loss``). Override it to train with another loss: every stage uses it."""
        return F.cross_entropy(logits, targets, reduction=reduction, label_smoothing=self.label_smoothing)

    def configure_metrics(self) -> MetricCollection:
        """The metrics each stage logs as ``<stage>/<name>``, built once and cloned per stage.

        Validation and test update them with the logits; training, once per epoch, with the
        predicted classes (storing an epoch of logits would cost memory with many classes), which
        torchmetrics' classification metrics accept alike. Keep ``acc``: ``val/acc_best`` reads it.
        """
        accuracy = MulticlassAccuracy(self.hparams.num_classes, average="micro")
        f1 = MacroF1Score(self.hparams.num_classes)
        return MetricCollection({"acc": accuracy, "f1": f1})

    def logged_metrics(self) -> set[str]:
        stages = (self.train_metrics, self.val_metrics, self.test_metrics)
        return (
            super().logged_metrics()
            | {"val/acc_best"}
            | {name for m in stages for name in m.keys(keep_base=False)}
        )

    def example_input(self) -> torch.Tensor | None:
        shape = getattr(self.trainer.datamodule, "input_shape", None)
        return torch.zeros(2, *shape) if shape else None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        warn_if_normalised_otherwise(self.net, self.trainer.datamodule)

    def on_train_start(self) -> None:
        super().on_train_start()
        if self._resumed_train_outputs is not None:
            preds, targets = self._resumed_train_outputs[self.global_rank]
            self._train_preds, self._train_targets = [preds.to(self.device)], [targets.to(self.device)]
            self._resumed_train_outputs = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A checkpoint taken mid-epoch keeps the epoch's training predictions so far (every rank's),
        # so train/acc and train/f1 of a resumed epoch still cover the whole epoch.
        if self._train_preds:
            mine = (torch.cat(self._train_preds).cpu(), torch.cat(self._train_targets).cpu())
            checkpoint["train_epoch_outputs"] = gather(self.trainer, mine)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_train_outputs = checkpoint.get("train_epoch_outputs")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = self.loss(logits, y)
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

    def on_validation_epoch_start(self) -> None:
        self._start_pictures()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics, self.val_loss, self.val_confusion)

    def on_validation_epoch_end(self) -> None:
        # The sanity check validates untrained weights: it must not count as a best.
        if not self.trainer.sanity_checking:
            self.val_acc_best(self.val_metrics["acc"].compute())
            self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)
        self._log_pictures("val", self.val_confusion)

    def on_test_epoch_start(self) -> None:
        self._start_pictures()

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_metrics, self.test_loss, self.test_confusion)

    def on_test_epoch_end(self) -> None:
        self._log_pictures("test", self.test_confusion)

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        probs = self(x).softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}

    def configure_callbacks(self) -> list[Callback]:
        # `predict` writes predictions.csv into the run directory; fit and test get nothing.
        return writer_when_predicting(self, ClassPredictionWriter)

    def deployable(self, datamodule: Any) -> Deployable:
        """What ``export`` writes: the network behind the data's normalisation, taking pixels. Export
        sets no data up, so a pretrained network's own normalisation is adopted here, as setup does."""
        adopt_network_normalisation(datamodule)
        return pixel_classifier(self.net, datamodule, self.hparams.num_classes, self.classes)

    def _evaluate(
        self,
        batch: tuple[torch.Tensor, torch.Tensor],
        stage: str,
        metrics: MetricCollection,
        loss: MeanMetric,
        confusion: MulticlassConfusionMatrix,
    ) -> None:
        x, y = batch
        logits = self(x)
        loss.update(self.loss(logits, y, reduction="none"))
        metrics.update(logits, y)
        # Metric objects are computed over the whole split and synced across DDP ranks, so every
        # rank agrees on the monitored value (and so on the best checkpoint).
        self.log(f"{stage}/loss", loss, prog_bar=True)
        self.log_dict(metrics, prog_bar=True)
        if self._pictures:
            preds = logits.argmax(dim=-1)
            confusion.update(preds, y)
            self._keep_misclassified(x, y, preds)

    def _start_pictures(self) -> None:
        # The same on every rank (the loggers are), as the confusion matrix's sync needs.
        trainer = self.trainer
        self._pictures = self.log_pictures and not trainer.sanity_checking and takes_pictures(self.loggers)
        self._misclassified = []

    def _keep_misclassified(self, x: torch.Tensor, y: torch.Tensor, preds: torch.Tensor) -> None:
        # Costs a device sync per batch, on rank 0 only, and only until the grid is full.
        room = MISCLASSIFIED_SHOWN - sum(len(kept[0]) for kept in self._misclassified)
        if room <= 0 or not self.trainer.is_global_zero:
            return
        wrong = (preds != y).nonzero().squeeze(1)[:room]
        if len(wrong):
            self._misclassified.append((x[wrong].cpu(), y[wrong].cpu(), preds[wrong].cpu()))

    def _log_pictures(self, stage: str, confusion: MulticlassConfusionMatrix) -> None:
        if not self._pictures:
            return
        matrix = confusion.compute()  # every rank takes part: the counts are summed over processes
        confusion.reset()
        if not self.trainer.is_global_zero:
            return
        datamodule = self.trainer.datamodule
        classes = self.classes or getattr(datamodule, "classes", None) or range(self.hparams.num_classes)
        classes = list(classes)
        figure = Figure(figsize=(6, 6), layout="constrained")
        confusion.plot(matrix, ax=figure.subplots(), labels=classes)
        log_picture(self.loggers, f"{stage}/confusion_matrix", figure, self.global_step)
        if self._misclassified:
            x, y, preds = (torch.cat(parts) for parts in zip(*self._misclassified, strict=True))
            to_pixels = getattr(datamodule, "to_pixels", None) or min_max
            figure = misclassified_figure(to_pixels(x), y, preds, classes)
            log_picture(self.loggers, f"{stage}/misclassified", figure, self.global_step)
        self._misclassified = []


def misclassified_figure(
    images: torch.Tensor, labels: torch.Tensor, preds: torch.Tensor, classes: Sequence[Any]
) -> Figure:
    """A grid of images in [0, 1], (N, C, H, W), each titled with its true and predicted class."""
    cols = min(8, len(images))
    rows = math.ceil(len(images) / cols)
    figure = Figure(figsize=(1.5 * cols, 1.7 * rows), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False).flat
    for ax, image, label, pred in zip(axes, images, labels, preds, strict=False):
        grey = image.shape[0] == 1
        shown = image[0] if grey else image.permute(1, 2, 0)
        ax.imshow(shown.numpy(), cmap="gray" if grey else None, vmin=0, vmax=1)
        ax.set_title(f"true {classes[label]}\npred {classes[pred]}", fontsize=8)
    for ax in figure.axes:
        ax.set_axis_off()
    return figure


def min_max(x: torch.Tensor) -> torch.Tensor:
    """Each image stretched to [0, 1]: the view of images whose normalisation is unknown."""
    low = x.amin(dim=(1, 2, 3), keepdim=True)
    high = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x - low) / (high - low).clamp_min(1e-12)
