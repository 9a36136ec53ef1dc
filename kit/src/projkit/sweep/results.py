"""What a finished sweep leaves: the best trial printed, ``trials.csv`` and the plots."""

from __future__ import annotations

import csv
import functools
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from projkit.context import current
from projkit.credentials import masked
from projkit.sweep.config import Sweep
from projkit.sweep.trials import FINISHED
from projkit.sweep.workers import local_pid, process_alive, this_worker


def writes_results(study: optuna.Study) -> bool:
    """Whether this worker writes the results: the one that finished the study's last trial, once no
    trial runs (workers started together would each write their own partial or repeated copy), or any
    worker when that one is gone from this machine (the same command started again on a done study)."""
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in FINISHED]
    if any(t.state == TrialState.RUNNING for t in trials):
        return False
    if not finished:
        return True
    worker = str(max(finished, key=lambda t: t.datetime_complete).user_attrs.get("worker", ""))
    pid = local_pid(worker)
    return worker == this_worker() or (pid is not None and not process_alive(pid))


def write_results(study: optuna.Study, sweep: Sweep, started: float) -> None:
    """Print the best trial and how to repeat it; write ``trials.csv``, ``history.png`` and
    ``importance.png`` into the sweep's folder."""
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state for t in trials)
    folder = sweep.folder
    folder.mkdir(parents=True, exist_ok=True)
    write_table(trials, folder / "trials.csv")
    written = ["trials.csv", *write_plots(study, folder)]
    print(
        f"\nSweep '{sweep.name}': {states[TrialState.COMPLETE]} complete, "
        f"{states[TrialState.PRUNED]} pruned, {states[TrialState.FAIL]} failed, "
        f"{states[TrialState.RUNNING]} still running "
        f"({time.monotonic() - started:.0f} s in this worker)"
    )
    if states[TrialState.COMPLETE]:
        best = study.best_trial
        run_dir = best.user_attrs.get("run_dir", "?")
        tests = ", ".join(f"{k} {v:.4f}" for k, v in best.user_attrs.items() if k.startswith("test/"))
        print(f"Best trial {best.number}: {sweep.metric} {best.value:.4f}" + (f" ({tests})" if tests else ""))
        for key, value in best.params.items():
            print(f"  {key} = {value}")
        print(f"  run directory: {run_dir}")
        threads = f"OMP_NUM_THREADS={best.user_attrs['threads']} " if "threads" in best.user_attrs else ""
        print(f"  repeat it:     {threads}{current().command} fit --config {run_dir}/config.yaml")
    print(f"Written into {folder}/: {', '.join(written)}")


def write_table(trials: Sequence[FrozenTrial], path: Path) -> None:
    """One row per trial: state, value, duration, its values, what it recorded (test metrics, run
    directory, the step it was pruned at)."""
    params = sorted({k for t in trials for k in t.params})
    attrs = sorted({k for t in trials for k in t.user_attrs})
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["number", "state", "value", "duration_s", *params, *attrs])
        for t in trials:
            duration = f"{t.duration.total_seconds():.1f}" if t.duration else ""
            row = [t.number, t.state.name, "" if t.value is None else t.value, duration]
            row += [t.params.get(k, "") for k in params] + [t.user_attrs.get(k, "") for k in attrs]
            writer.writerow([masked(cell) if isinstance(cell, str) else cell for cell in row])


def write_plots(study: optuna.Study, folder: Path) -> list[str]:
    """Optuna's optimisation history and parameter importances as PNG files (importances need two
    complete trials). The importances are PED-ANOVA's, which needs only NumPy: Optuna's default,
    fANOVA, needs scikit-learn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import matplotlib as plots

    written = []
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    importances = functools.partial(plots.plot_param_importances, evaluator=PedAnovaImportanceEvaluator())
    for name, plot, needs in (
        ("history.png", plots.plot_optimization_history, 1),
        ("importance.png", importances, 2),
    ):
        if len(complete) < needs:
            continue
        try:
            axes = plot(study)
        except (RuntimeError, ValueError) as error:  # e.g. no variance: every complete trial alike
            print(f"{name} not drawn: {error}")
            continue
        axes.figure.savefig(folder / name, dpi=120, bbox_inches="tight")
        plt.close(axes.figure)
        written.append(name)
    return written
