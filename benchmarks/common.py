"""What the benchmarks share: the shipped experiments, clocks, and the plain training step they are
measured against."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule, Trainer, seed_everything
from torch.utils.data import DataLoader

from proj.cli import ProjCLI, main
from proj.models import TaskModule
from proj.optim import WarmupCosineLR, param_groups

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
TEXT_EXPERIMENTS = ("shakespeare_char", "shakespeare_char_cpu")
IMAGE_EXPERIMENTS = ("digits", "mnist", "fashion_mnist", "cifar10")
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}

Batch = tuple[torch.Tensor, torch.Tensor]


def parser(description: str, experiments: Sequence[str], default: str = "all") -> argparse.ArgumentParser:
    """The options every benchmark takes: the experiment (or ``all``), the corpus and the threads."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    choices = [*experiments, "all"] if default == "all" else list(experiments)
    parser.add_argument("--experiment", choices=choices, default=default)
    parser.add_argument("--corpus", help="Tiny Shakespeare's input.txt (default: the config's path)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and apply ``--threads`` before anything is timed."""
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def print_lowest(
    experiments: Sequence[str],
    args: argparse.Namespace,
    benchmark: Callable[[str, argparse.Namespace], float],
    decimals: int,
) -> None:
    """Run ``benchmark`` on the chosen experiments; the last line is the lowest ratio, the one a
    bar is checked against."""
    chosen = list(experiments) if args.experiment == "all" else [args.experiment]
    ratios = {name: benchmark(name, args) for name in chosen}
    lowest = min(ratios, key=ratios.get)
    print(f"ratio {ratios[lowest]:.{decimals}f} (lowest, {lowest})")


def cli_args(experiment: str, corpus: str | None = None) -> list[str]:
    """The experiment's shipped config, plus where the text is for the text experiments (by
    default the config's own path, where ``fit`` downloads Tiny Shakespeare when it is absent)."""
    args = ["--config", str(CONFIGS / f"{experiment}.yaml")]
    if corpus is not None and experiment in TEXT_EXPERIMENTS:
        args.append(f"--data.init_args.path={corpus}")
    return args


def digits_trial(epochs: int, save_dir: Path) -> list[str]:
    """A sweep trial's ``python -m proj`` arguments, as the sweep benchmarks run it: ``fit`` of the
    digits experiment for ``epochs``, quiet, no test, its run directory under ``save_dir``."""
    return [
        "fit", *cli_args("digits"), f"--trainer.max_epochs={epochs}", "--trainer.enable_progress_bar=false",
        "--test_after_fit=false", f"--trainer.logger.init_args.save_dir={save_dir}",
    ]  # fmt: skip


def build(args: Sequence[str]) -> ProjCLI:
    """Model, data module and trainer exactly as ``fit`` would build them, nothing run; seeded, the
    data set up, and the trainer attached to the data module in training mode, since its
    device-side transforms augment only while a trainer trains."""
    cli = main(list(args), run=False)
    seed_everything(cli.config.seed_everything)
    datamodule, trainer = cli.datamodule, cli.trainer
    datamodule.trainer = trainer
    trainer.training = True
    datamodule.prepare_data()
    datamodule.setup("fit")
    return cli


def device_batches(
    datamodule: LightningDataModule, loader: DataLoader, device: torch.device
) -> Iterator[Batch]:
    """Training batches epoch after epoch, on the device and through the data module's
    ``on_after_batch_transfer``, as the Trainer delivers them to ``training_step``."""
    for epoch in itertools.count():
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            batch = [t.to(device, non_blocking=True) for t in batch]
            yield datamodule.on_after_batch_transfer(batch, 0)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PlainStep:
    """One training step written by hand: zero_grad, forward, loss, backward, clip, step, scheduler,
    with the module's network, AdamW and parameter groups, schedule, the trainer's clipping and
    precision."""

    def __init__(self, model: TaskModule, trainer: Trainer, total_steps: int) -> None:
        self.device = trainer.strategy.root_device
        self.net = model.net.to(self.device).train()
        self.loss = model.loss  # the task's own loss, applied to the network's output
        self.optimizer = model.optimizer(param_groups(self.net))
        self.scheduler = model.scheduler(self.optimizer)
        if isinstance(self.scheduler, WarmupCosineLR) and self.scheduler.total_steps is None:
            self.scheduler.total_steps = total_steps
        self.clip = trainer.gradient_clip_val
        self.precision = trainer.precision

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.precision, self.device):
            loss = self.loss(self.net(x), y)
        loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip)
        self.optimizer.step()
        self.scheduler.step()


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "32-true":
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"trainer.precision={precision}: the plain step knows 32-true and bf16-mixed only")
