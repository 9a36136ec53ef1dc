"""Jobs on the local Slurm cluster and PostgreSQL server of ``make cluster``, for a project's tests of
its job scripts and the kit's of its machinery in jobs: submit, ask Slurm about a job, wait for it to
end, read what it wrote; a database of the test's own; the checks of a sweep's shared study.

``Slurm(root)`` finds the cluster ``make cluster`` made in the checkout at ``root`` (or the one
``SLURM_CONF`` names), and holds the environment every job and Slurm command runs in. A test module
binds its methods once (``sbatch, job, scontrol = SLURM.sbatch, SLURM.job, SLURM.scontrol``) and
checks the cluster in a module fixture (``SLURM.check()``): without the cluster the tests fail, never
skip, with the command that starts it."""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

POSTGRES = "postgresql://postgres@127.0.0.1:15432"
# One CPU process: a training job as a project's README shows it for the local cluster.
ONE_TASK = ("--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1")
CPU = ("--trainer.accelerator=cpu", "--trainer.precision=32-true", "--trainer.enable_progress_bar=false")
# Columns of metrics.csv that measure the machine, not the training: left out where runs are compared.
TIMINGS = {"train/samples_per_sec", "train/peak_memory_mb"}
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


class Slurm:
    """The local cluster of the checkout at ``root``; ``env``: what every job and command gets on top
    of this process's environment (the interpreter, one thread, rank 0 found on this machine)."""

    def __init__(self, root: Path, **env: str) -> None:
        self.conf = Path(os.environ.get("SLURM_CONF") or root / ".cluster" / "slurm" / "slurm.conf")
        self.env = {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "PYTHON": sys.executable,
            "OMP_NUM_THREADS": "1",
            # The nodes node1 and node2 of `make test-cluster` resolve nowhere: rank 0 is found here instead.
            "MASTER_ADDR": "127.0.0.1",
            **env,
        }

    def check(self) -> None:
        """The cluster is up with its two nodes: otherwise the test fails with what to run."""
        import pytest

        if not self.conf.is_file():
            pytest.fail("no local cluster: run `make cluster` first (`make test-cluster` does)")
        nodes = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True
        )
        states = dict(line.split() for line in nodes.stdout.splitlines())
        if nodes.returncode != 0 or not {"idle", "mix", "alloc"} & set(states.values()):
            pytest.fail(
                f"the local cluster does not answer (`make cluster` starts it): {nodes.stderr.strip()}"
            )
        if len(states) != 2:
            pytest.fail(
                f"the local cluster has {len(states)} node(s), the tests need 2: "
                "make cluster-stop, then make test-cluster"
            )

    def sbatch(self, folder: Path, *args: str, env: dict[str, str] | None = None) -> str:
        """Submit from ``folder`` (``env``: instead of the cluster's, a shell's as a user has it); the
        job's id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *args], cwd=folder, env=env or self.env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """What `scontrol show job` says of the job, as a mapping."""
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], env=self.env, capture_output=True, text=True
        )
        assert shown.returncode == 0, shown.stderr
        return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)

    def scontrol(self, *args: str) -> None:
        """``scontrol ARGS`` (a requeue, a new start time), which must succeed."""
        subprocess.run(["scontrol", *args], env=self.env, check=True, capture_output=True)

    def wait_until_done(self, job_id: str, timeout: float = 300, release: bool = True) -> dict[str, str]:
        """The job's final state. A requeued job waits 2 minutes (Slurm's BeginTime for requeued jobs);
        with ``release`` it starts at once instead."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info["JobState"] in ENDED:
                return info
            if release and info["JobState"] == "PENDING" and info.get("Reason") == "BeginTime":
                self.scontrol("update", f"JobId={job_id}", "StartTime=now")
            assert time.monotonic() < deadline, f"job {job_id} not done: {info['JobState']}"
            time.sleep(0.5)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 240) -> None:
    """Poll ``check`` until it holds; past ``timeout`` seconds the test fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def output(folder: Path, job_id: str) -> str:
    """What the job wrote to ``runs/slurm-<id>.out``, where the job scripts send it."""
    return (folder / "runs" / f"slurm-{job_id}.out").read_text()


def training_rows(run: Path) -> list[dict[str, str]]:
    """The run's metrics.csv rows without the machine's timings: what two runs that trained alike share."""
    with open(run / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMINGS} for row in csv.DictReader(f)]


@contextlib.contextmanager
def database(server: str = POSTGRES) -> Iterator[str]:
    """A PostgreSQL database of its own on the local server, dropped afterwards: its URL."""
    import psycopg

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        yield f"{server}/{name}"
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def check_study(name: str, url: str, n_trials: int, outputs: list[str], folder: Path) -> list:
    """Exactly ``n_trials`` finished, none left running, each finished trial ran once in a run
    directory of its own, and one worker wrote the results; the study's trials."""
    import optuna
    from optuna.trial import TrialState

    trials = optuna.load_study(study_name=name, storage=url).trials
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED) == n_trials, states
    assert TrialState.RUNNING not in states
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    for trial in done:
        assert [
            p.name for p in (folder / "runs/sweeps" / name / f"trial_{trial.number}").glob("version_*")
        ] == ["version_0"]
    assert len({t.user_attrs["run_dir"] for t in done}) == n_trials
    assert sum("Written into" in out for out in outputs) == 1, outputs
    for result in ("trials.csv", "history.png"):
        assert (folder / "runs/sweeps" / name / result).stat().st_size > 0
    with open(folder / "runs/sweeps" / name / "trials.csv") as f:
        assert len(list(csv.DictReader(f))) == len(trials)
    return trials
