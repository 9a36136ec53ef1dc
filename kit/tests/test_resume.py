"""A run killed with SIGKILL and resumed with `--ckpt_path last` ends bit-identical to a run that
was never interrupted; a broken save never costs the previous checkpoint."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import TASKS, fault, main
from projkit.testing import config, kill_at, launch, step_checkpoints

# Classify: 14 batches of 16 per epoch, logged every 2 steps. A periodic checkpoint every 6 steps,
# 2 epochs, dropout and augmentation on (the classify config has both).
PERIODIC = "trainer:\n  max_epochs: 2\n  enable_progress_bar: false\n  callbacks+:" + step_checkpoints(6)
# The language model (dropout on) validated every 10 steps.
ARGS = {
    "image": (),
    "text": (
        "--model.init_args.scheduler.init_args.warmup_steps=5",
        "--trainer.max_steps=30",
        "--trainer.val_check_interval=10",
        "--trainer.limit_val_batches=2",
    ),
}


def fit_args(workdir: Path, *extra: str, kill_step: int | None = None, task: str = "image") -> list[str]:
    experiment, _ = TASKS[task]
    overlay = workdir / "overlay.yaml"
    overlay.write_text(PERIODIC + (kill_at(kill_step) if kill_step is not None else ""))
    return ["fit", "--config", config(experiment), "--config", str(overlay), "--test_after_fit=false",
            *ARGS[task], *extra]  # fmt: skip


def run_fit(
    workdir: Path, *extra: str, kill_step: int | None = None, task: str = "image"
) -> subprocess.CompletedProcess:
    args = fit_args(workdir, *extra, kill_step=kill_step, task=task)
    return launch.run(args, workdir)


def final_state(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def metric_rows(run: Path) -> list[tuple[int, str, str]]:
    """Every value metrics.csv holds, by step and name, but the speed and memory readings."""
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    timing = ("per_sec", "peak_memory", "mfu")
    return sorted(
        (int(row["step"]), name, value)
        for row in rows
        for name, value in row.items()
        if value and name != "step" and not any(word in name for word in timing)
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, Path]:
    """Each task's run, never interrupted, computed once and on demand: in this process, as the same
    seed gives the same weights in any process."""
    runs: dict[str, Path] = {}

    def run(task: str) -> Path:
        if task not in runs:
            workdir = tmp_path_factory.mktemp(f"uninterrupted-{task}")
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(workdir)
                main(fit_args(workdir, task=task))
            runs[task] = workdir / "runs" / TASKS[task][1] / "version_0"
        return runs[task]

    return run


def resume(workdir: Path, task: str = "image") -> Path:
    """``--ckpt_path last`` in this process (what stopped the run needed a process of its own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        main(fit_args(workdir, "--ckpt_path=last", task=task))
    runs = list((workdir / "runs" / TASKS[task][1]).iterdir())
    assert [r.name for r in runs] == ["version_0"], "the resumed run continues in its own directory"
    return runs[0]


@pytest.mark.slow
def test_killed_run_resumes_bit_identical(uninterrupted, tmp_path):
    """Killed mid-epoch 3 steps after the step-18 checkpoint, which is then truncated (what a save
    interrupted without atomic writes leaves): the resume falls back to last.ckpt, which the end of
    epoch 0 (step 14) wrote. The runs of test_sigterm_run_resumes_bit_identical stop elsewhere."""
    killed = run_fit(tmp_path, kill_step=21)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    newest = tmp_path / "runs" / "classify" / "version_0" / "checkpoints" / "step0018.ckpt"
    newest.write_bytes(newest.read_bytes()[:1000])
    os.utime(newest)
    with pytest.warns(UserWarning, match=r"Skipping unreadable checkpoint .*step0018\.ckpt"):
        run = resume(tmp_path)

    reference = uninterrupted("image")
    expected, got = final_state(reference), final_state(run)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), f"{key} differs"
    assert metric_rows(run) == metric_rows(reference), "logged steps duplicated or missing"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "step", "where"),
    # Classify logs every 2 steps and has 14 batches an epoch; the language model validates every 10.
    [
        ("image", 10, "a logging step mid-epoch"),
        ("image", 14, "the epoch's last batch, before its validation and end"),
        ("text", 10, "a step followed by a validation, mid-epoch"),
    ],
)
def test_sigterm_run_resumes_bit_identical(task, step, where, uninterrupted, tmp_path):
    """A SIGTERM stops the run after the step it lands in (optimizer step ``step``), and after what
    follows that step; resumed, the run ends with the checkpoints and metrics.csv of the
    uninterrupted one."""
    (tmp_path / "sigterm.yaml").write_text("trainer:\n  callbacks+:\n" + fault("SignalAtStep", step=step - 1))
    stopped = run_fit(tmp_path, "--config", str(tmp_path / "sigterm.yaml"), task=task)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    run = f"runs/{TASKS[task][1]}/version_0"
    command = f"python -m tinyproj fit --config {run}/config.yaml --ckpt_path {run}/checkpoints/last.ckpt"
    assert f"Received SIGTERM at step {step}: saved {run}/checkpoints/last.ckpt" in stopped.stderr
    assert f"Resume with: {command}" in stopped.stderr
    assert "UserWarning: Received" not in stopped.stderr, "a plain line, not a warning with a source path"
    resumed, reference = resume(tmp_path, task), uninterrupted(task)
    assert metric_rows(resumed) == metric_rows(reference), f"{where}: logged steps duplicated or missing"
    # The same files: the resumed run knows the best checkpoint of the validation after the stop.
    names = sorted(path.name for path in (resumed / "checkpoints").iterdir())
    assert names == sorted(path.name for path in (reference / "checkpoints").iterdir())
    for name in names:
        expected = torch.load(reference / "checkpoints" / name, weights_only=True)["state_dict"]
        got = torch.load(resumed / "checkpoints" / name, weights_only=True)["state_dict"]
        assert all(torch.equal(expected[key], got[key]) for key in expected), f"{where}: {name} differs"


@pytest.mark.slow
@pytest.mark.parametrize(
    "read",
    [
        ("--data.init_args.num_workers=2",),
        ("--data.init_args.per_item=true", "--data.init_args.num_workers=2"),
    ],
    ids=["2-workers", "random-flips-2-workers"],
)
def test_sigterm_streamed_run_resumes_bit_identical(read, tmp_path):
    """The same on the data as streaming chunks read by LitData's loader: its position is in
    last.ckpt, and the resume reads the rest of the epoch as the uninterrupted run did. A random
    transform of each training item in the loader's workers (``per_item``: a flip), whose RNG
    streams restart with the resumed run's workers, draws the same numbers as in the uninterrupted
    run (``SeededStreamingDataset``)."""
    main(["optimize", "--config", config("classify.yaml"), f"--output={tmp_path / 'chunks'}"])
    data = (f"--data.init_args.stream_from={tmp_path / 'chunks'}", *read)
    (tmp_path / "reference").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path / "reference")
        main(fit_args(tmp_path / "reference", *data))
    (tmp_path / "sigterm.yaml").write_text("trainer:\n  callbacks+:\n" + fault("SignalAtStep", step=9))
    stopped = run_fit(tmp_path, "--config", str(tmp_path / "sigterm.yaml"), *data)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        main(fit_args(tmp_path, *data, "--ckpt_path=last"))
    reference, resumed = tmp_path / "reference/runs/classify/version_0", tmp_path / "runs/classify/version_0"
    expected, got = final_state(reference), final_state(resumed)
    assert all(torch.equal(expected[key], got[key]) for key in expected), "other weights after the resume"
    assert metric_rows(resumed) == metric_rows(reference), "logged steps duplicated or missing"


@pytest.mark.slow
def test_resume_with_nothing_to_resume_fails_clearly(workdir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config("classify.yaml"), "--ckpt_path=last"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--ckpt_path last: no readable checkpoint under runs/classify" in err
    assert "Drop --ckpt_path to train from scratch" in err


@pytest.mark.slow
def test_kill_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """SIGKILL while last.ckpt is rewritten at step 4, inside ``torch.save`` with the temporary file
    open (the run waits there to be killed): last.ckpt stays step 2's, and ``--ckpt_path last``
    resumes from it."""
    stalled = tmp_path / "stalled"
    overlay = tmp_path / "stall.yaml"
    overlay.write_text(
        "trainer:\n  callbacks+:\n    - class_path: faults.StallSaveAtStep\n"
        f"      init_args: {{step: 4, path: {stalled}}}\n"
    )
    args = ["fit", "--config", config("classify.yaml"), "--last_checkpoint.init_args.every_n_train_steps=2",
            "--trainer.max_steps=5", "--trainer.num_sanity_val_steps=0", "--test_after_fit=false",
            "--trainer.enable_progress_bar=false"]  # fmt: skip
    run = launch.start([*args, "--config", str(overlay)], tmp_path)
    try:
        while not stalled.exists():
            assert run.poll() is None, run.output()[1][-3000:]
            time.sleep(0.05)
        checkpoints = tmp_path / "runs" / "classify" / "version_0" / "checkpoints"
        assert (checkpoints / f".last.ckpt.{run.pid}.tmp").exists(), "the kill lands inside the save"
        previous = (checkpoints / "last.ckpt").read_bytes()
    finally:
        os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=60)
    assert run.returncode == -signal.SIGKILL

    last = checkpoints / "last.ckpt"
    assert last.read_bytes() == previous and torch.load(last, weights_only=True)["global_step"] == 2
    monkeypatch.chdir(tmp_path)
    cli = main([*args, "--ckpt_path=last"])
    assert Path(cli.trainer.ckpt_path).resolve() == last.resolve() and cli.trainer.global_step == 5
    assert not list(checkpoints.glob(".*.tmp")), "the killed save's temporary file is cleared"


@pytest.mark.slow
def test_cli_writes_checkpoints_atomically(workdir):
    from projkit.reliability import AtomicCheckpointIO

    cli = main(["fit", "--config", config("classify.yaml"), "--trainer.fast_dev_run=true"])
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


@pytest.mark.slow
def test_each_safeguard_is_switched_off_by_its_key(workdir):
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from projkit.reliability import ExactResume, Preemption, StopOnDivergence

    off = ["--exact_resume=null", "--preemption=null", "--stop_on_divergence=null", "--checkpoint_io=null"]
    cli = main(["fit", "--config", config("classify.yaml"), "--trainer.max_steps=2", *off])
    kinds = {type(callback) for callback in cli.trainer.callbacks}
    assert not kinds & {ExactResume, Preemption, StopOnDivergence}
    assert type(cli.trainer.strategy.checkpoint_io) is TorchCheckpointIO
    saved = torch.load(Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2 and "rng_states" not in saved


def scalar_steps(events: Path) -> dict[str, list[int]]:
    """The steps of every scalar TensorBoard shows from ``events`` (a file, or a run's folder)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(events))
    reader.Reload()
    return {tag: [event.step for event in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


@pytest.mark.slow
def test_tensorboard_shows_each_step_once_after_a_kill_and_resume(tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        "trainer:\n  max_steps: 14\n  log_every_n_steps: 1\n  limit_val_batches: 1\n"
        "  enable_progress_bar: false\n  callbacks+:" + step_checkpoints(4)
    )
    killed = tmp_path / "killed.yaml"
    killed.write_text("trainer:\n  callbacks+:" + kill_at(10))
    configs = ("classify.yaml", "logger/tensorboard.yaml", str(overlay))
    command = ["fit", *(f"--config={config(c)}" for c in configs), "--test_after_fit=false"]
    first = launch.run([*command, "--config", str(killed)], tmp_path)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    run = tmp_path / "runs" / "classify" / "version_0"
    (written,) = run.glob("events.out.tfevents.*")
    assert max(scalar_steps(written)["train/loss"]) >= 8, "precondition: events after the step-8 checkpoint"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        main([*command, "--ckpt_path=last"])
    shown = scalar_steps(run)
    assert shown["train/loss"] == list(range(14)), "every step once, none lost"
    # `epoch` goes with each call that logs (the epoch's and the validation's metrics share a step).
    repeated = {tag: steps for tag, steps in shown.items() if tag != "epoch" and len(set(steps)) < len(steps)}
    assert repeated == {}
