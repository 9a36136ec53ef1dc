"""Sweep workers sharing one machine: their trials with torch's own thread count (a thread per core
each) against the machine's cores split between them, as ``projkit.sweep.trial_threads`` gives them.

Each round starts ``--workers`` trials together, ``python -m <package> fit`` on the experiment
(``--experiment``: the checkout's ``configs/digits.yaml`` by default, or another name or a config's
path) forked from ``projkit.preloaded``'s server as the sweep starts them, and times them until the last
exits; the two settings alternate, ``--rounds`` times each, the one that goes first alternating
too. Every trial must train the same steps (read from its last checkpoint), or the comparison
stops. Medians over the rounds are printed, with the ratio own / split
(above 1: splitting the cores is that much faster)::

    python kit/benchmarks/sweep_workers.py                      # 2 trials at once, 10 epochs, 3 rounds
    python kit/benchmarks/sweep_workers.py --workers 4 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from common import experiment_config, label, project_for, trial_args
from projkit import preloaded
from projkit.sweep import cpu_cores


def trials_at_once(
    experiment: str, workers: int, epochs: int, threads: int | None, folder: Path
) -> tuple[float, set[int]]:
    """Seconds until ``workers`` trials of ``experiment`` started together have all exited, ``threads``
    each (``OMP_NUM_THREADS``), or torch's own choice for None; and the steps the trials trained."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    folder.mkdir(parents=True)
    start = time.perf_counter()
    trials = [
        preloaded.start(
            trial_args(experiment, epochs, folder / str(i)), Path.cwd(), env, folder / f"output_{i}.log"
        )
        for i in range(workers)
    ]
    for i, trial in enumerate(trials):
        if trial.wait() != 0:
            log = (folder / f"output_{i}.log").read_text()
            raise RuntimeError(f"{' '.join(trial.args)} failed ({trial.returncode}):\n{log[-3000:]}")
    seconds = time.perf_counter() - start
    name = label(experiment)
    lasts = [folder / str(i) / name / "version_0" / "checkpoints" / "last.ckpt" for i in range(workers)]
    return seconds, {torch.load(last, weights_only=True)["global_step"] for last in lasts}


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Runs the rounds and prints them; the seconds of each setting's rounds, in order."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--experiment", default="digits", help="NAME for the checkout's configs/NAME.yaml, or a config's path"
    )
    parser.add_argument("--workers", type=int, default=2, help="trials at once, one per worker")
    parser.add_argument("--epochs", type=int, default=10, help="each trial's epochs of the experiment")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    project_for(experiment_config(args.experiment))  # the project whose trials the server forks
    split = max(1, cpu_cores() // args.workers)
    print(f"{args.workers} trials at once on {cpu_cores()} cores: torch's own threads vs {split} each")
    times: dict[str, list[float]] = {"own": [], "split": []}
    trained: set[int] = set()
    preloaded.start_server()  # its start, once per worker, is no round's
    with tempfile.TemporaryDirectory() as runs:
        for round_ in range(args.rounds):
            order = ("own", "split") if round_ % 2 == 0 else ("split", "own")
            for setting in order:
                threads = split if setting == "split" else None
                folder = Path(runs) / f"{setting}{round_}"
                seconds, steps = trials_at_once(args.experiment, args.workers, args.epochs, threads, folder)
                times[setting].append(seconds)
                trained |= steps
                if len(trained) != 1:
                    raise RuntimeError(f"the trials trained different steps, not the same work: {trained}")
            print(
                f"round {round_ + 1} ({order[0]} first): own {times['own'][-1]:.1f} s, "
                f"split {times['split'][-1]:.1f} s"
            )
    own, split_s = statistics.median(times["own"]), statistics.median(times["split"])
    print(f"each trial trained {trained.pop()} steps")
    print(f"median: own {own:.1f} s, split {split_s:.1f} s")
    print(f"ratio {own / split_s:.2f} (own / split)")
    return times


if __name__ == "__main__":
    os.environ.pop("OMP_NUM_THREADS", None)  # the server imports torch with its own thread count
    main()
