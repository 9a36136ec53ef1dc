"""On the local Slurm cluster and PostgreSQL server of `make cluster` (`make test-cluster` starts them),
the kit's machinery as `python -m tinyproj` jobs: DDP over 2 tasks and over 2 nodes, a requeued job
resuming to the uninterrupted job's very weights, a time limit the job saves and requeues itself
before, scancel, and sweeps whose workers share a PostgreSQL study, started together and as a job
array. The jobs run scripts the tests write (``JOB``, ``SWEEP_JOB``), shaped as
kit/scripts/slurm.sbatch and kit/scripts/sweep.sbatch are. Never skipped: without the cluster they fail."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from conftest import HERE, ROOT
from projkit.sweep import storage_for
from projkit.testing import config
from projkit.testing.cluster import CPU, ONE_TASK, Slurm, check_study, output, training_rows, wait_for
from projkit.testing.cluster import database as postgres_database

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SLURM = Slurm(ROOT, PYTHONPATH=str(HERE))  # tinyproj and the fault callbacks
ENV, sbatch, job = SLURM.env, SLURM.sbatch, SLURM.job
scontrol, wait_until_done = SLURM.scontrol, SLURM.wait_until_done


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    """The cluster must be up: a missing one fails every test with the command that starts it."""
    SLURM.check()


@pytest.fixture
def database() -> Iterator[str]:
    """A PostgreSQL database of its own on the local server, dropped afterwards."""
    with postgres_database() as url:
        yield url


# A project's training job (kit/scripts/slurm.sbatch): one task per device, DDP over the job's tasks
# and nodes, `--ckpt_path auto` so that a requeued job resumes; the experiment and flags follow.
JOB = """#!/usr/bin/env bash
#SBATCH --job-name=tinyproj
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=runs/slurm-%j.out
set -euo pipefail
srun "$PYTHON" -m tinyproj fit --config "$1" --trainer.strategy=ddp --ckpt_path auto \\
  --trainer.num_nodes="$SLURM_JOB_NUM_NODES" --trainer.devices="$SLURM_NTASKS_PER_NODE" "${@:2}"
"""
# A project's sweep worker as a job array task (kit/scripts/sweep.sbatch).
SWEEP_JOB = """#!/usr/bin/env bash
#SBATCH --job-name=tinyproj-sweep
#SBATCH --ntasks=1
#SBATCH --output=runs/slurm-%A_%a.out
set -euo pipefail
exec "$PYTHON" -m tinyproj sweep --config "$1" "${@:2}"
"""
# Each training step of a job's first start (not of its requeued one) sleeps this long, so that a
# requeue or scancel that follows a step reaches the job mid-run: tinyproj trains a step in
# milliseconds, and would finish first.
SLOW = {"class_path": "faults.SlowFirstStart", "init_args": {"seconds": 0.3}}


def workdir(tmp_path: Path, name: str) -> Path:
    """A folder to submit from, as a project's checkout is, with the job scripts."""
    folder = tmp_path / name
    (folder / "runs").mkdir(parents=True)
    (folder / "train.sbatch").write_text(JOB)
    (folder / "sweep.sbatch").write_text(SWEEP_JOB)
    return folder


def fit_job(folder: Path, *args: str, options: tuple[str, ...] = tuple(ONE_TASK)) -> str:
    return sbatch(folder, *options, "train.sbatch", config("classify.yaml"), *CPU, *args)


def touch_at(step: int) -> str:
    """An overlay whose callbacks create ``ready`` (in the job's folder) at ``step`` and slow the
    job's first start (``SLOW``)."""
    touch = {"class_path": "faults.TouchAtStep", "init_args": {"step": step, "path": "ready"}}
    return yaml.safe_dump({"trainer": {"callbacks+": [touch, SLOW]}})


def write_sweep(folder: Path, name: str, n_trials: int) -> Path:
    """Trials of one epoch of 14 steps, each step slowed by half a second (``faults.SlowFirstStart``
    outside Slurm, and in a worker's first start): the workers' trials overlap."""
    spec = {
        "configs": [config("classify.yaml")],
        "flags": [
            "--trainer.max_epochs=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.limit_test_batches=1",
            "--model.init_args.scheduler.init_args.warmup_steps=0",
            "--trainer.callbacks+=faults.SlowFirstStart",
            "--trainer.callbacks.init_args.seconds=0.5",
        ],
        "metric": "val/loss",
        "direction": "minimize",
        "n_trials": n_trials,
        "space": {"model.init_args.optimizer.init_args.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2}},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


# `make test-cluster` runs these on 4 workers, and xdist deals the 8 tests round-robin, so the 4th,
# the time-limit job (90 to 120 s, mostly waiting for Slurm's warning), shares its worker with the last,
# the shortest, and the others go two to a worker: none runs much longer than that job.
def test_three_sweep_workers_share_a_postgresql_study_and_retry_a_killed_workers_trial(tmp_path, database):
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    folder = workdir(tmp_path, "sweep")
    sweep = write_sweep(folder, "shared", n_trials=4)
    command = [sys.executable, "-m", "tinyproj", "sweep", "--config", str(sweep), "--storage", database]
    logs = [folder / f"worker{i}.log" for i in range(3)]
    workers = []
    for log in logs:
        with open(log, "w") as out:
            workers.append(
                subprocess.Popen(command, cwd=folder, env=ENV, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            )  # fmt: skip

    def running() -> list:
        try:  # storage_for waits out the workers creating the tables
            study = optuna.load_study(study_name="shared", storage=storage_for(database))
        except KeyError:  # not created yet
            return []
        return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    wait_for("three trials running at once", lambda: len(running()) == 3)
    victim = running()[0]
    pid = int(victim.user_attrs["worker"].rsplit(":", 1)[1])
    os.killpg(pid, signal.SIGKILL)  # the worker and its trial
    killed = next(w for w in workers if w.pid == pid)
    # Reaped at once, as a shell reaps its job: a zombie still answers kill(pid, 0), so the others
    # would take its worker for alive and its trial for running.
    killed.wait(timeout=60)
    for worker in workers:
        worker.wait(timeout=300)
    outputs = [log.read_text() for log in logs]
    assert killed.returncode == -signal.SIGKILL and all(w.returncode == 0 for w in workers if w is not killed)

    trials = check_study("shared", database, 4, outputs, folder)
    assert trials[victim.number].state == TrialState.FAIL
    retries = [t for t in trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == victim.number]
    assert len(retries) == 1 and retries[0].params == victim.params and retries[0].state != TrialState.FAIL


def test_a_requeued_job_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    """`scontrol requeue` mid-run: last.ckpt saved, exit 143, the job starts again, `--ckpt_path auto`
    resumes it, and it ends with the very weights and metrics of the same job left alone."""
    jobs = {}
    for name in ("alone", "requeued"):
        folder = workdir(tmp_path, name)
        (folder / "touch.yaml").write_text(touch_at(15))
        jobs[name] = (folder, fit_job(folder, "--config", "touch.yaml", "--trainer.max_epochs=2"))
    folder, requeued = jobs["requeued"]
    wait_for("step 15 of the job", (folder / "ready").exists)
    scontrol("requeue", requeued)
    infos = {name: wait_until_done(job_id) for name, (_, job_id) in jobs.items()}

    log = output(folder, requeued)
    assert (infos["requeued"]["JobState"], infos["requeued"]["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    assert infos["requeued"]["Restarts"] == "1" and infos["alone"]["Restarts"] == "0"
    assert log.count("Received SIGTERM at step") == 1 and "exit code 143" in log
    assert "UserWarning: Received" not in log and "auto-requeue" not in log  # one mechanism, a plain line
    assert f"Slurm job {requeued} is COMPLETING: Slurm is ending it (requeued or cancelled)" in log
    assert "Restoring states from the checkpoint" in log
    runs = {name: folder / "runs" / "classify" / "version_0" for name, (folder, _) in jobs.items()}
    assert not (jobs["requeued"][0] / "runs" / "classify" / "version_1").exists()  # one run directory
    weights = {
        name: torch.load(run / "checkpoints" / "last.ckpt", weights_only=True) for name, run in runs.items()
    }
    assert weights["requeued"]["global_step"] == weights["alone"]["global_step"] == 28  # 2 epochs of 14
    alone, again = weights["alone"]["state_dict"], weights["requeued"]["state_dict"]
    assert alone.keys() == again.keys() and all(torch.equal(alone[k], again[k]) for k in alone)
    assert training_rows(runs["requeued"]) == training_rows(runs["alone"])  # every row once, the same


def test_scancel_stops_the_job_for_good_and_the_printed_command_resumes_it(tmp_path):
    folder = workdir(tmp_path, "scancel")
    (folder / "touch.yaml").write_text(touch_at(5))
    job_id = fit_job(folder, "--config", "touch.yaml", "--trainer.max_epochs=2")
    wait_for("step 5 of the job", (folder / "ready").exists)
    subprocess.run(["scancel", job_id], env=ENV, check=True)
    info = wait_until_done(job_id, release=False)
    time.sleep(2)  # long enough for a requeue to show
    info = job(job_id)
    log = output(folder, job_id)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), log[-3000:]
    assert "exit code 143" in log and "so it is not requeued here" in log
    command = log.split("Resume with: ", 1)[1].splitlines()[0]
    expected = "python -m tinyproj fit --config runs/classify/version_0/config.yaml --ckpt_path "
    assert command.startswith(expected)
    resumed = subprocess.run(
        [sys.executable, *shlex.split(command)[1:]], cwd=folder, env=ENV, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = torch.load(folder / "runs/classify/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == 28 and not (folder / "runs/classify/version_1").exists()


def test_a_job_at_its_time_limit_saves_requeues_itself_and_finishes_on_its_next_start(tmp_path):
    """`--time=2 --signal=TERM@30`: Slurm warns the job 30 s before its 2 minutes are up (at its first
    check of the time limits from then on: they are 30 s apart, so 90 to 120 s after the start), the
    job saves and requeues itself, and its second start, unslowed, resumes and finishes in its own
    first 90 s. Its first start takes 10 s a step, 140 s for the epoch's 14: the warning comes before
    it ends."""
    folder = workdir(tmp_path, "time")
    slow = {"class_path": "faults.SlowFirstStart", "init_args": {"seconds": 10.0}}
    (folder / "slow.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks+": [slow]}}))
    job_id = fit_job(
        folder, "--config", "slow.yaml", "--trainer.max_epochs=1", "--test_after_fit=false",
        options=(*ONE_TASK, "--time=2", "--signal=TERM@30"),
    )  # fmt: skip
    info = wait_until_done(job_id, timeout=360)
    log = output(folder, job_id)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-3000:]
    # A start slower than 90 s meets the warning before its first step: requeued unsaved, the same end.
    assert log.count("Received SIGTERM") == 1
    assert f"Requeued Slurm job {job_id}" in log and "exit code 143" in log
    last = torch.load(folder / "runs/classify/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == 14


def test_a_job_array_of_sweep_workers_shares_a_postgresql_study(tmp_path, database):
    folder = workdir(tmp_path, "array")
    sweep = write_sweep(folder, "array", n_trials=3)
    options = ["--array=0-2", "--cpus-per-task=1"]
    array = sbatch(folder, *options, "sweep.sbatch", str(sweep), "--storage", database)
    tasks = [f"{array}_{i}" for i in range(3)]
    infos = [wait_until_done(task) for task in tasks]
    outputs = [(folder / "runs" / f"slurm-{array}_{i}.out").read_text() for i in range(3)]
    assert [(i["JobState"], i["ExitCode"]) for i in infos] == [("COMPLETED", "0:0")] * 3, outputs
    trials = check_study("array", database, 3, outputs, folder)
    assert len({t.user_attrs["worker"] for t in trials}) >= 2  # the workers shared the trials


def test_a_job_on_two_nodes_trains_as_one_ddp_run(tmp_path):
    """One task on each of two slurmd daemons: Slurm's variables make them ranks 0 and 1 of one run."""
    folder = workdir(tmp_path, "nodes")
    two = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1"]
    job_id = fit_job(folder, "--trainer.max_epochs=8", "--test_after_fit=true", options=tuple(two))
    info = wait_until_done(job_id)
    log = output(folder, job_id)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    assert (info["NumNodes"], info["NumTasks"]) == ("2", "2")
    assert info["NodeList"] == "node[1-2]", log[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in log, log[-3000:]
    run = folder / "runs" / "classify" / "version_0"
    assert list(folder.glob("runs/**/config.yaml")) == [run / "config.yaml"]
    trainer = yaml.safe_load((run / "config.yaml").read_text())["trainer"]
    assert (trainer["num_nodes"], str(trainer["devices"])) == (2, "1")
    (test_acc,) = [float(r["test/acc"]) for r in training_rows(run) if r["test/acc"]]
    assert test_acc >= 0.95


def test_two_tasks_on_one_node_train_in_one_run_directory(tmp_path):
    folder = workdir(tmp_path, "ddp")
    two = ["--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1"]
    job_id = fit_job(folder, "--trainer.max_epochs=8", "--test_after_fit=true", options=tuple(two))
    info = wait_until_done(job_id)
    log = output(folder, job_id)
    assert (info["JobState"], info["ExitCode"], info["NumTasks"]) == ("COMPLETED", "0:0", "2"), log[-3000:]
    assert "GLOBAL_RANK: 1" in log or "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert "auto-requeue" not in log  # Lightning's SLURM handlers stay off: Preemption is the one
    assert [p.relative_to(folder) for p in folder.glob("runs/**/config.yaml")] == [
        Path("runs/classify/version_0/config.yaml")
    ]
    rows = training_rows(folder / "runs" / "classify" / "version_0")
    (test_acc,) = [float(r["test/acc"]) for r in rows if r["test/acc"]]
    assert test_acc >= 0.95


def test_a_job_signalled_while_it_starts_requeues_itself_and_trains_on_its_next_start(tmp_path):
    """A SIGTERM before the first step (its own here, as the run sets up; in life a time limit's
    warning or a preemption while the job imports or prepares its data) finds nothing to save: the job
    requeues itself and exits 143 with no run directory left, and its next start trains the run."""
    folder = workdir(tmp_path, "starting")
    signalled = [{"class_path": "faults.SignalInSetup"}, {"class_path": "projkit.reliability.Preemption"}]
    overlay = {"preemption": None, "trainer": {"callbacks+": signalled}}  # the fault's setup comes first
    (folder / "starting.yaml").write_text(yaml.safe_dump(overlay))
    job_id = fit_job(folder, "--config", "starting.yaml", "--trainer.max_epochs=1", "--test_after_fit=false")
    info = wait_until_done(job_id)
    log = output(folder, job_id)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-3000:]
    assert log.count("Received SIGTERM while starting, before any step: nothing to save.") == 1
    assert f"Requeued Slurm job {job_id}" in log and "Traceback" not in log
    last = torch.load(folder / "runs/classify/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == 14 and not (folder / "runs/classify/version_1").exists()
