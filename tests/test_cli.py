"""End-to-end CLI runs: every experiment trains a step, runs get their own directory, a run repeats
from its saved config, and checkpoints drive test and predict. (Bad input: test_bad_input.py.)"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_FIT, config, fit, write_png
from proj.cli import main

DOWNLOADED = ("mnist.yaml", "fashion_mnist.yaml", "cifar10.yaml")


@pytest.mark.parametrize(
    "experiment",
    # The downloadable datasets, read from tiny files of theirs, in `make test`; the edit loop has digits.
    [
        "digits.yaml",
        *(pytest.param(e, marks=pytest.mark.slow) for e in DOWNLOADED),
    ],
)
def test_fast_dev_run(experiment, image_data):
    cli = fit(experiment, "debug/fast_dev_run.yaml", extra=("--data.num_workers=0",))
    assert cli.trainer.state.finished
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["test/loss"])


@pytest.mark.slow
def test_each_run_gets_its_own_directory_with_its_config(workdir):
    fit("digits.yaml", extra=TINY_FIT)
    fit("digits.yaml", extra=(*TINY_FIT, "--data.batch_size=32"))
    runs = sorted((workdir / "runs" / "digits").iterdir())
    assert [r.name for r in runs] == ["version_0", "version_1"]
    for run in runs:
        assert (run / "config.yaml").is_file()
        assert (run / "metrics.csv").is_file()
        assert (run / "checkpoints" / "last.ckpt").is_file()
    assert "batch_size: 32" in (runs[1] / "config.yaml").read_text()
    assert "batch_size: 64" in (runs[0] / "config.yaml").read_text()


@pytest.mark.slow
def test_saved_config_reproduces_the_run(workdir):
    quick = (
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=1",
        "--test_after_fit=false",
        "--model.init_args.label_smoothing=0.05",
    )
    fit("digits.yaml", extra=quick)
    first = workdir / "runs" / "digits" / "version_0"
    main(["fit", "--config", str(first / "config.yaml")])
    second = workdir / "runs" / "digits" / "version_1"
    assert "label_smoothing: 0.05" in (second / "config.yaml").read_text()
    weights = [
        torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for run in (first, second)
    ]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


@pytest.mark.slow
def test_absent_dataset_offline_says_where_to_put_files(workdir, monkeypatch, capsys):
    """In one line, as a user sees it (no ``PROJ_DEBUG``), leaving no run directory behind."""
    from torchvision.datasets import MNIST

    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing listens: download fails
    monkeypatch.delenv("PROJ_DEBUG")
    with pytest.raises(SystemExit) as exit_info:
        fit("mnist.yaml")
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    said, hint = error.splitlines()  # the reason, on one line, and how to see the traceback
    assert re.match(r"error: Could not download MNIST into 'data'.*IDX files.*data_dir", said), error
    assert "PROJ_DEBUG" in hint
    assert not (workdir / "runs").exists()


@pytest.mark.slow
def test_checkpoint_loads_weights_only_and_drives_test_and_predict(workdir):
    fit(
        "digits.yaml",
        extra=(
            "--trainer.max_epochs=2",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
        ),
    )
    last = workdir / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["hyper_parameters"]["net"]["class_path"] == "proj.nets.ConvNet"

    tested = main(["test", "--config", config("digits.yaml"), f"--ckpt_path={last}"])
    assert tested.trainer.callback_metrics["test/acc"] > 0.5

    predicted = main(["predict", "--config", config("digits.yaml"), f"--ckpt_path={last}"])
    batches = predicted.trainer.predict_loop.predictions
    probs = torch.cat([b["probs"] for b in batches])
    preds = torch.cat([b["preds"] for b in batches])
    assert probs.shape == (len(predicted.datamodule.splits["test"]), 10)
    assert torch.allclose(probs.sum(-1), torch.ones(len(probs)))
    assert torch.equal(preds, probs.argmax(-1))


@pytest.mark.slow
def test_module_rebuilds_from_checkpoint_alone(workdir):
    from proj.models import ImageClassifier

    fit(
        "digits.yaml",
        extra=(
            "--trainer.max_epochs=1",
            "--test_after_fit=false",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1",
        ),
    )
    last = Path("runs/digits/version_0/checkpoints/last.ckpt")
    model = ImageClassifier.load_from_checkpoint(last, weights_only=True)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.slow
def test_load_from_checkpoint_never_runs_code_from_the_file(workdir, monkeypatch):
    """The Python API refuses what the CLI refuses, whatever asks torch to unpickle in full."""
    from bad_inputs import MARKER, with_payload
    from proj.models import ImageClassifier

    fit("digits.yaml", extra=(*TINY_FIT, "--test_after_fit=false"))
    last = Path("runs/digits/version_0/checkpoints/last.ckpt")
    crafted = workdir / "crafted.ckpt"
    torch.save(with_payload(torch.load(last, weights_only=True)), crafted)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(ValueError, match=r"'.*crafted.ckpt' holds pickled objects that `weights_only=True`"):
        ImageClassifier.load_from_checkpoint(crafted)
    with pytest.raises(ValueError, match=r"weights_only=False.*loads checkpoints with weights only"):
        ImageClassifier.load_from_checkpoint(crafted, weights_only=False)
    assert not Path(MARKER).exists(), "the checkpoint's code ran"
    assert ImageClassifier.load_from_checkpoint(last)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.slow
def test_wandb_runs_each_get_their_own_config(workdir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "300")
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-that-must-not-be-written-0123456789")
    import wandb

    for _ in range(2):
        fit("digits.yaml", "logger/wandb.yaml", extra=(*TINY_FIT, "--test_after_fit=false"))
        wandb.finish()  # as a notebook would; separate processes get separate W&B runs anyway
    run_dirs = sorted(p.parent for p in (workdir / "runs").glob("*/*/config.yaml"))
    assert len(run_dirs) == 2 and run_dirs[0] != run_dirs[1]
    for run in run_dirs:
        assert (run / "checkpoints" / "last.ckpt").is_file()
    written = [p for p in workdir.rglob("*") if p.is_file()]
    assert written and not any(b"secret-key-that" in p.read_bytes() for p in written)


@pytest.mark.parametrize("args", [[], ["fitt", "--config", "x.yaml"]], ids=["none", "misspelt"])
def test_a_command_line_that_names_no_subcommand_is_told_the_four(args, capsys, monkeypatch):
    # The CLI builds only the parser of the subcommand a command line starts with: without one
    # (or with a misspelt one) the user still learns every choice, in one line, as jsonargparse says it.
    monkeypatch.delenv("PROJ_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(name in err for name in ("validate", "test", "predict")), err


@pytest.mark.slow
def test_help_names_the_command_and_every_subcommand(capsys):
    """``python -m proj --help``: its own usage line (not ``__main__.py``), and one line for each
    subcommand, ``sweep`` (run before Lightning is imported) among them."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: python -m proj ")
    listed = dict(re.findall(r"^    (\w+) +(.+)$", shown, re.M))
    assert set(listed) == {"fit", "validate", "test", "predict", "export", "sweep"}, shown
    assert all(line.endswith(".") for line in listed.values()), listed  # each said in full, on its line
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert capsys.readouterr().out.startswith("usage: python -m proj [options] fit ")


@pytest.mark.slow
def test_metrics_are_printed_to_four_digits_and_a_perfect_f1_as_one(workdir, caplog):
    """Ten classes of one picture each, the same in train/, val/ and test/: learnt in a few dozen
    steps, so the test ends with every class right, and says so as ``1.000``."""
    patterns = np.random.default_rng(0).integers(0, 256, (10, 16, 16))
    for split in ("train", "val", "test"):
        for label, pixels in enumerate(patterns):
            for copy in range(2):
                write_png(workdir / "images" / split / str(label) / f"{copy}.png", pixels)
    caplog.set_level(logging.INFO)
    main(
        [
            "fit",
            "--config",
            config("image_folder.yaml"),
            "--data.init_args.root=images",
            "--data.init_args.image_size=16",
            "--data.init_args.augment=false",
            "--data.init_args.num_workers=0",
            "--data.init_args.batch_size=20",
            "--model.init_args.net.init_args.dropout=0",
            "--model.init_args.scheduler=null",
            "--model.init_args.optimizer.init_args.lr=0.01",
            "--trainer.max_epochs=12",
            "--trainer.enable_progress_bar=false",
            "--early_stopping=null",
        ]
    )
    (said,) = [line for line in caplog.messages if line.startswith("Test metrics: ")]
    values = dict(re.findall(r"(test/\w+) (\S+?)(?:,|$)", said))
    assert values["test/acc"] == values["test/f1"] == "1.000", said
    assert all(f"{float(value):#.4g}" == value for value in values.values()), said  # no more digits
