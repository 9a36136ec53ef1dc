"""Training throughput: samples/s and tokens/s that match the real step rate, MFU from FLOPs counted on
the meta device against an explicit peak or the dense peak of a known GPU."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger

from conftest import main
from projkit.callbacks import TrainingThroughput
from projkit.callbacks.throughput import peak_flops, training_flops
from projkit.testing import config
from tinyproj.data import Blobs, Chars
from tinyproj.models import Classifier, LanguageModel
from tinyproj.nets import MLP, TinyGPT

PEAK = 1e11  # an explicit peak FLOP/s: Lightning knows none for a CPU


class Clock(Callback):
    """The time at the end of each training batch, read just before TrainingThroughput reads it."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times[trainer.global_step] = time.perf_counter()


def fit(model, datamodule, throughput: TrainingThroughput, folder: Path):
    """Nine steps, logging every second one (Lightning writes no step metrics for the last step)."""
    seed_everything(0)
    clock = Clock()
    trainer = Trainer(
        max_steps=9,
        log_every_n_steps=2,
        limit_val_batches=0,
        logger=CSVLogger(folder, name="run", version=0),
        callbacks=[clock, throughput],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=datamodule)
    rows: dict[int, dict[str, str]] = {}
    with open(folder / "run" / "version_0" / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(int(row["step"]), {}).update({k: v for k, v in row.items() if v})
    return clock, rows


def logged(rows: dict[int, dict[str, str]], name: str) -> dict[int, float]:
    """A metric by the step Lightning wrote it at (one less than the optimizer steps taken)."""
    return {step + 1: float(row[name]) for step, row in rows.items() if row.get(name)}


@pytest.mark.slow
def test_image_fit_logs_samples_per_sec_at_the_real_rate_and_mfu_against_the_given_peak(tmp_path):
    datamodule = Blobs(batch_size=16)
    model = Classifier(MLP(4, (1, 4, 4)), num_classes=4)
    throughput = TrainingThroughput(available_flops=PEAK, window=2)
    clock, rows = fit(model, datamodule, throughput, tmp_path)
    samples = logged(rows, "train/samples_per_sec")
    assert sorted(samples) == [4, 6, 8]  # from the second logging step, over the last two steps
    for step, rate in samples.items():
        measured = 2 * 16 / (clock.times[step] - clock.times[step - 2])
        assert rate == pytest.approx(measured, rel=0.1)
    assert throughput.flops_per_batch == training_flops(model.net, torch.zeros(16, 1, 4, 4))
    for step, mfu in logged(rows, "train/mfu").items():
        assert mfu == pytest.approx(throughput.flops_per_batch * samples[step] / 16 / PEAK, rel=1e-6)
    assert all(value > 0 for value in logged(rows, "train/peak_memory_mb").values())


@pytest.mark.slow
def test_text_fit_logs_tokens_per_sec_and_no_mfu_without_a_peak(tmp_path):
    text = tmp_path / "verse.txt"
    text.write_text("Shall I compare thee to a summer's day?\n" * 40, encoding="utf-8")
    datamodule = Chars(path=str(text), block_size=16, batch_size=4)
    net = TinyGPT(datamodule.vocab_size, block_size=16, n_head=2, n_embd=16)
    model = LanguageModel(net, datamodule.vocab)
    _, rows = fit(model, datamodule, TrainingThroughput(count_tokens=True, window=2), tmp_path)
    samples, tokens = logged(rows, "train/samples_per_sec"), logged(rows, "train/tokens_per_sec")
    assert sorted(tokens) == [4, 6, 8]
    assert all(tokens[step] == pytest.approx(16 * samples[step]) for step in tokens)
    assert not logged(rows, "train/mfu")


# One device's dense bf16/fp16 peak (half the datasheet's figure "with sparsity"), by the name CUDA
# reports: the H200s and the H100 NVL from the template's own table, the others from Lightning's.
DENSE_PEAKS = [
    ("NVIDIA H200", torch.bfloat16, 989.5e12),
    ("NVIDIA H200 NVL", torch.bfloat16, 835.5e12),
    ("NVIDIA H100 NVL", torch.float16, 835.5e12),
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4e12),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756e12),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12),
    ("NVIDIA A100 80GB PCIe", torch.float16, 312e12),
]


@pytest.mark.parametrize(("name", "dtype", "dense"), DENSE_PEAKS)
def test_mfu_is_measured_against_the_dense_peak_of_common_gpus(name, dtype, dense, monkeypatch):
    """No flag needed on these cards, and never the sparse peak, which would halve MFU. There is
    no GPU here, so CUDA's device name is the one thing stood in for."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda"), dtype) == pytest.approx(dense, rel=1e-3)


@pytest.mark.parametrize(("matmul_precision", "dense"), [("high", 494.5e12), ("highest", 67e12)])
def test_an_h200_in_float32_is_measured_against_tf32_unless_matmuls_are_exact(
    matmul_precision, dense, monkeypatch
):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmul_precision)
    try:
        assert peak_flops(torch.device("cuda"), torch.float32) == dense
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.slow
def test_peak_flops_are_set_by_a_flag(workdir):
    """The README's way to give MFU the peak of a GPU no table knows."""
    flag = "--throughput.available_flops=989e12"
    cli = main(["--config", config("lm.yaml"), flag], run=False)
    (monitor,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, TrainingThroughput)]
    assert monitor.available_flops == 989e12


def test_a_peak_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="available_flops must be positive or null"):
        TrainingThroughput(available_flops=0)


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("32-true", torch.float32), ("bf16-mixed", torch.bfloat16), ("64-true", torch.float64)],
)
def test_mfu_is_measured_against_the_precisions_own_dtype(precision, dtype):
    """One of the two private Lightning functions the template calls (Lightning offers no public way
    to ask a precision plugin its compute dtype): this fails when Lightning moves or changes it."""
    from projkit.internals.lightning import compute_dtype

    trainer = Trainer(accelerator="cpu", precision=precision, logger=False, enable_progress_bar=False)
    assert compute_dtype(trainer) == dtype
