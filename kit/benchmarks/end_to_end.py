"""Time to result: the whole ``python -m <package> fit`` command, from
process start to its final test metric, against a plain PyTorch script doing the same work
(``plain_fit.py``).

For each experiment (the checkout's ``configs/shakespeare_char_cpu.yaml``, the GPT, and
``configs/digits.yaml``, the CNN, by default; ``--experiment`` another name or a config's path)
both sides run as fresh processes, alternating, ``--rounds`` times each, and each run is timed from
just before its process starts until it exits. The project's side is the real command with the
shipped config, changed only in where it writes (a temporary folder), where the text is
(``--corpus``) and one callback, ``PhaseTimer``, which records where the time went. The plain side
builds the same network and data module from the same config through the project's CLI, trains
them with the same recipe (batches, AdamW parameter groups, warmup+cosine schedule, clipping, steps,
evaluation cadence and batches, early stopping, the samples a language model draws after each
validation, the best checkpoint on improvement and the last at the end), then tests the best weights
on the same test split. Each run reports the steps it trained, and the comparison stops if the sides
differ. Medians over the rounds are printed, with the ratio plain / project (1.0: the project's ``fit``
costs nothing around the training; at least 1.0 for the GPT, whose CPU step takes torch's fused AdamW
where the plain script, as nanoGPT, takes torch's default). Since both sides import Lightning and
build the objects through the CLI's parser, the start-up phase's difference is what ``fit`` adds to
building them (the Trainer's set-up, the run directory, the callbacks); what the command costs
before that is the start-up measure below::

    python kit/benchmarks/end_to_end.py                        # both experiments, 3 rounds
    python kit/benchmarks/end_to_end.py --threads 1 --clock cpu --rounds 2   # on a busy machine

Where the project's extra time went is measured on both sides in every run, each moment counted once, in
the innermost phase open: start-up (process start to the first training step, imports and
building included), the sanity check, training steps (everything between the steps, logging and
the progress bar included), validation, sampling (the text written after each validation),
checkpointing (``trainer.save_checkpoint``: assembling the state, writing, syncing), test (after
training: loading the best checkpoint and testing it) and exit (after the test metric until the
process ends). ``PhaseTimer`` costs a few hook calls per step, microseconds against a CPU step of
milliseconds.

Start-up is measured on its own too, as a ratio against ``import lightning.pytorch``, which every
command pays: ``python -m <package> --help`` and ``python -m <package> fit --config ...
--print_config`` (bar: at most 1.5), the first experiment's config.

``--clock cpu`` times each run by its process's CPU time (``getrusage`` of the child; with
``--threads 1`` one thread does the work), which other processes on a shared machine do not
inflate; it leaves out time spent waiting for the disk, such as an fsync.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from common import chosen, cli_args, experiment_config, label, parser, project_for
from plain_fit import Phases

BENCHMARKS = Path(__file__).resolve().parent
EXPERIMENTS = ("shakespeare_char_cpu", "digits")
PHASES = (
    "start-up",
    "sanity check",
    "training steps",
    "validation",
    "sampling",
    "checkpointing",
    "test",
    "exit",
)


class PhaseTimer(Callback):
    """Records, in the project's ``fit`` process, the seconds of each phase (``plain_fit.Phases``) and
    writes them to ``phases.json`` in the folder ``BENCH_OUT`` names when the test metric is logged."""

    def __init__(self) -> None:
        self.phases = Phases()
        self.training = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        # Checkpoints are written from several callbacks and hooks: time them where they all pass.
        trainer.save_checkpoint = self.timed("checkpointing", trainer.save_checkpoint)
        if hasattr(pl_module, "log_samples"):
            pl_module.log_samples = self.timed("sampling", pl_module.log_samples)

    def timed(self, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.phases(phase):
                return method(*args, **kwargs)

        return wrapper

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.phases.enter("sanity check")

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.phases.leave()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if not self.training:
            self.training = True
            self.phases.base("training steps")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.phases.enter("validation")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.phases.leave()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.phases.base("test")

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.phases.write(Path(os.environ["BENCH_OUT"]) / "phases.json", trainer.global_step)


def run(command: Sequence[str], folder: Path, env: dict[str, str], clock: str) -> dict[str, float]:
    """Run ``command`` in ``folder``; its seconds (wall or CPU) and the phases it recorded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    env = {**env, "BENCH_T0": repr(start), "BENCH_OUT": str(folder), "BENCH_CLOCK": clock}
    with open(folder / "output.log", "w") as log:
        done = subprocess.run(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = (folder / "output.log").read_text()[-3000:]
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    total = cpu if clock == "cpu" else wall
    phases_file = folder / "phases.json"
    if not phases_file.exists():
        return {"total": total}
    phases = json.loads(phases_file.read_text())
    phases["exit"] = total - phases.pop("metric_at")
    return {**phases, "total": total}


def fit_command(experiment: str, folder: Path, corpus: str | None, steps: int | None) -> list[str]:
    package = project_for(experiment_config(experiment)).package
    command = [sys.executable, "-m", package, "fit", *cli_args(experiment, corpus)]
    command += [f"--trainer.logger.init_args.save_dir={folder}", f"--trainer.default_root_dir={folder}"]
    command += ["--trainer.callbacks+=end_to_end.PhaseTimer"]
    return command + ([f"--trainer.max_steps={steps}"] if steps else [])


def plain_command(experiment: str, folder: Path, corpus: str | None, steps: int | None) -> list[str]:
    command = [sys.executable, str(BENCHMARKS / "plain_fit.py"), f"--experiment={experiment}"]
    command += [f"--out={folder}", *([f"--corpus={corpus}"] if corpus else [])]
    return command + ([f"--steps={steps}"] if steps else [])


def environment(threads: int | None) -> dict[str, str]:
    """The children's environment: ``end_to_end.PhaseTimer`` importable, and the threads fixed."""
    path = os.pathsep.join(p for p in (str(BENCHMARKS), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def startup(experiment: str, args: argparse.Namespace, env: dict[str, str]) -> None:
    """Start-up of two commands that train nothing, against importing Lightning alone."""
    package = project_for(experiment_config(experiment)).package
    fit = [sys.executable, "-m", package, "fit", *cli_args(experiment)]
    commands = {
        "import lightning.pytorch": [sys.executable, "-c", "import lightning.pytorch"],
        f"python -m {package} --help": [sys.executable, "-m", package, "--help"],
        f"python -m {package} fit --config ... --print_config": [*fit, "--print_config"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.startup_rounds):
            for name, command in commands.items():
                times[name].append(run(command, Path(folder), env, args.clock)["total"])
    base = statistics.median(times["import lightning.pytorch"])
    print(f"start-up, median of {args.startup_rounds} ({args.clock} s):")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {name:48} {median:6.2f}  {median / base:.2f}x import lightning.pytorch")


def benchmark(experiment: str, args: argparse.Namespace, env: dict[str, str]) -> float:
    fit = f"{project_for(experiment_config(experiment)).package} fit"  # "<package> fit"
    sides = {"plain script": plain_command, fit: fit_command}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, command in sides.items():
            with tempfile.TemporaryDirectory() as folder:
                argv = command(experiment, Path(folder), args.corpus, args.steps)
                results[name].append(run(argv, Path(folder), env, args.clock))
    trained = {name: {r["steps"] for r in runs} for name, runs in results.items()}
    if len(set.union(*trained.values())) != 1:
        raise RuntimeError(
            f"{label(experiment)}: the sides trained different steps, not the same work: {trained}"
        )
    (steps,) = trained[fit]
    asked = f"{args.steps} steps asked" if args.steps else "steps as configured"
    print(f"{label(experiment)}: {asked}, {steps} trained by each side in each round, {args.rounds} rounds "
          f"alternating, medians ({args.clock} s)")  # fmt: skip
    medians = {}
    for name, runs in results.items():
        medians[name] = {p: statistics.median(r.get(p, 0.0) for r in runs) for p in (*PHASES, "total")}
        rounds = " ".join(f"{r['total']:.1f}" for r in runs)
        print(f"  {name:12} {medians[name]['total']:7.2f} (rounds: {rounds})")
    plain, project = medians["plain script"], medians[fit]
    short = fit.removesuffix(" fit")  # the column's and the ratio's name for the project's side
    print(f"  where the time went:  {'plain':>7} {short:>7} {'extra':>7}")
    for phase in PHASES:
        extra = project[phase] - plain[phase]
        print(f"    {phase:18} {plain[phase]:7.2f} {project[phase]:7.2f} {extra:+7.2f}")
    ratio = plain["total"] / project["total"]
    print(f"  {label(experiment)} ratio {ratio:.3f} (plain / {short})")
    return ratio


def main(argv: list[str] | None = None) -> dict[str, float]:
    options = parser(__doc__, EXPERIMENTS)  # --experiment, --corpus, --threads (of both sides here)
    options.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating")
    options.add_argument("--startup-rounds", type=int, default=5, help="0: no start-up measure")
    options.add_argument("--steps", type=int, help="optimizer steps (default: the config's)")
    options.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = options.parse_args(argv)
    # Both sides read the config's own text unless --corpus names another (the children's folders differ).
    args.corpus = str(Path(args.corpus).resolve()) if args.corpus else None
    if args.clock == "cpu" and args.threads != 1:
        options.error("--clock cpu counts the CPU time of one working thread: pass --threads 1")
    env = environment(args.threads)
    print(f"threads {args.threads or 'torch default'}, {args.clock} clock")
    experiments = chosen(EXPERIMENTS, args)
    if args.startup_rounds:
        startup(experiments[0], args, env)
    ratios = {label(name): benchmark(name, args, env) for name in experiments}
    # The bar is the GPT's: the digits' CNN steps are short enough for Lightning's loop to show.
    checked = "shakespeare_char_cpu" if "shakespeare_char_cpu" in ratios else label(experiments[0])
    print(f"ratio {ratios[checked]:.3f} ({checked})")
    return ratios


if __name__ == "__main__":
    main()
