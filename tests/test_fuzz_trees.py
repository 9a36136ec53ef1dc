"""A fuzzer of image-folder trees: Hypothesis draws folders with good, truncated, empty, mislabelled
and special files, links to files and folders, loops, broken links, hidden files, empty and extra
classes, and read-only folders, and checks the contract for each: refused in one line that names
``data.root`` (and, for unreadable files, each of them), or accepted with every real image once, in
its class, and no unreadable one; never a traceback; nothing written outside ``runs/``.

Seeded (``derandomize``), so a run repeats; ``PROJ_FUZZ_EXAMPLES`` sets how many trees the first
test draws (a tenth of them go through the CLI), for ``make fuzz`` to draw more. What it found
became rows of ``bad_inputs.py`` (image folders).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projkit.errors import ConfigError
from projkit.testing import config, write_png

from proj import main
from proj.data import ImageFolderDataModule

EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "0"))


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


GOOD = "good"
BAD = ("truncated", "empty", "text", "unknown", "fifo")
OTHER = ("link_to_good", "broken_link", "hidden", "dir_named_png", "not_an_image_name")
KINDS = (GOOD, *BAD, *OTHER)


@dataclass
class Tree:
    """What was planted: the good image files (each with its class) and the unreadable ones
    (relative to the root)."""

    root: Path
    good: dict[Path, str] = field(default_factory=dict)
    bad: list[Path] = field(default_factory=list)
    extra_class: bool = False


def plant(path: Path, kind: str, rng: np.random.Generator, tree: Tree, label: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == GOOD:
        write_png(path, rng.integers(0, 256, (6, 6)))
        tree.good[path] = label
    elif kind == "truncated":
        write_png(path, rng.integers(0, 256, (6, 6)))
        path.write_bytes(path.read_bytes()[: int(rng.integers(1, 60))])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("not an image\n")
    elif kind == "unknown":
        path.write_bytes(bytes([0x7F, 0x00]) + rng.integers(0, 256, 64, dtype=np.uint8).tobytes())
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_good":
        target = path.with_name(f"target_{path.name}")
        write_png(target, rng.integers(0, 256, (6, 6)))
        tree.good[target] = label
        path.symlink_to(target.name)
        return
    elif kind == "broken_link":
        path.symlink_to("nowhere.png")
    elif kind == "hidden":
        path.with_name(f"._{path.name}").write_text("AppleDouble")
        return
    elif kind == "dir_named_png":
        (path / "inner").mkdir(parents=True)
        return
    elif kind == "not_an_image_name":
        path.with_suffix(".txt").write_text("notes")
        return
    if kind in BAD:
        tree.bad.append(path.relative_to(tree.root))


@st.composite
def trees(draw: st.DrawFn) -> dict:
    """A tree's recipe; ``build`` makes it. Drawn as plain data, so Hypothesis shrinks a failure."""
    split_folders = draw(st.booleans())
    classes = draw(st.lists(st.sampled_from(["cat", "dog", "fox"]), min_size=1, max_size=3, unique=True))
    splits = ("train", "val", "test") if split_folders else ("",)
    files = {
        (split, name): draw(st.lists(st.sampled_from(KINDS), max_size=4))
        for split in splits
        for name in classes
        if split in ("train", "") or draw(st.booleans())
    }
    return {
        "files": files,
        "loop": draw(st.booleans()),
        "cross_link": draw(st.booleans()) and len(classes) > 1,
        "extra_val_class": split_folders and draw(st.booleans()),
        "read_only": draw(st.booleans()),
        "skip": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def build(recipe: dict, root: Path) -> Tree:
    tree = Tree(root)
    rng = np.random.default_rng(recipe["seed"])
    for (split, name), kinds in recipe["files"].items():
        folder = root / split / name
        folder.mkdir(parents=True, exist_ok=True)
        for i, kind in enumerate(kinds):
            plant(folder / f"{i}.png", kind, rng, tree, name)
    train = root / "train" if (root / "train").is_dir() else root
    names = sorted(p.name for p in train.iterdir() if p.is_dir())
    if recipe["loop"]:
        (train / names[0] / "up").symlink_to("..")
    if recipe["cross_link"] and len(names) > 1:
        (train / names[0] / "other").symlink_to(Path("..") / names[1])
    if recipe["extra_val_class"]:
        write_png(root / "val" / "zebra" / "0.png", rng.integers(0, 256, (6, 6)))
        tree.extra_class = True
    if recipe["read_only"]:
        for folder, _, _ in os.walk(root):
            os.chmod(folder, 0o555)
    return tree


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        for p in sorted(root.rglob("*"))
        if not p.is_symlink() and not p.is_fifo()
    }


def check_contract(tree: Tree, skip: bool) -> None:
    """The data module's answer to ``tree``: one refusal line naming data.root, or the data as documented."""
    dm = ImageFolderDataModule(root=str(tree.root), image_size=8, bad_files="skip" if skip else "refuse")
    try:
        _ = dm.num_classes
        dm.setup("fit")
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message and message.startswith("data.root"), message
        if "cannot be read as images" in message:  # else the classes were refused, checked first
            assert not skip
            for bad in tree.bad[:20]:
                assert f"'{bad}'" in message, (bad, message)
        return
    assert skip or not tree.bad, "unreadable files accepted"
    assert not tree.extra_class, "a val class that train lacks accepted"
    samples = [(path, label) for ds in dm.splits.values() for path, label in ds.samples]
    real = [os.path.realpath(path) for path, _ in samples]
    assert len(real) == len(set(real)), "a file counted twice"
    bad = {os.path.realpath(tree.root / path) for path in tree.bad}
    assert not bad & set(real), "an unreadable file in a split"
    labels = {os.path.realpath(path): dm.classes[label] for path, label in samples}
    for path, name in tree.good.items():
        assert labels.get(os.path.realpath(path)) == name, (path, name, labels.get(os.path.realpath(path)))


@pytest.mark.slow  # some 15 s for 60 trees: `make test`, not the edit loop
@fuzz(EXAMPLES or 60)
@given(recipe=trees())
def test_image_folder_trees_keep_the_contract(recipe):
    with tempfile.TemporaryDirectory() as tmp:
        tree = build(recipe, Path(tmp) / "data" / "imgs")
        before = digest(Path(tmp))
        try:
            check_contract(tree, recipe["skip"])
            assert digest(Path(tmp)) == before, "the data module wrote into the data folder"
        finally:
            for folder, _, _ in os.walk(tmp):
                os.chmod(folder, 0o755)


@pytest.mark.slow
@fuzz(EXAMPLES // 10 or 4)
@given(recipe=trees())
def test_image_folder_trees_through_the_cli(recipe, tmp_path_factory, monkeypatch, capsys):
    # As a user runs it, in a folder of their own: exit 0 or 2, one error line, never a traceback,
    # nothing written outside runs/ (the tree is under data/).
    work = tmp_path_factory.mktemp("fuzz")
    monkeypatch.chdir(work)
    monkeypatch.delenv("PROJ_DEBUG", raising=False)
    build(recipe, work / "data" / "imgs")
    before = digest(work)
    args = ["fit", "--config", config("image_folder.yaml"), "--data.init_args.root=data/imgs"]
    args += [
        "--data.init_args.image_size=8",
        "--data.init_args.num_workers=0",
        "--data.init_args.batch_size=2",
    ]
    args += ["--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]
    args += ["--test_after_fit=false", f"--data.init_args.bad_files={'skip' if recipe['skip'] else 'refuse'}"]
    try:
        code = 0
        try:
            main(args)
        except SystemExit as exit_info:
            code = exit_info.code
        err = capsys.readouterr().err
        assert code in (0, 2), err[-2000:]
        assert "Traceback" not in err
        if code == 2:
            errors = [line for line in err.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and "data.root" in errors[0], err[-2000:]
        after = digest(work)
        outside = {name for name in after.keys() - before.keys() if not name.startswith("runs")}
        assert not outside, outside
        assert {k: v for k, v in after.items() if k in before} == before
    finally:
        for folder, _, _ in os.walk(work):
            os.chmod(folder, 0o755)
        shutil.rmtree(work, ignore_errors=True)
