"""A sweep trial as a new interpreter (``python -m <package> fit``) against
the same trial forked from the server that has imported torch, Lightning and the CLI
(``projkit.preloaded``, what ``python -m <package> sweep`` does).

Each round runs the experiment (``--experiment``: the checkout's ``configs/digits.yaml`` by default,
or another name or a config's path) for ``--epochs`` both ways, the one that goes first
alternating, one thread each (as a sweep gives its trials on a shared machine). The two must end
with the same weights, or the comparison stops: a forked trial is the same run. The server's own
start, paid once per sweep worker, is timed apart. Medians over the rounds are printed, with the
ratio new / forked (above 1: forking is that much faster)::

    python kit/benchmarks/trial_start.py                   # 2 epochs, 3 rounds
    python kit/benchmarks/trial_start.py --epochs 10 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from common import experiment_config, label, project_for, trial_args
from projkit import preloaded


def trial(experiment: str, how: str, epochs: int, folder: Path) -> tuple[float, dict[str, torch.Tensor]]:
    """Seconds from the start of a trial of ``experiment`` to its exit, started ``how`` (``new`` or
    ``forked``), and the weights it ended with."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = trial_args(experiment, epochs, folder)
    package = project_for(experiment_config(experiment)).package
    folder.mkdir(parents=True)
    log = folder / "output.log"
    start = time.perf_counter()
    if how == "new":
        with open(log, "w") as out:
            code = subprocess.run(
                [sys.executable, "-m", package, *args], env=env, stdout=out, stderr=out
            ).returncode
    else:
        code = preloaded.start(args, Path.cwd(), env, log).wait()
    seconds = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"the {how} trial failed ({code}):\n{log.read_text()[-3000:]}")
    last = torch.load(
        folder / label(experiment) / "version_0" / "checkpoints" / "last.ckpt", weights_only=True
    )
    return seconds, last["state_dict"]


def server_start(folder: Path) -> float:
    """Seconds until a forked ``python -m <package> --help`` has exited, the server's start included
    when it is not running yet."""
    start = time.perf_counter()
    code = preloaded.start(["--help"], Path.cwd(), dict(os.environ), folder / "help.log").wait()
    if code != 0:
        raise RuntimeError(f"--help failed ({code}): {(folder / 'help.log').read_text()[-3000:]}")
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Runs the rounds and prints them; the seconds of each way's rounds, in order."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--experiment", default="digits", help="NAME for the checkout's configs/NAME.yaml, or a config's path"
    )
    parser.add_argument("--epochs", type=int, default=2, help="each trial's epochs of the experiment")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    project_for(experiment_config(args.experiment))  # the project whose trials the server forks
    times: dict[str, list[float]] = {"new": [], "forked": []}
    with tempfile.TemporaryDirectory() as runs:
        print(
            f"server started and answered --help in {server_start(Path(runs)):.1f} s (once per sweep worker)"
        )
        for round_ in range(args.rounds):
            order = ("new", "forked") if round_ % 2 == 0 else ("forked", "new")
            weights = {}
            for how in order:
                seconds, weights[how] = trial(
                    args.experiment, how, args.epochs, Path(runs) / f"{how}{round_}"
                )
                times[how].append(seconds)
            if weights["new"].keys() != weights["forked"].keys() or not all(
                torch.equal(weights["new"][k], weights["forked"][k]) for k in weights["new"]
            ):
                raise RuntimeError("the forked trial ended with other weights than the new interpreter's")
            print(
                f"round {round_ + 1} ({order[0]} first): new {times['new'][-1]:.1f} s, "
                f"forked {times['forked'][-1]:.1f} s, the same weights"
            )
    new, forked = statistics.median(times["new"]), statistics.median(times["forked"])
    print(f"median: new {new:.1f} s, forked {forked:.1f} s")
    print(f"ratio {new / forked:.2f} (new / forked)")
    return times


if __name__ == "__main__":
    main()
