"""``predict`` leaves its output behind: a CSV of classes for images (the test split or a folder of
files) and the continued prompts of a language model, each in a new file of the run directory,
whose path is printed; never overwritten, never half-written, the same file from a DDP run.
Run on tinyproj's classifier (predictions.csv) and language model (predictions.jsonl)."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import main
from projkit.callbacks import PredictionFileWriter
from projkit.callbacks.prediction_writer import write_new_file
from projkit.testing import TINY_FIT, config, fit, launch

QUIET = ("--trainer.enable_progress_bar=false",)
CLASSIFY = ("--config", config("classify.yaml"))


def classify_run(folder: Path, *extra: str) -> Path:
    """``last.ckpt`` of a classify run fitted in ``folder``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        fit("classify.yaml", extra=(*extra, "--test_after_fit=false", *QUIET))
    return folder / "runs" / "classify" / "version_0" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two training steps: enough for a checkpoint, not for good predictions."""
    return classify_run(tmp_path_factory.mktemp("tiny_classify"), *TINY_FIT)


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs: test accuracy well above chance."""
    return classify_run(tmp_path_factory.mktemp("trained_classify"), "--trainer.max_epochs=2")


def predict(*args: str):
    return main(["predict", *args, *QUIET])


def predict_classify(checkpoint: Path, *args: str):
    return predict(*CLASSIFY, f"--ckpt_path={checkpoint}", *args)


def written(cli) -> Path:
    """The file the CLI's prediction writer wrote."""
    (writer,) = [c for c in cli.trainer.callbacks if isinstance(c, PredictionFileWriter)]
    return writer.path


def printed_path(out: str) -> Path:
    (path,) = re.findall(r"^Predictions written to (.+)$", out, re.MULTILINE)
    return Path(path)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def model_on_test_split(cli) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The predicted class and its probability for each test sample, computed from the model
    directly on the split as training sees it, and the true labels."""
    test = cli.datamodule.splits["test"]
    x, labels = cli.datamodule.on_after_batch_transfer((test.images, test.labels), 0)
    with torch.no_grad():
        probs, preds = cli.model.eval()(x).softmax(-1).max(-1)
    return preds, probs, labels


@pytest.mark.slow
def test_classify_csv_has_the_models_class_for_each_test_sample(tiny_checkpoint, workdir, capsys):
    cli = predict_classify(tiny_checkpoint)
    path = written(cli)
    assert re.fullmatch(r"predictions(-\d+)?\.csv", path.name)
    assert printed_path(capsys.readouterr().out) == path
    rows = read_csv(path)
    preds, probs, _ = model_on_test_split(cli)
    assert list(rows[0]) == ["index", "class", "probability"]
    assert [int(row["index"]) for row in rows] == list(range(len(preds)))
    classes = cli.datamodule.classes  # the checkpoint names none: the data module's names
    assert {row["class"] for row in rows} <= set(classes)
    written_probs = torch.tensor([float(row["probability"]) for row in rows])
    assert ((written_probs > 0) & (written_probs <= 1)).all()
    assert [row["class"] for row in rows] == [classes[p] for p in preds.tolist()]
    assert torch.allclose(written_probs, probs, atol=1e-6)


@pytest.mark.slow
def test_trained_classify_predictions_are_mostly_right(trained_checkpoint, workdir):
    cli = predict_classify(trained_checkpoint)
    rows = read_csv(written(cli))
    _, _, labels = model_on_test_split(cli)
    preds = torch.tensor([cli.datamodule.classes.index(row["class"]) for row in rows])
    assert (preds == labels).float().mean() > 0.5


@pytest.mark.slow
def test_a_second_predict_into_the_same_run_writes_a_new_file(tiny_checkpoint, workdir):
    same_run = "--trainer.logger.init_args.version=7"
    first = written(predict_classify(tiny_checkpoint, same_run))
    before = first.read_bytes()
    second = written(predict_classify(tiny_checkpoint, same_run))
    assert second.parent == first.parent and re.fullmatch(r"predictions-\d+\.csv", second.name)
    assert first.read_bytes() == before == second.read_bytes()


def test_new_file_never_reuses_a_name(tmp_path):
    names = [write_new_file(tmp_path / "run", "predictions", ".csv", print).name for _ in range(3)]
    assert names == ["predictions.csv", "predictions-1.csv", "predictions-2.csv"]


@pytest.mark.slow
def test_a_predict_killed_while_writing_leaves_no_partial_file(tiny_checkpoint, workdir):
    """A real SIGKILL halfway through the rows: the earlier complete file stays as it was, and the
    killed command's file does not appear at all."""
    same_run = "--trainer.logger.init_args.version=7"
    first = written(predict_classify(tiny_checkpoint, same_run))
    before = first.read_bytes()
    overlay = workdir / "killed.yaml"
    overlay.write_text("trainer:\n  callbacks+:\n    - class_path: faults.KillWhileWriting\n")
    args = ["predict", "--config", config("classify.yaml"), "--config", str(overlay),
            f"--ckpt_path={tiny_checkpoint}", same_run, *QUIET]  # fmt: skip
    killed = launch.run(args, workdir, {**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert sorted(p.name for p in first.parent.glob("predictions*")) == ["predictions.csv"]
    assert first.read_bytes() == before
    # The next command on the run clears what the killed one left, and writes its file whole.
    assert written(predict_classify(tiny_checkpoint, same_run)).read_bytes() == before
    assert sorted(p.name for p in first.parent.iterdir() if p.name.endswith(".tmp")) == []


def write_image_files(folder: Path, images: torch.Tensor) -> list[str]:
    """Each 1×4×4 uint8 image twice: as a grey PNG, and as an RGB PNG of three equal channels that
    the data module must turn grey. Both read back as the image exactly."""
    folder.mkdir()
    names = []
    for i, image in enumerate(images):
        grey = image[0].numpy().astype(np.uint8)
        Image.fromarray(grey).save(folder / f"grey{i:02d}.png")
        Image.fromarray(np.stack([grey] * 3, axis=-1)).save(folder / f"rgb{i:02d}.png")
        names += [f"grey{i:02d}.png", f"rgb{i:02d}.png"]
    (folder / ".DS_Store").write_bytes(b"\0")  # hidden: not an image to classify
    return sorted(names)


@pytest.mark.slow
def test_predict_on_a_folder_of_image_files(tiny_checkpoint, workdir):
    """``data.predict_path``: a ``file`` column of the folder's files in name order, and the
    predictions the same images get in the test split."""
    on_split = predict_classify(tiny_checkpoint)
    split_rows = read_csv(written(on_split))
    n = 20
    names = write_image_files(workdir / "mine", on_split.datamodule.splits["test"].images[:n])

    cli = predict_classify(tiny_checkpoint, "--data.init_args.predict_path=mine")
    rows = read_csv(written(cli))
    assert list(rows[0]) == ["file", "class", "probability"]
    assert [row["file"] for row in rows] == names
    assert {row["class"] for row in rows} <= set(cli.datamodule.classes)
    by_file = {row["file"]: row for row in rows}
    for i in range(n):
        for name in (f"grey{i:02d}.png", f"rgb{i:02d}.png"):
            row, expected = by_file[name], split_rows[i]
            assert row["class"] == expected["class"], name
            assert float(row["probability"]) == pytest.approx(float(expected["probability"]), abs=2e-6)


def lab_tiff(path: Path) -> None:
    """A TIFF in Pillow's LAB mode, which Pillow cannot convert to grey."""
    pixels = np.random.default_rng(0).integers(0, 256, (6, 7, 3), dtype=np.uint8)
    Image.merge("LAB", Image.fromarray(pixels, "RGB").split()).save(path, format="TIFF")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda folder: None,
            r"data\.predict_path: no folder at 'mine'.*point data\.init_args\.predict_path at",
        ),
        pytest.param(
            lambda folder: folder.mkdir(),
            r"data\.predict_path: 'mine' holds no files.*Put the images to classify",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda folder: (folder.mkdir(), (folder / "notes.txt").write_text("not a picture")),
            r"data\.predict_path: 1 file\(s\) under 'mine' cannot be read as images: 'notes\.txt' is a text "
            r"file, not an image: move it out of the folder",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda folder: (folder.mkdir(), lab_tiff(folder / "lab.tif")),
            r"data\.predict_path: 1 file\(s\) under 'mine' cannot be read as images: 'lab\.tif' is an image, "
            r"but its mode LAB is one Pillow cannot convert to L \(grey\): save it as RGB or grey",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["missing", "empty", "unreadable", "unconvertible"],
)
@pytest.mark.slow
def test_a_bad_predict_folder_is_refused_before_predicting(make, message, workdir):
    make(workdir / "mine")
    with pytest.raises((FileNotFoundError, ValueError), match=f"(?s){message}"):
        predict(*CLASSIFY, "--data.init_args.predict_path=mine", "--allow_untrained=true")
    assert not list(workdir.rglob("predictions*"))


@pytest.mark.slow
def test_language_model_prints_and_writes_each_continuation(workdir, capsys):
    tiny = ("--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1")
    fit("lm.yaml", extra=(*tiny, "--test_after_fit=false", *QUIET))
    checkpoint = workdir / "runs" / "lm" / "version_0" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    prompts = ["ROMEO:", "JULIET:"]
    args = (
        "--config",
        config("lm.yaml"),
        f"--ckpt_path={checkpoint}",
        f"--data.init_args.predict_prompts={json.dumps(prompts)}",
        "--model.init_args.predict_tokens=20",
        "--trainer.logger.init_args.version=7",
    )
    path = written(predict(*args))
    out = capsys.readouterr().out
    assert printed_path(out) == path
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["prompt"] for line in lines] == prompts
    for line in lines:
        assert line["text"].startswith(line["prompt"]) and len(line["text"]) == len(line["prompt"]) + 20
        assert line["text"] in out

    before = path.read_bytes()
    again = written(predict(*args))
    assert again.parent == path.parent and re.fullmatch(r"predictions-\d+\.jsonl", again.name)
    assert path.read_bytes() == before


@pytest.mark.slow
def test_ddp_writes_the_single_process_file(tiny_checkpoint, workdir):
    single = read_csv(written(predict_classify(tiny_checkpoint)))
    ddp = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]
    args = ["predict", "--config", config("classify.yaml"), *ddp, f"--ckpt_path={tiny_checkpoint}", *QUIET]
    result = launch.run(args, workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_csv(workdir / printed_path(result.stdout))  # printed once, by rank 0
    assert [row["index"] for row in rows] == [row["index"] for row in single]
    assert [row["class"] for row in rows] == [row["class"] for row in single]
    for row, expected in zip(rows, single, strict=True):
        assert float(row["probability"]) == pytest.approx(float(expected["probability"]), abs=2e-6)
