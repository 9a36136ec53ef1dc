"""End-to-end CLI runs on the tiny project: runs get their own directory, a run repeats from its
saved config, checkpoints drive test and predict and rebuild their module, the command line names
its subcommands, and metrics print to four digits. (Bad input: test_bad_input.py.)"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from conftest import main
from projkit.testing import TINY_FIT, config, fit


@pytest.mark.slow
def test_each_run_gets_its_own_directory_with_its_config(workdir):
    fit("classify.yaml", extra=TINY_FIT)
    fit("classify.yaml", extra=(*TINY_FIT, "--data.batch_size=32"))
    runs = sorted((workdir / "runs" / "classify").iterdir())
    assert [r.name for r in runs] == ["version_0", "version_1"]
    for run in runs:
        assert (run / "config.yaml").is_file()
        assert (run / "metrics.csv").is_file()
        assert (run / "checkpoints" / "last.ckpt").is_file()
    assert "batch_size: 32" in (runs[1] / "config.yaml").read_text()
    assert "batch_size: 16" in (runs[0] / "config.yaml").read_text()


@pytest.mark.slow
def test_saved_config_reproduces_the_run(workdir):
    quick = (
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=1",
        "--test_after_fit=false",
        "--model.init_args.net.init_args.dropout=0.05",
    )
    fit("classify.yaml", extra=quick)
    first = workdir / "runs" / "classify" / "version_0"
    main(["fit", "--config", str(first / "config.yaml")])
    second = workdir / "runs" / "classify" / "version_1"
    assert "dropout: 0.05" in (second / "config.yaml").read_text()
    weights = [
        torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for run in (first, second)
    ]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


@pytest.mark.slow
def test_checkpoint_loads_weights_only_and_drives_test_and_predict(workdir):
    fit(
        "classify.yaml",
        extra=(
            "--trainer.max_epochs=2",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
        ),
    )
    last = workdir / "runs" / "classify" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["hyper_parameters"]["net"]["class_path"] == "tinyproj.nets.MLP"

    tested = main(["test", "--config", config("classify.yaml"), f"--ckpt_path={last}"])
    assert tested.trainer.callback_metrics["test/acc"] > 0.5

    predicted = main(["predict", "--config", config("classify.yaml"), f"--ckpt_path={last}"])
    batches = predicted.trainer.predict_loop.predictions
    probs = torch.cat([b["probs"] for b in batches])
    preds = torch.cat([b["preds"] for b in batches])
    assert probs.shape == (len(predicted.datamodule.splits["test"]), 4)
    assert torch.allclose(probs.sum(-1), torch.ones(len(probs)))
    assert torch.equal(preds, probs.argmax(-1))


@pytest.mark.slow
def test_module_rebuilds_from_checkpoint_alone(workdir):
    from tinyproj.models import Classifier

    fit(
        "classify.yaml",
        extra=(
            "--trainer.max_epochs=1",
            "--test_after_fit=false",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1",
        ),
    )
    last = Path("runs/classify/version_0/checkpoints/last.ckpt")
    model = Classifier.load_from_checkpoint(last, weights_only=True)
    assert model(torch.zeros(2, 1, 4, 4)).shape == (2, 4)


@pytest.mark.slow
def test_load_from_checkpoint_never_runs_code_from_the_file(workdir, monkeypatch):
    """The Python API refuses what the CLI refuses, whatever asks torch to unpickle in full."""
    from bad_inputs import MARKER, with_payload
    from tinyproj.models import Classifier

    fit("classify.yaml", extra=(*TINY_FIT, "--test_after_fit=false"))
    last = Path("runs/classify/version_0/checkpoints/last.ckpt")
    crafted = workdir / "crafted.ckpt"
    torch.save(with_payload(torch.load(last, weights_only=True)), crafted)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(ValueError, match=r"'.*crafted.ckpt' holds pickled objects that `weights_only=True`"):
        Classifier.load_from_checkpoint(crafted)
    with pytest.raises(ValueError, match=r"weights_only=False.*loads checkpoints with weights only"):
        Classifier.load_from_checkpoint(crafted, weights_only=False)
    assert not Path(MARKER).exists(), "the checkpoint's code ran"
    assert Classifier.load_from_checkpoint(last)(torch.zeros(2, 1, 4, 4)).shape == (2, 4)


@pytest.mark.slow
def test_wandb_runs_each_get_their_own_config(workdir, monkeypatch):
    from bad_inputs import WANDB

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "300")
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-that-must-not-be-written-0123456789")
    import wandb

    overlay = workdir / "wandb.yaml"  # as a project's configs/logger/wandb.yaml
    overlay.write_text(WANDB)
    for _ in range(2):
        fit("classify.yaml", str(overlay), extra=(*TINY_FIT, "--test_after_fit=false"))
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
    """``python -m tinyproj --help``: the project's own usage line (not ``__main__.py``), and one line
    for each subcommand, ``sweep`` (run before Lightning is imported) among them."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: python -m tinyproj ")
    listed = dict(re.findall(r"^    (\w+) +(.+)$", shown, re.M))
    commands = {"fit", "validate", "test", "predict", "export", "optimize", "sweep", "serve"}
    assert set(listed) == commands, shown
    assert all(line.endswith(".") for line in listed.values()), listed  # each said in full, on its line
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert capsys.readouterr().out.startswith("usage: python -m tinyproj [options] fit ")


@pytest.mark.slow
def test_metrics_are_printed_to_four_digits_and_a_perfect_accuracy_as_one(workdir, caplog):
    """The tiny project's prototypes, learnt in its five epochs, so the test ends with every image
    right, and says so as ``1.000``."""
    caplog.set_level(logging.INFO)
    main(["fit", "--config", config("classify.yaml"), "--trainer.enable_progress_bar=false"])
    (said,) = [line for line in caplog.messages if line.startswith("Test metrics: ")]
    values = dict(re.findall(r"(test/\w+) (\S+?)(?:,|$)", said))
    assert set(values) == {"test/acc", "test/loss"}, said
    assert values["test/acc"] == "1.000", said
    assert all(f"{float(value):#.4g}" == value for value in values.values()), said  # no more digits


def test_a_batch_limit_of_1_is_one_batch_and_1_0_the_whole_set(workdir):
    """Lightning reads an int limit as a number of batches and a float as a fraction; its annotation
    lists float first, which made `--trainer.limit_train_batches=1` a whole epoch."""
    one = ("--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1", "--trainer.max_epochs=2")
    trainer = fit("classify.yaml", extra=(*one, "--test_after_fit=false")).trainer
    assert (trainer.global_step, trainer.num_val_batches) == (2, [1])
    whole = main(["--config", config("classify.yaml"), "--trainer.limit_train_batches=1.0"], run=False)
    assert whole.trainer.limit_train_batches == 1.0 and isinstance(whole.trainer.limit_train_batches, float)
