"""The run directory as a user meets it in the first hour: ``last.ckpt`` is the last state, the
evaluating commands find the checkpoint and write beside it, short runs are complete, and nothing a
run wrote is lost when a command resumes, fails, or meets another one in the same folder."""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from conftest import main
from projkit.cli import ProjectCLI
from projkit.testing import TINY_FIT, config, fit, kill_at, launch

RUN = Path("runs/classify/version_0")
STEPS_PER_EPOCH = 14  # 224 training images in batches of 16
# Two epochs at a rate that overshoots, still warming up when the second begins: val/loss worsens in
# the second epoch (0.18, then 0.27).
WORSENING = (
    "--trainer.max_epochs=2",
    "--model.init_args.optimizer.init_args.lr=2",
    "--model.init_args.scheduler.init_args.warmup_steps=20",
    "--trainer.enable_progress_bar=false",
)
# Its metrics.csv: 3 rows (rates, throughput, loss) for each of its 14 logging steps, 2 (validation,
# training accuracy) for each epoch, and its test's.
FINISHED_ROWS = 14 * 3 + 2 * 2 + 1


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def steps_of(run: Path, name: str) -> list[int]:
    return [int(row["step"]) for row in rows(run) if row.get(name)]


def global_step(path: Path) -> int:
    return torch.load(path, weights_only=True, map_location="cpu")["global_step"]


def error_of(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code != 0
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A classify run whose val/loss worsened at its end, tested after fit; its folder is copied for
    each test that changes it."""
    workdir = tmp_path_factory.mktemp("finished")
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        fit("classify.yaml", extra=WORSENING)
    finally:
        os.chdir(previous)
    return workdir


@pytest.fixture
def run_copy(finished: Path, workdir: Path) -> Path:
    subprocess.run(["cp", "-a", str(finished / "runs"), str(workdir)], check=True)
    return workdir / RUN


@pytest.mark.slow
def test_last_checkpoint_is_the_final_state_when_val_loss_worsened(finished):
    run = finished / RUN
    best = [p for p in (run / "checkpoints").glob("epoch*.ckpt")]
    assert len(best) == 1 and global_step(best[0]) == STEPS_PER_EPOCH, "precondition: the best is epoch 0's"
    # Logged before each validation's step is counted.
    assert steps_of(run, "val/loss") == [STEPS_PER_EPOCH - 1, 2 * STEPS_PER_EPOCH - 1]
    assert global_step(run / "checkpoints" / "last.ckpt") == 2 * STEPS_PER_EPOCH


@pytest.mark.slow
@pytest.mark.parametrize("subcommand", ["test", "validate"])
def test_evaluating_commands_take_last_and_best_and_write_into_the_run(subcommand, run_copy, caplog):
    before = rows(run_copy)
    # What fit logged for each checkpoint: val/loss at each epoch's end; test/loss of the best.
    val_losses = [float(row["val/loss"]) for row in before if row.get("val/loss")]
    expected = {
        ("validate", "best"): val_losses[0],
        ("validate", "last"): val_losses[-1],
        ("test", "best"): next(float(row["test/loss"]) for row in before if row.get("test/loss")),
    }
    best = next((run_copy / "checkpoints").glob("epoch000-*.ckpt"))
    for which, file in (("last", run_copy / "checkpoints" / "last.ckpt"), ("best", best)):
        cli = main([subcommand, "--config", config("classify.yaml"), f"--ckpt_path={which}"])
        assert Path(cli.trainer.ckpt_path).resolve() == file.resolve()
        if (subcommand, which) in expected:
            logged = cli.trainer.callback_metrics["val/loss" if subcommand == "validate" else "test/loss"]
            assert logged == pytest.approx(expected[subcommand, which], rel=1e-5)
    assert sorted(p.name for p in run_copy.parent.iterdir()) == ["version_0"], "no new run folder"
    after = rows(run_copy)
    assert [r["step"] for r in after[: len(before)]] == [r["step"] for r in before], "rows kept"
    assert len(after) == len(before) + 2, "one row per evaluation"
    assert "Run directory: runs/classify/version_0" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("subcommand", ["test", "validate", "predict"])
def test_evaluating_without_a_checkpoint_is_refused_unless_asked(subcommand, workdir, capsys):
    err = error_of([subcommand, "--config", config("classify.yaml")], capsys)
    assert "untrained weights" in err and "--ckpt_path last" in err and "--allow_untrained=true" in err
    assert not Path("runs").exists()
    extra = (
        "--trainer.limit_test_batches=1",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_predict_batches=1",
    )
    cli = main([subcommand, "--config", config("classify.yaml"), "--allow_untrained=true", *extra])
    assert cli.trainer.state.finished


@pytest.mark.slow
def test_last_with_nothing_to_evaluate_says_to_fit_first(workdir, capsys):
    err = error_of(["test", "--config", config("classify.yaml"), "--ckpt_path=last"], capsys)
    assert "no readable checkpoint under runs/classify" in err and "Run `fit` first" in err


@pytest.mark.slow
@pytest.mark.parametrize("how", ["last", "auto"])
def test_resuming_a_finished_run_keeps_its_metrics_and_does_not_test_again(how, run_copy, caplog):
    before = (run_copy / "metrics.csv").read_bytes()
    assert len(rows(run_copy)) == FINISHED_ROWS and rows(run_copy)[-1]["test/acc"], "precondition: tested"
    fit("classify.yaml", extra=(*WORSENING, f"--ckpt_path={how}"))
    assert (run_copy / "metrics.csv").read_bytes() == before, "no second copy of its test"
    assert "Nothing to train: the checkpoint is where this run ends" in caplog.text
    assert sorted(p.name for p in run_copy.parent.iterdir()) == ["version_0"]


@contextlib.contextmanager
def checkpoints_that_cannot_be_written(run: Path, how: str) -> Iterator[None]:
    """``run/checkpoints`` that refuses new files (``unwritable``), or a file system holding just
    the checkpoints already there (``full``: a small tmpfs, which needs root)."""
    folder = run / "checkpoints"
    if how == "unwritable":
        # Root writes through permissions; an immutable folder refuses root too.
        lock, unlock = (
            (["chattr", "+i"], ["chattr", "-i"])
            if os.geteuid() == 0
            else (["chmod", "555"], ["chmod", "755"])
        )
        subprocess.run([*lock, str(folder)], check=True)
        try:
            yield
        finally:
            subprocess.run([*unlock, str(folder)], check=True)
        return
    kept = folder.with_name("kept")
    folder.rename(kept)
    folder.mkdir()
    # Room for the checkpoints there, in whole pages of 4 KiB, and for less than one more.
    size = sum(-(-p.stat().st_size // 4096) * 4 for p in kept.iterdir()) + 16
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", str(folder)], capture_output=True
    ).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        for path in kept.iterdir():
            shutil.copy2(path, folder / path.name)
        yield
    finally:
        # Lazily: the refused command's checkpoint reads are memory-mapped, and a mapping still held by
        # its traceback keeps the folder busy until it is collected.
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


@pytest.mark.slow  # a resumed epoch, up to its first checkpoint
@pytest.mark.parametrize("how", ["unwritable", "full"])
def test_a_resume_that_cannot_save_its_checkpoint_leaves_the_metrics_as_they_were(how, run_copy):
    before = (run_copy / "metrics.csv").read_bytes()
    with checkpoints_that_cannot_be_written(run_copy, how), pytest.raises(OSError):
        fit("classify.yaml", extra=(*WORSENING, "--trainer.max_epochs=3", "--ckpt_path=last"))
    assert (run_copy / "metrics.csv").read_bytes() == before
    assert sorted(p.name for p in run_copy.iterdir() if p.name.endswith((".csv", ".resume", ".tmp"))) == [
        "metrics.csv"
    ]


@pytest.mark.slow
def test_a_resume_killed_before_its_first_checkpoint_loses_no_row(run_copy):
    before = (run_copy / "metrics.csv").read_bytes()
    overlay = run_copy.parents[2] / "kill.yaml"
    overlay.write_text("trainer:\n  callbacks+:" + kill_at(2 * STEPS_PER_EPOCH + 3))
    args = ["fit", "--config", config("classify.yaml"), "--config", str(overlay), *WORSENING,
            "--trainer.max_epochs=3", "--ckpt_path=last"]  # fmt: skip
    killed = launch.run(args, overlay.parent)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert rows(run_copy)[FINISHED_ROWS - 1]["test/acc"], "the finished run's test is kept"
    # The next command on the run starts from every row the killed one found.
    fit("classify.yaml", extra=(*WORSENING, "--ckpt_path=last", "--test_after_fit=false"))
    assert (run_copy / "metrics.csv").read_bytes() == before


@pytest.mark.slow  # three commands, one a resumed fit of a third epoch
def test_a_resume_that_fails_at_start_keeps_the_metrics(run_copy, capsys):
    before = (run_copy / "metrics.csv").read_bytes()
    # The newest checkpoint, written mid-epoch by a 2-process run: refused while it is restored.
    checkpoint = torch.load(run_copy / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["Blobs"]["train_order"].update(batches=5, epoch_done=False, world_size=2)
    torch.save(checkpoint, run_copy / "checkpoints" / "two_processes.ckpt")
    with pytest.raises(ValueError, match=r"run of 2 process\(es\).*--trainer.devices=2"):
        fit("classify.yaml", extra=(*WORSENING, "--ckpt_path=last"))
    assert (run_copy / "metrics.csv").read_bytes() == before
    (run_copy / "checkpoints" / "two_processes.ckpt").unlink()

    bare = run_copy / "checkpoints" / "weights.ckpt"
    torch.save({k: checkpoint[k] for k in ("state_dict", "global_step", "epoch", "hyper_parameters")}, bare)
    err = error_of(["fit", "--config", config("classify.yaml"), f"--ckpt_path={bare}"], capsys)
    assert "holds weights only" in err and "init_from" in err
    assert (run_copy / "metrics.csv").read_bytes() == before
    # `last` passes over the newer file that cannot be resumed and takes the newest one that can.
    fit("classify.yaml", extra=(*WORSENING, "--trainer.max_epochs=3", "--ckpt_path=last"))
    assert global_step(run_copy / "checkpoints" / "last.ckpt") == 3 * STEPS_PER_EPOCH
    ends = [STEPS_PER_EPOCH * epoch - 1 for epoch in (1, 2, 3)]
    assert steps_of(run_copy, "val/loss") == ends
    assert steps_of(run_copy, "train/acc") == ends, "each epoch's training metrics once"


@pytest.mark.slow
def test_a_held_run_refuses_a_second_process_and_loses_nothing(run_copy, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from pathlib import Path; from projkit.rundir.lock import RunLock; "
         f"RunLock.acquire(Path({str(run_copy)!r})); print('held', flush=True); input()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file() and p.name != ".lock"}
        err = error_of(["fit", "--config", config("classify.yaml"), "--ckpt_path=last"], capsys)
        assert f"in use by another process (PID {holder.pid})" in err
        after = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file() and p.name != ".lock"}
        assert after == before
    finally:
        holder.communicate("\n", timeout=30)
    main(["test", "--config", config("classify.yaml"), "--ckpt_path=last"])  # free once it ends


@pytest.mark.slow
def test_stale_temporary_checkpoint_is_removed(run_copy):
    stale = run_copy / "checkpoints" / ".last.ckpt.99999.tmp"
    stale.write_bytes(b"half a checkpoint")
    main(["test", "--config", config("classify.yaml"), "--ckpt_path=last"])
    assert not stale.exists()


@pytest.mark.slow
def test_debug_overlay_writes_nothing_outside_runs(workdir):
    fit("classify.yaml", "debug/fast_dev_run.yaml")
    assert sorted(p.name for p in workdir.iterdir()) in ([], ["runs"])


@pytest.mark.slow
def test_a_short_language_model_run_validates_and_schedules_to_its_end(workdir):
    """A run that stops at max_steps before its first validation still validates at its last step,
    keeps a best checkpoint of it, and its schedule spans exactly the steps it trains."""
    extra = (
        "--trainer.max_steps=20",
        "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2",
        "--trainer.enable_progress_bar=false",
    )
    fit("lm.yaml", extra=extra)
    run = workdir / "runs" / "lm" / "version_0"
    assert steps_of(run, "val/loss") == [19], "validated at its last step, not only at the epoch's end"
    best = [p for p in (run / "checkpoints").iterdir() if p.name.startswith("epoch000-loss")]
    assert len(best) == 1 and global_step(best[0]) == 20, "a best, of the last step's validation"
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["lr_schedulers"][0]["total_steps"] == 20


@pytest.mark.slow
def test_a_run_prints_where_it_writes_and_nothing_it_cannot_act_on(workdir):
    command = [sys.executable, "-m", "tinyproj", "fit", "--config", config("classify.yaml"), *TINY_FIT]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "Run directory: runs/classify/version_0" in out
    assert "Best checkpoint: runs/classify/version_0/checkpoints/epoch000-loss" in out
    assert "Last checkpoint: runs/classify/version_0/checkpoints/last.ckpt" in out
    for noise in (
        "Tip:",
        "LeafSpec",
        "Total Flops 0",
        "weights_only` was not set",
        "exists and is not empty",
    ):
        assert noise not in out, noise
    tested = subprocess.run(
        [sys.executable, "-m", "tinyproj", "test", "--config", config("classify.yaml"), "--ckpt_path=best"],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "dirpath has changed" not in tested.stdout + tested.stderr


@pytest.mark.slow
def test_early_stopping_says_why_and_where_it_stopped(workdir, caplog):
    # Any value is an improvement on the first validation's (inf), none after it is by 100.
    patience = ("--early_stopping.patience=1", "--early_stopping.min_delta=100", "--trainer.max_epochs=30")
    cli = fit("classify.yaml", extra=(*TINY_FIT, *patience, "--test_after_fit=false"))
    assert cli.trainer.global_step == 4, "precondition: stopped after two epochs of two steps"
    assert "Early stopping: Monitored metric val/loss did not improve in the last 1 records." in caplog.text
    assert "Stopped in epoch 2 of 30 (step 4); --early_stopping.patience sets" in caplog.text


@pytest.mark.slow
def test_a_resume_names_the_settings_its_checkpoint_overrides(run_copy):
    new_lr = "--model.init_args.optimizer.init_args.lr=0.0001"
    saved = torch.load(run_copy / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]
    with pytest.warns(UserWarning, match=r"ignored: model\.init_args\.optimizer\.init_args\.lr=0\.0001 "
                      r"\(the checkpoint's 2(\.0)? is used\)\..*start a new run") as caught:  # fmt: skip
        cli = fit("classify.yaml", extra=(*WORSENING, "--ckpt_path=last", new_lr))
    assert len([w for w in caught if "were ignored" in str(w.message)]) == 1
    # What the warning says is what ran: the model built with the checkpoint's rate, the optimizer
    # restored at the rate its schedule had reached.
    assert cli.model.hparams["optimizer"]["init_args"]["lr"] == 2
    assert cli.trainer.optimizers[0].param_groups[0]["lr"] == saved["param_groups"][0]["lr"] != 0.0001


@pytest.mark.slow
def test_a_resume_with_other_settings_names_them_and_saves_its_config_beside(workdir):
    """The run's config.yaml keeps the settings it began with; a resume that trains on with others
    (a longer max_epochs, a flag left off) says each one and leaves its own config in the run. Each
    resume here trains (a checkpoint every 10 steps, all kept, to resume from): one with nothing left
    to train starts no training and is compared with nothing."""
    every_10_steps = """
trainer:
  callbacks+:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        {every_n_train_steps: 10, save_top_k: -1, filename: "step{step:04d}", auto_insert_metric_name: false}
"""
    Path("steps.yaml").write_text(every_10_steps)
    same = ["fit", "--config", config("classify.yaml"), "--config", "steps.yaml", *WORSENING]
    main(same)
    checkpoints = workdir / RUN / "checkpoints"

    def resumed(*args: str) -> tuple[ProjectCLI, list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cli = main([*same, *args])
        return cli, [str(w.message) for w in caught if "other settings" in str(w.message)]

    assert resumed(f"--ckpt_path={checkpoints / 'step0020.ckpt'}")[1] == [], "the same settings: nothing said"
    longer = ("--trainer.max_epochs=3", "--data.batch_size=32", "--test_after_fit=false")
    cli, said = resumed(*longer, "--ckpt_path=last")
    assert said == [
        f"Resuming {RUN} with other settings than its config.yaml: data.init_args.batch_size=32 (was 16); "
        "test_after_fit=false (was true); trainer.max_epochs=3 (was 2). The run trains on with these "
        f"(saved in {RUN}/config.from_step_28.yaml); to resume it with the earlier ones: "
        f"python -m tinyproj fit --config {RUN}/config.yaml --ckpt_path last"
    ]
    assert cli.datamodule.batch_size == 32 and cli.trainer.current_epoch == 3, "what it says is what ran"
    saved = yaml.safe_load((workdir / RUN / "config.from_step_28.yaml").read_text())
    assert (saved["data"]["init_args"]["batch_size"], saved["trainer"]["max_epochs"]) == (32, 3)
    assert yaml.safe_load((workdir / RUN / "config.yaml").read_text())["trainer"]["max_epochs"] == 2, "kept"
    # A requeued job: the same command again, from a checkpoint of the resume it repeats.
    assert resumed(*longer, f"--ckpt_path={checkpoints / 'step0030.ckpt'}")[1] == [], "as the last resume"
    assert sorted(p.name for p in (workdir / RUN).glob("config*.yaml")) == [
        "config.from_step_28.yaml",
        "config.yaml",
    ]
    step = global_step(checkpoints / "last.ckpt")
    (workdir / RUN / "config.from_step_28.yaml").write_text(
        "trainer: ["
    )  # spoilt by hand: the resume goes on
    assert resumed(*longer, "--ckpt_path=last", "--trainer.max_epochs=4")[1] == [
        f"Resuming {RUN} with other settings than its config.from_step_28.yaml: config.from_step_28.yaml "
        f"cannot be read (ParserError). The run trains on with these (saved in {RUN}/config.from_step_"
        f"{step}.yaml); to resume it with the earlier ones: "
        f"python -m tinyproj fit --config {RUN}/config.from_step_28.yaml --ckpt_path last"
    ]
    resumed_config = yaml.safe_load((workdir / RUN / f"config.from_step_{step}.yaml").read_text())
    assert resumed_config["trainer"]["max_epochs"] == 4


@pytest.mark.slow
def test_auto_in_a_batch_job_resumes_that_jobs_run_and_no_other(run_copy, monkeypatch, caplog):
    """A job script's `--ckpt_path auto`: a new job starts a new run even where the checkout holds a
    finished run of the experiment (which it once resumed, trained nothing and called a success); a
    requeued job, which keeps its job id, resumes the run it started."""
    args = ["fit", "--config", config("classify.yaml"), *WORSENING, "--ckpt_path", "auto"]
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    fit_first = main([*args, "--trainer.max_epochs=1"])
    started = Path(fit_first.trainer.log_dir)
    assert started == Path("runs/classify/version_1"), "a new run beside the finished version_0"
    assert (started / ".job").read_text() == "4242\n" and not (RUN / ".job").exists()
    assert fit_first.trainer.global_step == STEPS_PER_EPOCH
    requeued = main(args)  # the same job again: resumes its own run, to its end
    assert Path(requeued.trainer.log_dir) == started and requeued.trainer.global_step == 2 * STEPS_PER_EPOCH
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    caplog.clear()
    other = main(args)
    assert Path(other.trainer.log_dir) == Path("runs/classify/version_2")
    assert "job 4243 has no run under runs/classify yet; it starts a new one" in caplog.text
    assert "Nothing to train" not in caplog.text


@pytest.mark.slow
def test_a_resume_longer_than_its_schedule_says_the_rate_stays_at_the_floor(workdir):
    """The run resumed with more epochs keeps the schedule it was built with: the steps past its end
    train at the floor rate, said with what to do (the settings warning names only max_epochs)."""
    quick = ("--trainer.enable_progress_bar=false", "--test_after_fit=false")
    fit("classify.yaml", extra=(*quick, "--trainer.max_epochs=1"))
    with pytest.warns(
        UserWarning, match="sized for 14 optimizer steps and this run trains to step 42"
    ) as said:
        resumed = fit("classify.yaml", extra=(*quick, "--trainer.max_epochs=3", "--ckpt_path", "last"))
    assert any("start a new run" in str(w.message) for w in said)
    floor = resumed.trainer.lr_scheduler_configs[0].scheduler
    assert floor.total_steps == STEPS_PER_EPOCH and resumed.trainer.global_step == 3 * STEPS_PER_EPOCH
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        same = fit("classify.yaml", extra=(*quick, "--trainer.max_epochs=3", "--ckpt_path", "last"))
    assert same.trainer.global_step == 3 * STEPS_PER_EPOCH  # nothing left to train: nothing to say
    assert not any("sized for" in str(w.message) for w in again)
