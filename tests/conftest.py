"""This project's test helpers: its shipped configs, a copy of the repository, tiny copies of the
downloadable datasets written in their real on-disk formats, folders of PNG files, a play the tests
write for the text runs, and the real Tiny Shakespeare for the few tests about that corpus itself.

The harness (short runs of the configs, ``python -m proj`` processes, the bad-input runner, the
``debug`` and ``workdir`` fixtures) is the kit's, ``projkit.testing``: `make upgrade-kit` brings its
fixes here."""

from __future__ import annotations

from projkit.testing.fixtures import one_thread_per_worker

one_thread_per_worker()

import atexit  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from projkit.context import use  # noqa: E402
from projkit.testing import write_png  # noqa: E402
from projkit.testing.fixtures import (  # noqa: E402, F401 (the fixtures, made this folder's)
    debug,
    lightning_logs_to_the_session,
    workdir,
)

from proj import PROJECT  # noqa: E402

# The kit's commands in this process (projkit.testing.launch's forked ones too) run for this
# project, and projkit.testing's helpers (config, fit) name its configs.
use(PROJECT)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# configs/defaults.yaml is what every experiment starts from (the CLI reads it first), not one itself.
DEFAULTS = CONFIGS / "defaults.yaml"
EXPERIMENTS = sorted(p.name for p in CONFIGS.glob("*.yaml") if p != DEFAULTS)
# configs/sweeps/ holds sweeps, which drive the CLI instead of stacking on an experiment: W&B sweep
# specs (a `command` for W&B's agent) and Optuna sweeps (`python -m proj sweep`).
OVERLAYS = sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.glob("*/*.yaml") if p.parent.name != "sweeps")
SWEEPS = sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.glob("sweeps/*.yaml"))
WANDB_SWEEPS = [name for name in SWEEPS if "command" in yaml.safe_load((CONFIGS / name).read_text())]
OPTUNA_SWEEPS = [name for name in SWEEPS if name not in WANDB_SWEEPS]


def write_play(path: Path, speeches: int = 3000, seed: int = 0) -> Path:
    """A play shaped like Tiny Shakespeare (a speaker in capitals and a colon, a few lines of verse,
    a blank line) from a few dozen words drawn by a seeded generator: structure a small GPT learns
    in a few steps, in 260,000 characters, enough for the text experiments' windows and epochs."""
    rng = random.Random(seed)
    speakers = ("ROMEO", "JULIET", "MERCUTIO", "NURSE", "FRIAR LAURENCE", "KING RICHARD", "QUEEN")
    subjects = ("my lord", "the king", "thy heart", "this night", "our love", "the sun", "sweet death")
    verbs = ("doth break", "shall know", "will not see", "hath made", "must leave", "cannot bear")
    objects = ("the crown", "thy face", "my soul", "the stars", "a kiss", "his sword", "o'er the sea")
    ends = (".", ",", "!", "?", ";", ":")
    speeches_text = []
    for _ in range(speeches):
        lines = [
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(ends)}".capitalize()
            for _ in range(rng.randint(1, 4))
        ]
        speeches_text.append(f"{rng.choice(speakers)}:\n" + "\n".join(lines) + "\n")
    path.write_text("\n".join(speeches_text), encoding="utf-8")
    return path


# The text runs' corpus, written once per test process into a folder of its own.
CORPUS = write_play(Path(tempfile.mkdtemp(prefix="proj-tests-")) / "play.txt")
atexit.register(shutil.rmtree, CORPUS.parent, ignore_errors=True)
# The real corpus, for the tests about it, where `fit --config configs/shakespeare_char_cpu.yaml`
# downloads it (PROJ_TINY_SHAKESPEARE names another copy); tests never download it.
TINY_SHAKESPEARE = Path(
    os.environ.get("PROJ_TINY_SHAKESPEARE") or ROOT / "data" / "tinyshakespeare" / "input.txt"
).resolve()
needs_tiny_shakespeare = pytest.mark.skipif(
    not TINY_SHAKESPEARE.is_file(),
    reason=f"needs the real Tiny Shakespeare at {TINY_SHAKESPEARE}, which "
    "`python -m proj fit --config configs/shakespeare_char_cpu.yaml` downloads there once "
    "(docs/data.md says from where); PROJ_TINY_SHAKESPEARE=<path> names a copy elsewhere",
)
EXPERIMENT_ARGS = {
    "shakespeare_char.yaml": (f"--data.init_args.path={CORPUS}",),
    "shakespeare_char_cpu.yaml": (f"--data.init_args.path={CORPUS}",),
}


# The offline experiment of each task: what the edit loop (`make test-fast`) builds of a test that
# `make test` runs on every experiment.
ONE_PER_TASK = ("digits.yaml", "shakespeare_char_cpu.yaml")


def each_experiment(fast: tuple[str, ...] = ONE_PER_TASK) -> list:
    """``EXPERIMENTS`` as parameters, those but ``fast`` marked slow."""
    return [pytest.param(e, marks=[] if e in fast else [pytest.mark.slow]) for e in EXPERIMENTS]


def small_gpt(*extra: str) -> tuple[str, ...]:
    """The character GPT on the tests' play at 2 layers of 64: a text run that takes seconds, for
    tests of what happens around training rather than of how well it learns."""
    return (
        f"--data.init_args.path={CORPUS}",
        "--model.init_args.net.init_args.n_layer=2",
        "--model.init_args.net.init_args.n_embd=64",
        *extra,
    )


def copy_repo(dest: Path) -> Path:
    """Copy what a clone of this repository holds (tracked files, plus new ones git does not ignore)
    into ``dest``: no environment, caches, runs or data come along."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to list the repository's files")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def experiment_args(name: str) -> tuple[str, ...]:
    """Command-line arguments an experiment needs under test (the text ones: where the play is).

    ``image_folder.yaml`` needs its folder instead, where the config says (``data/my_images``): two
    class folders of one PNG each are written into the working folder, enough to build the model.
    """
    if name == "image_folder.yaml":
        for label in (0, 1):
            write_png(Path("data/my_images/train") / f"class{label}" / "0.png", np.full((4, 4), 255 * label))
    return EXPERIMENT_ARGS.get(name, ())


def write_digit_folder(root: Path, size: int = 16, split_folders: bool = True) -> dict[str, int]:
    """The package's 1,797 8×8 digits as ``size``×``size`` grey PNG files in class folders ``0``…``9``:
    ``root/{train,val,test}/<digit>/`` (70/15/15 %, seeded), or all in ``root/<digit>/``. Returns the
    number of files per split folder."""
    from PIL import Image

    from proj.data.image import load_digits

    images, targets = load_digits()
    order = np.random.default_rng(0).permutation(len(targets))
    cut = [int(0.7 * len(order)), int(0.85 * len(order))]
    parts = dict(zip(("train", "val", "test"), np.split(order, cut), strict=True))
    if not split_folders:
        parts = {"": order}
    for split, indices in parts.items():
        for i in indices:
            pixels = (images[i] * 255.0 / 16).round()
            image = Image.fromarray(pixels.astype(np.uint8)).resize((size, size), Image.BILINEAR)
            path = root / split / str(targets[i]) / f"{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path)
    return {split: len(indices) for split, indices in parts.items()}


def fake_images(n: int, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy images whose mean brightness pattern depends on the label, so they are learnable."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    base = rng.integers(0, 256, (10, *shape))
    noise = rng.integers(-40, 41, (n, *shape))
    return np.clip(base[labels] + noise, 0, 255).astype(np.uint8), labels.astype(np.uint8)


def write_idx(path: Path, array: np.ndarray) -> None:
    """The IDX format torchvision's MNIST reader parses: magic (uint8, ndim), big-endian dims, bytes."""
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str, n_train: int = 200, n_test: int = 100) -> None:
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    for prefix, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = fake_images(n, (28, 28), seed)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)


def write_cifar10(root: Path, per_batch: int = 40) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for seed, name in enumerate(names):
        images, labels = fake_images(per_batch, (3, 32, 32), seed)
        batch = {"data": images.reshape(per_batch, -1), "labels": labels.tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    meta = {
        "label_names": [
            "plane",
            "car",
            "bird",
            "cat",
            "deer",
            "dog",
            "frog",
            "horse",
            "ship",
            "truck",
        ]
    }
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))


@pytest.fixture
def image_data(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811 (the fixture)
    """data/ holding tiny MNIST, Fashion-MNIST and CIFAR-10 files for the real torchvision readers.

    CIFAR-10's reader checks each file's md5 against the real release, which no small file can
    match; that one check is bypassed, the parsing is torchvision's own.
    """
    from torchvision.datasets import cifar

    data = workdir / "data"
    write_mnist(data, "MNIST")
    write_mnist(data, "FashionMNIST")
    write_cifar10(data)
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())
    return data
