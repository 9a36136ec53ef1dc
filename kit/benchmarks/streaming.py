"""Streaming from LitData chunks: peak memory as the data set grows tenfold, and samples/s against
the data held in memory and against a folder of PNG files.

A data set of ``--images`` uint8 3x32x32 images with labels of 10 classes (random pixels, seeded:
CIFAR-10's size at the default 60,000) is generated at each of ``--scales`` (1x and 10x by default);
five sixths of it is the training split, the rest validation and test. Each scale is written under
``--workdir`` as the kit's ``optimize`` writes a data module (``projkit.data.streaming.write_splits``),
and its training split as PNG files in ``ImageFolder`` layout (``root/train/<class>/<n>.png``), up to
``--folder-cap`` training images: a larger scale has no image folder, and the output says so.

Each measurement runs in a new process (forked from a server that has imported torch, LitData and the
kit, so imports are paid once) and reads one shuffled training epoch in batches of ``--batch``
(``--batches`` stops sooner), uint8 batches as the trainer receives them, nothing decoded further:

- streaming: the kit's ``open_splits`` and ``streaming_loader`` (LitData's ``StreamingDataLoader``),
  with each of ``--workers``;
- in memory: every image held as one tensor (``TensorImageDataset``) in the kit's training loader,
  batches cut in the process (no workers: they would only copy);
- image folder: the PNG files found as the kit finds them (``image_files``), each decoded with Pillow
  in the kit's training loader, with each of ``--workers``.

The process's peak memory is its own maximum resident set (``ru_maxrss``, counting the imports it
shares with the server) plus its largest loader worker's (``RUSAGE_CHILDREN``, a forked copy whose
shared pages count again). Rounds alternate the order of the paths; medians of samples/s are printed
with each path's ratio to streaming, then streaming's peak at each scale against 1x. The last line is
the highest of those ratios (about 1: streaming's memory does not grow with the data)::

    python kit/benchmarks/streaming.py                           # 60,000 and 600,000 images, 3 rounds
    python kit/benchmarks/streaming.py --images 6000 --rounds 1  # a quick look
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

SHAPE = (3, 32, 32)
CLASSES = 10
PRELOADED = [
    "projkit.data.streaming",
    "projkit.data.loaders",
    "projkit.data.image_files",
    "PIL.PngImagePlugin",
]
MiB = 2**20


def generate(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images and their labels, the same for the same seed: the data every path reads."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, *SHAPE), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, CLASSES, (n,), generator=generator)


def split_bounds(n: int) -> dict[str, tuple[int, int]]:
    """Each split's slice: five sixths training (CIFAR-10's 50,000 of 60,000), the rest halved."""
    train = n * 5 // 6
    val = train + (n - train) // 2
    return {"train": (0, train), "val": (train, val), "test": (val, n)}


class Generated:
    """What ``write_splits`` asks of a data module: each split's ``(image, label)`` items, its facts."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels
        self.stream_facts = {"classes": [str(c) for c in range(CLASSES)], "input_shape": list(SHAPE)}

    def stream_items(self, split: str) -> list[tuple[torch.Tensor, int]]:
        start, end = split_bounds(len(self.labels))[split]
        return [(self.images[i], int(self.labels[i])) for i in range(start, end)]


def write_streaming(images: torch.Tensor, labels: torch.Tensor, folder: Path) -> tuple[int, float]:
    """The chunks as ``optimize`` writes them; their bytes and the seconds it took."""
    from projkit.data.streaming import write_splits

    start = time.perf_counter()
    record = write_splits(Generated(images, labels), str(folder))
    return sum(f["bytes"] for f in record["files"].values()), time.perf_counter() - start


def write_folder(images: torch.Tensor, labels: torch.Tensor, root: Path) -> float:
    """The training split as PNG files, ``root/train/<class>/<n>.png``; the seconds it took."""
    start = time.perf_counter()
    for name in range(CLASSES):
        (root / "train" / str(name)).mkdir(parents=True)
    pixels = images.permute(0, 2, 3, 1).numpy()
    for i in range(*split_bounds(len(labels))["train"]):
        Image.fromarray(pixels[i]).save(root / "train" / str(int(labels[i])) / f"{i}.png")
    return time.perf_counter() - start


class PngFiles(Dataset):
    """``(path, label)`` samples, each decoded with Pillow into a uint8 ``(C, H, W)`` tensor."""

    def __init__(self, samples: list[tuple[Path, int]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as image:
            pixels = np.array(image.convert("RGB"))  # a copy torch may write to
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), label


def training_loader(side: dict[str, Any]) -> Any:
    """The training loader of one path, as its kit code builds it."""
    from projkit.data.loaders import loader_options
    from projkit.reliability import TrainOrder

    if side["path"] == "streaming":
        from projkit.data.streaming import open_splits, streaming_loader

        splits, _ = open_splits(side["where"], seed=0)
        return streaming_loader(splits["train"], side["batch"], side["workers"], pin_memory=False)
    if side["path"] == "in memory":
        from projkit.data.in_memory import TensorImageDataset

        images, labels = generate(side["images"], side["seed"])
        start, end = split_bounds(side["images"])["train"]
        dataset = TensorImageDataset(images[start:end], labels[start:end])
        batched = True
    else:
        from projkit.data.image_files import image_files

        root, walked, seen = Path(side["where"]) / "train", set(), set()
        samples = [(p, c) for c in range(CLASSES) for p in image_files(root / str(c), walked, seen)]
        dataset, batched = PngFiles(samples), False
    options = loader_options(dataset, side["workers"], pin_memory=False)
    return TrainOrder().loader(dataset, side["batch"], None, batched=batched, **options)


def measure(side: dict[str, Any], result: str) -> None:
    """In a new process: one epoch (or ``batches``) of the path's training loader; writes to
    ``result`` its samples, seconds, the batch's form, and peak memory of process and workers."""
    # The loader's workers start as a training process's would (the platform's default, fork on
    # Linux before Python 3.14), not as this process did, so they are its children.
    multiprocessing.set_start_method(side["start_method"], force=True)
    start_rss = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    loader = training_loader(side)
    samples, form = 0, None
    start = time.perf_counter()
    batches = iter(loader)
    for number, (images, labels) in enumerate(batches, 1):
        samples += len(labels)
        form = [str(images.dtype), list(images.shape[1:])]
        if number == side["batches"]:
            break
    seconds = time.perf_counter() - start
    del batches, loader  # joins the workers, so that RUSAGE_CHILDREN counts them
    gc.collect()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    out = {"samples": samples, "seconds": seconds, "form": form, "start": start_rss, "process": peak}
    Path(result).write_text(json.dumps({**out, "workers": workers}))


def run(context: Any, side: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``measure`` in a new process forked from the server; what it measured."""
    result = folder / "result.json"
    result.unlink(missing_ok=True)
    process = context.Process(target=measure, args=(side, str(result)))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"measuring {name(side)} failed (exit code {process.exitcode}); see above")
    return json.loads(result.read_text())


def name(side: dict[str, Any]) -> str:
    return f"{side['path']}, {side['workers']} workers"


def sides_of(scale: int, args: argparse.Namespace, workdir: Path, folder: bool) -> list[dict[str, Any]]:
    """The paths measured at ``scale``: streaming and the image folder with each of ``--workers``
    (the folder where it was written), in memory with none."""
    common = {
        "start_method": multiprocessing.get_start_method(),
        "batch": args.batch,
        "batches": args.batches,
        "seed": args.seed,
        "images": args.images * scale,
    }
    where = {
        "streaming": str(workdir / f"{scale}x" / "chunks"),
        "image folder": str(workdir / f"{scale}x" / "png"),
    }
    sides = [{**common, "path": "streaming", "workers": w, "where": where["streaming"]} for w in args.workers]
    sides.append({**common, "path": "in memory", "workers": 0})
    if folder:
        sides += [
            {**common, "path": "image folder", "workers": w, "where": where["image folder"]}
            for w in args.workers
        ]
    return sides


def measure_scale(
    context: Any, sides: list[dict[str, Any]], rounds: int, folder: Path
) -> dict[str, list[dict[str, Any]]]:
    """Every path's measurements, ``rounds`` times, the order reversed every other round; stops
    unless all paths delivered the same samples in the same form (the same work)."""
    found: dict[str, list[dict[str, Any]]] = {name(side): [] for side in sides}
    for round_ in range(rounds):
        order = sides if round_ % 2 == 0 else sides[::-1]
        for side in order:
            found[name(side)].append(run(context, side, folder))
        shown = ", ".join(
            f"{name(s)} {found[name(s)][-1]['samples'] / found[name(s)][-1]['seconds']:,.0f}" for s in order
        )
        print(f"  round {round_ + 1}: {shown} samples/s")
    # The same form, and the same samples but for the last partial batch, which a streamed epoch drops
    # (on any number of processes alike); rates are per sample.
    counts = {m["samples"] for ms in found.values() for m in ms}
    forms = {json.dumps(m["form"]) for ms in found.values() for m in ms}
    if len(forms) != 1 or max(counts) - min(counts) >= sides[0]["batch"]:
        raise RuntimeError(
            f"the paths delivered different samples or batches, not the same work: {counts} {forms}"
        )
    return found


def peak(measures: list[dict[str, Any]]) -> float:
    """The highest peak of the rounds, process and largest worker together, in MiB."""
    return max(m["process"] + m["workers"] for m in measures) / MiB


def report_scale(scale: int, found: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """Medians of samples/s and peaks per path, then each path's speed against streaming's."""
    read = next(iter(found.values()))[0]["samples"]
    train = split_bounds(args.images * scale)["train"][1]
    part = "the whole epoch" if read == train else f"of an epoch of {train:,}"
    print(f"{scale}x: {read:,} training images read by each ({part}), medians of {args.rounds} rounds:")
    rates = {}
    for label, measures in found.items():
        rates[label] = statistics.median(m["samples"] / m["seconds"] for m in measures)
        worst = max(measures, key=lambda m: m["process"] + m["workers"])
        print(
            f"  {label:24} {rates[label]:>10,.0f} samples/s  peak {peak(measures):,.1f} MiB (process "
            f"{worst['process'] / MiB:,.1f} + largest worker {worst['workers'] / MiB:,.1f}; process "
            f"+{(worst['process'] - worst['start']) / MiB:,.1f} over its start)"
        )
    for workers in args.workers:
        streaming = rates[f"streaming, {workers} workers"]
        others = [
            f"{streaming / rate:.2f}x {other}" for other, rate in rates.items() if "streaming" not in other
        ]
        print(f"  streaming, {workers} workers: " + "; ".join(others))


def write_scale(scale: int, args: argparse.Namespace, workdir: Path) -> bool:
    """The data set at ``scale`` as chunks and (below the cap) as PNG files; whether the folder was."""
    n = args.images * scale
    images, labels = generate(n, args.seed)
    size, seconds = write_streaming(images, labels, workdir / f"{scale}x" / "chunks")
    line = f"{scale}x: {n:,} images; chunks {size / 1e6:,.1f} MB written in {seconds:.1f} s"
    train = split_bounds(n)["train"][1]
    folder = train <= args.folder_cap
    if folder:
        seconds = write_folder(images, labels, workdir / f"{scale}x" / "png")
        line += f"; image folder of {train:,} PNG files written in {seconds:.1f} s"
    else:
        line += (
            f"; NO image folder ({train:,} training images > --folder-cap {args.folder_cap:,}): not measured"
        )
    print(line, flush=True)
    return folder


def report_memory(peaks: dict[int, dict[str, float]], args: argparse.Namespace) -> float:
    """Streaming's peak at each scale against the first; the highest ratio."""
    base, highest = args.scales[0], 0.0
    for workers in args.workers:
        label = f"streaming, {workers} workers"
        for scale in args.scales[1:]:
            ratio = peaks[scale][label] / peaks[base][label]
            highest = max(highest, ratio)
            print(
                f"peak memory, {label}: {base}x {peaks[base][label]:,.1f} MiB, {scale}x "
                f"{peaks[scale][label]:,.1f} MiB, ratio {ratio:.3f} ({scale}x / {base}x)"
            )
    return highest


def remove(workdir: Path, scales: list[int], made: bool) -> None:
    """What this script wrote: the whole folder when it made it, otherwise its own entries in it."""
    if made:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for scale in scales:
        shutil.rmtree(workdir / f"{scale}x", ignore_errors=True)
    (workdir / "result.json").unlink(missing_ok=True)


def options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--images", type=int, default=60_000, help="images at 1x (default: CIFAR-10's 60,000)"
    )
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10], help="sizes, multiples of --images")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="loader workers to try")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=0, help="batches read per measure (default: an epoch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folder-cap", type=int, default=60_000, help="most training images written as PNG")
    parser.add_argument(
        "--workdir", type=Path, help="where the data is written (default: a new temporary folder)"
    )
    parser.add_argument("--keep", action="store_true", help="leave the data in --workdir at the end")
    return parser


def main(argv: Sequence[str] | None = None) -> float:
    """Writes the data, measures and prints; the highest ratio of streaming's peak memory."""
    parser = options()
    args = parser.parse_args(argv)
    if len(args.scales) < 2:
        parser.error("--scales: give at least two sizes, e.g. --scales 1 10: memory is compared across them")
    if args.workdir is not None and (taken := [s for s in args.scales if (args.workdir / f"{s}x").exists()]):
        parser.error(
            f"--workdir: '{args.workdir / f'{taken[0]}x'}' exists (kept data?): delete it or choose another"
        )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="streaming-benchmark-"))
    workdir.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    print(f"{args.images:,} images at 1x, 3x32x32 uint8, {CLASSES} classes, seed {args.seed}; in {workdir}")
    try:
        peaks = {}
        for scale in args.scales:
            folder = write_scale(scale, args, workdir)
            found = measure_scale(context, sides_of(scale, args, workdir, folder), args.rounds, workdir)
            report_scale(scale, found, args)
            peaks[scale] = {label: peak(measures) for label, measures in found.items()}
        highest = report_memory(peaks, args)
    finally:
        if not args.keep:
            remove(workdir, args.scales, made=args.workdir is None)
    print(f"ratio {highest:.3f} (streaming's peak memory, largest scale / {args.scales[0]}x, highest)")
    return highest


if __name__ == "__main__":
    main()
