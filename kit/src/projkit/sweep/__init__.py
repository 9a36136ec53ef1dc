"""Hyperparameter sweeps with Optuna:
``python -m <package> sweep --config configs/sweeps/<sweep>.yaml``.

A sweep config names the experiment's configs, the search space (the CLI's own dotted keys), the metric
and its direction, the number of trials, the sampler and the pruner. Each trial is an ordinary
``python -m <package> fit`` in a process of its own, with the trial's values as ``--key=value`` flags,
so its saved ``config.yaml`` repeats it alone; the process is forked from one that has imported
torch and Lightning (``projkit.preloaded``), as importing them again took half of a short CPU trial.
The study lives in a real database: SQLite in ``runs/sweeps/<name>/study.db`` unless ``--storage``
names another (PostgreSQL, MySQL), which is how workers on several machines share one study; workers
on one machine share the SQLite file.

Resuming is starting the same command again: a trial left running by a worker that died (its process
gone from this machine, or its heartbeat silent for ``GRACE_PERIOD_S`` on any machine) is marked
failed and retried once with the same values, and workers start trials until ``n_trials`` have
finished (complete or pruned) across all of them.

This module runs the sweep and imports neither torch nor Lightning (its trials' server does): a
worker waits on its trials' processes at little cost. The trial's side, reporting the metric and
obeying the pruner, is ``projkit.callbacks.pruning.OptunaPruning``, which the CLI adds when
``TRIAL_ENV`` is set.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from typing import NoReturn

import optuna

from projkit import preloaded
from projkit.context import current
from projkit.sweep.config import Sweep, SweepConfigError, build_pruner, load_sweep, suggest, trial_args
from projkit.sweep.results import write_results, writes_results
from projkit.sweep.storage import default_storage, from_storage, shown_url, storage_for, storage_refused
from projkit.sweep.trials import run_worker
from projkit.sweep.workers import HOST, cpu_cores, trial_threads, workers_here

# Heartbeats, stale trials and the matplotlib plots are "experimental" in Optuna 4: used as documented.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


DESCRIPTION = (
    "Run an Optuna sweep: each trial is a `fit` with the trial's values as flags. "
    "Start the same command again, here or on other machines (with --storage), to add workers or "
    "to resume."
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The sweep's options, on ``parser``: also the CLI's, whose ``--help`` lists ``sweep``."""
    parser.add_argument(
        "--config", required=True, help="the sweep config, e.g. configs/sweeps/digits_optuna.yaml"
    )
    parser.add_argument(
        "--storage",
        help="the study's database URL (default: SQLite in runs/sweeps/<name>/study.db); "
        "e.g. postgresql://user@host/db for workers on several machines",
    )
    parser.add_argument("--n_trials", type=int, help="trials to finish, overriding the config's n_trials")
    return parser


def main(argv: Sequence[str] | None = None) -> optuna.Study:
    """``python -m <package> sweep --config SWEEP.yaml [--storage URL] [--n_trials N]``."""
    parser = argparse.ArgumentParser(prog=f"{current().command} sweep", description=DESCRIPTION)
    parser = add_arguments(parser)
    args = parser.parse_args(argv)
    storage_url = args.storage
    try:
        sweep = load_sweep(args.config)
        if args.n_trials is not None and args.n_trials < 1:
            raise SweepConfigError(f"--n_trials {args.n_trials}: give a positive number of trials")
        preloaded.start_server()
        if args.storage is None:
            sweep.folder.mkdir(parents=True, exist_ok=True)
        storage_url = args.storage or default_storage(sweep)
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # this module prints one line per trial
        started = time.monotonic()
        shown = shown_url(storage_url)
        print(f"Sweep '{sweep.name}': study in {shown}, trials under {sweep.folder}/", flush=True)
        study = run_worker(sweep, storage_url, args.n_trials or sweep.n_trials)
        finish(study, sweep, started)
    except SweepConfigError as error:
        refuse(error)
    except KeyboardInterrupt:
        print("Interrupted: the running trial is marked failed. Start the same command again to continue.")
        raise SystemExit(130) from None
    except Exception as error:
        # Every error of the study's database, whichever call met it, ends here in one line.
        if storage_url is None or not from_storage(error):
            raise
        refuse(storage_refused(storage_url, error))
    return study


def refuse(error: SweepConfigError) -> NoReturn:
    print(f"error: {error}", file=sys.stderr)
    raise SystemExit(2) from None


def finish(study: optuna.Study, sweep: Sweep, started: float) -> None:
    """The results, written by the worker that finished the sweep's last trial."""
    if writes_results(study):
        write_results(study, sweep, started)
    else:
        print(
            f"Sweep '{sweep.name}': this worker is done ({time.monotonic() - started:.0f} s); the worker "
            "that finishes the last trial writes trials.csv and the plots."
        )


__all__ = [
    "DESCRIPTION",
    "HOST",
    "SweepConfigError",
    "add_arguments",
    "build_pruner",
    "cpu_cores",
    "load_sweep",
    "main",
    "storage_for",
    "suggest",
    "trial_args",
    "trial_threads",
    "workers_here",
]
