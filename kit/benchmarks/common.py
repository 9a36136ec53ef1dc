"""What the benchmarks share: the project and its experiments, clocks, and the plain training step
they are measured against.

The benchmarks measure the kit on a project's experiments, and name no project: ``--experiment NAME``
is the config ``configs/NAME.yaml`` of the checkout these scripts sit in (``kit/benchmarks/`` of
it), or the path of any experiment config. The commands run for the project whose package the
config's model names (its ``PROJECT``), otherwise for the checkout's own
(``projkit.project.of_checkout``). The baselines train the network and data the project's command
line builds from the same config (``main([...], run=False)``), so both sides do the same work.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule, Trainer, seed_everything
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from projkit import strict_yaml
from projkit.cli import ProjectCLI
from projkit.context import use
from projkit.optim import WarmupCosineLR, fused_where_supported, param_groups
from projkit.project import Project, of_checkout
from projkit.task import TaskModule

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
# The checkout's experiments each benchmark runs by default (`--experiment all`): the template's own.
TEXT_EXPERIMENTS = ("shakespeare_char", "shakespeare_char_cpu")
IMAGE_EXPERIMENTS = ("digits", "mnist", "fashion_mnist", "cifar10")
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}

Batch = tuple[torch.Tensor, torch.Tensor]


def experiment_config(experiment: str | Path) -> Path:
    """The config file of ``experiment``: a path to one as it is, a bare name the checkout's
    ``configs/<name>.yaml``."""
    path = Path(experiment)
    if path.suffix in (".yaml", ".yml") or path.is_file() or len(path.parts) > 1:
        return path.resolve()
    return CONFIGS / f"{experiment}.yaml"


def label(experiment: str | Path) -> str:
    """How the output names an experiment: its config's file name, as its runs are named."""
    return experiment_config(experiment).stem


def model_class_path(config: Path) -> str | None:
    """The ``model.class_path`` an experiment config states, if it states one."""
    loaded = strict_yaml.read(config) or {}
    model = loaded.get("model") if isinstance(loaded, dict) else None
    found = model.get("class_path") if isinstance(model, dict) else None
    return found if isinstance(found, str) else None


def project_for(config: Path | None = None) -> Project:
    """The project whose experiment ``config`` is, made current: the package its model's class path
    names when that package has a ``PROJECT``, otherwise the checkout's."""
    found = None
    class_path = model_class_path(config) if config is not None and config.is_file() else None
    if class_path is not None and "." in class_path:
        try:
            found = getattr(importlib.import_module(class_path.split(".")[0]), "PROJECT", None)
        except ImportError:
            found = None
    if not isinstance(found, Project):
        return of_checkout(ROOT)
    use(found)
    return found


def first_config(args: Sequence[str]) -> Path | None:
    """The first ``--config`` of a command line."""
    for before, arg in zip([None, *args], args, strict=False):
        if before in ("--config", "-c"):
            return Path(arg)
        if arg.startswith("--config="):
            return Path(arg.removeprefix("--config="))
    return None


def cli(args: Sequence[str], run: bool = True) -> ProjectCLI:
    """The command line, in this process, of the project whose experiment the first ``--config`` is
    (``python -m <package> ARGS``; ``run=False`` builds the model, data and trainer only)."""
    return project_for(first_config(args)).main(list(args), run)


def model_class(config: Path) -> type | None:
    class_path = model_class_path(config)
    if class_path is None:
        return None
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name, None)


def is_text(experiment: str | Path) -> bool:
    """Whether the experiment's model learns a text: its data hands it a vocabulary (``data_facts``)."""
    model = model_class(experiment_config(experiment))
    return "vocab" in getattr(model, "data_facts", ())


def parser(description: str, experiments: Sequence[str], default: str = "all") -> argparse.ArgumentParser:
    """The options every benchmark takes: the experiment (or ``all``), the corpus and the threads."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    every = f"; all: {', '.join(experiments)}" if default == "all" else ""
    shown = f"NAME for the checkout's configs/NAME.yaml, or a config file's path (default: {default}{every})"
    parser.add_argument("--experiment", default=default, help=shown)
    parser.add_argument("--corpus", help="the text experiments' text file (default: the config's path)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and apply ``--threads`` before anything is timed."""
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def chosen(experiments: Sequence[str], args: argparse.Namespace) -> list[str]:
    """The experiments ``--experiment`` names: one, or the benchmark's list for ``all``."""
    return list(experiments) if args.experiment == "all" else [args.experiment]


def print_lowest(
    experiments: Sequence[str],
    args: argparse.Namespace,
    benchmark: Callable[[str, argparse.Namespace], float],
    decimals: int,
) -> None:
    """Run ``benchmark`` on the chosen experiments; the last line is the lowest ratio, the one a
    bar is checked against."""
    ratios = {label(name): benchmark(name, args) for name in chosen(experiments, args)}
    lowest = min(ratios, key=ratios.get)
    print(f"ratio {ratios[lowest]:.{decimals}f} (lowest, {lowest})")


def cli_args(experiment: str | Path, corpus: str | None = None) -> list[str]:
    """The experiment's config, plus where the text is for a text experiment (by default the
    config's own path, where ``fit`` downloads Tiny Shakespeare when it is absent)."""
    config = experiment_config(experiment)
    args = ["--config", str(config)]
    if corpus is not None and is_text(config):
        args.append(f"--data.init_args.path={corpus}")
    return args


def trial_args(experiment: str | Path, epochs: int, save_dir: Path) -> list[str]:
    """A sweep trial's ``python -m <package>`` arguments, as the sweep benchmarks run it: ``fit`` of
    the experiment for ``epochs``, quiet, no test, its run directory under ``save_dir``."""
    return [
        "fit", *cli_args(experiment), f"--trainer.max_epochs={epochs}", "--trainer.enable_progress_bar=false",
        "--test_after_fit=false", f"--trainer.logger.init_args.save_dir={save_dir}",
    ]  # fmt: skip


def build(args: Sequence[str]) -> ProjectCLI:
    """Model, data module and trainer exactly as ``fit`` would build them, nothing run; seeded, the
    data set up, and the trainer attached to the data module in training mode, since its
    device-side transforms augment only while a trainer trains."""
    built = cli(args, run=False)
    seed_everything(built.config.seed_everything)
    datamodule, trainer = built.datamodule, built.trainer
    datamodule.trainer = trainer
    trainer.training = True
    datamodule.prepare_data()
    datamodule.setup("fit")
    return built


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
        self.optimizer = hand_written_optimizer(model, self.net, self.device)
        self.scheduler = model.scheduler(self.optimizer) if model.scheduler is not None else None
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
        if self.scheduler is not None:
            self.scheduler.step()


def hand_written_optimizer(model: TaskModule, net: torch.nn.Module, device: torch.device) -> Optimizer:
    """The recipe's optimizer as nanoGPT builds it by hand: on the parameter groups, torch's fused
    AdamW on CUDA, torch's default elsewhere (the kit picks the fused kernel on a CPU too)."""
    groups = param_groups(net)
    optimizer = model.optimizer([dict(group) for group in groups])
    return fused_where_supported(optimizer, groups) if device.type == "cuda" else optimizer


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast of Lightning's ``trainer.precision``, for the two the configs use."""
    if precision == "32-true":
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"trainer.precision={precision}: the plain step knows 32-true and bf16-mixed only")
