"""The loaders every data module builds: one batched gather for whole-tensor datasets, per-item
calls, workers and Lightning's default collation for any other map-style dataset. Training goes in
the resumable order of ``projkit.reliability.TrainOrder``."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset

from projkit import library_warnings
from projkit.data.in_memory import keep_batch
from projkit.reliability import TrainOrder


def batched(dataset: Dataset) -> bool:
    """Whether ``dataset`` cuts a whole batch in one ``__getitems__`` call (whole-tensor datasets)."""
    return hasattr(type(dataset), "__getitems__")


def loader_options(dataset: Dataset, num_workers: int, pin_memory: bool) -> dict[str, Any]:
    """``DataLoader`` options for ``dataset``: a batched dataset returns its batch as it is
    (``keep_batch``), a per-item one gets Lightning's default collation."""
    options = {"num_workers": num_workers, "pin_memory": pin_memory, "persistent_workers": num_workers > 0}
    return {**options, "collate_fn": keep_batch} if batched(dataset) else options


def eval_loader(
    dataset: Dataset, batch_size: int, trainer: Trainer | None, num_workers: int = 0, pin_memory: bool = False
) -> DataLoader:
    """The loader of an evaluation split, in order.

    Under DDP each rank takes every ``world_size``-th sample and no more: Lightning's default
    ``DistributedSampler`` would pad the shards with repeated samples, which the metrics would
    then count twice.
    """
    sampler = None
    if trainer is not None and trainer.world_size > 1:
        sampler = UnrepeatedDistributedSampler(
            dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
        )
    options = loader_options(dataset, num_workers, pin_memory)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **options)


def _without_worker_hint(dataset: Dataset, prefix: str) -> None:
    """A whole-tensor dataset's loader (Lightning's ``<prefix>_dataloader``), cut a batch at a time in
    this process, goes without Lightning's hint to add loader workers, which would only slow it."""
    if batched(dataset):
        library_warnings.whole_tensor_loader(f"{prefix}_dataloader")


def streamed(dataset: Any, settings: Any, resume: dict[str, Any] | None = None) -> DataLoader:
    """LitData's loader of a streamed split, with the module's loader settings."""
    from projkit.data.streaming import streaming_loader

    return streaming_loader(dataset, settings.batch_size, settings.num_workers, settings.pin_memory, resume)


class SplitLoaders:
    """The loaders and checkpoint hooks of a data module whose splits are datasets in ``self.splits``:
    training in ``self.train_order``'s resumable order, evaluation in order, with the module's saved
    ``batch_size``, ``num_workers`` and ``pin_memory`` (``self.hparams``, as ``save_hyperparameters``
    keeps them; a batch-size finder sets them there too). Mixed in before ``LightningDataModule``; a
    module only adds its ``predict_dataloader`` and, for an epoch that is not one pass over the
    training split, ``train_epoch_size``."""

    splits: dict[str, Dataset]
    hparams: Any
    train_order: TrainOrder
    trainer: Trainer | None
    stream: tuple[str, dict[str, Any]] | None = None  # the URL and record of streamed splits
    stream_read: tuple[str, dict[str, Any]] | None = None  # the URL and record stream_record read

    def stream_record(self, url: str) -> dict[str, Any]:
        """The checked ``streaming.json`` under ``url``, read once by this data module: what it needs
        before its splits (a text's vocabulary, when the CLI builds the model) and the splits come
        from one listing and one read (of an object store, each a request)."""
        if self.stream_read is None or self.stream_read[0] != url:
            from projkit.data.streaming import read_record  # LitData: imported by streamed runs only

            self.stream_read = (url, read_record(url))
        return self.stream_read[1]

    def stream_splits(
        self, url: str, block_size: int | None = None, transform: Any = None, train_transform: Any = None
    ) -> dict[str, Any]:
        """Read the splits from the chunks ``optimize`` wrote under ``url`` (``projkit.data.streaming``):
        LitData's loaders serve them, and resume from LitData's state. ``transform`` applies to each
        item read, ``train_transform`` in its place to training's, its random draws repeated exactly
        on a resume (``open_splits``). Returns the stored facts."""
        from projkit.data import streaming  # LitData: imported by streamed runs only

        splits, record = streaming.open_splits(
            url, streaming.seed(), block_size, transform, train_transform, record=self.stream_record(url)
        )
        streaming.check_facts(record["facts"], getattr(self, "stream_facts", None) or {}, url)
        self.splits.update(splits)
        self.stream = (url, record)
        self.stream_position = streaming.StreamPosition()
        return record["facts"]

    def train_epoch_size(self) -> int | None:
        """Samples an epoch draws; None: each training sample once."""
        return None

    def train_dataloader(self) -> DataLoader:
        dataset, settings = self.splits["train"], self.hparams
        if self.stream is not None:
            return streamed(dataset, settings, self.stream_position.take())
        _without_worker_hint(dataset, "train")
        return self.train_order.loader(
            dataset,
            settings.batch_size,
            self.trainer,
            self.train_epoch_size(),
            batched=batched(dataset),
            **loader_options(dataset, settings.num_workers, settings.pin_memory),
        )

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")

    def loader(self, split: str) -> DataLoader:
        settings = self.hparams
        if self.stream is not None and split in ("train", "val", "test"):
            return streamed(self.splits[split], settings)
        stage = getattr(getattr(self.trainer, "state", None), "stage", None)
        if stage is not None:  # the loop that asks: val (or the sanity check), test or predict
            _without_worker_hint(self.splits[split], stage.dataloader_prefix)
        return eval_loader(
            self.splits[split], settings.batch_size, self.trainer, settings.num_workers, settings.pin_memory
        )

    def state_dict(self) -> dict[str, Any]:
        if self.stream is not None:
            return self.stream_position.state_dict(self.stream[1], self.trainer)
        return self.train_order.state_dict(self.trainer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.stream is not None or "stream" in state_dict:
            if getattr(getattr(self.trainer, "state", None), "fn", None) != TrainerFn.FITTING:
                return  # an evaluation reads its splits whole: any data, the checkpoint's or other
            from projkit.data.streaming import StreamPosition

            url, record = self.stream or (None, {})
            position = self.stream_position if self.stream is not None else StreamPosition()
            position.load_state_dict(state_dict.get("stream"), record, url, self.trainer)
            return
        self.train_order.load_state_dict(state_dict, self.trainer)
