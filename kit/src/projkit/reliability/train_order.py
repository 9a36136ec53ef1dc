"""Training order that a checkpoint restores exactly, mid-epoch included, whatever the dataset."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sized
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from projkit.errors import ConfigError


class ResumableSampler(DistributedSampler):
    """Shuffles each epoch with a generator seeded by ``seed + epoch`` and can start part-way.

    The order of an epoch is a pure function of (seed, epoch, rank), never of the global RNG, so a
    resumed run sees the same order; ``start`` skips the samples this rank already trained on, once.
    It is a ``DistributedSampler``, so Lightning leaves it in place under DDP and each rank keeps its
    own shard and position. ``epoch_size`` caps an epoch at that many samples (across all ranks),
    for data sets where an "epoch" is a chosen number of random draws.

    ``keyed`` yields ``(index, item_seed)`` pairs for ``SeededItems``: one seed per position of the
    epoch, drawn from the same generator after the order, so random transforms are a function of
    (seed, epoch, position) too.
    """

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        epoch_size: int | None = None,
        keyed: bool = False,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.epoch_size = epoch_size
        if epoch_size is not None:
            self.num_samples = -(-epoch_size // num_replicas)
            self.total_size = self.num_samples * num_replicas
        self.keyed = keyed
        self.start = 0

    def __iter__(self) -> Iterator[int] | Iterator[tuple[int, int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        indices = torch.randperm(len(self.dataset), generator=generator)
        if self.total_size > len(indices):
            indices = indices.repeat(-(-self.total_size // len(indices)))
        mine = indices[: self.total_size][self.rank :: self.num_replicas]
        start, self.start = self.start, 0
        if not self.keyed:
            return iter(mine[start:].tolist())
        # torch's CPU generator keeps 32 bits of a seed, so that is all a seed gets.
        seeds = torch.randint(2**32, (self.total_size,), generator=generator)
        mine_seeds = seeds[self.rank :: self.num_replicas]
        return zip(mine[start:].tolist(), mine_seeds[start:].tolist(), strict=True)


class SeededItems(Dataset):
    """A per-item dataset whose item ``(index, item_seed)`` is built with torch's RNG seeded by
    ``item_seed``, the global RNG left as it was.

    Random transforms then draw the same numbers for a sample wherever it is built: in the main
    process or any loader worker, in an uninterrupted run or one resumed mid-epoch (whose fresh
    workers would otherwise restart their RNG streams), and dropout in the training step never
    sees the data's draws. torchvision's transforms draw from torch's RNG; one drawing from
    ``random`` or NumPy would not repeat on resume.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, item_seed = key
        # The default generator itself: torch.manual_seed would also seed every accelerator, and
        # costs 50x more per item.
        rng = torch.default_generator
        state = rng.get_state()
        rng.manual_seed(item_seed)
        try:
            return self.dataset[index]
        finally:
            rng.set_state(state)


def check_position(position: Any) -> None:
    """A saved position must be what ``TrainOrder.state_dict`` writes: the sampler starts from it."""
    if position is None:
        return
    shape = {"epoch": 0, "batches": 0, "epoch_done": False, "world_size": 1}
    ok = isinstance(position, dict) and all(
        key in position
        and (type(position[key]) is bool if key == "epoch_done" else type(position[key]) is int)
        and 0 <= position[key] < 2**63
        and (key != "world_size" or position[key] >= 1)
        for key in shape
    )
    if not ok:
        raise ConfigError(
            f"--ckpt_path: the checkpoint's training position is {str(position)[:200]}, not what the kit "
            "writes (a whole epoch, batches and world_size and a true/false epoch_done): it was edited or "
            "made elsewhere. Use another checkpoint of the run (runs/<experiment>/<version>/checkpoints/)."
        )


class TrainOrder:
    """The training order of a data module: builds its training loader and holds where a
    checkpoint left it, so the order is resumed exactly, mid-epoch included.

    A data module keeps one and hands Lightning's checkpoint hooks to it::

        def state_dict(self):
            return self.train_order.state_dict(self.trainer)

        def load_state_dict(self, state_dict):
            self.train_order.load_state_dict(state_dict, self.trainer)

    Lightning stores ``state_dict()`` in every checkpoint and hands it back through
    ``load_state_dict()`` before the training loader is built, so ``loader`` starts the sampler at
    the saved epoch and batch. The loader's own generator (used for worker seeds) is seeded too, so
    building a loader never draws from the global RNG that dropout uses. A per-item dataset is
    wrapped in ``SeededItems``, so its random transforms repeat exactly with or without workers.
    """

    def __init__(self) -> None:
        self._resume_from: dict[str, Any] | None = None

    def loader(
        self,
        dataset: Sized,
        batch_size: int,
        trainer: Trainer | None,
        epoch_size: int | None = None,
        batched: bool = False,
        **options: Any,
    ) -> DataLoader:
        """The training loader, from where a loaded checkpoint left off. ``batched``: ``dataset``
        cuts whole batches itself, so its items need no seeds; ``options`` go to the ``DataLoader``."""
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        keyed = not batched
        sampler = ResumableSampler(dataset, replicas, rank, seed=seed, epoch_size=epoch_size, keyed=keyed)
        if self._resume_from is not None:
            epoch, batches = self._resume_from["epoch"], self._resume_from["batches"]
            if self._resume_from["epoch_done"]:
                sampler.set_epoch(epoch + 1)
            else:
                sampler.set_epoch(epoch)
                sampler.start = batches * batch_size
            self._resume_from = None
        generator = torch.Generator().manual_seed(seed)
        items = SeededItems(dataset) if keyed else dataset
        return DataLoader(items, batch_size=batch_size, sampler=sampler, generator=generator, **options)

    def state_dict(self, trainer: Trainer | None) -> dict[str, Any]:
        """Where training stands: epoch, batches done in it, and the number of processes."""
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

    def load_state_dict(self, state_dict: dict[str, Any], trainer: Trainer | None) -> None:
        self._resume_from = state_dict.get("train_order") if isinstance(state_dict, dict) else {}
        check_position(self._resume_from)
        saved = (self._resume_from or {}).get("world_size", 1)
        now = trainer.world_size if trainer is not None else 1
        if saved != now and not (self._resume_from or {}).get("epoch_done"):
            # Each process's position is counted in its own shard: with another number of
            # processes the rest of the epoch would be other samples than the interrupted run's.
            raise ConfigError(
                f"--ckpt_path: the checkpoint was written mid-epoch by a run of {saved} process(es), and "
                f"this run has {now}. Resume it with the same number of processes (trainer.devices x "
                f"trainer.num_nodes = {saved}, e.g. --trainer.devices={saved}), or resume from a "
                "checkpoint written at an epoch's end."
            )
        # Lightning warns that a plain DataLoader cannot resume mid-epoch; this one's sampler does.
        warnings.filterwarnings(
            "ignore", message="You're resuming from a checkpoint that ended before the epoch"
        )
