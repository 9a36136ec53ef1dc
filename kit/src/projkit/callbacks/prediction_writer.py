"""What ``predict`` leaves behind: a file of predictions in the run directory, never overwritten.

Lightning's ``BasePredictionWriter`` hands each rank its predictions and the dataset indices they
belong to; the writers here gather every rank's rows on rank 0, put them back in sample order and
write one file there, so a DDP run writes the same file as a single process.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from collections.abc import Callable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import IO, Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.trainer.states import TrainerFn

from projkit.data.names import printable
from projkit.rundir.naming import run_directory


class PredictionFileWriter(BasePredictionWriter):
    """Writes ``<stem><suffix>`` in the run directory (``stem-1``, ``stem-2``, … when taken) and
    prints its path.

    A subclass turns each rank's predictions into rows that start with the sample's index in the
    predict split (``rows``) and writes the ordered rows of all ranks (``write``), which may add
    lines for the console to ``messages``. ``path`` is the file written last, on rank 0.
    """

    stem = "predictions"
    suffix: str

    def __init__(self, write_interval: Literal["epoch", "batch_and_epoch"] = "epoch") -> None:
        super().__init__(write_interval)
        self.path: Path | None = None
        self.messages: list[str] = []

    def rows(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Sequence[int]],
    ) -> list[tuple]:
        raise NotImplementedError

    def write(self, trainer: Trainer, file: IO[str], rows: list[tuple]) -> None:
        raise NotImplementedError

    def write_on_epoch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any],
    ) -> None:
        # One predict dataloader: Lightning flattens its predictions but not its batch indices.
        rows = self.rows(trainer, pl_module, predictions, batch_indices[0])
        rows = gather_on_rank_zero(trainer, rows)
        if not trainer.is_global_zero:
            return
        ordered = sorted(rows, key=itemgetter(0))
        folder = Path(run_directory(trainer))
        self.path = write_new_file(
            folder, self.stem, self.suffix, lambda file: self.write(trainer, file, ordered)
        )
        self.messages.append(f"Predictions written to {self.path}")

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Printed once the progress bar has finished its line (it is an earlier callback).
        for message in self.messages:
            print(message)
        self.messages = []


class ClassPredictionWriter(PredictionFileWriter):
    """``predictions.csv``: per sample its identifier, the predicted class and that class's
    probability, from ``ImageClassifier.predict_step``'s ``probs`` and ``preds``.

    The identifier is the sample's index in the predict split (column ``index``), or its file name
    (column ``file``) when the data module predicts on files and lists them in ``predict_files``.
    Classes are named as the checkpoint names them (``ImageClassifier.classes``), else by the data
    module's ``classes`` where it has them.
    """

    suffix = ".csv"

    def rows(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        predictions: Sequence[dict[str, torch.Tensor]],
        batch_indices: Sequence[Sequence[int]],
    ) -> list[tuple[int, int, float]]:
        rows = []
        for batch, indices in zip(predictions, batch_indices, strict=True):
            preds = batch["preds"]
            probs = batch["probs"].gather(1, preds.unsqueeze(1)).squeeze(1)
            rows += zip(indices, preds.tolist(), probs.tolist(), strict=True)
        return rows

    def write(self, trainer: Trainer, file: IO[str], rows: list[tuple[int, int, float]]) -> None:
        files = getattr(trainer.datamodule, "predict_files", None)
        named = getattr(trainer.lightning_module, "classes", None)
        classes = named or getattr(trainer.datamodule, "classes", None)
        out = csv.writer(file)
        out.writerow(["file" if files else "index", "class", "probability"])
        for index, pred, prob in rows:
            name = printable(classes[pred]) if classes else pred
            out.writerow([printable(files[index]) if files else index, name, f"{prob:.6f}"])


class TextPredictionWriter(PredictionFileWriter):
    """``predictions.jsonl``: one ``{"prompt": ..., "text": ...}`` line per prompt, in prompt
    order, where ``text`` is the prompt and its continuation (``LanguageModel.predict_step``). The
    texts are printed too: a continuation is made to be read, not only stored.

    The prompts come from the batches, so any loader of prompt strings works: they are kept per
    batch (``write_on_batch_end``) until the epoch's rows are gathered.
    """

    suffix = ".jsonl"

    def __init__(self) -> None:
        super().__init__("batch_and_epoch")
        self._prompts: dict[int, str] = {}

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: list[str],
        batch_indices: Sequence[int],
        batch: list[str],
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        self._prompts.update(zip(batch_indices, batch, strict=True))

    def rows(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        predictions: Sequence[list[str]],
        batch_indices: Sequence[Sequence[int]],
    ) -> list[tuple[int, str, str]]:
        indices = itertools.chain.from_iterable(batch_indices)
        texts = itertools.chain.from_iterable(predictions)
        rows = [(i, self._prompts[i], text) for i, text in zip(indices, texts, strict=True)]
        self._prompts = {}
        return rows

    def write(self, trainer: Trainer, file: IO[str], rows: list[tuple[int, str, str]]) -> None:
        for n, (_, prompt, text) in enumerate(rows, 1):
            file.write(json.dumps({"prompt": prompt, "text": text}, ensure_ascii=False) + "\n")
            self.messages.append(f"--- prompt {n} of {len(rows)} ---\n{text}\n")


def writer_when_predicting(module: LightningModule, writer: type[PredictionFileWriter]) -> list[Callback]:
    """The writer for a task module's ``configure_callbacks``: only while predicting, so ``fit`` and
    ``test`` are untouched, and only when no prediction writer is configured, so one given in the
    config's ``trainer.callbacks`` takes its place."""
    trainer = module.trainer
    if trainer.state.fn != TrainerFn.PREDICTING:
        return []
    if any(isinstance(callback, BasePredictionWriter) for callback in trainer.callbacks):
        return []
    return [writer()]


def gather_on_rank_zero(trainer: Trainer, rows: list[tuple]) -> list[tuple]:
    """Every rank's rows on rank 0 (the others get none); a single process keeps its own."""
    if trainer.world_size == 1 or not torch.distributed.is_initialized():
        return rows
    gathered = [None] * trainer.world_size if trainer.is_global_zero else None
    torch.distributed.gather_object(rows, gathered, dst=0)
    return [row for part in gathered for row in part] if trainer.is_global_zero else []


def write_new_file(folder: Path, stem: str, suffix: str, write: Callable[[IO[str]], None]) -> Path:
    """Write ``folder/stem+suffix`` with ``write``, or ``stem-1``, ``stem-2``, … when taken; returns
    its path.

    The file appears complete or not at all: it is written to a temporary file beside it, synced,
    then linked under the first free name, so a process killed while writing leaves no partial
    file (the temporary one goes with the next command on the run). Each name is taken
    exclusively, so an earlier file is never overwritten, even by a run racing this one.
    """
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{stem}{suffix}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8", newline="") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        for n in itertools.count():
            path = folder / (f"{stem}-{n}{suffix}" if n else f"{stem}{suffix}")
            try:
                os.link(temporary, path)
            except FileExistsError:
                continue
            return path
    finally:
        temporary.unlink(missing_ok=True)
