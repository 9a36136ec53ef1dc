"""Training speed, model FLOPs utilisation and peak memory, measured without slowing training."""

from __future__ import annotations

import copy
import sys
import time
from typing import Any

import torch
from lightning.fabric.utilities.throughput import Throughput, get_available_flops, measure_flops
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from projkit.internals.lightning import compute_dtype

# Lightning's Throughput names (global where there are several processes, else "device/…") → ours.
RATES = {"samples_per_sec": "samples_per_sec", "items_per_sec": "tokens_per_sec", "mfu": "mfu"}


class TrainingThroughput(Callback):
    """Logs, on the steps the loggers write: ``train/samples_per_sec`` (all processes together),
    ``train/tokens_per_sec`` with ``count_tokens`` (input positions: batch × sequence length),
    ``train/mfu`` (model FLOPs utilisation) where the device's peak is known, and
    ``train/peak_memory_mb`` (CUDA's peak allocation, or on a CPU the process's peak resident memory).

    Rates come from Lightning's ``Throughput`` over the last ``window`` logging steps, with the time
    spent validating left out. The FLOPs of one training step are counted once, on the first batch,
    by Lightning's ``measure_flops`` on a meta-device copy of the module's ``net`` (a forward and a
    backward pass, no memory and no compute; with activation checkpointing the recomputed forward
    counts too). ``available_flops`` is one device's dense peak FLOP/s at the run's precision; null
    looks it up by the GPU's name (``peak_flops``: H200s and the H100 NVL here, other common GPUs in
    Lightning's table). On a CPU there is no table, so MFU needs the peak passed.

    Lightning's own ``ThroughputMonitor`` calls ``torch.cuda.synchronize()`` after every batch,
    which idles a GPU whose host would otherwise be queuing the next step, and logs validation and
    test rates against batch indices instead of steps. Here the clock is read, and the device
    synchronised, only on logging steps, and only training is measured.
    """

    def __init__(
        self, count_tokens: bool = False, available_flops: float | None = None, window: int = 5
    ) -> None:
        if window < 2:
            raise ValueError(f"TrainingThroughput.window must be at least 2 logging steps, got {window}")
        if available_flops is not None and available_flops <= 0:
            raise ValueError(
                f"TrainingThroughput.available_flops must be positive or null, got {available_flops}"
            )
        self.count_tokens = count_tokens
        self.available_flops = available_flops
        self.window = window
        self.flops_per_batch: int | None = None
        self._throughput: Throughput | None = None
        self._reset()

    def _reset(self) -> None:
        self._start = time.perf_counter()
        self._paused = 0.0
        self._validation_start: float | None = None
        self._batches = self._samples = self._tokens = 0
        self._batches_at_update = 0
        self._step = -1

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        peak = self.available_flops
        device = trainer.strategy.root_device
        if peak is None:
            peak = peak_flops(device, compute_dtype(trainer))
            if peak is None and device.type == "cuda":
                rank_zero_warn(
                    f"No peak FLOP/s known for {torch.cuda.get_device_name(device)}, so no train/mfu is "
                    "logged: set available_flops of projkit.callbacks.TrainingThroughput (one "
                    "device's dense peak at the run's precision, from its datasheet: half the "
                    "figure 'with sparsity'), e.g. `throughput: {available_flops: 312e12}` in a "
                    "config, or --throughput.available_flops=312e12."
                )
        self._throughput = Throughput(
            available_flops=peak, world_size=trainer.world_size, window_size=self.window
        )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._reset()
        self._throughput.reset()
        self._step = trainer.global_step

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._validation_start is not None:
            self._paused += time.perf_counter() - self._validation_start
            self._validation_start = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        inputs = batch[0] if isinstance(batch, (list, tuple)) else batch
        if self.flops_per_batch is None:
            self.flops_per_batch = self._count_flops(pl_module, inputs)
        self._batches += 1
        self._samples += len(inputs)
        if self.count_tokens:
            self._tokens += inputs.numel()
        step = trainer.global_step
        if step == self._step:
            return  # accumulating gradients: no optimizer step in this batch
        self._step = step
        every = trainer.log_every_n_steps
        if every <= 0 or step % every:
            return
        self._update(trainer, pl_module)

    def _update(self, trainer: Trainer, pl_module: LightningModule) -> None:
        device = pl_module.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - self._start - self._paused
        batches = self._batches - self._batches_at_update
        self._batches_at_update = self._batches
        self._throughput.update(
            time=elapsed,
            batches=self._batches,
            samples=self._samples,
            lengths=self._tokens if self.count_tokens else None,
            flops=self.flops_per_batch * batches if self.flops_per_batch else None,
        )
        rates = self._throughput.compute()
        metrics = {"train/peak_memory_mb": peak_memory_mb(device)}
        for key, name in RATES.items():
            value = rates.get(key, rates.get(f"device/{key}"))
            if value is not None:
                metrics[f"train/{name}"] = value
        # Straight to the loggers, at the step this step's other metrics get, as Lightning's
        # LearningRateMonitor does: through self.log each value would cost half a millisecond.
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=logged_step(trainer))

    def _count_flops(self, pl_module: LightningModule, inputs: torch.Tensor) -> int:
        net = getattr(pl_module, "net", None)
        if not isinstance(net, nn.Module) or not isinstance(inputs, torch.Tensor):
            return 0
        try:
            return training_flops(net, inputs)
        except Exception as error:
            rank_zero_warn(
                f"Could not count {type(net).__name__}'s FLOPs, so no train/mfu is logged: {error}"
            )
            return 0


def training_flops(net: nn.Module, inputs: torch.Tensor) -> int:
    """FLOPs of one forward and backward pass of ``net`` on a batch shaped like ``inputs``.

    Counted by Lightning's ``measure_flops`` on a copy of ``net`` whose parameters and buffers are
    empty meta tensors (shared weights stay shared), so the real weights, their gradients and the
    device's memory are left alone.
    """
    memo: dict[int, Any] = {}
    for p in net.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in net.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    meta = copy.deepcopy(net, memo)
    x = torch.empty_like(inputs, device="meta")
    # Anomaly detection (the debug overlay) would read the meta gradients' values, which have none.
    with torch.autograd.set_detect_anomaly(False):
        return measure_flops(meta, lambda: meta(x), lambda y: y.sum())


# Dense peak FLOP/s (no 2:4 sparsity: half the datasheets' headline tensor-core figures) by compute
# dtype, for the GPUs that Lightning 2.6's table misses or holds the sparse peak of, which would halve
# MFU (Lightning-AI/pytorch-lightning#21677): its "h200 sxm1" entry, which no H200's name ("NVIDIA
# H200") reaches, and its "h100 nvl" are sparse. Its H100 SXM and PCIe and A100 entries are dense
# (tests/test_throughput.py checks them). Keys: words of the device's name, the most specific first.
# The H200 NVL and the H100 NVL share one datasheet's figures.
NVL_PEAKS: dict[torch.dtype | str, float] = {
    torch.float64: 30e12,
    torch.float32: 60e12,
    "tfloat32": 417.5e12,
    torch.bfloat16: 835.5e12,
    torch.float16: 835.5e12,
    torch.int8: 1670.5e12,
}
DENSE_PEAKS: dict[tuple[str, ...], dict[torch.dtype | str, float]] = {
    ("h200", "nvl"): NVL_PEAKS,
    ("h100", "nvl"): NVL_PEAKS,
    ("h200",): {
        torch.float64: 34e12,
        torch.float32: 67e12,
        "tfloat32": 494.5e12,
        torch.bfloat16: 989.5e12,
        torch.float16: 989.5e12,
        torch.int8: 1979e12,
    },
}


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """One device's dense peak FLOP/s at ``dtype``, by the GPU's name: ``DENSE_PEAKS``, else
    Lightning's table (``get_available_flops``); None where neither knows it."""
    if device.type == "cuda":
        words = set(torch.cuda.get_device_name(device).lower().split())
        for chip, peaks in DENSE_PEAKS.items():
            if words.issuperset(chip):
                # float32 matmuls run on TF32 tensor cores unless the precision is "highest" (as in
                # Lightning's lookup; every card above is Ampere or later).
                tf32 = dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest"
                return peaks.get("tfloat32" if tf32 else dtype)
    return get_available_flops(device, dtype)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if sys.platform == "win32":
        return float("nan")  # no getrusage
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB on Linux


def logged_step(trainer: Trainer) -> int:
    """The step Lightning gives the metrics logged in an optimizer step's ``on_train_batch_end``:
    the count of optimizer steps before it (``global_step`` already counts this one)."""
    return trainer.global_step - 1
