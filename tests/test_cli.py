"""The template's image experiments through the CLI: each trains a step, the downloadable datasets
from tiny files of theirs, and an absent one offline says where its files go. (The CLI itself, on
the kit's tiny project: kit/tests/test_cli.py; bad input: test_bad_input.py.)"""

from __future__ import annotations

import re

import pytest
import torch
from projkit.testing import fit

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
