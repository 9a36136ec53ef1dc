"""The plain PyTorch script ``end_to_end.py`` times the project's ``fit`` against: the run a user
would write by hand around the project's own network and data, with no Trainer, doing the work of
the experiment's config.

It builds the experiment's model and data module as the project's command line builds them
(``main(["--config", ...], run=False)``: the config over the project's defaults, the data's facts
linked into the network, seeded), so that it names no network or data class of its own, then trains
that network in a loop of its own: the data module's training batches (its loader, sampler and
device-side transforms, as ``fit`` gets them), the model's loss, its optimizer on
``projkit.optim``'s parameter groups as nanoGPT builds it (torch's fused AdamW on CUDA, torch's
default on a CPU, where the kit's ``fit`` takes the fused one too) and its schedule, the config's
steps (or epochs), gradient clipping, precision, validation cadence and batches, early stopping
patience on ``val/loss``, and, for a model that samples after each validation (a ``log_samples``
method: the template's language model), the same samples. It saves a checkpoint (weights, optimizer,
schedule, step) whenever ``val/loss`` improves and the last one at the end, logs the training loss
every ``log_every_n_steps`` steps to ``metrics.csv``, then tests the best checkpoint's weights on
the test split: what a user gets from ``fit``, written the short way::

    python kit/benchmarks/plain_fit.py --experiment shakespeare_char_cpu --out /tmp/plain
    python kit/benchmarks/plain_fit.py --experiment shakespeare_char --device cuda --out /tmp/plain

``--experiment`` is a name of the checkout's ``configs/`` or a config file's path. Lightning is
imported (the project's model and data module are Lightning's classes, built by its CLI), but no
Trainer runs anything. On a GPU the recipe's ``trainer.precision`` applies (``bf16-mixed``:
autocast to bfloat16). ``--set`` changes the recipe with the keys of ``fit``'s flags (``--set
trainer.limit_val_batches=2``), so both sides of a comparison take the same changes.
``metrics.csv`` records with each logged loss ``train_seconds``, the time spent in training steps
so far (validation and sampling left out, as ``projkit.callbacks.TrainingThroughput`` leaves them
out), read after the loss, which waits for the device.

Run by ``end_to_end.py`` (``BENCH_T0`` in the environment) it writes the seconds each phase took,
and the steps it trained, to ``phases.json`` in ``--out``, for the breakdown ``end_to_end.py``
prints and its check that both sides did the same work.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from common import autocast, build, cli_args, device_batches, hand_written_optimizer
from projkit.optim import WarmupCosineLR

Batch = tuple[torch.Tensor, torch.Tensor]


class Phases:
    """Seconds per phase, each moment counted once, in the innermost phase open: ``start-up``
    until the first training step, then ``training steps`` unless another phase is open.

    The clock is the wall clock from ``BENCH_T0`` (a ``time.time()`` taken before the process
    started), or with ``BENCH_CLOCK=cpu`` the process's CPU time, which starts with the process.
    """

    def __init__(self) -> None:
        cpu = os.environ.get("BENCH_CLOCK") == "cpu"
        self.clock = time.process_time if cpu else time.time
        self.start = 0.0 if cpu else float(os.environ.get("BENCH_T0", time.time()))
        self.seconds: dict[str, float] = defaultdict(float)
        self.open = ["start-up"]
        self.mark = self.start

    def _switch(self) -> None:
        now = self.clock()
        self.seconds[self.open[-1]] += now - self.mark
        self.mark = now

    def enter(self, phase: str) -> None:
        self._switch()
        self.open.append(phase)

    def leave(self) -> None:
        self._switch()
        self.open.pop()

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self.enter(phase)
        try:
            yield
        finally:
            self.leave()

    def base(self, phase: str) -> None:
        """From now on, time outside any other phase is ``phase``'s."""
        self._switch()
        self.open[0] = phase

    def write(self, path: Path, steps: int) -> None:
        """The seconds so far, when (``metric_at``) they were written, and the optimizer steps
        trained: the work done, which both sides of a comparison must match."""
        self._switch()
        path.write_text(json.dumps({**self.seconds, "metric_at": self.mark - self.start, "steps": steps}))


def recipe_args(
    experiment: str, out: Path, corpus: str | None, steps: int | None, changes: Sequence[str] = ()
) -> list[str]:
    """The command line that builds the experiment's objects as ``fit`` would: its config, the
    corpus, ``--steps`` as ``trainer.max_steps``, then ``changes`` (``dotted.key=value``, the keys
    of ``fit``'s flags). The trainer is only read, never run: on the CPU, without a logger, its
    folder ``out`` (where a language model's samples go, as into a run's folder)."""
    args = [*cli_args(experiment, corpus), *(f"--{change}" for change in changes)]
    if steps:
        args.append(f"--trainer.max_steps={steps}")
    return [*args, "--trainer.accelerator=cpu", "--trainer.logger=false", f"--trainer.default_root_dir={out}"]


def batch_limit(limit: int | float, batches: int) -> int:
    """Lightning's ``limit_*_batches``: a count, or a fraction of the loader's batches."""
    return limit if isinstance(limit, int) else int(batches * limit)


def evaluate(
    net: nn.Module, loss: Callable, batches: Iterator[Batch], limit: float, precision: str
) -> dict[str, float]:
    """The model's loss over every target (or token), and the share of them predicted, in
    inference mode, over the first ``limit`` batches."""
    net.eval()
    total, count, correct = 0.0, 0, 0
    with torch.inference_mode():
        for i, (x, y) in enumerate(batches):
            if i >= limit:
                break
            with autocast(precision, x.device):
                logits = net(x).float()
            total += loss(logits, y, reduction="none").sum().item()
            count += y.numel()
            correct += (logits.argmax(-1) == y).sum().item()
    net.train()
    return {"loss": total / count, "acc": correct / count}


def eval_batches(datamodule, loader, device: torch.device) -> Iterator[Batch]:
    """A split's batches on the device through the data module's ``on_after_batch_transfer``."""
    for batch in loader:
        yield datamodule.on_after_batch_transfer([t.to(device, non_blocking=True) for t in batch], 0)


@contextlib.contextmanager
def stage(trainer, name: str) -> Iterator[None]:
    """The trainer in ``name`` (``validating``, ``testing``) as the data module's transforms read it
    (no training augmentation there), then back to training."""
    setattr(trainer, name, True)
    try:
        yield
    finally:
        trainer.training = True


def run(
    experiment: str,
    out: Path,
    corpus: str | None,
    steps: int | None,
    device: torch.device,
    changes: Sequence[str] = (),
) -> None:
    phases = Phases()
    out.mkdir(parents=True, exist_ok=True)
    built = build(recipe_args(experiment, out, corpus, steps, changes))
    model, datamodule, trainer = built.model, built.datamodule, built.trainer
    precision = str(built.config.trainer.precision)
    model.to(device)
    net = model.net.train()
    train_loader = datamodule.train_dataloader()
    batches_per_epoch = len(train_loader)
    limits = [trainer.max_steps] if trainer.max_steps > 0 else []
    if trainer.max_epochs is not None and trainer.max_epochs > 0:
        limits.append(trainer.max_epochs * batches_per_epoch)
    max_steps = min(limits)
    # Validation every val_check_interval steps (a fraction: of an epoch), or at each epoch's end,
    # and after the last step.
    interval = trainer.val_check_interval
    every = interval if isinstance(interval, int) else max(1, int(batches_per_epoch * interval))
    limit_val = batch_limit(trainer.limit_val_batches, len(datamodule.val_dataloader()))
    log_every = trainer.log_every_n_steps
    clip = trainer.gradient_clip_val
    stopping = [cb for cb in trainer.callbacks if type(cb).__name__ == "EarlyStopping"]
    patience = stopping[0].patience if stopping else math.inf
    samples = hasattr(model, "log_samples") and getattr(model, "num_samples", 1) > 0
    model.trainer = trainer  # what log_samples reads: the step, the (no) loggers, the folder

    optimizer = hand_written_optimizer(model, net, device)
    scheduler = model.scheduler(optimizer) if model.scheduler is not None else None
    if isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps is None:
        scheduler.total_steps = max_steps
    best_path, best, waited = out / "best.ckpt", math.inf, 0
    logged = ["step,train/loss,train/grad_norm,train_seconds"]
    start, paused = time.perf_counter(), 0.0

    def state(step: int) -> dict:
        saved = {"net": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        return {**saved, "scheduler": scheduler.state_dict()} if scheduler is not None else saved

    net.train()
    batches = device_batches(datamodule, train_loader, device)
    for step, (x, y) in enumerate(batches, start=1):
        if step == 1:
            phases.base("training steps")
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, device):
            loss = model.loss(net(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), math.inf if clip is None else clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if step % log_every == 0:
            loss_value, norm_value = loss.item(), norm.item()
            logged.append(f"{step},{loss_value},{norm_value},{time.perf_counter() - start - paused}")
        if step % every != 0 and step != max_steps:
            continue
        pause = time.perf_counter()
        with phases("validation"):
            with stage(trainer, "validating"):
                val_batches = eval_batches(datamodule, datamodule.val_dataloader(), device)
                val = evaluate(net, model.loss, val_batches, limit_val, precision)
            logged.append(f"{step},val/loss={val['loss']},val/acc={val['acc']}")
        if samples:
            with phases("sampling"):
                model.log_samples()  # samples.txt in --out, as fit writes it into the run's folder
        paused += time.perf_counter() - pause
        (out / "metrics.csv").write_text("\n".join(logged) + "\n")
        if val["loss"] < best:
            best, waited = val["loss"], 0
            with phases("checkpointing"):
                torch.save(state(step), best_path)
        else:
            waited += 1
        if waited >= patience or step >= max_steps:
            break
    with phases("checkpointing"):
        torch.save(state(step), out / "last.ckpt")
    phases.base("test")
    net.load_state_dict(torch.load(best_path, weights_only=True)["net"])
    datamodule.setup("test")
    with stage(trainer, "testing"):
        test_batches = eval_batches(datamodule, datamodule.test_dataloader(), device)
        test = evaluate(net, model.loss, test_batches, math.inf, precision)
    print(f"test/loss {test['loss']:.4f} test/acc {test['acc']:.4f}")
    if "BENCH_T0" in os.environ:
        phases.write(out / "phases.json", step)


def main(argv: list[str] | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    options = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    options.add_argument(
        "--experiment", required=True, help="NAME for the checkout's configs/NAME.yaml, or a config's path"
    )
    options.add_argument("--out", type=Path, required=True, help="folder for checkpoints and metrics")
    options.add_argument("--corpus", help="a text experiment's text file (default: the config's path)")
    options.add_argument("--steps", type=int, help="optimizer steps (default: the config's)")
    options.add_argument("--device", default="cpu", help="where to train: cpu, cuda (default: cpu)")
    options.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change the recipe, e.g. --set trainer.limit_val_batches=2 (repeatable)",
    )
    args = options.parse_args(argv)
    run(args.experiment, args.out, args.corpus, args.steps, torch.device(args.device), args.set)


if __name__ == "__main__":
    main()
