"""Running trials: each a ``fit`` in a process of its own, its value read from its run's metrics."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
from collections import Counter
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from projkit import TRIAL_ENV, preloaded
from projkit.credentials import masked
from projkit.sweep.config import Sweep, SweepConfigError, suggest, trial_args
from projkit.sweep.storage import fail_dead_trials, fresh, open_study, storage_for
from projkit.sweep.workers import cpu_cores, register_worker, this_worker, trial_threads

# A sweep whose trials keep failing (a metric the model does not log, a range that diverges) stops
# rather than sampling on: it might never reach n_trials.
MAX_FAILURES_IN_A_ROW = 3


FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class TrialFailed(RuntimeError):
    """A trial's run failed; the sweep goes on with the next trial."""


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def best_value(rows: list[dict[str, str]], metric: str, direction: str) -> float | None:
    """The best value of ``metric`` the run logged: the trial's value, as its best checkpoint is the
    best of the run."""
    values = [float(row[metric]) for row in rows if row.get(metric) not in (None, "")]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return None
    return min(values) if direction == "minimize" else max(values)


def objective_for(sweep: Sweep, storage_url: str):
    """The objective: one trial's ``fit`` in a process of its own, whose output goes to
    ``runs/sweeps/<name>/trial_<n>/output.log``."""

    said = None

    def objective(trial: optuna.Trial) -> float:
        nonlocal said
        values = suggest(trial, sweep.space)
        trial.set_user_attr("worker", this_worker())
        folder = sweep.folder / f"trial_{trial.number}"
        folder.mkdir(parents=True, exist_ok=True)
        report_to = {
            "storage": storage_url,
            "study": sweep.name,
            "trial": trial.number,
            "metric": sweep.metric,
            "pruner": sweep.pruner,
        }
        env = {**os.environ, TRIAL_ENV: json.dumps(report_to)}
        threads = trial_threads(sweep)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads[0])
            trial.set_user_attr("threads", threads[0])  # which its repeat needs: sums differ by threads
            if threads != said:
                print(
                    f"Trials here use {threads[0]} CPU thread(s) each: {threads[1]} worker(s) of this sweep "
                    f"share this machine's {cpu_cores()} cores (OMP_NUM_THREADS sets it instead).",
                    flush=True,
                )
                said = threads
        log = folder / "output.log"
        log.write_text("")
        process = preloaded.start(trial_args(sweep, values, trial.number), Path.cwd(), env, log)
        try:
            code = process.wait()
        except BaseException:  # an interrupted worker takes its trial with it
            process.send_signal(signal.SIGKILL)
            raise
        recorded = fresh(trial.study, trial.number).user_attrs
        run_dir = Path(recorded.get("run_dir", folder))
        if code == 2:  # the CLI refused the command: every trial would fail alike
            raise SweepConfigError(
                f"trial {trial.number}: the CLI refused its command ({log}):\n{tail(log, 10)}"
            )
        rows = read_metrics(run_dir)
        for key, value in last_values(rows, prefix="test/").items():
            trial.set_user_attr(key, value)
        value = best_value(rows, sweep.metric, sweep.direction)
        if code != 0 or value is None:
            error = f"exit status {code}: {tail(log, 1)}" if code else f"its run logged no {sweep.metric}"
            trial.set_user_attr("error", f"{error} (output: {log})")
            raise TrialFailed(error)
        if "pruned_at_step" in recorded:
            raise optuna.TrialPruned(f"at step {recorded['pruned_at_step']}")
        return value

    return objective


def last_values(rows: list[dict[str, str]], prefix: str) -> dict[str, float]:
    """The last logged value of each metric whose name starts with ``prefix``."""
    found = {}
    for row in rows:
        found.update({k: float(v) for k, v in row.items() if k.startswith(prefix) and v not in (None, "")})
    return found


def tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` of a trial's output, as the sweep shows and records them: masked, since a
    trial may print its study's storage URL."""
    text = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return masked("\n".join(text[-lines:])) or "(no output)"


def describe(trial: FrozenTrial, metric: str) -> str:
    """One line for a finished trial."""
    seconds = f" in {trial.duration.total_seconds():.0f} s" if trial.duration else ""
    values = ", ".join(
        f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
        for k, v in trial.params.items()
    )
    if trial.state == TrialState.COMPLETE:
        outcome = f"{metric} {trial.value:.4f}"
    elif trial.state == TrialState.PRUNED:
        outcome = f"pruned at step {trial.user_attrs.get('pruned_at_step', '?')}"
    else:
        outcome = "failed"
    return f"trial {trial.number}: {outcome}{seconds} ({values})"


def run_worker(sweep: Sweep, storage_url: str, n_trials: int) -> optuna.Study:
    """Run trials until ``n_trials`` of the study have finished (complete or pruned) or are running
    in other workers; registered in ``workers/`` meanwhile, so that the workers here share the cores."""
    storage = storage_for(storage_url)
    study = open_study(sweep, storage)  # a storage refused leaves no folder behind
    registration = register_worker(sweep)
    try:
        return run_trials(sweep, storage_url, storage, study, n_trials)
    finally:
        registration.unlink(missing_ok=True)


def run_trials(
    sweep: Sweep, storage_url: str, storage: optuna.storages.RDBStorage, study: optuna.Study, n_trials: int
) -> optuna.Study:
    objective = objective_for(sweep, storage_url)
    failures = 0

    def announce(study: optuna.Study, trial: FrozenTrial) -> None:
        nonlocal failures
        failures = failures + 1 if trial.state == TrialState.FAIL else 0
        reason = f": {trial.user_attrs['error']}" if "error" in trial.user_attrs else ""
        print(masked(describe(trial, sweep.metric) + reason), flush=True)

    while True:
        fail_dead_trials(study, storage)
        states = Counter(t.state for t in study.get_trials(deepcopy=False))
        if sum(states[s] for s in FINISHED) + states[TrialState.RUNNING] >= n_trials:
            break
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SystemExit(
                f"error: {failures} trials in a row failed; see their output.log under {sweep.folder}/. "
                "Start the same command again once fixed: the study continues."
            )
        study.optimize(objective, n_trials=1, catch=(TrialFailed,), callbacks=[announce])
    return study
