"""How many times faster the data path delivers training batches than the training step uses them.

For each experiment (by default each of the checkout's, ``configs/<name>.yaml``; ``--experiment``
takes one name or a config's path), built from its config as shipped: batches/s of the data path
(the data module's training loader with the config's batch size, workers and ``pin_memory``, each
batch moved to the device and through the data module's ``on_after_batch_transfer``: scaling,
normalisation and the training augmentation) divided by batches/s of the training step alone (forward, loss,
backward, clipping, optimizer and scheduler steps, at the config's precision) on a batch already
there. The device is the one the config picks (``accelerator: auto``), so run it on the machine
that trains: on a CPU the step is slow and every ratio is large; on a GPU the step is fast and the
data path, still on the host, is what can fall behind. Each ratio should be at least 5, leaving
room for a busier host; the last line is the lowest::

    python kit/benchmarks/dataloading.py

Both sides are timed on the wall clock (loader workers are other processes), best of ``--rounds``,
each round at least ``--seconds`` long, after a warm-up that starts the workers.

A data module that reads a torchvision dataset (its ``dataset_class``: MNIST, Fashion-MNIST,
CIFAR-10) reads it from the config's ``data_dir`` when its files are there. Otherwise (no network
here) files of the real size (60,000 + 10,000 images of 28×28, or 50,000 + 10,000 of 32×32×3) with
random pixels are written in the real formats into a temporary
folder and read by the same torchvision readers, and the output says so; the one thing bypassed
then is CIFAR-10's md5 check, which no synthetic file can pass.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import pickle
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from torchvision import datasets
from torchvision.datasets import cifar

from common import (
    IMAGE_EXPERIMENTS,
    TEXT_EXPERIMENTS,
    PlainStep,
    build,
    cli,
    cli_args,
    device_batches,
    experiment_config,
    label,
    parse,
    parser,
    print_lowest,
    synchronize,
)
from projkit import strict_yaml

EXPERIMENTS = (*IMAGE_EXPERIMENTS, *TEXT_EXPERIMENTS)


def rate(call: Callable[[], object], device: torch.device, seconds: float, rounds: int) -> float:
    """Calls per second, best of ``rounds`` runs of at least ``seconds`` each after one warm-up
    call (which alone is the measure when it outlasts ``seconds``: a GPU config's step on a CPU
    takes minutes); the device is synchronised only around a run, so queued work overlaps as it
    does in training."""
    synchronize(device)
    start = time.perf_counter()
    call()
    synchronize(device)
    once = time.perf_counter() - start
    if once >= seconds:
        return 1 / once
    calls = math.ceil(seconds / once)
    best = 0.0
    for _ in range(rounds):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        synchronize(device)
        best = max(best, calls / (time.perf_counter() - start))
    return best


def write_idx(path: Path, array: np.ndarray) -> None:
    """The IDX format of the MNIST files: magic (0, 0, uint8 code, ndim), big-endian sizes, bytes."""
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def data_class(config: Path) -> type | None:
    """The data module class an experiment config states (``data.class_path``), if it states one."""
    data = (strict_yaml.read(config) or {}).get("data")
    class_path = data.get("class_path") if isinstance(data, dict) else None
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name, None)


def synthetic_kind(dataset_class: type | None) -> str | None:
    """Which of the formats this script writes ``dataset_class`` reads: ``cifar10`` or ``mnist``
    (MNIST's and its kin's IDX files), or None."""
    if not isinstance(dataset_class, type):
        return None
    if issubclass(dataset_class, datasets.CIFAR10):
        return "cifar10"
    if issubclass(dataset_class, datasets.MNIST):  # Fashion-MNIST, KMNIST: the same files
        return "mnist"
    return None


def write_synthetic(dataset_class: type, root: Path) -> None:
    """Files of the real size and format where torchvision's reader of ``dataset_class`` looks."""
    rng = np.random.default_rng(0)
    if synthetic_kind(dataset_class) == "cifar10":
        folder = root / dataset_class.base_folder
        folder.mkdir(parents=True)
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for name in names:
            batch = {"data": rng.integers(0, 256, (10_000, 3 * 32 * 32), dtype=np.uint8)}
            batch["labels"] = rng.integers(0, 10, 10_000).tolist()
            (folder / name).write_bytes(pickle.dumps(batch))
        (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(i) for i in range(10)]}))
        return
    raw = root / dataset_class.__name__ / "raw"  # MNIST.raw_folder
    raw.mkdir(parents=True)
    for prefix, n in (("train", 60_000), ("t10k", 10_000)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))


@contextlib.contextmanager
def data_args(experiment: str, corpus: str | None) -> Iterator[tuple[list[str], str]]:
    """The CLI arguments that find the experiment's data, and where the data comes from."""
    args = cli_args(experiment, corpus)
    dataset_class = getattr(data_class(experiment_config(experiment)), "dataset_class", None)
    if synthetic_kind(dataset_class) is None:
        yield args, "real data"
        return
    datamodule = cli(args, run=False).datamodule
    try:
        datamodule.torchvision_dataset(train=True)
        datamodule.torchvision_dataset(train=False)
    except FileNotFoundError:
        pass
    else:
        yield args, f"real data in {datamodule.data_dir}"
        return
    with (
        tempfile.TemporaryDirectory() as folder,
        mock.patch.object(cifar, "check_integrity", lambda path, md5=None: Path(path).is_file()),
    ):
        write_synthetic(dataset_class, Path(folder))
        yield [*args, f"--data.init_args.data_dir={folder}"], "SYNTHETIC files of the real size and format"


def benchmark(experiment: str, args: argparse.Namespace) -> float:
    with data_args(experiment, args.corpus) as (cli_arguments, source):
        built = build(cli_arguments)
        datamodule, trainer = built.datamodule, built.trainer
        loader = datamodule.train_dataloader()
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.max_epochs * len(loader)
        step = PlainStep(built.model, trainer, total_steps=total)
        batches = device_batches(datamodule, loader, step.device)
        for _ in range(args.warmup):
            next(batches)
        delivered = rate(lambda: next(batches), step.device, args.seconds, args.rounds)
        x, y = next(batches)
        used = rate(lambda: step(x, y), step.device, args.seconds, args.rounds)
    ratio = delivered / used
    print(
        f"{label(experiment)}: data path {delivered:,.1f} batches/s, training step {used:,.3g} batches/s, "
        f"ratio {ratio:,.1f} (batch {loader.batch_size}, {loader.num_workers} workers, "
        f"{step.device.type}, {trainer.precision}; {source})"
    )
    return ratio


def main_benchmark(argv: list[str] | None = None) -> None:
    options = parser(__doc__, EXPERIMENTS)
    options.add_argument("--seconds", type=float, default=2.0, help="least length of each timed run")
    options.add_argument("--rounds", type=int, default=3, help="timed runs per side; the best counts")
    options.add_argument("--warmup", type=int, default=5, help="batches loaded before timing")
    args = parse(options, argv)
    print(f"threads {torch.get_num_threads()}")
    print_lowest(EXPERIMENTS, args, benchmark, decimals=1)


if __name__ == "__main__":
    main_benchmark()
