"""Steady-state training throughput of ``proj fit`` against a plain PyTorch loop, same work.

Both train the GPT of ``configs/shakespeare_char_cpu.yaml`` (built by the CLI from that config) on
the same ``TextDataModule`` batches, with the same AdamW and parameter groups, schedule, gradient
clipping, precision and threads. The CLI run is the real ``fit`` subcommand with the config's
logging, checkpointing and progress bar; validation falls outside the timed steps. Each side runs
``--rounds`` times, alternating, and keeps its best round, so a busy machine penalises neither.
The last line is the ratio, which should be at least 0.95:

    python benchmarks/lm_throughput.py --corpus ../shared/data/tinyshakespeare/input.txt
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.nn import functional as F

from proj.cli import main
from proj.optim import param_groups

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "shakespeare_char_cpu.yaml"


class StepTimer(Callback):
    """Wall time at the start of every training step; the CLI builds it from its class path."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        self.times.append(time.perf_counter())


def rate(times: list[float], warmup: int, tokens_per_step: int) -> float:
    """Tokens per second from the start of step ``warmup`` to the start of the last step."""
    return (len(times) - 1 - warmup) * tokens_per_step / (times[-1] - times[warmup])


def lightning_run(corpus: str, steps: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        cli = main(
            [
                "fit",
                f"--config={CONFIG}",
                f"--data.init_args.path={corpus}",
                f"--trainer.max_steps={steps}",
                f"--trainer.default_root_dir={folder}",
                f"--trainer.logger.init_args.save_dir={folder}",
                "--trainer.callbacks+=__main__.StepTimer",
                "--test_after_fit=false",
            ]
        )
        timer = next(cb for cb in cli.trainer.callbacks if isinstance(cb, StepTimer))
        datamodule = cli.datamodule
        return rate(timer.times, warmup, datamodule.batch_size * datamodule.block_size)


def plain_run(corpus: str, steps: int, warmup: int) -> float:
    cli = main(["--config", str(CONFIG), f"--data.init_args.path={corpus}"], run=False)
    seed_everything(cli.config.seed_everything)
    model, datamodule = cli.model.net, cli.datamodule
    optimizer = cli.model.optimizer(param_groups(model))
    scheduler = cli.model.scheduler(optimizer)
    datamodule.setup("fit")
    model.train()
    times = []
    for step, (x, y) in enumerate(datamodule.train_dataloader()):
        if step == steps:
            break
        times.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    return rate(times, warmup, datamodule.batch_size * datamodule.block_size)


def main_benchmark() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_corpus = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
    parser.add_argument("--corpus", default=str(default_corpus), help="Tiny Shakespeare's input.txt")
    parser.add_argument("--steps", type=int, default=240, help="steps per run, below the validation interval")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out of the timing")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    plain, lightning = [], []
    for _ in range(args.rounds):
        plain.append(plain_run(args.corpus, args.steps, args.warmup))
        lightning.append(lightning_run(args.corpus, args.steps, args.warmup))
    print(f"threads {torch.get_num_threads()}, steps {args.warmup}..{args.steps}, best of {args.rounds}")
    print("plain loop tokens/s", " ".join(f"{r:,.0f}" for r in plain))
    print("proj fit   tokens/s", " ".join(f"{r:,.0f}" for r in lightning))
    print(f"ratio {max(lightning) / max(plain):.3f}")


if __name__ == "__main__":
    main_benchmark()
