"""Refusals that come before the CLI parses anything, or outside it: the launcher's variables
(read while Lightning is imported), the sweep's study database, and a run folder even root cannot
write (``chattr +i``). Each is one line naming the variable, flag or folder, exit 2. On the tiny
project."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import main
from projkit.sweep import load_sweep
from projkit.sweep import main as sweep
from projkit.sweep.storage import open_study, storage_for
from projkit.testing import TINY_FIT, config

# A sweep of the classify experiment, as a project's configs/sweeps/ holds one.
SWEEP = f"""
configs: [{config("classify.yaml")}]
flags: [--trainer.max_epochs=1, --trainer.enable_progress_bar=false]
metric: val/loss
direction: minimize
n_trials: 1
space:
  model.init_args.optimizer.init_args.lr: {{type: float, low: 1.0e-3, high: 1.0e-1, log: true}}
"""


def one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


@pytest.mark.slow
def test_a_bad_local_rank_is_named(workdir: Path):
    run = subprocess.run(
        [sys.executable, "-m", "tinyproj", "fit", "--config", config("classify.yaml")],
        cwd=workdir,
        env={**os.environ, "LOCAL_RANK": "xyz", "PROJ_DEBUG": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "environment variable LOCAL_RANK='xyz'" in one_error(run.stderr)
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize(
    ("storage", "words"),
    [
        ("notadb://x", "--storage notadb://x: the study's database failed"),
        ("sqlite:////nonexistent/dir/s.db", "the folder /nonexistent/dir/ does not exist"),
        ("garbage", "--storage garbage: not a database URL"),
        (None, "study.db: not an SQLite database"),
    ],
)
def test_a_study_database_that_cannot_open_is_named(storage, words, workdir: Path, capsys, monkeypatch):
    monkeypatch.delenv("PROJ_DEBUG")
    (workdir / "configs" / "sweeps").mkdir(parents=True)
    (workdir / "configs" / "sweeps" / "classify_optuna.yaml").write_text(SWEEP)
    study = workdir / "runs" / "sweeps" / "classify_optuna" / "study.db"
    study.parent.mkdir(parents=True)
    study.write_text("not a database\n")
    with pytest.raises(SystemExit) as exit_info:
        sweep(
            ["--config", "configs/sweeps/classify_optuna.yaml", "--n_trials", "1"]
            + (["--storage", storage] if storage else [])
        )
    assert exit_info.value.code == 2
    assert words in one_error(capsys.readouterr().err)
    assert study.read_text() == "not a database\n"


def sweep_file(workdir: Path, folder: str, text: str = SWEEP) -> str:
    path = workdir / folder / "classify_optuna.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path.relative_to(workdir))


def test_a_study_database_that_fails_later_is_named(workdir: Path, capsys, monkeypatch):
    """An error of the study's database after it opened (a trial in a state Optuna does not know: a
    LookupError inside SQLAlchemy) ends the worker in the same one line, through the one place every
    storage error passes."""
    monkeypatch.delenv("PROJ_DEBUG")
    path = sweep_file(workdir, "configs/sweeps")
    storage = storage_for(f"sqlite:///{workdir / 's.db'}")
    open_study(load_sweep(path), storage).ask()
    with sqlite3.connect(workdir / "s.db") as database:
        database.execute("UPDATE trials SET state = 'BOGUS'")
    with pytest.raises(SystemExit) as exit_info:
        sweep(["--config", path, "--storage", f"sqlite:///{workdir / 's.db'}"])
    assert exit_info.value.code == 2
    error = one_error(capsys.readouterr().err)
    assert f"--storage sqlite:///{workdir / 's.db'}: the study's database failed (" in error
    assert "LookupError: 'BOGUS' is not among the defined enum values" in error


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("high: 1.0e-1", "high: 1.0"), "was made for a search space that differs at model.init_args"),
        (("metric: val/loss", "metric: val/acc"), "metric: the study 'classify_optuna' in the storage"),
    ],
)
def test_two_sweep_configs_of_one_name_do_not_share_a_study(change, words, workdir, capsys, monkeypatch):
    monkeypatch.delenv("PROJ_DEBUG")
    first = sweep_file(workdir, "configs/sweeps")
    open_study(load_sweep(first), storage_for(f"sqlite:///{workdir / 's.db'}"))
    other = sweep_file(workdir, "mine", SWEEP.replace(*change))
    with pytest.raises(SystemExit) as exit_info:
        sweep(["--config", other, "--storage", f"sqlite:///{workdir / 's.db'}"])
    assert exit_info.value.code == 2
    error = one_error(capsys.readouterr().err)
    assert words in error and "Rename one of the sweep configs" in error
    assert not (workdir / "runs" / "sweeps" / "classify_optuna" / "trial_0").exists(), "no trial ran"


def immutable(folder: Path) -> bool:
    return subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0


@pytest.mark.slow
def test_an_immutable_experiment_folder_is_named(workdir: Path, capsys, monkeypatch):
    """``chattr +i`` stops root too (a folder of mode 0 does not), and os.access sees it."""
    monkeypatch.delenv("PROJ_DEBUG")
    folder = workdir / "runs" / "classify"
    folder.mkdir(parents=True)
    if not immutable(folder):
        pytest.skip("chattr +i needs root on a filesystem that supports it")
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", config("classify.yaml"), *TINY_FIT])
        assert exit_info.value.code == 2
        assert "the experiment's folder 'runs/classify' is not writable" in one_error(capsys.readouterr().err)
        assert not any(folder.iterdir())
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.slow
def test_resuming_into_an_immutable_run_is_named(workdir: Path, capsys, monkeypatch):
    main(["fit", "--config", config("classify.yaml"), *TINY_FIT, "--test_after_fit=false"])
    run = workdir / "runs" / "classify" / "version_0"
    metrics = (run / "metrics.csv").read_bytes()
    monkeypatch.delenv("PROJ_DEBUG")
    if not immutable(run):
        pytest.skip("chattr +i needs root on a filesystem that supports it")
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "fit",
                    "--config",
                    config("classify.yaml"),
                    *TINY_FIT,
                    "--trainer.max_epochs=2",
                    "--ckpt_path=last",
                ]
            )
        assert exit_info.value.code == 2
        assert "no permission to use 'runs/classify/version_0/" in one_error(capsys.readouterr().err)
    finally:
        subprocess.run(["chattr", "-i", str(run)], check=True)
    assert (run / "metrics.csv").read_bytes() == metrics
