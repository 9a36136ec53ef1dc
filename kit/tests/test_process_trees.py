"""Process trees end together: a sweep worker killed (SIGTERM, or kill -9, which it cannot catch)
takes its running trial with it, though the trial is a child of the server it was forked from, not
of the worker; left running, it trained on as an orphan beside the retry a restart makes. Rank 1 of
a DDP run ends when rank 0, which launched it, is killed while the processes initialise. And a
command that has written everything exits 0 when a SIGTERM then asks it to stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from projkit.testing import TINY_FIT, config
from test_sweep import LR, QUICK, start_worker, write_sweep


def ended(processes: list[psutil.Process], within: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after ``within`` seconds (a bound, not a measure)."""
    _, alive = psutil.wait_procs(processes, timeout=within)
    return alive


@pytest.mark.slow
def test_a_killed_sweep_worker_takes_its_trial_with_it(workdir):
    """kill -9, which the worker cannot catch (a SIGTERM ends it by the same default action)."""
    started = workdir / "past_step_5"
    touch = ["--trainer.callbacks+=faults.TouchAtStep", "--trainer.callbacks.init_args.step=5"]
    sweep = write_sweep(
        workdir / "orphans.yaml",
        flags=[
            *QUICK,
            "--trainer.max_epochs=100000",
            "--early_stopping=null",  # the trial trains on, as one that has not converged does
            *touch,
            f"--trainer.callbacks.init_args.path={started}",
        ],
        space={LR: {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}},
        n_trials=1,
    )
    worker = start_worker(sweep, workdir, "worker.log")
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not started.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), (workdir / "worker.log").read_text()
        tree = psutil.Process(worker.pid).children(recursive=True)  # the trials' server and the trial
        assert len(tree) >= 2, tree
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone, not its process group
        worker.wait()
        left = ended(tree, within=120)
        assert not left, f"still running after their worker was killed: {[p.cmdline() for p in left]}"
    finally:  # what this test started, whatever happened
        for process in [psutil.Process(worker.pid), *tree] if worker.poll() is None else tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


@pytest.mark.slow
def test_a_sigterm_after_everything_is_written_exits_0(workdir):
    """A command that finished (its run written, ``main`` returned) and then receives SIGTERM, as a
    scheduler sends at a job's end, still exits 0: a death by the signal reads as a failure."""
    args = ["fit", "--config", config("classify.yaml"), *TINY_FIT, "--test_after_fit=false"]
    driver = (
        "import os, signal\n"
        "from tinyproj import run\n"
        f"run({args!r})\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('went on after the signal')\n"
    )
    env = {**os.environ, "PROJ_DEBUG": ""}
    done = subprocess.run(
        [sys.executable, "-c", driver], cwd=workdir, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "went on after the signal" in done.stdout
    assert (workdir / "runs" / "classify" / "version_0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_rank_1_ends_when_rank_0_is_killed_while_the_processes_initialise(workdir):
    """Rank 0 (which launches rank 1) killed as soon as rank 1 exists: rank 1 would wait for it in the
    rendezvous for as long as its timeout; it ends instead, as the later phases' watch would."""
    ddp = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]
    command = [sys.executable, "-m", "tinyproj", "fit", "--config", config("classify.yaml"), *ddp, *TINY_FIT]
    with open(workdir / "rank0.log", "w") as log:
        rank0 = subprocess.Popen(
            command, cwd=workdir, env={**os.environ, "PROJ_DEBUG": ""}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    ranks: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not ranks and rank0.poll() is None and time.monotonic() < deadline:
            ranks = psutil.Process(rank0.pid).children()
            time.sleep(0.02)
        assert ranks, (workdir / "rank0.log").read_text()[-3000:]
        rank0.kill()
        rank0.wait()
        left = ended(ranks, within=120)
        assert not left, "rank 1 waited on for rank 0, killed while the processes initialised"
    finally:
        for process in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
