"""ImageFolderDataModule on real PNG files (the package's digits at 16×16): the folder's facts and
splits, training to a bar, the same weights with loader workers as without, predicting on files,
and a kill -9 mid-epoch resumed bit-identical."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from projkit.testing import config, fit, kill_at, launch, step_checkpoints, write_png
from torchvision.transforms import v2

from conftest import write_digit_folder
from proj import main
from proj.data import ImageFolderDataModule

TESTS = Path(__file__).parent
# 16×16 keeps a step short on a CPU; a mirrored digit is another digit, so no flip.
SMALL = (
    "--data.init_args.image_size=16",
    "--data.init_args.flip=false",
    "--trainer.enable_progress_bar=false",
)


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """``train/``, ``val/`` and ``test/`` folders of 1,257, 270 and 270 digit PNGs, written once."""
    root = tmp_path_factory.mktemp("images") / "digits"
    assert write_digit_folder(root) == {"train": 1257, "val": 270, "test": 270}
    return root


def args(root: Path, *extra: str) -> tuple[str, ...]:
    return (f"--data.init_args.root={root}", *SMALL, *extra)


@pytest.mark.slow
def test_facts_splits_and_normalised_batches_come_from_the_folder(digits):
    dm = ImageFolderDataModule(root=str(digits), image_size=16, flip=False)
    assert dm.classes == tuple("0123456789") and dm.num_classes == 10
    assert dm.input_shape == (3, 16, 16)
    dm.setup("fit")
    assert {name: len(ds) for name, ds in dm.splits.items()} == {"train": 1257, "val": 270, "test": 270}
    x, y = next(iter(dm.val_dataloader()))  # Lightning's default collation
    assert x.shape == (64, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert dm.on_after_batch_transfer([x, y], 0)[0] is x, "normalised once, on the CPU workers"
    # to_pixels undoes the normalisation: the evaluation transform's own pixels in [0, 1].
    path, _ = dm.splits["val"].samples[0]
    with Image.open(path) as image:
        unnormalised = v2.Compose(dm.eval_transform().transforms[:-1])(image.convert("RGB"))
    assert torch.allclose(dm.to_pixels(x[:1])[0], unnormalised, atol=1e-6)


@pytest.mark.slow
def test_one_folder_is_split_by_a_seeded_fraction(tmp_path):
    write_digit_folder(tmp_path / "all", split_folders=False)

    def splits(**kwargs) -> dict[str, list[str]]:
        dm = ImageFolderDataModule(root=str(tmp_path / "all"), **kwargs)
        dm.setup("fit")
        return {name: [path for path, _ in ds.samples] for name, ds in dm.splits.items()}

    first = splits(val_fraction=0.1, test_fraction=0.2)
    assert {name: len(paths) for name, paths in first.items()} == {"train": 1258, "val": 180, "test": 359}
    assert len(set().union(*first.values())) == 1797, "every file in exactly one split"
    assert first == splits(val_fraction=0.1, test_fraction=0.2)
    other = splits(val_fraction=0.1, test_fraction=0.2, split_seed=7)
    assert set(other["test"]) != set(first["test"])


@pytest.mark.slow  # a real training run; predicting on files is in test_predict's edit-loop tests too
def test_trains_to_the_bar_and_predicts_on_a_folder_of_files(digits, workdir):
    trained = fit(
        "image_folder.yaml", extra=args(digits, "--trainer.max_epochs=3", "--data.init_args.num_workers=0")
    )
    assert trained.trainer.callback_metrics["test/acc"] >= 0.9
    mine = workdir / "mine"
    mine.mkdir()
    for digit in "37":
        shutil.copy(next((digits / "test" / digit).iterdir()), mine / f"a_{digit}.png")
    predict = args(digits, f"--data.init_args.predict_path={mine}", "--ckpt_path=last")
    main(["predict", "--config", config("image_folder.yaml"), *predict])
    with open(workdir / "runs" / "image_folder" / "version_0" / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["file"] for row in rows] == ["a_3.png", "a_7.png"]
    assert [row["class"] for row in rows] == ["3", "7"]


@pytest.mark.slow  # two fits and worker processes; SeededItems' per-item seeds are in test_data
def test_two_loader_workers_train_the_same_weights_as_none(digits, workdir):
    # Random crops and dropout on: the crops are drawn per sample from its own seed, the same in a
    # worker as in the main process, and never from the RNG dropout draws from.
    weights = []
    for workers in (0, 2):
        short = ("--trainer.max_steps=6", "--trainer.limit_val_batches=1")
        extra = args(digits, *short, f"--data.init_args.num_workers={workers}", "--test_after_fit=false")
        weights.append(fit("image_folder.yaml", extra=extra).model.state_dict())
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


def fit_args(workdir: Path, root: Path, *extra: str, kill_step: int | None = None) -> list[str]:
    overlay = workdir / "overlay.yaml"
    periodic = "trainer:\n  max_steps: 30\n  callbacks+:" + step_checkpoints(6)
    overlay.write_text(periodic + (kill_at(kill_step) if kill_step is not None else ""))
    return ["fit", "--config", config("image_folder.yaml"), "--config", str(overlay),
            *args(root, "--data.init_args.num_workers=2"), "--test_after_fit=false", *extra]  # fmt: skip


def run_fit(
    workdir: Path, root: Path, *extra: str, kill_step: int | None = None
) -> subprocess.CompletedProcess:
    args = fit_args(workdir, root, *extra, kill_step=kill_step)
    return launch.run(args, workdir, {**os.environ, "PYTHONPATH": str(TESTS)})


@pytest.mark.slow
def test_killed_mid_epoch_with_workers_resumes_bit_identical(digits, tmp_path):
    # 20 batches an epoch, 30 steps: killed at step 27, it resumes from the step-24 checkpoint, mid-epoch 1.
    # Only the killed run needs a process of its own: the same seed gives the same weights in any.
    reference = tmp_path / "reference"
    killed = tmp_path / "killed"
    for folder in (reference, killed):
        folder.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(reference)
        main(fit_args(reference, digits))
    result = run_fit(killed, digits, kill_step=27)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(killed)
        resumed = main(fit_args(killed, digits, "--ckpt_path=last"))
    assert Path(resumed.trainer.ckpt_path).name == "step0024.ckpt"

    def final(folder: Path) -> dict[str, torch.Tensor]:
        last = folder / "runs" / "image_folder" / "version_0" / "checkpoints" / "last.ckpt"
        return torch.load(last, weights_only=True)["state_dict"]

    expected, got = final(reference), final(killed)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_folder_mistakes_name_the_field_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.root: no folder at '.*nowhere'.*train/<class>/"):
        _ = ImageFolderDataModule(root=str(tmp_path / "nowhere")).num_classes
    for path in ("train/cat/0.png", "train/dog/0.png", "val/cat/0.png", "val/fox/0.png"):
        write_png(tmp_path / "pets" / path, np.zeros((4, 4)))
    with pytest.raises(ValueError, match=r"class folders that '.*train' lacks: fox"):
        ImageFolderDataModule(root=str(tmp_path / "pets")).setup("fit")
    with pytest.raises(ValueError, match=r"data.mean and data.std need one value per channel \(1\)"):
        ImageFolderDataModule(channels=1)


@pytest.mark.slow
def test_a_symlink_loop_counts_each_real_file_once(tmp_path, workdir):
    # root/<class>/ split by fractions, with a link back up (`c0/up -> ..`) and a second name for a
    # file: followed, the loop multiplied 20 images into hundreds, the same ones in train and test.
    root = tmp_path / "loop"
    for label in (0, 1):
        for i in range(10):
            write_png(root / f"c{label}" / f"{i}.png", np.full((8, 8), 100 * label + i))
    (root / "c0" / "up").symlink_to("..")
    (root / "c1" / "again.png").symlink_to("0.png")
    extra = args(root, "--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--test_after_fit=false")
    cli = main(["fit", "--config", config("image_folder.yaml"), "--data.init_args.num_workers=0", *extra])
    splits = {
        name: [os.path.realpath(path) for path, _ in ds.samples] for name, ds in cli.datamodule.splits.items()
    }
    assert sum(map(len, splits.values())) == 20
    assert len(set().union(*splits.values())) == 20, "no image in two splits, nor twice in one"


@pytest.mark.slow
def test_a_broken_jpeg_is_told_to_be_copied_again_not_converted(tmp_path, workdir, monkeypatch, capsys):
    root = tmp_path / "photos"
    for label in (0, 1):
        for i in range(3):
            write_png(root / "train" / f"c{label}" / f"{i}.png", np.full((8, 8), 100 * label + i))
    photo = root / "train" / "c1" / "photo.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(photo)
    photo.write_bytes(photo.read_bytes()[:-600])
    monkeypatch.delenv("PROJ_DEBUG")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config("image_folder.yaml"), *args(root, "--data.init_args.num_workers=0")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: data.root: 1 file(s)" in err and "'train/c1/photo.jpg' is truncated" in err
    assert "Copy it again" in err and "convert" not in err.lower() and "Traceback" not in err
    assert not list(workdir.glob("runs/*/*")), "no run directory left behind"


def two_shapes(root: Path, labels: tuple[str, str], per_class: int) -> tuple[str, ...]:
    """A folder of two classes of 8x8 PNGs (bright and dark, named ``labels``), and the flags of a
    one-epoch run of configs/image_folder.yaml on it."""
    for index in range(per_class):
        for label, level in zip(labels, (230, 25), strict=True):
            write_png(root / label / f"{index}.png", np.full((8, 8), level + index % 5))
    return (
        "--config",
        config("image_folder.yaml"),
        *args(root, "--data.init_args.image_size=8", "--data.init_args.num_workers=0"),
        "--trainer.max_epochs=1",
    )


@pytest.mark.slow  # a tiny fit, a predict and an export
def test_the_checkpoint_names_the_folders_classes_for_predict_and_export_without_the_data(workdir):
    """The class names are the training folders', kept in the checkpoint: once the folders are gone
    (renamed here), predict's rows and export's model.json still say them."""
    root = workdir / "shapes"
    common = two_shapes(root, ("bright", "dark"), per_class=24)
    main(["fit", *common, "--test_after_fit=false"])
    last = workdir / "runs" / "image_folder" / "version_0" / "checkpoints" / "last.ckpt"
    assert list(torch.load(last, weights_only=True)["hyper_parameters"]["classes"]) == ["bright", "dark"]
    mine = workdir / "mine"
    mine.mkdir()
    shutil.copy(root / "dark" / "0.png", mine / "dark.png")
    shutil.copy(root / "bright" / "0.png", mine / "bright.png")
    (root / "bright").rename(root / "class_a")
    (root / "dark").rename(root / "class_b")
    with pytest.warns(UserWarning, match=r"classes \(class_a, class_b\) are not the checkpoint's"):
        main(["predict", *common, f"--data.init_args.predict_path={mine}", f"--ckpt_path={last}"])
    with open(last.parents[1] / "predictions.csv", newline="") as f:
        named = {row["file"]: row["class"] for row in csv.DictReader(f)}
    assert set(named.values()) <= {"bright", "dark"}, named
    main(["export", *common, f"--ckpt_path={last}", "--formats=pt2"])
    (described,) = last.parents[1].glob("export/*/model.json")
    assert json.loads(described.read_text())["classes"] == ["bright", "dark"]


@pytest.mark.slow
def test_class_folders_and_files_whose_names_are_not_utf8_work_end_to_end(workdir):
    """A class folder and a file to predict named in Latin-1 (bytes that are not UTF-8): fit, predict,
    test, export and a resume all run, each name kept as text with the byte shown as ``\\xe9``."""
    root = workdir / "shapes"
    latin = os.fsdecode(b"caf\xe9")  # the name Python gives the folder: a lone surrogate for the byte
    common = two_shapes(root, (latin, "dark"), per_class=24)
    mine = workdir / "mine"
    mine.mkdir()
    shutil.copy(root / latin / "0.png", mine / os.fsdecode(b"\xfe.png"))
    main(["fit", *common, "--test_after_fit=false"])
    last = workdir / "runs" / "image_folder" / "version_0" / "checkpoints" / "last.ckpt"
    assert list(torch.load(last, weights_only=True)["hyper_parameters"]["classes"]) == ["caf\\xe9", "dark"]
    main(["predict", *common, f"--data.init_args.predict_path={mine}", f"--ckpt_path={last}"])
    with open(last.parents[1] / "predictions.csv", newline="", encoding="utf-8") as f:
        assert [row["file"] for row in csv.DictReader(f)] == ["\\xfe.png"]
    main(["test", *common, f"--ckpt_path={last}"])
    main(["export", *common, f"--ckpt_path={last}", "--formats=pt2"])
    (described,) = last.parents[1].glob("export/*/model.json")
    assert json.loads(described.read_text())["classes"] == ["caf\\xe9", "dark"]
    resumed = main(["fit", *common, "--trainer.max_epochs=2", "--test_after_fit=false", "--ckpt_path=last"])
    assert resumed.trainer.current_epoch == 2


@pytest.mark.slow  # a tiny fit, a predict and two exports
def test_export_reads_no_training_files_and_predict_skips_bad_files_when_told(workdir, capsys):
    """Export reads the checkpoint, not the training files: a bad file there does not stop it, nor
    the training folder's deletion, and what it prints and writes names no path of this machine.
    ``bad_files=skip`` holds for ``predict_path`` too: the bad file is left out with a line, the
    others predicted, also once the training folder is gone."""
    root = workdir / "shapes"
    common = two_shapes(root, ("bright", "dark"), per_class=8)
    main(["fit", *common, "--test_after_fit=false"])
    (root / "dark" / "notes.png").write_text("not an image")
    mine = workdir / "mine"
    for name, level in (("a.png", 230), ("b.png", 25)):
        write_png(mine / name, np.full((11, 7), level))
    (mine / "broken.png").write_bytes((mine / "a.png").read_bytes()[:30])
    skip = ("--data.init_args.bad_files=skip", f"--data.init_args.predict_path={mine}", "--ckpt_path=last")
    left_out = r"data\.predict_path: left out 1 unreadable file\(s\) .*broken\.png"
    with pytest.warns(UserWarning, match=left_out):
        main(["predict", *common, *skip])
    predictions = workdir / "runs" / "image_folder" / "version_0" / "predictions.csv"
    predicted = predictions.read_text()
    assert [row["file"] for row in csv.DictReader(predicted.splitlines())] == ["a.png", "b.png"]
    capsys.readouterr()
    main(["export", *common, "--ckpt_path=last", "--formats=onnx"])
    printed = capsys.readouterr().out
    assert "Exported runs/image_folder/version_0/export/last/model.json" in printed, printed
    described = workdir / "runs" / "image_folder" / "version_0" / "export" / "last" / "model.json"
    spec = json.loads(described.read_text())
    # No path of this machine, but in the field deprecated for it in 1.1.0 (1.2.0 names the file alone).
    assert "checkpoint.path" in spec["deprecated"] and spec["checkpoint"].pop("path")
    assert str(workdir) not in printed + json.dumps(spec)
    assert spec["classes"] == ["bright", "dark"]
    shutil.rmtree(root)
    described.unlink()
    main(["export", *common, "--ckpt_path=last", "--formats=onnx"])
    assert json.loads(described.read_text())["classes"] == ["bright", "dark"]
    predictions.unlink()
    with pytest.warns(UserWarning, match=left_out):
        main(["predict", *common, *skip])
    assert predictions.read_text() == predicted
