"""Steady-state training speed of ``proj fit`` against a plain PyTorch loop doing the same work.

For each experiment (``configs/digits.yaml``: the CNN on the 8×8 digits; ``configs/
shakespeare_char_cpu.yaml``: the GPT on Tiny Shakespeare) both sides train the network the CLI
builds from the shipped config, on the batches of the same data module (its training loader and its
``on_after_batch_transfer`` device-side transforms, augmentation included), with the same batch
size, AdamW and parameter groups, learning-rate schedule, gradient clipping, precision, device and
threads. The CLI side is the real ``fit`` subcommand with the config as shipped (its logging,
checkpoints, callbacks and progress bar), changed only in ``max_steps``, where the run writes (a
temporary folder) and ``test_after_fit`` (testing comes after the timed steps anyway). The plain
side is the loop a user would write by hand: zero_grad, forward, loss, backward, clip, step,
scheduler.

A step's time runs from one ``on_train_batch_start`` (or loop iteration) to the next, so it counts
data loading, logging, checkpoints written every N steps, epoch boundaries and everything else
between steps. Validation is not training and the plain loop does none: the validation loop and
the checkpoints it triggers (best and ``last.ckpt``) are left out of the CLI's steps, and their
time is printed on its own line. The first ``--warmup`` steps are left out too. Each side runs
``--rounds`` times, alternating; for every step index the fastest round counts, which filters out
other processes' bursts on a shared machine while keeping periodic costs (logging every
``log_every_n_steps``, a checkpoint every 100 steps) that every round pays at the same steps.

The ratio is (CLI steps/s) / (plain steps/s), one per experiment; the last line is the lowest,
which should be at least 0.97 on a CPU::

    python benchmarks/overhead.py --corpus ../shared/data/tinyshakespeare/input.txt

On a machine busy with other work, ``--threads 1 --clock cpu`` times each step by the CPU time of
the one thread doing all the work (``time.thread_time``), which other processes do not inflate (it
leaves out time spent waiting for the disk, such as a checkpoint's fsync).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.nn import functional as F

from proj.cli import ProjCLI, main
from proj.models import ImageClassifier, LanguageModel
from proj.optim import WarmupCosineLR, param_groups

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = {
    "digits": ROOT / "configs" / "digits.yaml",
    "shakespeare_char_cpu": ROOT / "configs" / "shakespeare_char_cpu.yaml",
}
DEFAULT_CORPUS = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]


class StepTimer(Callback):
    """The clock at the start of every training step, less the time spent validating so far.

    Lightning calls ``ModelCheckpoint`` last among the callbacks, so validation's end is taken in
    the module's own ``on_validation_end``, which runs after every callback's: the checkpoints a
    validation triggers are counted with it.
    """

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.validations: list[float] = []
        self._excluded = 0.0
        self._validation_start: float | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        hook = pl_module.on_validation_end

        def on_validation_end() -> None:
            hook()
            self._end_validation(trainer)

        pl_module.on_validation_end = on_validation_end

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        self.starts.append(clock() - self._excluded)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._validation_start = clock()

    def _end_validation(self, trainer: Trainer) -> None:
        took = clock() - self._validation_start
        self._excluded += took
        if not trainer.sanity_checking:
            self.validations.append(took)


def step_times(starts: list[float], warmup: int) -> torch.Tensor:
    return torch.tensor(starts[warmup:], dtype=torch.float64).diff()


def cli_args(experiment: str, corpus: str) -> list[str]:
    args = ["--config", str(EXPERIMENTS[experiment])]
    if experiment.startswith("shakespeare"):
        args.append(f"--data.init_args.path={corpus}")
    return args


def lightning_run(experiment: str, corpus: str, steps: int, warmup: int) -> tuple[torch.Tensor, list[float]]:
    # The progress bar is drawn (and costs what it costs) on stderr, leaving stdout to the results.
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(sys.stderr):
        cli = main(
            [
                "fit",
                *cli_args(experiment, corpus),
                f"--trainer.max_steps={steps}",
                f"--trainer.default_root_dir={folder}",
                f"--trainer.logger.init_args.save_dir={folder}",
                f"--trainer.callbacks+={__name__}.StepTimer",
                "--test_after_fit=false",
            ]
        )
    timer = next(cb for cb in cli.trainer.callbacks if isinstance(cb, StepTimer))
    return step_times(timer.starts, warmup), timer.validations


def plain_loss(model: LightningModule) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if isinstance(model, LanguageModel):
        return lambda logits, y: F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
    if isinstance(model, ImageClassifier):
        smoothing = model.hparams.label_smoothing
        return lambda logits, y: F.cross_entropy(logits, y, label_smoothing=smoothing)
    raise TypeError(f"no plain loss for {type(model).__name__}")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "32-true":
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"trainer.precision={precision}: the plain loop knows 32-true and bf16-mixed only")


def plain_run(experiment: str, corpus: str, steps: int, warmup: int) -> tuple[torch.Tensor, list[float]]:
    cli: ProjCLI = main(cli_args(experiment, corpus), run=False)
    seed_everything(cli.config.seed_everything)
    trainer, datamodule, net = cli.trainer, cli.datamodule, cli.model.net
    device = trainer.strategy.root_device
    # The data module's device-side transforms augment only while a trainer is training.
    datamodule.trainer = trainer
    trainer.training = True
    datamodule.prepare_data()
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    net.to(device).train()
    loss_fn = plain_loss(cli.model)
    optimizer = cli.model.optimizer(param_groups(net))
    scheduler = cli.model.scheduler(optimizer)
    if isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps is None:
        scheduler.total_steps = steps  # as the Trainer estimates it under max_steps
    clip = trainer.gradient_clip_val
    precision = autocast(trainer.precision, device)

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for epoch in itertools.count():
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                batch = [t.to(device, non_blocking=True) for t in batch]
                yield datamodule.on_after_batch_transfer(batch, 0)

    starts = []
    for step, (x, y) in enumerate(batches()):
        starts.append(clock())
        if step == steps:
            break
        optimizer.zero_grad(set_to_none=True)
        with precision:
            loss = loss_fn(net(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        optimizer.step()
        scheduler.step()
    return step_times(starts, warmup), []


def benchmark(experiment: str, args: argparse.Namespace) -> float:
    runs: dict[str, list[torch.Tensor]] = {"plain loop": [], "proj fit": []}
    validations: list[float] = []
    for _ in range(args.rounds):
        for name, run in (("plain loop", plain_run), ("proj fit", lightning_run)):
            times, validated = run(experiment, args.corpus, args.steps, args.warmup)
            runs[name].append(times)
            validations += validated
    print(f"{experiment}: steps {args.warmup}..{args.steps}, {args.rounds} rounds")
    rates = {}
    for name, rounds in runs.items():
        per_round = " ".join(f"{len(t) / t.sum():.2f}" for t in rounds)
        fastest = torch.stack(rounds).min(dim=0).values
        rates[name] = len(fastest) / fastest.sum().item()
        print(f"  {name:10} steps/s {rates[name]:.2f} (rounds: {per_round})")
    if validations:
        print(
            f"  left out of proj fit's steps: {len(validations)} validations with their checkpoints, "
            f"{1000 * min(validations):.0f} ms each at the fastest"
        )
    ratio = rates["proj fit"] / rates["plain loop"]
    print(f"  {experiment} ratio {ratio:.3f}")
    return ratio


def main_benchmark(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", choices=[*EXPERIMENTS, "all"], default="all")
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="Tiny Shakespeare's input.txt")
    parser.add_argument("--steps", type=int, default=240, help="steps per run (the LM validates at 250)")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out of the timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args(argv)
    if args.warmup + 2 > args.steps:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}) by at least 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        parser.error("--clock cpu counts one thread's CPU time: pass --threads 1")
    global clock
    clock = CLOCKS[args.clock]
    print(f"threads {torch.get_num_threads()}, {args.clock} clock")
    experiments = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    ratios = {name: benchmark(name, args) for name in experiments}
    lowest = min(ratios, key=ratios.get)
    print(f"ratio {ratios[lowest]:.3f} (lowest, {lowest})")


if __name__ == "__main__":
    main_benchmark()
