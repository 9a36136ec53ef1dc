"""README's "Start your own experiment" works as written: its files, dropped into a fresh copy of the
repository with nothing else changed, lint clean, pass the config tests and train. Its "Bring your
own model" loss trains as the module it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest
import torch
import yaml
from projkit.testing import config
from torch.nn import functional as F

from conftest import ROOT, copy_repo
from proj import main

# A fenced block right after `<!-- file: PATH -->` is the whole content of the file at PATH.
FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?\n)```", re.DOTALL)


def readme_files() -> dict[str, str]:
    return {m["path"]: m["body"] for m in FILE_BLOCK.finditer((ROOT / "README.md").read_text())}


def import_readme_module(path: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The README's file block ``path`` (under ``src/``) as the module that path names, as if the
    file were there, without writing into the repository."""
    name = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
    module = types.ModuleType(name)
    module.__file__ = str(ROOT / path)
    exec(compile(readme_files()[path], path, "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.mark.slow
def test_readme_experiment_trains_in_a_copy_with_nothing_else_touched(tmp_path):
    files = readme_files()
    experiments = [path for path in files if re.fullmatch(r"configs/[^/]+\.yaml", path)]
    assert len(experiments) == 1 and any(path.endswith(".py") for path in files), sorted(files)
    copy = copy_repo(tmp_path)
    for path, body in files.items():
        assert not (copy / path).exists(), f"the README would overwrite {path}"
        (copy / path).write_text(body)

    def run(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(copy / "src")}
        return subprocess.run(
            [sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=300
        )

    python_files = [path for path in files if path.endswith(".py")]
    for lint in (["check", "--no-cache"], ["format", "--no-cache", "--check"]):
        result = run("-m", "ruff", *lint, *python_files)
        assert result.returncode == 0, result.stdout

    experiment = experiments[0]
    name = experiment.removeprefix("configs/")
    tests = run("-m", "pytest", "tests/test_configs.py", "-q", "-p", "no:cacheprovider", "-k", name)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert re.search(r"\d+ passed", tests.stdout)

    # Then as the README's everyday commands go: train, then predict with the newest checkpoint.
    trained = run("-m", "proj", "fit", "--config", experiment, "--trainer.max_epochs=1")
    assert trained.returncode == 0, trained.stderr[-3000:]
    net = yaml.safe_load(files[experiment])["model"]["init_args"]["net"]["class_path"].rsplit(".", 1)[1]
    summary = re.search(r"\| net\s+\| (\w+)", trained.stderr)  # Lightning's model summary, logged
    assert summary and summary.group(1) == net, trained.stderr[-3000:]
    assert "Test metrics: test/acc" in trained.stderr
    run_dir = f"runs/{name.removesuffix('.yaml')}/version_0"
    assert f"Run directory: {run_dir}" in trained.stderr
    predicted = run("-m", "proj", "predict", "--config", experiment, "--ckpt_path", "last")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert f"Predictions written to {run_dir}/predictions.csv" in predicted.stdout
    assert f"Last checkpoint: {run_dir}/checkpoints/last.ckpt" in trained.stderr
    # What `make train` prints, in the order the README shows it.
    shown = re.search(r"It prints where the run goes.*?```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    said = [line.split(":")[0] for line in shown.group(1).splitlines() if ": " in line]
    assert said == ["Run directory", "Best checkpoint", "Last checkpoint", "Test metrics"]
    printed = [trained.stderr.index(f"{line}: ") for line in said]
    assert printed == sorted(printed), trained.stderr[-3000:]


@pytest.mark.slow
def test_readme_focal_loss_trains_the_digits_and_is_the_logged_loss(workdir, monkeypatch):
    focal = import_readme_module("src/proj/models/focal.py", monkeypatch)
    model_flag = "--model=proj.models.focal.FocalLossClassifier"
    quiet = ("--trainer.max_epochs=5", "--trainer.enable_progress_bar=false")
    cli = main(["fit", "--config", config("digits.yaml"), model_flag, *quiet])
    model, data = cli.model.eval(), cli.datamodule
    assert type(model) is focal.FocalLossClassifier and model.gamma == 2.0
    assert cli.trainer.callback_metrics["test/acc"] >= 0.95

    # test/loss, from the best checkpoint now in the model, is the focal loss of the test split.
    batches = [data.on_after_batch_transfer(batch, 0) for batch in data.test_dataloader()]
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in batches])
    targets = torch.cat([y for _, y in batches])
    test_loss = cli.trainer.callback_metrics["test/loss"].item()
    assert test_loss == pytest.approx(model.loss(logits, targets).item(), rel=1e-5)
    assert test_loss < 0.5 * F.cross_entropy(logits, targets).item()
    per_sample = model.loss(logits, targets, reduction="none")
    assert per_sample.shape == targets.shape
    model.gamma = 0.0  # no focusing: plain cross-entropy
    torch.testing.assert_close(model.loss(logits, targets), F.cross_entropy(logits, targets))
