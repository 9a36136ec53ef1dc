"""Streaming data: an experiment's splits written as LitData chunks to a folder or an object store
(``optimize``), and read back through LitData's ``StreamingDataset`` and ``StreamingDataLoader``.

The chunks are written in this process, in the data module's order, so the same data gives the same
bytes; ``streaming.json``, written last, records every file's size and sha256, the data module's
facts and a fingerprint of the whole. A reader checks the files' sizes against it before the first
batch (a missing or cut-short chunk is named), and a resumed run checks the fingerprint against its
checkpoint's. The loader's position is LitData's own state, which the data module's checkpoint
state carries and the kit hands to the resumed loader (``StreamPosition``, ``StreamingLoader``);
LitData re-splits what remains of an epoch when the number of processes changes, and the resume
says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
from litdata.streaming import Cache
from litdata.streaming.sampler import ChunkedIndex
from tqdm import tqdm

from projkit.data.stores import Store, join, said_in_one_line
from projkit.errors import ConfigError
from projkit.files import sha256_of
from projkit.internals import litdata as litdata_seam
from projkit.protocol import STREAM_ITEMS

RECORD = "streaming.json"
SPLITS = ("train", "val", "test")
KINDS = ("items", "tokens")
FORMAT = 1
SHUFFLE_WINDOW = 256  # items LitData shuffles among within a chunk, and decodes together


def write_splits(datamodule: Any, output: str, chunk_bytes: int | str = "64MB") -> dict[str, Any]:
    """Every split of ``datamodule`` as chunks under ``output/<split>/``, then ``streaming.json``.

    ``output`` must be empty: a destination holding other data is refused before anything is written.
    """
    chunk_bytes = chunk_size(chunk_bytes)
    store = Store(output, "--output")
    with said_in_one_line(output, "--output"):
        existing = store.sizes()
    if existing:
        raise ConfigError(
            f"--output: '{output}' already holds {len(existing)} file(s) ({next(iter(existing))}, ...): "
            "optimize writes into an empty folder or prefix. Choose a new one, or delete that one first."
        )
    items_of = STREAM_ITEMS.of(datamodule, "optimize")
    kind = getattr(datamodule, "stream_kind", "items")
    if kind not in KINDS:
        raise ConfigError(f"{type(datamodule).__name__}.stream_kind is {kind!r}: one of {', '.join(KINDS)}.")
    with tempfile.TemporaryDirectory(prefix="optimize-") as staging:
        files: dict[str, dict[str, Any]] = {}
        counts = {}
        for split in SPLITS:
            counts[split] = write_chunks(items_of(split), Path(staging), split, kind, chunk_bytes, files)
        record = {
            "format": FORMAT,
            "kind": kind,
            "facts": dict(getattr(datamodule, "stream_facts", {}) or {}),
            "items": counts,
            "files": files,
            "fingerprint": fingerprint(files),
        }
        with said_in_one_line(output, "--output"):
            for name in tqdm(sorted(files), desc=f"copying to {output}", unit="file", leave=False):
                store.put(Path(staging, name), name)
            Path(staging, RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            store.put(Path(staging, RECORD), RECORD)  # last: its presence says the rest is there
    return record


def write_chunks(
    items: Iterable[Any], staging: Path, split: str, kind: str, chunk_bytes: int, files: dict[str, Any]
) -> int:
    """``items`` as LitData chunks in ``staging/split``, each file's size and sha256 put in ``files``;
    the number of items.

    LitData stamps its index with the time; the stamp is replaced by the chunks' own hash, so the
    same items give the same bytes, and LitData's cache, keyed on the stamp, still tells two
    different datasets at one URL apart.
    """
    folder = staging / split
    loader = TokensLoader() if kind == "tokens" else None
    cache = Cache(str(folder), chunk_bytes=chunk_bytes, item_loader=loader)
    total = len(items) if hasattr(items, "__len__") else None
    count = 0
    for count, item in enumerate(tqdm(items, desc=f"optimize {split}", total=total, unit="item"), 1):
        cache[count - 1] = item
    cache.done()
    cache.merge()
    digests = {p.name: sha256_of(p) for p in sorted(folder.iterdir()) if p.name != "index.json"}
    index = json.loads((folder / "index.json").read_text())
    index["updated_at"] = hashlib.sha256("".join(digests.values()).encode()).hexdigest()[:16]
    (folder / "index.json").write_text(json.dumps(index, sort_keys=True))
    digests["index.json"] = sha256_of(folder / "index.json")
    for name in sorted(digests):
        files[f"{split}/{name}"] = {"bytes": (folder / name).stat().st_size, "sha256": digests[name]}
    return count


def chunk_size(value: int | str) -> int:
    """``--chunk_bytes`` as the positive number of bytes LitData's writer is given: a whole number of
    bytes, or a number and a unit read as LitData reads them (``64MB``, ``1.5GB``, ``512k``).
    Anything else is refused in one line, before anything is read or written, not as LitData's
    traceback (or a chunk of 0 bytes) once the data is prepared."""
    text = str(value).strip()
    size = int(text) if text.isascii() and text.isdigit() else litdata_seam.bytes_of(text)
    if size is None or size <= 0:
        raise ConfigError(
            f"--chunk_bytes: {value!r} is no positive size: give a number of bytes (e.g. 67108864) or "
            "a number and a unit, KB, MB, GB or TB (e.g. 64MB)."
        )
    return size


def optimize_datamodule(datamodule: Any, output: str, chunk_bytes: int | str) -> dict[str, Any]:
    """``optimize``: the data module's splits, prepared as for ``fit`` and ``test``, written under
    ``output``; says where, and the key that trains from it."""
    chunk_size(chunk_bytes)  # both refused before the data is downloaded and prepared
    Store(output, "--output")
    if (getattr(datamodule, "hparams", None) or {}).get("stream_from"):
        raise ConfigError(
            "optimize: data.init_args.stream_from is set; optimize reads the experiment's own data. Unset it."
        )
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.setup("test")
    record = write_splits(datamodule, output, chunk_bytes)
    size = sum(f["bytes"] for f in record["files"].values())
    counts = ", ".join(f"{split} {n}" for split, n in record["items"].items())
    rank_zero_info(
        f"optimize: wrote {counts} items ({len(record['files'])} files, {size / 1e6:.1f} MB) to '{output}'. "
        f"Train on them with --data.init_args.stream_from={output}"
    )
    return record


def fingerprint(files: dict[str, dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def read_record(url: str, field: str = "data.stream_from") -> dict[str, Any]:
    """``url``'s ``streaming.json``, its files checked present and whole by their sizes; an object
    store reached over plain HTTP, which LitData cannot download from, refused before the first read."""
    store = Store(url, field)
    if endpoint := store.plain_http():
        raise ConfigError(
            f"{field}: '{url}' is reached over plain HTTP ({endpoint}, AWS_ENDPOINT_URL), and "
            "LitData downloads chunks over HTTPS only: serve the store over HTTPS, its certificate "
            "trusted with AWS_CA_BUNDLE and SSL_CERT_FILE."
        )
    with said_in_one_line(url, field):
        sizes = store.sizes()
        if RECORD not in sizes:
            raise ConfigError(
                f"{field}: '{url}' holds no {RECORD}: it is not (or not yet entirely) written by optimize. "
                f"Write it with `optimize --config <experiment>.yaml --output {url}`."
            )
        record = json.loads(store.read(RECORD))
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("kind") not in KINDS:
        raise ConfigError(f"{field}: '{url}/{RECORD}' is not one optimize writes: write the data again.")
    for name, expected in sorted(record["files"].items()):
        if sizes.get(name) != expected["bytes"]:
            found = "missing" if name not in sizes else f"{sizes[name]} bytes of {expected['bytes']}"
            raise ConfigError(
                f"{field}: '{join(url, name)}' is {found}: the copy was cut short or changed. "
                "Write the data again with optimize into an empty destination."
            )
    return record


def open_splits(
    url: str,
    seed: int,
    block_size: int | None = None,
    transform: Callable | None = None,
    train_transform: Callable | None = None,
    record: dict[str, Any] | None = None,
) -> tuple[dict[str, StreamingDataset], dict[str, Any]]:
    """The training (shuffled by ``seed``), validation and test splits under ``url``, and its record.

    ``block_size``: a token dataset's items are windows of that many tokens; ``transform`` applies
    to every item (in the loader's workers, so it must be picklable: a module-level function or
    class). ``train_transform``, in its place for the training split, may draw random numbers from
    torch's RNG: they repeat on a resume (``SeededStreamingDataset``). An object store's chunks are
    cached under ``LITDATA_CACHE_DIR`` as it is now (LitData reads it once, when first imported),
    else ~/.lightning/chunks. ``record``: ``read_record(url)``, when it was read."""
    record = read_record(url) if record is None else record
    if (record["kind"] == "tokens") != (block_size is not None):
        raise ConfigError(
            f"data.stream_from: '{url}' holds {record['kind']} written by another kind of data module "
            "than this one: write this experiment's data with optimize, or point at that experiment's."
        )
    splits = {}
    for split in SPLITS:
        loader = TokensLoader(block_size=block_size) if record["kind"] == "tokens" else None
        seeded = split == "train" and train_transform is not None
        with said_in_one_line(url, "data.stream_from"):
            splits[split] = (SeededStreamingDataset if seeded else StreamingDataset)(
                join(url, split),
                cache_dir=os.environ.get("LITDATA_CACHE_DIR") or None,
                item_loader=loader,
                # Decoded a shuffle window at a time: LitData's "auto" decodes small tensors 32 at a
                # time, and its window shuffle of 256 then decodes each about 28 times (10-16x slower).
                batch_decode=SHUFFLE_WINDOW,
                item_shuffle_window=SHUFFLE_WINDOW,
                shuffle=split == "train",
                seed=seed,
                # Training: the same setting on any number of processes, so a resume may change it.
                # Evaluation: every sample.
                drop_last=split == "train",
                transform=train_transform if seeded else transform,
            )
    return splits, record


class SeededStreamingDataset(StreamingDataset):
    """LitData's dataset whose ``transform`` (a random crop, a flip) draws from torch's RNG seeded
    by a pure function of the run's seed, the epoch and the item's index in the chunks, the global
    RNG left as it was, as ``projkit.reliability.SeededItems`` does for data in memory.

    LitData applies ``transform`` in the loader's workers, whose RNG streams restart with every
    epoch's and every resume's fresh workers, and without workers in the main process, where it
    would draw from the RNG that dropout uses. Seeded per item, an item gets the same random
    transform wherever it is read: with any number of workers, in a run never interrupted or in one
    resumed mid-epoch; a new one each epoch. The epoch is LitData's (``set_epoch`` before an epoch's
    workers start, the checkpoint's on a resume), as its shuffle uses it. torchvision's transforms
    draw from torch's RNG; one drawing from ``random`` or NumPy would not repeat on resume."""

    def __getitem__(self, index: ChunkedIndex | int | slice | str) -> Any:
        if isinstance(index, ChunkedIndex | int):
            position = index.index if isinstance(index, ChunkedIndex) else index
            # The default generator itself: torch.manual_seed would also seed every accelerator.
            rng = torch.default_generator
            state = rng.get_state()
            rng.manual_seed(item_seed(self.seed, self.current_epoch, int(position)))
            try:
                return super().__getitem__(index)
            finally:
                rng.set_state(state)
        return super().__getitem__(index)


def item_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of item ``index``'s random transform in ``epoch`` of a run seeded ``seed``: 32 bits
    (all torch's CPU generator keeps) of a hash, unrelated for neighbouring items and epochs."""
    key = f"{seed} {epoch} {index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")


def check_facts(stored: dict[str, Any], own: dict[str, Any], url: str) -> None:
    """The data module's facts (classes, shape) must be those the chunks were written with."""
    for key in sorted(stored.keys() & own.keys()):
        if json.loads(json.dumps(stored[key])) != json.loads(json.dumps(own[key])):
            raise ConfigError(
                f"data.stream_from: '{url}' was written with {key} {stored[key]!r}, and this data module "
                f"has {own[key]!r}: point at chunks of this experiment's data, or write them with optimize."
            )


class StreamingLoader(StreamingDataLoader):
    """LitData's loader, started at ``resume`` (its state in a checkpoint) when given.

    The kit restores the position itself: Lightning hands a loader its saved state only when the
    loader is built after the checkpoint's loops are restored, and a learning-rate schedule sized by
    ``estimated_stepping_batches`` builds it before. Epochs Lightning cuts short
    (``limit_train_batches``) are handled too: LitData keeps replaying a restored position until an
    epoch is read to its end, where an uninterrupted run starts the next epoch; and a checkpoint
    written at a cut-short epoch's end would be continued, where it starts the next."""

    def __init__(self, *args: Any, resume: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resumed_epoch_read = False
        if resume and resume.get("epoch_done"):
            litdata_seam.resume_epoch_end(self, resume["loader"]["current_epoch"])
        elif resume:
            self.load_state_dict(resume["loader"])

    def __iter__(self) -> Any:
        if self.resumed_epoch_read:  # the resumed epoch is over, however it ended
            litdata_seam.end_restore(self)
            self.resumed_epoch_read = False
        restoring = litdata_seam.restoring(self)
        for batch in super().__iter__():  # a generator: an iter() without a batch changes nothing
            self.resumed_epoch_read = restoring
            yield batch


def streaming_loader(
    dataset: StreamingDataset,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
    resume: dict[str, Any] | None = None,
) -> StreamingLoader:
    """LitData's loader, from a checkpoint's position (``StreamPosition``) when given. Its own seeded
    generator makes the workers' base seed, so starting an epoch never draws from the global RNG
    that dropout uses (a resumed run restores that RNG after its first batch is already fetched)."""
    generator = torch.Generator().manual_seed(seed())
    options = {"num_workers": num_workers, "pin_memory": pin_memory, "generator": generator}
    return StreamingLoader(dataset, batch_size=batch_size, resume=resume, **options)


def seed() -> int:
    """The run's seed, as ``seed_everything`` left it: the shuffle is a function of it and the epoch."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class StreamPosition:
    """What a checkpoint records of a streamed run: the training loader's LitData state, which data
    (the fingerprint), how many processes read it and whether the epoch was over. A resume on
    changed data is refused, one with another number of processes says that the rest of the epoch
    comes in another order, and one after an epoch's end starts the next."""

    def __init__(self) -> None:
        self.resumed: dict[str, Any] | None = None

    def state_dict(self, record: dict[str, Any], trainer: Trainer | None) -> dict[str, Any]:
        loader = getattr(trainer, "train_dataloader", None) if trainer is not None else None
        if not isinstance(loader, StreamingDataLoader):
            return {}
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        done = batches >= trainer.num_training_batches
        position = {
            "fingerprint": record["fingerprint"],
            "world_size": trainer.world_size,
            "epoch_done": done,
        }
        return {"stream": {**position, "loader": loader.state_dict()}}

    def load_state_dict(
        self, saved: dict[str, Any] | None, record: dict[str, Any], url: str | None, trainer: Trainer | None
    ) -> None:
        """``saved``: the checkpoint's position, None when it was trained on data in memory; ``url``
        and ``record``: the chunks read now, ``url`` None when none are."""
        if url is None:
            raise ConfigError(
                "--ckpt_path: the checkpoint was trained on streamed chunks: resume it with the same "
                "--data.init_args.stream_from, or start a new run."
            )
        if not isinstance(saved, dict):
            raise ConfigError(
                "--ckpt_path: the checkpoint was trained on the experiment's own data, not on chunks: "
                "resume it without data.init_args.stream_from, or start a new run with it."
            )
        if saved.get("fingerprint") != record["fingerprint"]:
            raise ConfigError(
                f"--ckpt_path: the checkpoint was trained on other data than '{url}' holds now (its "
                "fingerprint differs): resume with the data it was trained on, or start a new run."
            )
        self.resumed = saved
        now, then = trainer.world_size if trainer is not None else 1, saved.get("world_size")
        if then != now and not saved.get("epoch_done"):
            rank_zero_info(
                f"Resuming mid-epoch with {now} process(es) where the checkpoint had {then}: "
                "the rest of the epoch is split anew, no sample repeated or skipped, in another order."
            )

    def take(self) -> dict[str, Any] | None:
        """The loaded checkpoint's position, once: for the first training loader built after it."""
        resumed, self.resumed = self.resumed, None
        return resumed


def split_window(window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A window of ``block_size + 1`` tokens as inputs and next-token targets, in int64."""
    window = window.long()
    return window[:-1], window[1:]
