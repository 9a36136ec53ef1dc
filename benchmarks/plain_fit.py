"""The plain PyTorch script ``end_to_end.py`` times ``proj fit`` against: the run a user would
write by hand, with no Lightning imported, doing the work of the shipped config.

It reads the experiment's config (``configs/defaults.yaml`` under it, as the CLI does) for the
recipe's numbers and trains the same network class from ``proj.nets`` with the same AdamW parameter
groups and warmup+cosine schedule from ``proj.optim``, on the same split of the same data, the same
batch size, steps (or epochs), gradient clipping, evaluation cadence and evaluation batches, early
stopping patience, and, for the language model, a text sample after each validation. It saves a
checkpoint (weights, optimizer, schedule, step) whenever ``val/loss`` improves and the last one at
the end, logs the training loss every ``log_every_n_steps`` steps to ``metrics.csv``, then tests
the best checkpoint's weights on the test split: what a user gets from ``proj fit``, written the
short way::

    python benchmarks/plain_fit.py --experiment shakespeare_char_cpu --out /tmp/plain
    python benchmarks/plain_fit.py --experiment shakespeare_char --device cuda --out /tmp/plain

On a GPU the recipe's ``trainer.precision`` applies (``bf16-mixed``: autocast to bfloat16).
``--set`` changes the recipe with the keys of ``proj fit``'s flags (``--set
trainer.limit_val_batches=2``), so both sides of a comparison take the same changes.
``metrics.csv`` records with each logged loss ``train_seconds``, the time spent in training steps
so far (validation and sampling left out, as ``proj.callbacks.TrainingThroughput`` leaves them
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
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.nn import functional as F

from proj.nets import GPT, ConvNet
from proj.optim import WarmupCosineLR, param_groups

ROOT = Path(__file__).resolve().parents[1]
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


def recipe(experiment: str, changes: Sequence[str] = ()) -> dict:
    """``configs/defaults.yaml`` with the experiment's config over it, merged key by key, then
    ``changes``: ``dotted.key=value`` with a YAML value, as ``proj fit`` takes them after ``--``."""

    def merge(base: dict, over: dict) -> dict:
        merged = dict(base)
        for key, value in over.items():
            both_dicts = isinstance(value, dict) and isinstance(merged.get(key), dict)
            merged[key] = merge(merged[key], value) if both_dicts else value
        return merged

    defaults = yaml.safe_load((ROOT / "configs" / "defaults.yaml").read_text())
    config = merge(defaults, yaml.safe_load((ROOT / "configs" / f"{experiment}.yaml").read_text()))
    for change in changes:
        key, _, value = change.partition("=")
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return config


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast of Lightning's ``trainer.precision``, for the two the configs use."""
    if precision == "32-true":
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"trainer.precision={precision}: the plain script knows 32-true and bf16-mixed only")


class Text:
    """The character data as ``TextDataModule`` cuts it: the first 90 % trains, validation takes
    ``val_windows`` non-overlapping windows spread over the rest, test all of them."""

    def __init__(
        self, path: Path, block_size: int, val_windows: int | None, seed: int, device: torch.device
    ) -> None:
        text = path.read_text(encoding="utf-8")
        self.vocab = "".join(sorted(set(text)))
        index = {c: i for i, c in enumerate(self.vocab)}
        tokens = torch.tensor([index[c] for c in text], dtype=torch.uint8)
        n_train = int(len(tokens) * 0.9)
        self.train, self.val = tokens[:n_train], tokens[n_train:]
        self.offsets = torch.arange(block_size + 1)
        self.block_size = block_size
        self.all_val = torch.arange((len(self.val) - 1) // block_size) * block_size
        self.val_starts = self.all_val
        if val_windows is not None and val_windows < len(self.all_val):
            spread = torch.linspace(0, len(self.all_val) - 1, val_windows).round().long()
            self.val_starts = self.all_val[spread]
        self.seed = seed
        self.device = device

    def cut(self, tokens: torch.Tensor, starts: torch.Tensor) -> Batch:
        windows = tokens[starts.unsqueeze(1) + self.offsets].long().to(self.device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]

    def train_batches(self, batch_size: int) -> Iterator[Batch]:
        """Random windows, as many an epoch as the training text holds end to end."""
        epoch_size = len(self.train) // self.block_size
        for epoch in range(10**9):
            order = torch.randperm(len(self.train) - self.block_size, generator=self.generator(epoch))
            for i in range(0, epoch_size, batch_size):
                yield self.cut(self.train, order[i : min(i + batch_size, epoch_size)])

    def generator(self, epoch: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + epoch)

    def batches_per_epoch(self, batch_size: int) -> int:
        return math.ceil(len(self.train) // self.block_size / batch_size)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        starts = self.val_starts if split == "val" else self.all_val
        for i in range(0, len(starts), batch_size):
            yield self.cut(self.val, starts[i : i + batch_size])


class Digits:
    """The package's 8×8 digits split as ``DigitsDataModule`` splits them (20 % test, then 10 % of
    the rest validation, each by its own seeded permutation), shifted by up to a pixel while
    training, scaled and normalised the same way."""

    mean, std, scale = 0.3, 0.38, 16.0

    def __init__(self, split_seed: int, seed: int, device: torch.device) -> None:
        from proj.data.image import load_digits

        pixels, targets = load_digits()
        images = torch.from_numpy(pixels).unsqueeze(1)
        labels = torch.from_numpy(targets)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(split_seed + 1))
        n_test = round(0.2 * len(labels))
        test, rest = order[:n_test], order[n_test:]
        self.splits = {"test": (images[test], labels[test])}
        images, labels = images[rest], labels[rest]
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(split_seed))
        n_val = max(1, round(0.1 * len(labels)))
        self.splits["val"] = (images[order[:n_val]], labels[order[:n_val]])
        self.splits["train"] = (images[order[n_val:]], labels[order[n_val:]])
        self.splits = {name: (x.to(device), y.to(device)) for name, (x, y) in self.splits.items()}
        self.seed = seed

    def normalise(self, images: torch.Tensor, augment: bool) -> torch.Tensor:
        x = images.float() / self.scale
        if augment:  # each image shifted by its own offset, one gather for the batch
            n, _, h, w = x.shape
            padded = F.pad(x, (1, 1, 1, 1))
            rows = (torch.randint(0, 3, (n, 1)) + torch.arange(h)).view(n, 1, h, 1)
            cols = (torch.randint(0, 3, (n, 1)) + torch.arange(w)).view(n, 1, 1, w)
            grey = torch.zeros((1, 1, 1, 1), dtype=torch.long)
            index = (torch.arange(n).view(n, 1, 1, 1), grey, rows, cols)
            x = padded[tuple(i.to(x.device) for i in index)]
        return (x - self.mean) / self.std

    def batches_per_epoch(self, batch_size: int) -> int:
        return math.ceil(len(self.splits["train"][1]) / batch_size)

    def train_batches(self, batch_size: int) -> Iterator[Batch]:
        images, labels = self.splits["train"]
        for epoch in range(10**9):
            order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.seed + epoch))
            for i in range(0, len(order), batch_size):
                index = order[i : i + batch_size]
                yield self.normalise(images[index], augment=True), labels[index]

    def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
        images, labels = self.splits[split]
        for i in range(0, len(labels), batch_size):
            yield self.normalise(images[i : i + batch_size], augment=False), labels[i : i + batch_size]


def evaluate(net: nn.Module, batches: Iterator[Batch], limit: int | None, precision: str) -> dict[str, float]:
    """Mean loss over every target, and accuracy for classes, in inference mode."""
    net.eval()
    total, count, correct = 0.0, 0, 0
    with torch.inference_mode():
        for i, (x, y) in enumerate(batches):
            if limit is not None and i >= limit:
                break
            with autocast(precision, x.device):
                logits = net(x).float()
            total += F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="sum").item()
            count += y.numel()
            correct += (logits.argmax(-1) == y).sum().item()
    net.train()
    return {"loss": total / count, "acc": correct / count}


def sample(net: GPT, vocab: str, prompt: str, tokens: int, precision: str) -> str:
    """``tokens`` characters continuing ``prompt``, drawn without moving the training RNG."""
    index = {c: i for i, c in enumerate(vocab)}
    device = net.lm_head.weight.device
    idx = torch.tensor([[index[c] for c in prompt]], device=device)
    net.eval()
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.inference_mode():
        for _ in range(tokens):
            with autocast(precision, device):
                logits = net(idx[:, -net.block_size :])[:, -1, :].float()
            idx = torch.cat((idx, torch.multinomial(logits.softmax(dim=-1), num_samples=1)), dim=1)
    net.train()
    return "".join(vocab[i] for i in idx[0].tolist())


def run(
    experiment: str,
    out: Path,
    corpus: str | None,
    steps: int | None,
    device: torch.device,
    changes: Sequence[str] = (),
) -> None:
    phases = Phases()
    config = recipe(experiment, changes)
    trainer, model, data = config["trainer"], config["model"]["init_args"], config["data"]["init_args"]
    seed = config["seed_everything"]
    torch.manual_seed(seed)
    batch_size = data["batch_size"]
    net_args = model["net"]["init_args"]
    if experiment.startswith("shakespeare"):
        path = Path(corpus or data.get("path", ROOT / "data/tinyshakespeare/input.txt"))
        source = Text(path, net_args["block_size"], data.get("val_windows"), seed, device)
        net: nn.Module = GPT(vocab_size=len(source.vocab), **net_args)
    else:
        source = Digits(data.get("split_seed", 12345), seed, device)
        net = ConvNet(num_classes=10, input_shape=(1, 8, 8), **net_args)
    net.to(device)
    precision = trainer["precision"]
    batches_per_epoch = source.batches_per_epoch(batch_size)
    max_steps = steps or trainer.get("max_steps") or trainer["max_epochs"] * batches_per_epoch
    # Validation every val_check_interval steps, or at each epoch's end, and after the last step.
    every = trainer.get("val_check_interval") or batches_per_epoch
    limit_val = trainer.get("limit_val_batches")
    log_every = trainer["log_every_n_steps"]
    clip = trainer["gradient_clip_val"]
    patience = config["early_stopping"]["init_args"]["patience"]
    sample_tokens = model.get("sample_tokens", 200)  # LanguageModel's default

    optimizer = torch.optim.AdamW(param_groups(net), **model["optimizer"]["init_args"])
    schedule = model.get("scheduler", {}).get("init_args", {})
    scheduler = WarmupCosineLR(optimizer, **{"total_steps": max_steps, **schedule})
    out.mkdir(parents=True, exist_ok=True)
    best_path, best, waited = out / "best.ckpt", math.inf, 0
    logged = ["step,train/loss,train/grad_norm,train_seconds"]
    start, paused = time.perf_counter(), 0.0

    def state(step: int) -> dict:
        return {
            "net": net.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
        }

    net.train()
    for step, (x, y) in enumerate(source.train_batches(batch_size), start=1):
        if step == 1:
            phases.base("training steps")
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, device):
            loss = F.cross_entropy(net(x).flatten(0, -2), y.flatten())
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        optimizer.step()
        scheduler.step()
        if step % log_every == 0:
            loss_value, norm_value = loss.item(), norm.item()
            logged.append(f"{step},{loss_value},{norm_value},{time.perf_counter() - start - paused}")
        if step % every != 0 and step != max_steps:
            continue
        pause = time.perf_counter()
        with phases("validation"):
            val = evaluate(net, source.eval_batches("val", batch_size), limit_val, precision)
            logged.append(f"{step},val/loss={val['loss']},val/acc={val['acc']}")
        if isinstance(source, Text):
            with phases("sampling"), open(out / "samples.txt", "a", encoding="utf-8") as f:
                text = sample(net, source.vocab, chr(10), sample_tokens, precision)
                f.write(f"--- step {step} ---\n{text}\n\n")
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
    test = evaluate(net, source.eval_batches("test", batch_size), None, precision)
    print(f"test/loss {test['loss']:.4f} test/acc {test['acc']:.4f}")
    if "BENCH_T0" in os.environ:
        phases.write(out / "phases.json", step)


def main(argv: list[str] | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    options = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    experiments = ["digits", "shakespeare_char_cpu", "shakespeare_char"]
    options.add_argument("--experiment", choices=experiments, required=True)
    options.add_argument("--out", type=Path, required=True, help="folder for checkpoints and metrics")
    options.add_argument("--corpus", help="Tiny Shakespeare's input.txt (default: the config's path)")
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
