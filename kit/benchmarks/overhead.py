"""Steady-state training speed of the project's ``fit`` (``python -m <package> fit``, shown as ``<package>
fit`` for the template's package) against a plain PyTorch loop doing the same work.

For each experiment (by default the checkout's ``configs/digits.yaml``: the CNN on the 8×8 digits;
``configs/shakespeare_char_cpu.yaml``: the GPT on Tiny Shakespeare; ``--experiment`` takes another
name or a config's path) both sides train the network the CLI builds from the config as shipped, on
the batches of the same data module (its training loader and its ``on_after_batch_transfer``
device-side transforms, augmentation included), with the same batch size, AdamW and parameter
groups, learning-rate schedule, gradient clipping, precision, device and threads. The CLI side is
the real ``fit`` subcommand with the config as shipped (its logging, checkpoints, callbacks and
progress bar), changed only in ``max_steps``, where the run writes (a temporary folder) and
``test_after_fit`` (testing comes after the timed steps anyway). The plain side is the loop a user
would write by hand: zero_grad, forward, loss, backward, clip, step, scheduler.

A step's time runs from one ``on_train_batch_start`` (or loop iteration) to the next, so it counts
data loading, logging, the checkpoint written every 100 steps and everything else
between steps. Validation is not training and the plain loop does none, so the steps in which the
CLI validated (for the digits, the last of each epoch: validation, then the best and ``last.ckpt``
checkpoints it triggers) are left out on both sides and their times printed on a line of their
own. The first ``--warmup`` steps are left out too. Each side runs ``--rounds`` times, alternating;
for every step index the fastest round counts, which filters out other processes' bursts on a
shared machine while keeping periodic costs (logging every ``log_every_n_steps``, a checkpoint
every 100 steps) that every round pays at the same steps.

With ``--per-callback`` (all of them by default), one more side per standard callback (a key of
``configs/defaults.yaml``: ``throughput``, ``preemption``...) runs the same ``fit`` with that one
switched off (``--key=null``), and a table gives what each costs a step: the step's time with all
of them minus without that one.

The ratio is (CLI steps/s) / (plain steps/s), one per experiment; the last line is the lowest,
which should be at least 0.97 on a CPU. A third side, a bare Trainer (the same ``fit`` with no
logger, checkpoints, progress bar or configured callbacks), shows how much of the difference is
Lightning's own loop (its hooks and closure) rather than what the template adds to it::

    python kit/benchmarks/overhead.py

On a machine busy with other work, ``--threads 1 --clock cpu`` times each step by the CPU time of
the one thread doing all the work (``time.thread_time``), which other processes do not inflate (it
leaves out time spent waiting for the disk, such as a checkpoint's fsync).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from common import (
    CLOCKS,
    PlainStep,
    build,
    cli,
    cli_args,
    device_batches,
    experiment_config,
    label,
    parse,
    parser,
    print_lowest,
    project_for,
)
from projkit.cli import STANDARD_CALLBACKS

EXPERIMENTS = ("digits", "shakespeare_char_cpu")
clock = CLOCKS["wall"]


class StepTimer(Callback):
    """The clock at the start of every training step, and which steps ran a validation."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.validated: list[int] = []

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        self.starts.append(clock())

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.validated.append(len(self.starts) - 1)


def step_times(starts: list[float], warmup: int) -> torch.Tensor:
    return torch.tensor(starts[warmup:], dtype=torch.float64).diff()


BARE_TRAINER = (
    "--trainer.callbacks=[]",
    *(f"--{key}=null" for key in STANDARD_CALLBACKS),  # the callbacks every experiment gets
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
)


def lightning_run(
    experiment: str, corpus: str | None, steps: int, warmup: int, bare: bool = False, without: str = ""
) -> tuple[torch.Tensor, list[int]]:
    # The progress bar is drawn (and costs what it costs) on stderr, leaving stdout to the results.
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(sys.stderr):
        where = [f"--trainer.default_root_dir={folder}"]
        where += list(BARE_TRAINER) if bare else [f"--trainer.logger.init_args.save_dir={folder}"]
        where += [f"--{without}=null"] if without else []
        ran = cli(
            [
                "fit",
                *cli_args(experiment, corpus),
                f"--trainer.max_steps={steps}",
                *where,
                f"--trainer.callbacks+={__name__}.StepTimer",
                "--test_after_fit=false",
            ]
        )
    timer = next(cb for cb in ran.trainer.callbacks if isinstance(cb, StepTimer))
    times = step_times(timer.starts, warmup)
    return times, [i - warmup for i in timer.validated if 0 <= i - warmup < len(times)]


def plain_run(experiment: str, corpus: str | None, steps: int, warmup: int) -> tuple[torch.Tensor, list[int]]:
    built = build(cli_args(experiment, corpus))
    # The Trainer estimates the schedule's length from max_steps, which the CLI side sets to steps.
    step = PlainStep(built.model, built.trainer, total_steps=steps)
    batches = device_batches(built.datamodule, built.datamodule.train_dataloader(), step.device)
    starts = []
    for i, (x, y) in enumerate(batches):
        starts.append(clock())
        if i == steps - 1:  # as on the CLI side, the last step starts the clock and is not timed
            break
        step(x, y)
    return step_times(starts, warmup), []


def benchmark(experiment: str, args: argparse.Namespace) -> float:
    fit = f"{project_for(experiment_config(experiment)).package} fit"  # "<package> fit"
    sides = {
        "plain loop": plain_run,
        fit: lightning_run,
        "bare Trainer": functools.partial(lightning_run, bare=True),
    }
    for key in args.per_callback:
        sides[f"without {key}"] = functools.partial(lightning_run, without=key)
    runs: dict[str, list[torch.Tensor]] = {name: [] for name in sides}
    validated: set[int] = set()
    for _ in range(args.rounds):
        for name, run in sides.items():
            times, steps_with_validation = run(experiment, args.corpus, args.steps, args.warmup)
            runs[name].append(times)
            validated.update(steps_with_validation)
    kept = torch.ones(args.steps - args.warmup - 1, dtype=torch.bool)
    kept[sorted(validated)] = False
    print(f"{label(experiment)}: steps {args.warmup}..{args.steps}, {args.rounds} rounds")
    rates, left_out = {}, {}
    for name, rounds in runs.items():
        fastest = torch.stack(rounds).min(dim=0).values
        rates[name] = kept.sum().item() / fastest[kept].sum().item()
        left_out[name] = fastest[~kept].mean().item() if validated else 0.0
        if not name.startswith("without "):
            per_round = " ".join(f"{kept.sum().item() / t[kept].sum().item():.2f}" for t in rounds)
            print(f"  {name:12} steps/s {rates[name]:.2f} (rounds: {per_round})")
    print_callback_costs(rates, fit, args.per_callback)
    if validated:
        fit_ms, loop_ms = 1000 * left_out[fit], 1000 * left_out["plain loop"]
        print(
            f"  left out: the {len(validated)} steps in which {fit} validated "
            f"(with the checkpoints validation triggers), {fit_ms:.0f} ms each against "
            f"{loop_ms:.0f} ms for the same steps of the plain loop"
        )
    floor = rates["bare Trainer"] / rates["plain loop"]
    added = rates[fit] / rates["bare Trainer"]
    print(f"  bare Trainer / plain loop {floor:.3f}; {fit} / bare Trainer {added:.3f}")
    ratio = rates[fit] / rates["plain loop"]
    print(f"  {label(experiment)} ratio {ratio:.3f}")
    return ratio


def print_callback_costs(rates: dict[str, float], fit: str, keys: list[str]) -> None:
    """What each standard callback costs a step of ``fit``: its time per step with all of them
    minus without that one (negative: within the noise, or it saves work elsewhere)."""
    if not keys:
        return
    step_ms = 1000 / rates[fit]
    print(f"  per callback, {fit} at {step_ms:.3f} ms a step; cost = that minus the step without it:")
    for key in keys:
        cost = step_ms - 1000 / rates[f"without {key}"]
        print(f"    {key:20} {cost:+8.3f} ms a step ({cost / step_ms:+6.1%})")


def callback_keys(value: str) -> list[str]:
    keys = [] if value == "none" else list(STANDARD_CALLBACKS) if value == "all" else value.split(",")
    unknown = sorted(set(keys) - set(STANDARD_CALLBACKS))
    if unknown:
        raise argparse.ArgumentTypeError(f"not a standard callback: {', '.join(unknown)}")
    return keys


def main_benchmark(argv: list[str] | None = None) -> None:
    options = parser(__doc__, EXPERIMENTS)
    options.add_argument("--steps", type=int, default=240, help="steps per run (the LM validates at 250)")
    options.add_argument("--warmup", type=int, default=20, help="first steps left out of the timing")
    options.add_argument("--rounds", type=int, default=3)
    options.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    options.add_argument(
        "--per-callback", type=callback_keys, default="all", metavar="KEYS",
        help="the standard callbacks (config keys, comma-separated; all, none) each switched off in "
        "a run of its own, to print what each costs a step",
    )  # fmt: skip
    args = parse(options, argv)
    if args.warmup + 2 > args.steps:
        options.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}) by at least 2")
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        options.error("--clock cpu counts one thread's CPU time: pass --threads 1")
    global clock
    clock = CLOCKS[args.clock]
    print(f"threads {torch.get_num_threads()}, {args.clock} clock")
    print_lowest(EXPERIMENTS, args, benchmark, decimals=3)


if __name__ == "__main__":
    main_benchmark()
