"""Training order that a checkpoint can restore exactly, mid-epoch included."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sized
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from proj.data.tensors import keep_batch


class ResumableSampler(DistributedSampler):
    """Shuffles each epoch with a generator seeded by ``seed + epoch`` and can start part-way.

    The order of an epoch is a pure function of (seed, epoch, rank), never of the global RNG, so a
    resumed run sees the same order; ``start`` skips the samples this rank already trained on, once.
    It is a ``DistributedSampler``, so Lightning leaves it in place under DDP and each rank keeps its
    own shard and position. ``epoch_size`` caps an epoch at that many samples (across all ranks),
    for data sets where an "epoch" is a chosen number of random draws.
    """

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        epoch_size: int | None = None,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.epoch_size = epoch_size
        if epoch_size is not None:
            self.num_samples = -(-epoch_size // num_replicas)
            self.total_size = self.num_samples * num_replicas
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        indices = torch.randperm(len(self.dataset), generator=generator)
        if self.total_size > len(indices):
            indices = indices.repeat(-(-self.total_size // len(indices)))
        mine = indices[: self.total_size][self.rank :: self.num_replicas]
        start, self.start = self.start, 0
        return iter(mine[start:].tolist())


class ResumableDataModule(LightningDataModule):
    """A data module of whole-tensor splits (``self.splits``, datasets with a batched
    ``__getitems__``) whose training order is saved in checkpoints and restored on resume.

    Lightning stores ``state_dict()`` in every checkpoint and hands it back through
    ``load_state_dict()`` before the training loader is built, so ``train_loader`` can start the
    sampler at the saved epoch and batch. The loader's own generator (used for worker seeds) is
    seeded too, so building a loader never draws from the global RNG that dropout uses.
    """

    batch_size: int
    num_workers: int
    pin_memory: bool
    splits: dict[str, Dataset]

    def __init__(self) -> None:
        super().__init__()
        self._resume_from: dict[str, Any] | None = None

    def loader_kwargs(self) -> dict[str, Any]:
        return {
            "collate_fn": keep_batch,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.num_workers > 0,
        }

    def loader(self, split: str) -> DataLoader:
        """The loader of an evaluation split, in order.

        Under DDP each rank takes every ``world_size``-th sample and no more: Lightning's default
        ``DistributedSampler`` would pad the shards with repeated samples, which the metrics would
        then count twice.
        """
        dataset, sampler, trainer = self.splits[split], None, self.trainer
        if trainer is not None and trainer.world_size > 1:
            sampler = UnrepeatedDistributedSampler(
                dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
            )
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, **self.loader_kwargs())

    def train_loader(self, dataset: Sized, epoch_size: int | None = None) -> DataLoader:
        trainer = self.trainer
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        sampler = ResumableSampler(dataset, replicas, rank, seed=seed, epoch_size=epoch_size)
        if self._resume_from is not None:
            epoch, batches = self._resume_from["epoch"], self._resume_from["batches"]
            if self._resume_from["epoch_done"]:
                sampler.set_epoch(epoch + 1)
            else:
                sampler.set_epoch(epoch)
                sampler.start = batches * self.batch_size
            self._resume_from = None
        generator = torch.Generator().manual_seed(seed)
        return DataLoader(
            dataset, batch_size=self.batch_size, sampler=sampler, generator=generator, **self.loader_kwargs()
        )

    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None or trainer.state.fn != TrainerFn.FITTING:
            return {}
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {
            "train_order": {
                "epoch": trainer.current_epoch,
                "batches": batches,
                "epoch_done": batches >= trainer.num_training_batches,
                "world_size": trainer.world_size,
            }
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume_from = state_dict.get("train_order")
        saved = (self._resume_from or {}).get("world_size", 1)
        now = self.trainer.world_size if self.trainer is not None else 1
        if saved != now and not (self._resume_from or {}).get("epoch_done"):
            # Each process's position is counted in its own shard: with another number of
            # processes the rest of the epoch would be other samples than the interrupted run's.
            raise ValueError(
                f"--ckpt_path: the checkpoint was written mid-epoch by a run of {saved} process(es), and "
                f"this run has {now}. Resume it with the same number of processes (trainer.devices x "
                f"trainer.num_nodes = {saved}, e.g. --trainer.devices={saved}), or resume from a "
                "checkpoint written at an epoch's end."
            )
        # Lightning warns that a plain DataLoader cannot resume mid-epoch; this one's sampler does.
        warnings.filterwarnings(
            "ignore", message="You're resuming from a checkpoint that ended before the epoch"
        )
