"""`python -m tinyproj sweep`: Optuna studies in SQLite shared by workers, pruning, resuming after a
worker is killed mid-trial, the results a user reads, and sweep configs refused with the field and the
fix. The sweep configs the tests write name tinyproj's experiment configs by their absolute paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import HERE, main
from projkit.sweep import HOST, cpu_cores, load_sweep, trial_threads, workers_here
from projkit.testing import config

# Trials of a few seconds on tinyproj's classifier (14 training steps an epoch): no warmup, so that a
# good learning rate is good from the first step.
QUICK = [
    "--trainer.enable_progress_bar=false",
    "--trainer.limit_test_batches=1",
    "--model.init_args.scheduler.init_args.warmup_steps=0",
]
LR = "model.init_args.optimizer.init_args.lr"
SECRET = "s3cret-that-must-not-be-shown"


def write_sweep(path: Path, **fields) -> Path:
    spec = {
        "configs": [config("classify.yaml")],
        "metric": "val/loss",
        "direction": "minimize",
        "n_trials": 2,
        "space": {LR: {"type": "categorical", "choices": [1.0e-7, 1.0e-2]}},
        **fields,
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def start_worker(sweep: Path, cwd: Path, log: str, *args: str) -> subprocess.Popen:
    """A sweep worker in a process group of its own (its trials join it), output to ``log``; the
    tests' folder is on its path (conftest puts it in ``PYTHONPATH``), so it finds ``tinyproj`` and
    its trials can import ``faults``."""
    env = {**os.environ}
    assert str(HERE) in env["PYTHONPATH"].split(os.pathsep)
    with open(cwd / log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tinyproj", "sweep", "--config", str(sweep), *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish(worker: subprocess.Popen, cwd: Path, log: str, timeout: float = 400) -> str:
    try:
        code = worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        raise
    output = (cwd / log).read_text()
    assert code == 0, output
    return output


def load(name: str, workdir: Path):
    import optuna

    storage = f"sqlite:///{workdir / 'runs' / 'sweeps' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage)


# A worker that opens the study, says so in a file ``ready_<pid>``, and once the file ``go`` exists asks
# for 10 trials (Optuna's ask takes a queued trial first): the workers reach for the same trials at once.
TAKE_QUEUED = """
import json, os, pathlib, sys, time
import optuna
from projkit.sweep import storage_for
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="queue", storage=storage_for(sys.argv[1]))
pathlib.Path(f"ready_{os.getpid()}").touch()
while not pathlib.Path("go").exists():
    time.sleep(0.01)
print(json.dumps([study.ask()._trial_id for _ in range(10)]))
"""


@pytest.mark.slow
def test_workers_sharing_a_sqlite_study_take_each_queued_trial_once(workdir):
    """Queued trials (enqueued by a user, or a dead worker's retried) are taken by one worker each:
    SQLite cannot lock the row a worker reads, and without the lock at begin these 4 workers were
    given 32 to 36 distinct trials of their 40 in four tries."""
    import json

    import optuna

    from projkit.sweep import storage_for

    url = f"sqlite:///{workdir / 'study.db'}"
    study = optuna.create_study(study_name="queue", storage=storage_for(url))
    for x in range(40):
        study.enqueue_trial({"x": float(x)}, skip_if_exists=False)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", TAKE_QUEUED, url], cwd=workdir, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    while len(list(workdir.glob("ready_*"))) < len(workers) and all(w.poll() is None for w in workers):
        time.sleep(0.05)
    (workdir / "go").touch()
    taken = [trial_id for worker in workers for trial_id in json.loads(worker.communicate(timeout=120)[0])]
    assert len(taken) == 40 and len(set(taken)) == 40, sorted(taken)


def test_the_workers_on_one_machine_share_its_cores_among_their_trials(workdir, monkeypatch):
    """Each trial's torch would start a thread per core, and two workers' trials on 2 cores took 3.8
    times as long so (``kit/benchmarks/sweep_workers.py``): a trial gets the cores over the live workers."""
    sweep = load_sweep(write_sweep(workdir / "cores.yaml"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    registered = sweep.folder / "workers"
    registered.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", ""])  # a killed worker, whose file stays
    gone.wait()
    try:
        for pid in (os.getpid(), other.pid, gone.pid):
            (registered / f"{HOST}:{pid}").touch()
        (registered / "another-machine:1").touch()  # on a shared file system: not this machine's
        assert workers_here(sweep) == 2
        assert trial_threads(sweep) == (max(1, cpu_cores() // 2), 2)
        assert sorted(p.name for p in registered.iterdir()) == sorted(
            ["another-machine:1", f"{HOST}:{os.getpid()}", f"{HOST}:{other.pid}"]
        )
    finally:
        other.kill()
        other.wait()
    assert workers_here(sweep) == 1 and trial_threads(sweep) == (cpu_cores(), 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice, which the trials inherit
    assert trial_threads(sweep) is None


@pytest.mark.slow
def test_two_workers_share_a_sqlite_study_prune_and_report_the_best_trial(workdir, monkeypatch):
    import optuna
    from optuna.trial import TrialState

    sweep = write_sweep(
        workdir / "two.yaml",
        flags=[*QUICK, "--trainer.max_epochs=2"],
        n_trials=2,
        # Deterministic whichever worker runs what: a trial still above 1.0 at a validation is pruned,
        # which a learning rate of 1e-7 always is (the loss stays at ln 4 = 1.39) and 1e-2 never (0.09
        # at the first validation).
        pruner={"class_path": "ThresholdPruner", "init_args": {"upper": 1.0}},
    )
    # Each worker's trial is one of these: one pruned, one complete.
    (workdir / "runs" / "sweeps" / "two").mkdir(parents=True)
    study = optuna.create_study(
        study_name="two", storage=f"sqlite:///{workdir / 'runs/sweeps/two/study.db'}", direction="minimize"
    )
    study.enqueue_trial({LR: 1.0e-7})
    study.enqueue_trial({LR: 1.0e-2})

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the workers share the cores themselves
    # A password in the study's URL (SQLite ignores it, with a warning): in no output or file.
    storage = f"--storage=sqlite:///{workdir / 'runs/sweeps/two/study.db'}?password={SECRET}"
    workers = [start_worker(sweep, workdir, f"worker{i}.log", storage) for i in range(2)]
    outputs = [finish(worker, workdir, f"worker{i}.log") for i, worker in enumerate(workers)]
    assert "study.db?password=***, trials under" in outputs[0]
    assert not [p for p in workdir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]

    for output in outputs:  # nothing before the worker's own first line (no log of Optuna's)
        assert output.startswith("Sweep 'two': study in sqlite:///"), output[:500]
    study = load("two", workdir)
    states = [t.state for t in study.trials]
    assert sorted(states) == sorted([TrialState.COMPLETE, TrialState.PRUNED]), states
    assert len({t.user_attrs["worker"] for t in study.trials}) == 2  # both workers ran trials
    for trial in study.trials:
        assert (trial.state == TrialState.PRUNED) == (trial.params[LR] == 1.0e-7), trial
        if trial.state == TrialState.PRUNED:  # stopped at its first validation, as it was logged
            assert list(trial.intermediate_values) == [14] == [trial.user_attrs["pruned_at_step"]]
            assert trial.intermediate_values[14] > 1.0

    best = study.best_trial
    run = Path(best.user_attrs["run_dir"])
    assert run == Path("runs/sweeps/two") / f"trial_{best.number}" / "version_0" and run.is_dir()
    assert any(f"Best trial {best.number}: val/loss {best.value:.4f}" in out for out in outputs)
    # The second worker to start found the first: each trial of its got half the cores or one.
    assert any(f"use {max(1, cpu_cores() // 2)} CPU thread(s) each: 2 worker(s)" in out for out in outputs)
    threads = best.user_attrs["threads"]
    repeat_it = f"OMP_NUM_THREADS={threads} python -m tinyproj fit --config {run}/config.yaml"
    assert repeat_it in "".join(outputs)
    assert not list((workdir / "runs" / "sweeps" / "two" / "workers").iterdir())  # both unregistered
    for name in ("trials.csv", "history.png"):
        assert (workdir / "runs" / "sweeps" / "two" / name).stat().st_size > 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["init_args"]["optimizer"]["init_args"]["lr"] == best.params[LR]
    assert "OptunaPruning" not in (run / "config.yaml").read_text()  # it would report again

    # Its config.yaml alone repeats it, beside it, and the study is left as it was, with the threads
    # the command it printed sets (a sum over other threads rounds otherwise).
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        repeat = main(["fit", "--config", str(run / "config.yaml")])
    finally:
        torch.set_num_threads(before)
    assert repeat.trainer.logger.log_dir == str(run.parent / "version_1")
    assert float(repeat.trainer.checkpoint_callback.best_model_score) == pytest.approx(best.value, abs=1e-4)
    assert len(load("two", workdir).trials) == len(study.trials)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_retry_is_not_failed_for_the_dead_worker_whose_name_it_carries(tmp_path):
    """Optuna's retry of a dead worker's trial copies that trial's attributes, the worker's name
    included, and a worker that starts the retry names itself only once its objective runs. Between
    the two, another worker's check must not take the retry for the dead worker's trial."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    from projkit.sweep.storage import fail_dead_trials

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=60,
        heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
    )  # fmt: skip
    study = optuna.create_study(storage=storage)
    left = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    left.set_user_attr("worker", f"{HOST}:{int(dead.stdout)}")  # killed while running it
    fail_dead_trials(study, storage)
    retry = study.ask()  # the retry, started by a worker that has not named itself yet
    fail_dead_trials(study, storage)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {left.number: TrialState.FAIL, retry.number: TrialState.RUNNING}
    assert retry.params == left.params and retry.user_attrs["worker"] == left.user_attrs["worker"]


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_resumes_the_study_to_completion(workdir, capsys):
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    started = workdir / "past_step_20"
    touch = ["--trainer.callbacks+=faults.TouchAtStep", "--trainer.callbacks.init_args.step=20"]
    sweep = write_sweep(
        workdir / "killed.yaml",
        flags=[*QUICK, "--trainer.max_epochs=3", *touch, f"--trainer.callbacks.init_args.path={started}"],
        space={LR: {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}},
        n_trials=1,
    )
    worker = start_worker(sweep, workdir, "first.log")
    deadline = time.monotonic() + 300
    while not started.exists() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), (workdir / "first.log").read_text()
    os.killpg(worker.pid, signal.SIGKILL)  # the worker and its trial, mid-epoch 2
    worker.wait()
    (interrupted,) = load("killed", workdir).trials
    assert interrupted.state == TrialState.RUNNING and interrupted.intermediate_values  # it had validated

    # The same command again, in this process (whose server for trials is up already).
    from projkit.sweep import main as resume

    resume(["--config", str(sweep)])
    output = capsys.readouterr().out
    trials = load("killed", workdir).trials
    assert trials[0].state == TrialState.FAIL  # marked failed at once: its worker's process is gone
    assert f"trial 0: its worker (PID {worker.pid}) is gone" in output
    assert [t.state for t in trials[1:]] == [TrialState.COMPLETE]  # the one trial to finish: the retry
    # The interrupted trial's values are tried again first.
    assert RetryHeartbeatStaleTrialCallback.retried_trial_number(trials[1]) == 0
    assert trials[1].params == interrupted.params


def sweep_error(path: Path, capsys) -> str:
    from projkit.sweep import main as sweep

    with pytest.raises(SystemExit) as exit_info:
        sweep(["--config", str(path)])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"configs": None}, r"configs: missing: list the experiment's config files"),
        ({"configs": ["configs/nope.yaml"]}, r"configs: no file 'configs/nope.yaml'"),
        ({"direction": "down"}, r"direction: 'down': write `minimize`"),
        ({"n_trials": 0}, r"n_trials: '0': the number of trials to finish"),
        ({"space": {LR: {"type": "loguniform", "low": 1, "high": 2}}}, rf"space.{LR}: unknown distribution "),
        ({"space": {LR: {"type": "float", "low": "1e-4", "high": 0.1}}}, r"write 1.0e-4"),
        (
            {"space": {LR: {"type": "float", "low": 0.0, "high": 0.1, "log": True}}},
            r"`low > 0` must hold for `log=True`",
        ),
        (
            {"space": {LR: {"type": "categorical", "choices": [[1, 2]]}}},
            r"categorical distribution should be a tuple of None, bool, int, float and str",
        ),
        (
            {"space": {LR: {"type": "float", "low": 0.1, "high": 1.0, "log": True, "step": 0.1}}},
            r"`step` is not supported when `log` is true",
        ),
        ({"sampler": {"class_path": "TPESamplr"}}, r"sampler: .*TPESamplr.*TPESampler"),
        (
            {"pruner": {"class_path": "MedianPruner", "init_args": {"warmup": 3}}},
            r"pruner: .*'warmup' is not accepted",
        ),
        ({"metrics": "val/loss"}, r"metrics: unknown field"),
    ],
)
def test_bad_sweep_configs_name_the_field_and_the_fix(fields, expected, workdir, capsys):
    import re

    err = sweep_error(write_sweep(workdir / "bad.yaml", **fields), capsys)
    assert re.search(expected, err), err
    assert not (workdir / "runs").exists()


def test_a_wandb_spec_is_pointed_to_wandb(workdir, capsys):
    """A W&B sweep spec (``method``, ``command`` for W&B's agent) given to ``sweep``."""
    spec = {
        "program": "tinyproj",
        "method": "bayes",
        "metric": {"name": "val/loss", "goal": "minimize"},
        "parameters": {f"--{LR}": {"min": 1.0e-4, "max": 1.0e-2}},
        "command": ["${env}", "python", "-m", "tinyproj", "fit", "--config", "classify.yaml", "${args}"],
    }
    (workdir / "wandb.yaml").write_text(yaml.safe_dump(spec))
    err = sweep_error(workdir / "wandb.yaml", capsys)
    assert "W&B sweep spec; run it with `wandb sweep" in err and "wandb.yaml" in err
    assert not (workdir / "runs").exists()


@pytest.mark.slow
def test_a_key_the_cli_refuses_stops_the_sweep_at_its_first_trial(workdir, capsys):
    sweep = write_sweep(
        workdir / "typo.yaml",
        space={"model.init_args.optimizer.init_args.lrr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2}},
    )
    output = sweep_error(sweep, capsys)
    assert "trial 0: the CLI refused its command" in output and "lrr" in output


@pytest.mark.slow
def test_a_metric_the_model_does_not_log_stops_the_sweep_before_its_first_trial_trains(
    workdir, monkeypatch, capsys
):
    monkeypatch.delenv("PROJ_DEBUG")  # the trial's refusal as a user sees it: one line, exit 2
    output = sweep_error(write_sweep(workdir / "metric.yaml", metric="val/los"), capsys)
    assert "trial 0: the CLI refused its command" in output
    assert "metric (of the sweep config)=val/los" in output and "Did you mean val/loss?" in output
    assert not list(workdir.glob("runs/sweeps/*/trial_0/version_*/checkpoints/*.ckpt")), "it trained"


@pytest.mark.slow
def test_the_plots_are_drawn_with_the_installed_packages_from_two_complete_trials(tmp_path):
    import optuna

    from projkit.sweep.results import write_plots

    study = optuna.create_study(direction="minimize")
    study.optimize(lambda trial: abs(trial.suggest_float(LR, 1e-4, 1e-2, log=True) - 3e-3), n_trials=1)
    assert write_plots(study, tmp_path) == ["history.png"]
    study.optimize(lambda trial: abs(trial.suggest_float(LR, 1e-4, 1e-2, log=True) - 3e-3), n_trials=2)
    assert write_plots(study, tmp_path) == ["history.png", "importance.png"]
    for name in ("history.png", "importance.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


@pytest.mark.parametrize(("sampler", "package"), [("QMCSampler", "scipy"), ("CmaEsSampler", "cmaes")])
def test_a_sampler_that_needs_a_package_not_installed_is_refused_before_any_trial(sampler, package, tmp_path):
    from projkit.sweep import SweepConfigError

    space = {LR: {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}}
    sweep = write_sweep(tmp_path / "sweep.yaml", sampler={"class_path": sampler}, space=space)
    with pytest.raises(SweepConfigError, match=rf"sampler: {sampler} needs the package '{package}'.*uv add"):
        load_sweep(sweep)


@pytest.mark.slow
def test_a_trial_forked_from_the_preloaded_server_computes_with_the_threads_it_is_given(tmp_path):
    """The server imported torch with its own thread count; each trial gets the one the worker gave it."""
    from projkit import preloaded

    for threads in ("1", "2"):
        record = tmp_path / f"threads_{threads}"
        args = ["fit", "--config", config("classify.yaml"), "--trainer.fast_dev_run=1",
                "--test_after_fit=false", "--trainer.callbacks+=faults.RecordThreads",
                f"--trainer.callbacks.init_args.path={record}"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(HERE)}
        log = tmp_path / f"output_{threads}.log"
        assert preloaded.start(args, tmp_path, env, log).wait(timeout=300) == 0, log.read_text()[-3000:]
        assert record.read_text() == threads
