"""The template's own Slurm scripts on the local Slurm cluster and PostgreSQL server of `make cluster`
(`make test-cluster` starts them), run as the README and the scripts' headers show them:
`sbatch kit/scripts/slurm.sbatch configs/digits.yaml ...` over 2 tasks, and kit/scripts/sweep.sbatch as
a job array of workers sharing a PostgreSQL study. What the kit does in such jobs (requeue, time limits,
scancel, DDP over nodes, sweeps on PostgreSQL) is tested on its tiny project, in
kit/tests/test_cluster.py. Never skipped: without the cluster they fail."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from projkit.testing import config
from projkit.testing.cluster import CPU, ONE_TASK, Slurm, check_study, output, training_rows
from projkit.testing.cluster import database as postgres_database

from conftest import ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SLURM = Slurm(ROOT)
ENV, SLURM_CONF, sbatch, job = SLURM.env, SLURM.conf, SLURM.sbatch, SLURM.job
scontrol, wait_until_done = SLURM.scontrol, SLURM.wait_until_done
# The kit's job scripts, submitted by path from a folder laid out as the checkout is.
SCRIPTS = ROOT / "kit" / "scripts"


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    """The cluster must be up: a missing one fails every test with the command that starts it."""
    SLURM.check()


@pytest.fixture
def database() -> Iterator[str]:
    """A PostgreSQL database of its own on the local server, dropped afterwards."""
    with postgres_database() as url:
        yield url


def workdir(tmp_path: Path, name: str) -> Path:
    """A folder to submit from, as the checkout is: configs/, kit/ (the job scripts find the
    environment with kit/scripts/find_python.sh) and pyproject.toml (which names the package) beside
    runs/."""
    folder = tmp_path / name
    (folder / "runs").mkdir(parents=True)
    for shared in ("configs", "kit", "pyproject.toml"):
        (folder / shared).symlink_to(ROOT / shared)
    return folder


def fit_job(
    folder: Path, *args: str, options: tuple[str, ...] = tuple(ONE_TASK), env: dict[str, str] = ENV
) -> str:
    return sbatch(
        folder, *options, str(SCRIPTS / "slurm.sbatch"), config("digits.yaml"), *CPU, *args, env=env
    )


def write_sweep(folder: Path, name: str, n_trials: int) -> Path:
    spec = {
        "configs": [config("digits.yaml")],
        "flags": [
            "--trainer.max_epochs=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.limit_test_batches=1",
            "--model.init_args.scheduler.init_args.warmup_steps=0",
        ],
        "metric": "val/loss",
        "direction": "minimize",
        "n_trials": n_trials,
        "space": {"model.init_args.optimizer.init_args.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2}},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_job_array_of_sweep_workers_shares_a_postgresql_study(tmp_path, database):
    folder = workdir(tmp_path, "array")
    sweep = write_sweep(folder, "array", n_trials=3)
    array = sbatch(folder, "--array=0-2", "--cpus-per-task=1", str(SCRIPTS / "sweep.sbatch"), str(sweep),
                   "--storage", database)  # fmt: skip
    tasks = [f"{array}_{i}" for i in range(3)]
    infos = [wait_until_done(task) for task in tasks]
    outputs = [(folder / "runs" / f"slurm-{array}_{i}.out").read_text() for i in range(3)]
    assert [(i["JobState"], i["ExitCode"]) for i in infos] == [("COMPLETED", "0:0")] * 3, outputs
    trials = check_study("array", database, 3, outputs, folder)
    assert len({t.user_attrs["worker"] for t in trials}) >= 2  # the workers shared the trials


def test_two_tasks_on_one_node_train_digits_in_one_run_directory(tmp_path):
    folder = workdir(tmp_path, "ddp")
    two = ["--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1"]
    job_id = fit_job(folder, "--trainer.max_epochs=8", "--test_after_fit=true", options=tuple(two))
    info = wait_until_done(job_id)
    log = output(folder, job_id)
    assert (info["JobState"], info["ExitCode"], info["NumTasks"]) == ("COMPLETED", "0:0", "2"), log[-3000:]
    assert "GLOBAL_RANK: 1" in log or "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert "auto-requeue" not in log  # Lightning's SLURM handlers stay off: Preemption is the one
    assert [p.relative_to(folder) for p in folder.glob("runs/**/config.yaml")] == [
        Path("runs/digits/version_0/config.yaml")
    ]
    rows = training_rows(folder / "runs" / "digits" / "version_0")
    (test_acc,) = [float(r["test/acc"]) for r in rows if r["test/acc"]]
    assert test_acc >= 0.95


def test_the_documented_line_from_a_fresh_shell_trains_a_new_run_beside_a_finished_one(tmp_path):
    """`sbatch kit/scripts/slurm.sbatch configs/digits.yaml` as the README's reader types it, in a shell
    where neither uv nor an environment is active (the job finds the checkout's .venv), in a checkout
    that already holds a finished run of the experiment: the second job trains a run of its own, where
    `--ckpt_path auto` resumed the finished run and trained nothing."""
    folder = workdir(tmp_path, "fresh")
    (folder / ".venv").symlink_to(Path(sys.executable).parent.parent)  # what `make install` made
    fresh = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "SLURM_CONF": str(SLURM_CONF),
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
    }
    short = (
        "--trainer.limit_train_batches=4",
        "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2",
    )
    for number in (0, 1):
        job_id = fit_job(folder, *short, env=fresh)
        info = wait_until_done(job_id)
        log = output(folder, job_id)
        assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
        assert f"Run directory: runs/digits/version_{number}" in log, log[-3000:]
        assert "Nothing to train" not in log and "Test metrics: test/acc" in log
        run = folder / "runs" / "digits" / f"version_{number}"
        assert (run / ".job").read_text().strip() == job_id
        assert max(int(r["step"]) for r in training_rows(run)) > 0
