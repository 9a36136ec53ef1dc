"""The notebooks run as shipped (so they never rot) and are stored without outputs (so diffs stay
readable and no stale results ship)."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from conftest import CONFIGS, CORPUS, ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"cell {number} holds outputs"


def execute(path: Path, parameters: str, folder: Path) -> nbformat.NotebookNode:
    """Run a notebook in ``folder`` with ``parameters`` placed after its ``parameters`` cell, as
    papermill would, and return it with its outputs; a failing cell raises ``CellExecutionError``."""
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    tagged = [i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters'"
    notebook.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(parameters))
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": folder}}
    )
    client.execute()
    return notebook


@pytest.mark.slow
def test_quickstart_trains_loads_the_best_checkpoint_and_plots(tmp_path, monkeypatch):
    # The kernel inherits this environment; without MPLBACKEND it shows figures inline, as in Jupyter.
    monkeypatch.delenv("MPLBACKEND", raising=False)
    shutil.copytree(CONFIGS, tmp_path / "configs")
    notebook = execute(
        ROOT / "notebooks" / "quickstart.ipynb", f"MAX_EPOCHS = 2\nROOT = {str(tmp_path)!r}", tmp_path
    )

    run = tmp_path / "runs" / "digits" / "version_0"
    for figure in ("curves.png", "confusion_matrix.png", "predictions.png"):
        assert (run / figure).read_bytes().startswith(b"\x89PNG"), figure
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert sum("image/png" in output.get("data", {}) for output in outputs) == 3
    text = "".join(output.get("text", "") for output in outputs)
    accuracy = float(re.search(r"test accuracy of the best checkpoint: ([\d.]+)", text).group(1))
    assert accuracy > 0.5  # the trained weights came back, not a fresh network's chance level


# A GPT small enough to learn something in 30 steps on CPU, validated every 10 of them on a few batches.
TINY_GPT = [
    "--model.init_args.net.init_args.n_layer=1",
    "--model.init_args.net.init_args.n_head=2",
    "--model.init_args.net.init_args.n_embd=32",
    "--model.init_args.net.init_args.block_size=32",
    "--model.init_args.scheduler.init_args.warmup_steps=5",
    "--model.init_args.optimizer.init_args.lr=0.01",
    "--model.init_args.num_samples=0",
    "--trainer.val_check_interval=10",
    "--trainer.limit_val_batches=5",
    "--trainer.limit_test_batches=5",
    "--trainer.log_every_n_steps=5",
]


@pytest.mark.slow
def test_language_model_notebook_trains_generates_and_plots(tmp_path, monkeypatch):
    monkeypatch.delenv("MPLBACKEND", raising=False)
    shutil.copytree(CONFIGS, tmp_path / "configs")
    parameters = f"STEPS = 30\nCORPUS = {str(CORPUS)!r}\nFLAGS = {TINY_GPT!r}\nROOT = {str(tmp_path)!r}"
    notebook = execute(ROOT / "notebooks" / "language_model.ipynb", parameters, tmp_path)

    run = tmp_path / "runs" / "shakespeare_char_cpu" / "version_0"
    assert (run / "loss.png").read_bytes().startswith(b"\x89PNG")
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert sum("image/png" in output.get("data", {}) for output in outputs) == 1
    sample = (run / "sample.txt").read_text(encoding="utf-8")
    assert sample.startswith("ROMEO:") and len(sample) > len("ROMEO:")
    assert set(sample) <= set(CORPUS.read_text(encoding="utf-8"))
    assert sample in "".join(output.get("text", "") for output in outputs)
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for name in ("train/loss", "val/loss"):
        losses = [float(row[name]) for row in rows if row.get(name)]
        assert len(losses) >= 3 and losses[-1] < losses[0], (name, losses)
