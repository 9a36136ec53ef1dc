"""What the check of an image folder costs before the first step (``projkit.data.image_files.
image_problems``, which an image-folder data module calls, decodes every file once, so that a
truncated or mislabelled one is named before training rather than stopping it partway): seconds per
10,000 files, for each kind of file written::

    python kit/benchmarks/image_check.py                 # 32x32 PNG, 256x256 PNG, 256x256 JPEG, 2,000 each
    python kit/benchmarks/image_check.py --files 10000

The files are written into a temporary folder first (random pixels, which compress worst: an upper
bound for real photographs of the same size), then the check is timed, on the wall clock and in CPU
time, best of ``--rounds``, after one unmeasured round that brings the files into the page cache as
a folder used for training is. The last line is the slowest kind, in seconds per 10,000 files.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from projkit.data.image_files import image_problems

KINDS = {"png 32": ("png", 32), "png 256": ("png", 256), "jpeg 256": ("jpeg", 256)}


def write_files(folder: Path, kind: str, size: int, n: int) -> list[Path]:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    paths = [folder / f"{i:05d}.{kind}" for i in range(n)]
    for path in paths:
        Image.fromarray(pixels).save(path)
    return paths


def seconds_per_10k(paths: list[Path], rounds: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds (all threads) per 10,000 files, each the best round's."""
    image_problems(paths)
    wall = cpu = float("inf")
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        assert not image_problems(paths)
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall * 10_000 / len(paths), cpu * 10_000 / len(paths)


def main(args: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000, help="files of each kind")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args(args)
    slowest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (kind, size) in KINDS.items():
            folder = Path(tmp) / name.replace(" ", "_")
            folder.mkdir()
            paths = write_files(folder, kind, size, options.files)
            cost, cpu = seconds_per_10k(paths, options.rounds)
            print(
                f"{name}: {cost:.2f} s per 10,000 files on the wall clock, {cpu:.2f} s of CPU on "
                f"{os.cpu_count()} threads ({options.files} files, best of {options.rounds})"
            )
            slowest = max(slowest, cost)
    print(f"slowest {slowest:.2f} s per 10,000 files")
    return slowest


if __name__ == "__main__":
    main()
