"""A kill -9 at any moment of a run loses nothing: each kill here is drawn at random over the whole
run (any batch start or end, validation, epoch start or end, checkpoint save, the end; after the
run's own checkpoint callbacks), the run resumed with `--ckpt_path auto`, and its final weights and
every row of metrics.csv compared with a run never killed. Seeded (``PROJ_KILL_SEED``, printed, else
drawn); the kit's suite kills a few times, ``make fuzz`` (``PROJ_FUZZ_EXAMPLES``) many more. Two
kills are chosen: right after a step checkpoint at an epoch's last batch, with and without a
validation after it, whose resume has to run that validation and the epoch's end."""

from __future__ import annotations

import csv
import os
import random
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import main
from projkit.testing import config, launch, step_checkpoints

KILLS = max(3, int(os.environ.get("PROJ_FUZZ_EXAMPLES", "0")) // 100)
# 3 epochs of 6 steps, logged every 2, the second validated at its end, a checkpoint every 3 steps:
# mid-epoch, at the last batch of an epoch that a validation follows (12) and of one without (6, 18).
OVERLAY = "trainer:\n  max_epochs: 3\n  check_val_every_n_epoch: 2\n  enable_progress_bar: false\n"
OVERLAY += "  callbacks+:" + step_checkpoints(3)
ARGS = ("--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2", "--test_after_fit=false")
RUN = Path("runs/classify/version_0")


def fit_args(
    workdir: Path, event: int = 0, count_to: Path | None = None, at: str = "", data: tuple[str, ...] = ()
) -> list[str]:
    """The run's arguments, killed at its ``event``-th hook (``at``: "hook step", at that hook's
    first call at that optimizer step instead); ``data``: the data module's own."""
    killer = f"\n    - class_path: faults.KillAtEvent\n      init_args:\n        event: {event}\n"
    killer += f"        count_to: {count_to}\n" if count_to else ""
    if at:
        hook, step = at.split()
        killer += f"        hook: {hook}\n        step: {step}\n"
    (workdir / "overlay.yaml").write_text(OVERLAY + killer)
    return [
        "fit",
        "--config",
        config("classify.yaml"),
        "--config",
        str(workdir / "overlay.yaml"),
        *ARGS,
        *data,
    ]


def rows(run: Path) -> Counter:
    """Each value metrics.csv holds, by step and name (the speed and memory readings aside), counted."""
    with open(run / "metrics.csv", newline="") as f:
        found = list(csv.DictReader(f))
    timing = ("per_sec", "peak_memory", "mfu")
    return Counter(
        (int(row["step"]), name, value)
        for row in found
        for name, value in row.items()
        if value and name != "step" and not any(word in name for word in timing)
    )


def uninterrupted(workdir: Path, data: tuple[str, ...] = ()) -> tuple[Path, int]:
    """The run never killed, in this process, and how many hooks it saw."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        main(fit_args(workdir, count_to=workdir / "events", data=data))
    return workdir / RUN, int((workdir / "events").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    return uninterrupted(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module", params=[0, 2], ids=["streamed", "streamed-2-workers"])
def streamed(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, tuple[str, ...]]:
    """The run never killed on the data as streaming chunks (LitData's loader, ``num_workers``)."""
    workdir = tmp_path_factory.mktemp("streamed")
    main(["optimize", "--config", config("classify.yaml"), f"--output={workdir / 'chunks'}"])
    data = (
        f"--data.init_args.stream_from={workdir / 'chunks'}",
        f"--data.init_args.num_workers={request.param}",
    )
    return *uninterrupted(workdir, data), data


def killed_and_resumed(
    workdir: Path, reference: Path, data: tuple[str, ...] = (), **kill
) -> tuple[bool, Counter, Counter]:
    """Kill a run in ``workdir`` (``fit_args``' ``event`` or ``at``), resume it with ``--ckpt_path
    auto``: whether its final weights are the uninterrupted run's, and the rows lost and repeated."""
    workdir.mkdir()
    killed = launch.run(fit_args(workdir, data=data, **kill), workdir, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        main([*fit_args(workdir, data=data), "--ckpt_path=auto"])  # killed before a checkpoint: starts
    resumed = max((workdir / RUN.parent).glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    expected = torch.load(reference / "checkpoints" / "last.ckpt", weights_only=True)
    got = torch.load(resumed, weights_only=True)
    exact = got["global_step"] == expected["global_step"] and all(
        torch.equal(value, got["state_dict"][key]) for key, value in expected["state_dict"].items()
    )
    expected_rows, got_rows = rows(reference), rows(resumed.parent.parent)
    return exact, expected_rows - got_rows, got_rows - expected_rows


@pytest.mark.slow
def test_a_kill_at_a_random_moment_loses_nothing(reference, tmp_path: Path):
    kills_at_random_moments(*reference, (), KILLS, tmp_path)


@pytest.mark.slow
def test_a_kill_at_a_random_moment_of_a_streamed_run_loses_nothing(streamed, tmp_path: Path):
    kills_at_random_moments(*streamed, max(1, KILLS // 2), tmp_path)


def kills_at_random_moments(
    run: Path, events: int, data: tuple[str, ...], kills: int, tmp_path: Path
) -> None:
    # Drawn from the system: the reference run seeded Python's generator.
    seed = int(os.environ.get("PROJ_KILL_SEED", random.SystemRandom().randrange(2**32)))
    print(f"PROJ_KILL_SEED={seed}: {kills} kills over {events} hooks")
    draws = random.Random(seed).sample(range(1, events + 1), min(kills, events))
    figures, wrong = Counter(), []
    for event in draws:
        exact, lost, repeated = killed_and_resumed(tmp_path / f"kill{event}", run, data, event=event)
        figures.update(runs=1, exact=exact, runs_with_wrong_rows=bool(lost or repeated))
        figures.update(rows_lost=lost.total(), rows_repeated=repeated.total())
        if not exact or lost or repeated:
            wrong.append((event, exact, sorted(lost)[:4], sorted(repeated)[:4]))
    print(f"seed {seed}: {dict(figures)}")
    assert not wrong, f"PROJ_KILL_SEED={seed}: (event, exact, lost, repeated) {wrong}"


@pytest.mark.slow
@pytest.mark.parametrize("step", [6, 12], ids=["no-validation-after", "validation-after"])
def test_a_kill_after_a_step_checkpoint_at_an_epochs_last_batch_loses_nothing(reference, tmp_path, step):
    # Steps 6 and 12 end an epoch (6 batches each) and are a step checkpoint's: the kill comes after
    # that file is written, before the epoch's end (and, at 12, the validation before it). Lightning
    # resumed such a file after them, without their rows (val/*, the epoch's train/acc); at 6 it drew
    # a random number more than a run never stopped (its skipped validation's loader), so other
    # weights followed.
    killed = f"on_train_batch_end {step}"
    exact, lost, repeated = killed_and_resumed(tmp_path / "kill", reference[0], at=killed)
    assert exact
    assert not lost and not repeated, f"lost {sorted(lost)}, repeated {sorted(repeated)}"
