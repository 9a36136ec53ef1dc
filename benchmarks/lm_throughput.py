"""Steady-state training throughput of ``proj fit`` against a plain PyTorch loop, same work.

Both train the GPT of ``configs/shakespeare_char_cpu.yaml`` (built by the CLI from that config) on
the same ``TextDataModule`` batches, with the same AdamW and parameter groups, schedule, gradient
clipping, precision and threads. The CLI run is the real ``fit`` subcommand with the config's
logging, checkpointing and progress bar; validation falls outside the timed steps.

A step's time runs from one ``on_train_batch_start`` (or loop iteration) to the next, so it
includes data loading, logging and everything else between steps. The first ``--warmup`` steps
are left out. Each side runs ``--rounds`` times, alternating; for every step index the fastest
round counts, which filters out other processes' bursts on a shared machine while keeping the
periodic costs (logging every ``log_every_n_steps``) that every round pays at the same steps.
The last line is the ratio, which should be at least 0.95:

    python benchmarks/lm_throughput.py --corpus ../shared/data/tinyshakespeare/input.txt

On a machine busy with other work, ``--threads 1 --clock cpu`` times each step by the CPU time of
the one thread doing all the work (``time.thread_time``), which other processes do not inflate.
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
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]


class StepTimer(Callback):
    """The clock at the start of every training step; the CLI builds it from its class path."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        self.times.append(clock())


def step_times(starts: list[float], warmup: int) -> torch.Tensor:
    return torch.tensor(starts[warmup:], dtype=torch.float64).diff()


def lightning_run(corpus: str, steps: int, warmup: int) -> tuple[torch.Tensor, int]:
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
        return step_times(timer.times, warmup), datamodule.batch_size * datamodule.block_size


def plain_run(corpus: str, steps: int, warmup: int) -> tuple[torch.Tensor, int]:
    cli = main(["--config", str(CONFIG), f"--data.init_args.path={corpus}"], run=False)
    seed_everything(cli.config.seed_everything)
    model, datamodule = cli.model.net, cli.datamodule
    optimizer = cli.model.optimizer(param_groups(model))
    scheduler = cli.model.scheduler(optimizer)
    datamodule.setup("fit")
    model.train()
    times = []
    for step, (x, y) in enumerate(datamodule.train_dataloader()):
        times.append(clock())
        if step == steps - 1:
            break
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    return step_times(times, warmup), datamodule.batch_size * datamodule.block_size


def main_benchmark() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_corpus = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
    parser.add_argument("--corpus", default=str(default_corpus), help="Tiny Shakespeare's input.txt")
    parser.add_argument("--steps", type=int, default=240, help="steps per run, below the validation interval")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out of the timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        parser.error("--clock cpu counts one thread's CPU time: pass --threads 1")
    global clock
    clock = CLOCKS[args.clock]
    runs: dict[str, list[torch.Tensor]] = {"plain loop": [], "proj fit": []}
    for _ in range(args.rounds):
        for name, run in (("plain loop", plain_run), ("proj fit", lightning_run)):
            times, tokens_per_step = run(args.corpus, args.steps, args.warmup)
            runs[name].append(times)
    print(
        f"threads {torch.get_num_threads()}, {args.clock} clock, steps {args.warmup}..{args.steps}, "
        f"{args.rounds} rounds"
    )
    rates = {}
    for name, rounds in runs.items():
        per_round = " ".join(f"{len(t) * tokens_per_step / t.sum():,.0f}" for t in rounds)
        fastest = torch.stack(rounds).min(dim=0).values
        rates[name] = len(fastest) * tokens_per_step / fastest.sum().item()
        print(f"{name:10} tokens/s {rates[name]:,.0f} (rounds: {per_round})")
    print(f"ratio {rates['proj fit'] / rates['plain loop']:.3f}")


if __name__ == "__main__":
    main_benchmark()
