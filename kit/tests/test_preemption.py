"""SIGTERM and Ctrl-C on any or all ranks: save, exit non-zero in bounded time, resume."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TASKS, fault, main
from projkit.testing import config, launch

LONG = ("--trainer.max_epochs=100", "--trainer.enable_progress_bar=false", "--test_after_fit=false")
DDP = ("--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2")
# The language model validated on a few batches.
ARGS = {"image": (), "text": ("--trainer.limit_val_batches=2",)}


def start(workdir: Path, *extra: str, fault: str = "", task: str = "image") -> launch.Process:
    experiment, _ = TASKS[task]
    overlay = workdir / "overlay.yaml"
    overlay.write_text("trainer:\n  callbacks+:\n" + fault)
    args = ["fit", "--config", config(experiment), "--config", str(overlay), *LONG, *ARGS[task], *extra]
    return launch.start(args, workdir, merge=True, session=True)


def wait_for(path: Path, process: launch.Process | subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, finish(process)[1][-3000:]
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.2)


def finish(process: launch.Process | subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("the run hung after the signal")
    return process.returncode, output


def assert_saved_and_resumable(
    workdir: Path, step_at_least: int, task: str = "image", processes: int = 1
) -> None:
    """The saved checkpoint holds at least ``step_at_least`` steps and ``--ckpt_path last`` continues
    from it (in this process: that resuming is exact is tests/test_resume.py's job). A checkpoint of
    several processes, taken mid-epoch, is refused to one process with the flag that resumes it
    (resumed by as many processes in tests/test_ddp.py)."""
    experiment, name = TASKS[task]
    last = workdir / "runs" / name / "version_0" / "checkpoints" / "last.ckpt"
    saved_step = torch.load(last, weights_only=True)["global_step"]
    assert saved_step >= step_at_least
    resume = ["fit", "--config", config(experiment), *ARGS[task], "--ckpt_path=last",
              f"--trainer.max_steps={saved_step + 2}", "--trainer.enable_progress_bar=false",
              "--test_after_fit=false"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        if processes > 1:
            with pytest.raises(ValueError, match=f"--trainer.devices={processes}"):
                main(resume)
            return
        main(resume)
    assert torch.load(last, weights_only=True)["global_step"] == saved_step + 2, "the resumed run continued"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "signum"),
    # A SIGTERM to each task's process: test_resume.py's test_sigterm_run_resumes_bit_identical.
    [("image", signal.SIGINT)],
    ids=["image-Ctrl-C"],
)
def test_signal_saves_and_exits_non_zero(task, signum, tmp_path):
    ready = tmp_path / "ready"
    process = start(tmp_path, fault=fault("TouchAtStep", step=5, path=str(ready)), task=task)
    wait_for(ready, process)
    os.killpg(process.pid, signum)
    code, output = finish(process)
    assert code == 128 + signum, output[-3000:]
    last = f"runs/{TASKS[task][1]}/version_0/checkpoints/last.ckpt"
    assert f"Received {signal.Signals(signum).name} at step" in output
    assert (
        f"Resume with: python -m tinyproj fit --config {Path(last).parents[1]}/config.yaml "
        f"--ckpt_path {last}" in output
    )
    assert "UserWarning" not in output, "a plain line, not a warning with a source path"
    assert_saved_and_resumable(tmp_path, 5, task=task)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hook", "extra"),
    [
        ("on_sanity_check_start", ()),
        # After the run's setup: the signal is kept until the Preemption installs its handlers.
        ("setup", ()),
        # The Preemption after the fault, no sanity check: the signal meets Lightning's handler.
        ("on_train_start", ("--preemption=null", "--trainer.num_sanity_val_steps=0")),
    ],
    ids=["in the sanity check", "in the setup", "to Lightning's handler"],
)
def test_sigterm_before_the_first_step_saves_it_and_exits_143(hook, extra, tmp_path):
    """Lightning ends such a run after its first step (or sanity-check batch) with exit code 0 and
    nothing saved, so a scheduler records success and requeues nothing."""
    preemption = "    - class_path: projkit.reliability.Preemption\n" if extra else ""
    faulty = fault("SignalInSetup") if hook == "setup" else fault("SignalBeforeTraining", hook=hook)
    process = start(tmp_path, *extra, fault=faulty + preemption)
    code, output = finish(process)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "Received SIGTERM at step 1: saved runs/classify/version_0/checkpoints/last.ckpt" in output
    assert_saved_and_resumable(tmp_path, 1)


@pytest.mark.slow
def test_sigterm_while_starting_exits_143_and_leaves_no_run(tmp_path):
    """A SIGTERM before the run's Preemption takes it over (here: in a callback's setup that comes
    before it; in life, while the process imports or prepares its data) has nothing to save: exit 143
    at once, as a scheduler's requeue expects (tests/test_cluster.py: the job is requeued), rather than
    a kill (-15), and the new run directory is gone, so that the next start takes its number."""
    preemption = "    - class_path: projkit.reliability.Preemption\n"
    process = start(tmp_path, "--preemption=null", fault=fault("SignalInSetup") + preemption)
    code, output = finish(process)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "Received SIGTERM while starting, before any step: nothing to save." in output
    assert "Traceback" not in output and not (tmp_path / "runs" / "classify" / "version_0").exists()


@pytest.mark.slow
def test_sigterm_repeated_while_stopping_still_exits_143(tmp_path):
    """Slurm signals a job's steps and srun forwards the same SIGTERM: the repeats, every 20 ms from
    the first until the process ends, must not turn the saved, resumable stop into a kill (-15)."""
    ready = tmp_path / "ready"
    process = start(tmp_path, fault=fault("TouchAtStep", step=5, path=str(ready)))
    wait_for(ready, process)
    while process.poll() is None:
        process.send_signal(signal.SIGTERM)
        time.sleep(0.02)
    code, output = finish(process)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert output.count("Received SIGTERM") == 1
    run = "runs/classify/version_0"
    resume = f"--config {run}/config.yaml --ckpt_path {run}/checkpoints/last.ckpt"
    assert f"Resume with: python -m tinyproj fit {resume}" in output
    assert "UserWarning" not in output, "a plain line, not a warning with a source path"
    assert_saved_and_resumable(tmp_path, 5)


@pytest.mark.slow
def test_sigterm_to_every_ddp_rank_saves_and_exits(tmp_path):
    ready = tmp_path / "ready"
    process = start(tmp_path, *DDP, fault=fault("TouchAtStep", step=3, path=str(ready)))
    wait_for(ready, process)
    os.killpg(process.pid, signal.SIGTERM)  # what SLURM and a process-group kill do
    code, output = finish(process)
    assert code != 0, output[-3000:]
    assert "Received SIGTERM" in output
    assert_saved_and_resumable(tmp_path, 3, processes=2)


@pytest.mark.slow
def test_sigterm_to_one_non_zero_rank_stops_every_rank(tmp_path):
    """Signalled in step 5 (from step 4): the ranks agree on a signal every ``log_every_n_steps``
    steps (2 here), so every rank stops at step 6."""
    process = start(tmp_path, *DDP, fault=fault("SignalAtStep", step=4, rank=1))
    code, output = finish(process, timeout=300)
    assert code != 0, output[-3000:]
    assert "Received SIGTERM at step 6" in output
    assert_saved_and_resumable(tmp_path, 6, processes=2)


@pytest.mark.slow
def test_sigterm_to_a_torchrun_job_saves_and_exits_non_zero(tmp_path):
    ready = tmp_path / "ready"
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("trainer:\n  callbacks+:\n" + fault("TouchAtStep", step=3, path=str(ready)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "-m", "tinyproj", "fit", "--config", config("classify.yaml"), "--config", str(overlay),
               *LONG, *DDP]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    wait_for(ready, process)
    os.killpg(process.pid, signal.SIGTERM)  # the agent and both workers, as a scheduler does
    code, output = finish(process, timeout=180)
    assert code != 0, output[-3000:]
    assert "Received SIGTERM" in output
    assert_saved_and_resumable(tmp_path, 3, processes=2)


@pytest.mark.slow
def test_sigterm_mid_accumulation_stops_after_the_optimizer_step(workdir):
    """Gradients accumulated over 2 batches: a SIGTERM in the first batch of a step stops after the
    second, as the accumulated gradients are in no checkpoint; the resumed run ends with the weights
    of the uninterrupted one."""
    args = ["fit", "--config", config("classify.yaml"), "--trainer.accumulate_grad_batches=2",
            "--trainer.max_steps=6", "--trainer.limit_val_batches=1", *LONG[1:]]  # fmt: skip
    overlay = workdir / "overlay.yaml"
    overlay.write_text("trainer:\n  callbacks+:\n" + fault("SignalAtStep", step=2))
    stopped = launch.run([*args, "--config", str(overlay)], workdir)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "Received SIGTERM at step 3" in stopped.stdout + stopped.stderr
    last = workdir / "runs" / "classify" / "version_0" / "checkpoints" / "last.ckpt"
    batches = torch.load(last, weights_only=True)["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert batches["total"]["processed"] == 6, "whole optimizer steps: the stop waited for the second batch"
    resumed = main([*args, "--ckpt_path=last"]).trainer.lightning_module.state_dict()
    (workdir / "alone").mkdir()
    os.chdir(workdir / "alone")
    alone = main(args).trainer.lightning_module.state_dict()
    assert all(torch.equal(alone[key], resumed[key]) for key in alone)


def metric_rows_of_tests(workdir: Path) -> list[dict[str, str]]:
    with open(workdir / "runs" / "classify" / "version_0" / "metrics.csv", newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("test/acc")]


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL"])
def test_a_run_stopped_in_its_test_after_fit_exits_non_zero_and_its_resume_tests(signame, tmp_path, caplog):
    """Lightning's handler ended the test after `fit` with exit code 0 and no test metrics; a run
    killed there was taken for finished and tested never."""
    one_epoch = ("--trainer.max_epochs=1", "--test_after_fit=true")
    process = start(tmp_path, *one_epoch, fault=fault("SignalInStage", stage="test", signal=signame))
    code, output = finish(process)
    assert code == (128 + signal.SIGTERM if signame == "SIGTERM" else -signal.SIGKILL), output[-3000:]
    if signame == "SIGTERM":
        assert "Received SIGTERM in `test`: stopped before its end, and nothing of it is kept." in output
    assert metric_rows_of_tests(tmp_path) == [], "precondition: the test never ended"
    resume = ["fit", "--config", config("classify.yaml"), *one_epoch, "--ckpt_path=last",
              "--trainer.enable_progress_bar=false"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        cli = main(resume)
        tested = metric_rows_of_tests(tmp_path)
        assert [float(row["test/acc"]) for row in tested] == [cli.trainer.callback_metrics["test/acc"]]
        caplog.clear()
        main(resume)
    assert "its test ran, so it is not tested again" in caplog.text
    assert metric_rows_of_tests(tmp_path) == tested


@pytest.mark.slow
@pytest.mark.parametrize(
    ("subcommand", "preemption"), [("test", True), ("test", False), ("predict", True)],
    ids=["test", "test-preemption-off", "predict"],
)  # fmt: skip
def test_sigterm_in_an_evaluating_command_exits_143(subcommand, preemption, tmp_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        main(["fit", "--config", config("classify.yaml"), "--trainer.max_epochs=1", "--test_after_fit=false",
              "--trainer.enable_progress_bar=false"])  # fmt: skip
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("trainer:\n  callbacks+:\n" + fault("SignalInStage", stage=subcommand))
    off = () if preemption else ("--preemption=null",)
    args = [subcommand, "--config", config("classify.yaml"), "--config", str(overlay), "--ckpt_path=last",
            "--trainer.enable_progress_bar=false", *off]  # fmt: skip
    process = launch.start(args, tmp_path, merge=True, session=True)
    code, output = finish(process)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    said = f"Received SIGTERM in `{subcommand}`" if preemption else "error: stopped by SIGTERM"
    assert said in output
    assert not (tmp_path / "runs" / "classify" / "version_0" / "predictions.csv").exists()
