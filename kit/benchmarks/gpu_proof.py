"""The GPU proof: what the template does on one GPU, in one command of at most 9 minutes (an H200),
with every stage given a budget and timed, stopping with exit 1 at the first stage that fails. It runs
the experiments of the checkout it sits in (``configs/`` beside ``kit/``), for the checkout's project
(``projkit.project.of_checkout``)::

    python kit/benchmarks/gpu_proof.py                      # on the GPU: writes kit/benchmarks/RESULTS.md
    python kit/benchmarks/gpu_proof.py --from gpt2_small    # a rerun from that stage on
    python kit/benchmarks/gpu_proof.py --smoke --results /tmp/RESULTS.md   # every stage, on the CPU

The stages run real ``python -m <package> fit`` commands (and ``plain_fit.py`` for the plain side),
each killed when it overruns what is left of its stage's budget (``STAGES``):

- **environment**: GPU, torch, CUDA and Lightning in one line; the corpus is at hand.
- **no_syncs**: 12 steps of each experiment on the first card: no ordinary step synchronises
  (``no_syncs`` below). Skipped without CUDA.
- **digits**: ``configs/digits.yaml`` with ``configs/trainer/gpu.yaml`` (bf16-mixed): test/acc and
  wall time.
- **fp16_scaler**: the character GPT for 300 steps in ``16-mixed``, with Lightning's gradient
  scaler and clipping to 0.1 so that every step clips; ``ScalerCheck`` (below) verifies on every
  step that the gradients clipped are the unscaled ones and logs the scale. Every logged loss
  must be finite.
- **shakespeare_char**: ``configs/shakespeare_char.yaml`` (nanoGPT's GPU recipe: 5,000 steps in
  bf16; nanoGPT reaches val/loss 1.4697 in about 3 minutes on an A100) to val/loss <= 1.47: wall
  time, tokens/s and MFU, then ``plain_fit.py`` for 300 steps of the same recipe on the same card:
  the ratio of steady-state steps/s, project / plain (each the median over its logging steps of the
  rate over the last 5 of them, validation left out).
- **gpt2_small**: a GPT-2-small network (the config's network class at 12 layers, 12 heads, 768
  wide, block 1024: 124 M parameters) for 100 steps of 32 sequences in bf16 with ``compile: true``
  on random tokens (a text of 50,257 distinct characters, GPT-2's vocabulary size): tokens/s, MFU
  (goal: at least 45 %) and peak memory, then the same with ``activation_checkpointing: true``,
  whose MFU counts the model's FLOPs only (``train/mfu``, given beside it, counts the recomputed
  forward pass too).

A goal missed (val/loss, MFU, digits' test/acc >= 0.95) is marked in RESULTS.md and ends the
script with exit 1 after the last stage; a stage that fails (a command's error, an overrun, a
check) stops it at once. RESULTS.md is written either way, with each figure, the command behind
it, the date and the card.

``--smoke`` runs every stage for a few steps on the CPU with tiny sizes, in this process (each
command's start-up, importing Lightning, would cost seconds), no compile (on a CPU it takes a
minute even for a one-layer GPT), and the 16-mixed stage through a CPU gradient scaler (Lightning
turns ``16-mixed`` on a CPU into bf16): the template's ``tests/test_benchmarks.py`` runs it so that
the script cannot rot between cards. It writes its results only where ``--results`` says.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import math
import os
import random
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.amp.grad_scaler import OptState

from projkit import strict_yaml
from projkit.project import Project, of_checkout

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parents[1]  # the checkout: its configs/, data/ and project
CORPUS = ROOT / "data" / "tinyshakespeare" / "input.txt"
RESULTS = BENCHMARKS / "RESULTS.md"
CONFIG = f"--config={ROOT / 'configs' / 'shakespeare_char.yaml'}"
GPU = f"--config={ROOT / 'configs' / 'trainer' / 'gpu.yaml'}"
NET = "model.init_args.net.init_args"
GPT2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "dropout": 0.0}
GPT2_VOCAB = 50257
GPT2_BATCH = 32
# What a stage's runs need none of, each a second or more per save of a 124 M network.
NO_CHECKPOINTS = [
    "--checkpoint=null",
    "--last_checkpoint=null",
    "--early_stopping=null",
    "--trainer.enable_checkpointing=false",
    "--test_after_fit=false",
]
# --smoke: sizes that take a CPU a few seconds a run.
TINY_NET = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16}
TINY_TEXT = [
    *(f"{NET}.{key}={value}" for key, value in TINY_NET.items()),
    "data.init_args.batch_size=4",
    "data.init_args.val_windows=8",
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "model.init_args.sample_tokens=5",
    "trainer.precision=32-true",  # a CPU without bf16 units emulates it: slower than float32
]
CPU = ["--trainer.accelerator=cpu"]
CPU_SCALER = [
    "--trainer.precision=null",
    "--trainer.plugins=[{class_path: lightning.pytorch.plugins.MixedPrecision, "
    "init_args: {precision: 16-mixed, device: cpu}}]",
]
VERSE = "Shall I compare thee to a summer's day? Thou art more lovely and more temperate.\n"


class StageFailed(Exception):
    """A stage that did not do what it must: the script stops with this message."""


class ScalerCheck(Callback):
    """Verifies, on every optimizer step of a run with a gradient scaler (``16-mixed``), that
    Lightning clips the unscaled gradients, and logs the scale as ``train/grad_scale``.

    In ``on_before_optimizer_step`` (Lightning calls it after its ``scaler.unscale_`` and before
    clipping) the scaler must record the optimizer as unscaled, and the gradients' norm is noted.
    At the batch's end (after the optimizer step, before the next ``zero_grad``) their norm must be
    the noted one clipped to ``gradient_clip_val``: clipping scaled gradients would leave it
    ``gradient_clip_val / scale``. Steps the scaler skipped (non-finite gradients, then a lower
    scale) are counted, not checked. ``scaler_check.json`` in the run's log folder gets the counts.
    The scaler's state is private to torch (``_per_optimizer_states``): a benchmark may read it.
    """

    def __init__(self) -> None:
        self.noted: float | None = None
        self.counts = {"steps": 0, "checked": 0, "clipped": 0, "skipped": 0}
        self.scales: list[float] = []

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is None:
            raise StageFailed("ScalerCheck: the run has no gradient scaler (trainer.precision: 16-mixed)")
        stage = scaler._per_optimizer_states[id(optimizer)]["stage"]
        if stage is not OptState.UNSCALED:
            raise StageFailed(f"ScalerCheck: the gradients reach clipping {stage.name}, not UNSCALED")
        self.noted = grad_norm(pl_module)
        self.scales.append(scaler.get_scale())
        if pl_module.is_logging_step():
            pl_module.log("train/grad_scale", self.scales[-1])

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.counts["steps"] += 1
        if self.noted is None or not math.isfinite(self.noted):
            self.counts["skipped"] += 1
            return
        clip = trainer.gradient_clip_val or math.inf
        expected = min(self.noted, clip)
        after = grad_norm(pl_module)
        if not math.isclose(after, expected, rel_tol=1e-3):
            raise StageFailed(
                f"ScalerCheck: step {trainer.global_step}: gradient norm {after:.6g} after clipping, "
                f"expected {expected:.6g} (unscaled {self.noted:.6g} clipped to {clip})"
            )
        self.counts["checked"] += 1
        self.counts["clipped"] += self.noted > clip
        self.noted = None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        summary = {**self.counts, "first_scale": self.scales[0], "last_scale": self.scales[-1]}
        summary["min_scale"] = min(self.scales)
        (Path(trainer.log_dir) / "scaler_check.json").write_text(json.dumps(summary))


def grad_norm(module: torch.nn.Module) -> float:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads).item()


@dataclass
class Stage:
    """One stage's outcome: its figures (name → shown value), the commands that made them, and
    the goals it met or missed."""

    name: str
    budget: float
    seconds: float = 0.0
    figures: dict[str, str] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    failure: str | None = None

    def goal(self, name: str, met: bool, smoke: bool) -> None:
        """A goal is only judged on a GPU: the smoke's tiny runs cannot reach any."""
        if not met and not smoke:
            self.missed.append(name)


class Proof:
    """The stages' shared state: options, working folder, and each command's deadline."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.project = of_checkout(ROOT)
        self.smoke = args.smoke
        self.work = work
        self.corpus = args.corpus
        self.deadline = math.inf
        self.stage: Stage | None = None

    def run(self, command: list[str], budget: float | None = None) -> None:
        """Run a command of the stage, within what is left of its budget (``budget``: at most that).

        On a GPU it is a process of its own; ``--smoke`` calls its ``main`` in this process.
        """
        shown = " ".join(command).replace(sys.executable, "python").replace(f"{self.work}/", "")
        self.stage.commands.append(shown.replace(f"{ROOT}/", ""))
        left = self.deadline - time.perf_counter()
        timeout = min(left, budget) if budget else left
        if self.smoke:
            in_process(self.project, command)
            return
        # ScalerCheck as gpu_proof.ScalerCheck, and the kit and the project this process imported,
        # installed or not.
        path = [str(BENCHMARKS), *source_folders(self.project), os.environ.get("PYTHONPATH")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
        log = self.work / f"{self.stage.name}-{len(self.stage.commands)}.log"
        try:
            with open(log, "w") as out:
                done = subprocess.run(
                    command, cwd=self.work, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
                )
        except subprocess.TimeoutExpired:
            raise StageFailed(f"over its budget after {timeout:.0f} s: {tail(log)}") from None
        if done.returncode != 0:
            raise StageFailed(f"exit {done.returncode}: {tail(log)}")

    def fit(self, name: str, args: Sequence[str], budget: float | None = None) -> dict[str, list[float]]:
        """``python -m <package> fit`` logging to runs/<name>/version_0 in the working folder; its
        metrics."""
        save = [
            f"--trainer.logger.init_args.save_dir={self.work / 'runs'}",
            f"--trainer.logger.init_args.name={name}",
            "--trainer.logger.init_args.version=0",
            f"--trainer.default_root_dir={self.work / 'runs'}",
        ]
        self.run([sys.executable, "-m", self.project.package, "fit", *args, *save], budget)
        return read_metrics(self.work / "runs" / name / "version_0" / "metrics.csv")


def source_folders(project: Project) -> list[str]:
    """The folders the kit and the project's package are imported from, for the commands' processes."""
    packages = [importlib.import_module("projkit"), importlib.import_module(project.package)]
    return list(dict.fromkeys(str(Path(package.__file__).resolve().parents[1]) for package in packages))


def in_process(project: Project, command: list[str]) -> None:
    """``python -m <package> …`` or ``python script.py …`` run in this process; what stops it, a
    failure."""
    saved = sys.argv
    try:
        if command[1:3] == ["-m", project.package]:
            project.main(command[3:])
        else:
            sys.argv = command[1:]
            runpy.run_path(command[1], run_name="__main__")
    except SystemExit as error:
        if error.code:
            raise StageFailed(f"exit {error.code}") from error
    except Exception as error:
        raise StageFailed(f"{type(error).__name__}: {error}") from error
    finally:
        sys.argv = saved


def tail(log: Path) -> str:
    """The last lines of a failed command's output: 40 printed (the working folder goes when the
    script ends), the last 3 for RESULTS.md."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    print("\n".join(lines[-40:]))
    return " | ".join(lines[-3:])


def read_metrics(path: Path) -> dict[str, list[float]]:
    """Each logged metric's values in step order."""
    if not path.exists():
        raise StageFailed(f"no metrics.csv at {path}")
    values: dict[str, list[float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if value and key not in ("step", "epoch"):
                    values.setdefault(key, []).append(float(value))
    return values


def need(metrics: dict[str, list[float]], name: str) -> list[float]:
    if not metrics.get(name):
        raise StageFailed(f"{name} was never logged")
    return metrics[name]


def steady(values: list[float]) -> float:
    """The median of a rate once warm: its first fifth (compilation, warm-up) left out."""
    return statistics.median(values[len(values) // 5 :])


def plain_rates(path: Path, window: int = 5) -> list[float]:
    """plain_fit.py's steps/s at each logging step over the last ``window`` of them, as
    ``TrainingThroughput`` measures the project's."""
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train_seconds")]
    points = [(int(row["step"]), float(row["train_seconds"])) for row in rows]
    return [
        (step - points[i - window][0]) / (seconds - points[i - window][1])
        for i, (step, seconds) in enumerate(points)
        if i >= window
    ]


def environment(proof: Proof, stage: Stage) -> None:
    import lightning

    if proof.smoke:
        card = f"CPU ({os.cpu_count()} cores, --smoke)"
    elif not torch.cuda.is_available():
        raise StageFailed("no CUDA device: on a CPU run the smoke, --smoke")
    else:
        card = torch.cuda.get_device_name(0)
    stage.figures["card"] = card
    versions = f"torch {torch.__version__}, CUDA {torch.version.cuda}, Lightning {lightning.__version__}"
    stage.figures["versions"] = f"{versions}, Python {sys.version.split()[0]}"
    print(f"{card}, {versions}")
    try:
        import projkit.cli  # noqa: F401  (jsonargparse with it)
    except ImportError as error:
        raise StageFailed(
            f"cannot import projkit.cli ({error}): install the wheels kit/benchmarks/gpu_wheels.sh "
            "downloads and put kit/src and src on PYTHONPATH (kit/docs/benchmarks.md)"
        ) from None
    if proof.smoke and proof.corpus is None:
        proof.corpus = proof.work / "verse.txt"
        proof.corpus.write_text(VERSE * 60, encoding="utf-8")
    proof.corpus = Path(proof.corpus or CORPUS).resolve()
    if not proof.corpus.is_file():
        raise StageFailed(
            f"no corpus at {proof.corpus}: a first `fit --config configs/shakespeare_char_cpu.yaml` "
            "downloads it there (on a machine without network, copy the file there), or pass --corpus"
        )


def digits(proof: Proof, stage: Stage) -> None:
    args = [f"--config={ROOT / 'configs' / 'digits.yaml'}", GPU]
    if proof.smoke:
        args += [*CPU, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3"]
        args += ["--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1"]
    start = time.perf_counter()
    metrics = proof.fit("digits", args)
    accuracy = need(metrics, "test/acc")[-1]
    stage.figures["test/acc"] = f"{accuracy:.4f}"
    stage.figures["wall time, start to test metric"] = f"{time.perf_counter() - start:.1f} s"
    stage.goal("digits test/acc >= 0.95", accuracy >= 0.95, proof.smoke)


def fp16_scaler(proof: Proof, stage: Stage) -> None:
    args = [CONFIG, GPU, f"--data.init_args.path={proof.corpus}", "--trainer.precision=16-mixed"]
    args += ["--trainer.max_steps=300", "--trainer.val_check_interval=300", "--trainer.limit_val_batches=10"]
    args += ["--trainer.gradient_clip_val=0.1", "--model.init_args.num_samples=0", *NO_CHECKPOINTS]
    args += ["--trainer.callbacks+=gpu_proof.ScalerCheck"]
    if proof.smoke:
        args += [*(f"--{change}" for change in TINY_TEXT), *CPU, *CPU_SCALER]
    metrics = proof.fit("fp16_scaler", args)
    losses = need(metrics, "train/loss")
    if not all(map(math.isfinite, losses)):
        raise StageFailed(f"a non-finite train/loss among {losses}")
    scales = need(metrics, "train/grad_scale")
    check = json.loads((proof.work / "runs" / "fp16_scaler" / "version_0" / "scaler_check.json").read_text())
    if check["checked"] == 0:
        raise StageFailed(f"ScalerCheck checked no step: {check}")
    stage.figures["train/loss, first and last logged"] = f"{losses[0]:.4f}, {losses[-1]:.4f} (all finite)"
    stage.figures["train/grad_scale logged"] = (
        f"{len(scales)} times, from {scales[0]:g} to {scales[-1]:g} (lowest {check['min_scale']:g})"
    )
    stage.figures["steps checked: unscaled before clipping"] = (
        f"{check['checked']} of {check['steps']} ({check['clipped']} clipped, {check['skipped']} "
        "skipped by the scaler for non-finite gradients)"
    )


def no_syncs(proof: Proof, stage: Stage) -> None:
    """Twelve steps of each experiment on the first card, logging every 4, each synchronisation
    that CUDA itself reports (``torch.cuda.set_sync_debug_mode``) counted by
    ``projkit.testing.SyncCounter(cuda=True)``: an ordinary step (neither the first, nor logging,
    validating, checkpointing or ending an epoch) must make none."""
    if proof.smoke or not torch.cuda.is_available():
        stage.figures["syncs per ordinary step"] = "skipped: no CUDA (kit/tests/test_step_syncs.py counts)"
        return
    experiments = {"digits": [f"--config={ROOT / 'configs' / 'digits.yaml'}"],
                   "shakespeare_char": [CONFIG, f"--data.init_args.path={proof.corpus}"]}  # fmt: skip
    for name, config in experiments.items():
        found = proof.work / f"{name}-syncs.json"
        counter = f"{{class_path: projkit.testing.SyncCounter, init_args: {{path: '{found}', cuda: true}}}}"
        args = [*config, GPU, "--trainer.max_steps=12", "--trainer.log_every_n_steps=4"]
        args += ["--trainer.val_check_interval=12", "--trainer.limit_val_batches=2", *NO_CHECKPOINTS]
        args += [f"--trainer.callbacks+={counter}"]
        proof.fit(f"{name}-syncs", args)
        windows = json.loads(found.read_text())
        events = [f"batch {b}: {e['what']} at {e['where']}" for b, es in windows.items() for e in es]
        stage.figures[f"{name}: syncs per ordinary step"] = f"{len(events)} in {len(windows)} ordinary steps"
        if events or len(windows) < 5:
            raise StageFailed(f"{name}: {len(windows)} ordinary steps; " + "; ".join(events[:5]))


def shakespeare_char(proof: Proof, stage: Stage) -> None:
    args = [CONFIG, GPU, f"--data.init_args.path={proof.corpus}"]
    changes = TINY_TEXT if proof.smoke else []
    if proof.smoke:
        args += [*(f"--{change}" for change in changes), *CPU]
    start = time.perf_counter()
    metrics = proof.fit("shakespeare_char", args, budget=stage.budget - 35)
    wall = time.perf_counter() - start
    best = min(need(metrics, "val/loss"))
    tokens = need(metrics, "train/tokens_per_sec")
    batch_tokens = (4 * TINY_NET["block_size"]) if proof.smoke else 64 * 256
    proj_rate = steady(tokens) / batch_tokens
    stage.figures["best val/loss"] = f"{best:.4f} (goal <= 1.47; nanoGPT 1.4697)"
    stage.figures["wall time, start to test metric"] = f"{wall:.1f} s (nanoGPT: about 3 min on an A100)"
    stage.figures["train/tokens_per_sec, steady"] = f"{steady(tokens):,.0f}"
    mfu = metrics.get("train/mfu")
    stage.figures["train/mfu, steady"] = f"{steady(mfu):.1%}" if mfu else "n/a (no peak FLOP/s known)"
    stage.goal("shakespeare_char val/loss <= 1.47", best <= 1.47, proof.smoke)

    out = proof.work / "plain"
    steps = 8 if proof.smoke else 300
    plain = [sys.executable, str(BENCHMARKS / "plain_fit.py"), "--experiment=shakespeare_char"]
    plain += [f"--out={out}", f"--corpus={proof.corpus}", f"--steps={steps}"]
    plain += ["--device=cpu" if proof.smoke else "--device=cuda"]
    plain += [f"--set={change}" for change in changes]
    proof.run(plain)
    plain_rate = steady(plain_rates(out / "metrics.csv"))
    stage.figures[f"steps/s, steady: {proof.project.package} / plain_fit.py"] = (
        f"{proj_rate:.2f} / {plain_rate:.2f} = {proj_rate / plain_rate:.3f}"
    )


def random_text(path: Path, vocab: int, length: int) -> None:
    """Random characters, each of ``vocab`` distinct ones at least once (a newline, the model's
    sample prompt, then from U+0100 on: no other control character, no surrogate), so the
    character data module reads them as ``vocab`` tokens."""
    chars = ["\n", *(chr(0x100 + i) for i in range(vocab - 1))]
    rng = random.Random(0)
    text = chars + rng.choices(chars, k=length - vocab)
    rng.shuffle(text)
    path.write_text("".join(text), encoding="utf-8")


def config_net(config: str) -> type:
    """The network class an experiment's config (``--config=PATH``) trains: its ``class_path``."""
    loaded = strict_yaml.read(config.removeprefix("--config="))
    module, _, name = loaded["model"]["init_args"]["net"]["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)


def gpt2_small(proof: Proof, stage: Stage) -> None:
    from projkit.callbacks.throughput import training_flops

    GPT = config_net(CONFIG)
    net, batch, steps = (TINY_NET, 2, 8) if proof.smoke else (GPT2, GPT2_BATCH, 100)
    text = proof.work / "random_tokens.txt"
    random_text(text, GPT2_VOCAB, max(2 * GPT2_VOCAB, 20 * batch * net["block_size"]))
    with torch.device("meta"):
        params = sum(p.numel() for p in GPT(GPT2_VOCAB, **net).parameters())
    stage.figures["network"] = (
        f"GPT {net['n_layer']} layers, {net['n_head']} heads, {net['n_embd']} wide, block "
        f"{net['block_size']}, vocabulary {GPT2_VOCAB}: {params / 1e6:.1f} M parameters; batches of {batch}"
    )
    args = [CONFIG, GPU, f"--data.init_args.path={text}", f"--data.init_args.batch_size={batch}"]
    args += [f"--{NET}.{key}={value}" for key, value in net.items()]
    args += [f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0", *NO_CHECKPOINTS]
    args += ["--model.init_args.num_samples=0"]
    args += ["--model.init_args.compile=false"] if proof.smoke else ["--model.init_args.compile=true"]
    if proof.smoke:
        args += [*CPU, "--trainer.log_every_n_steps=1", "--trainer.precision=32-true"]
    inputs = torch.zeros(batch, net["block_size"], dtype=torch.long)
    flops = {}
    for checkpointing in (False, True):
        with torch.device("meta"):
            flops[checkpointing] = training_flops(
                GPT(GPT2_VOCAB, **net, activation_checkpointing=checkpointing).train(), inputs
            )
        name = "gpt2_small_checkpointing" if checkpointing else "gpt2_small"
        flag = f"--{NET}.activation_checkpointing={str(checkpointing).lower()}"
        start = time.perf_counter()
        metrics = proof.fit(name, [*args, flag], budget=stage.budget / 2)
        wall = time.perf_counter() - start
        tokens = need(metrics, "train/tokens_per_sec")[-1]
        memory = max(need(metrics, "train/peak_memory_mb"))
        shown = "with" if checkpointing else "without"
        summary = f"{tokens:,.0f} tokens/s, peak memory {memory / 1024:.2f} GiB"
        mfu = metrics.get("train/mfu")
        if mfu:
            model_mfu = mfu[-1] * flops[False] / flops[checkpointing]
            summary += f", MFU {model_mfu:.1%}"
            if checkpointing:
                summary += f" ({mfu[-1]:.1%} counting the recomputed forward)"
            stage.goal(f"gpt2_small MFU >= 45 % {shown} checkpointing", model_mfu >= 0.45, proof.smoke)
        else:
            summary += ", MFU n/a (no peak FLOP/s known)"
        stage.figures[f"{shown} activation checkpointing"] = f"{summary}; {wall:.0f} s with compiling"


# name, seconds, what it runs: 520 s in all, under 9 minutes.
STAGES: list[tuple[str, float, Callable[[Proof, Stage], None]]] = [
    ("environment", 15, environment),
    ("no_syncs", 40, no_syncs),  # two runs of 12 steps
    ("digits", 45, digits),
    ("fp16_scaler", 40, fp16_scaler),
    ("shakespeare_char", 220, shakespeare_char),  # the project's fit 185 s at most, plain_fit.py the rest
    ("gpt2_small", 160, gpt2_small),  # 80 s a run, compiling included
]


def write_results(path: Path, stages: list[Stage], argv: Sequence[str], started: datetime.datetime) -> None:
    card = stages[0].figures.get("card", "?")
    total = sum(stage.seconds for stage in stages)
    budget = sum(stage.budget for stage in stages)
    command = " ".join(["python", "kit/benchmarks/gpu_proof.py", *argv])
    failed = [stage for stage in stages if stage.failure]
    missed = [goal for stage in stages for goal in stage.missed]
    verdict = "FAILED at " + failed[0].name if failed else ("goals missed" if missed else "all passed")
    lines = [
        "# GPU proof",
        "",
        f"`{command}` on {card}, {started:%Y-%m-%d %H:%M} UTC: {verdict}, {total:.0f} s "
        f"(budget {budget:.0f} s). {stages[0].figures.get('versions', '')}.",
        "",
    ]
    if missed:
        lines += ["Goals missed: " + "; ".join(missed) + ".", ""]
    for stage in stages:
        lines += [f"## {stage.name}: {stage.seconds:.0f} s of {stage.budget:.0f} s", ""]
        lines += [f"- {name}: {value}" for name, value in stage.figures.items()]
        if stage.failure:
            lines.append(f"- FAILED: {stage.failure}")
        if stage.commands:
            lines += ["", "```bash", *stage.commands, "```"]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--smoke", action="store_true", help="every stage for a few steps on the CPU")
    options.add_argument("--corpus", help=f"Tiny Shakespeare's input.txt (default: {CORPUS})")
    options.add_argument("--results", type=Path, help=f"where to write the results (default: {RESULTS})")
    names = [name for name, _, _ in STAGES]
    options.add_argument("--from", dest="first", choices=names[1:], help="skip the stages before this one")
    argv = sys.argv[1:] if argv is None else argv
    args = options.parse_args(argv)
    if args.smoke and args.results is None:
        options.error("--smoke writes its results only where --results says, never over RESULTS.md")
    started = datetime.datetime.now(datetime.timezone.utc)
    chosen = STAGES if args.first is None else [STAGES[0], *STAGES[names.index(args.first) :]]
    stages: list[Stage] = []
    with tempfile.TemporaryDirectory(prefix="gpu_proof-") as folder:
        proof = Proof(args, Path(folder))
        for name, budget, function in chosen:
            stage = proof.stage = Stage(name, budget)
            stages.append(stage)
            start = time.perf_counter()
            proof.deadline = start + budget
            try:
                function(proof, stage)
            except StageFailed as error:
                stage.failure = str(error)
            stage.seconds = time.perf_counter() - start
            # The budgets are a GPU's: on the smoke's CPU they mean nothing.
            if stage.failure is None and stage.seconds > budget and not args.smoke:
                stage.failure = f"over its budget: {stage.seconds:.0f} s"
            status = f"FAILED: {stage.failure}" if stage.failure else "ok"
            print(f"[{name}] {stage.seconds:.1f} s of {budget:.0f} s: {status}", flush=True)
            for figure, value in stage.figures.items():
                print(f"    {figure}: {value}")
            if stage.failure:
                break
        write_results(args.results or RESULTS, stages, argv, started)
    missed = [goal for stage in stages for goal in stage.missed]
    if missed:
        print("goals missed: " + "; ".join(missed))
    print(f"results: {args.results or RESULTS}")
    return 1 if stages[-1].failure or missed else 0


if __name__ == "__main__":
    sys.exit(main())
