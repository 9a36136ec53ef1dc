"""Mixed precision comes from the Trainer: bf16-mixed trains on CPU with fp32 master weights, and
under fp16 with a gradient scaler the gradients are unscaled before they are clipped."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

import probes
from conftest import main
from projkit.testing import config

QUIET = ("--trainer.enable_progress_bar=false", "--test_after_fit=false")
# Plain SGD with lr 1 and no decay, so a step moves the weights by exactly the clipped gradient.
ONE_STEP = (
    "--model.init_args.net.init_args.dropout=0.0",
    "--data.init_args.augment=false",
    "--model.init_args.optimizer=torch.optim.SGD",
    "--model.init_args.optimizer.init_args.lr=1.0",
    "--model.init_args.optimizer.init_args.weight_decay=0.0",
    "--model.init_args.scheduler=null",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    *QUIET,
)
FP16_WITH_SCALER = (
    "--trainer.precision=null",
    "--trainer.plugins=lightning.pytorch.plugins.MixedPrecision",
    "--trainer.plugins.init_args.precision=16-mixed",
    "--trainer.plugins.init_args.device=cpu",
)


class UpdateSize(Callback):
    """The norm of how far each optimizer step moved the weights."""

    def __init__(self) -> None:
        self.sizes: list[float] = []

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        self.before = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx
    ) -> None:
        moved = [p.detach() - b for p, b in zip(pl_module.parameters(), self.before, strict=True)]
        self.sizes.append(torch.linalg.vector_norm(torch.cat([m.flatten() for m in moved])).item())


@pytest.mark.slow
def test_bf16_mixed_trains_on_cpu_with_fp32_master_weights(workdir):
    cli = main(["fit", "--config", config("classify.yaml"), "--trainer.precision=bf16-mixed",
                "--trainer.max_epochs=4", "--trainer.enable_progress_bar=false"])  # fmt: skip
    assert cli.trainer.callback_metrics["test/acc"] > 0.9
    last = torch.load(workdir / "runs/classify/version_0/checkpoints/last.ckpt", weights_only=True)
    assert {v.dtype for v in last["state_dict"].values() if v.is_floating_point()} == {torch.float32}


def fit_one_step(precision: tuple[str, ...], folder: str, clip: float) -> tuple[dict, list[float]]:
    cli = main(["--config", config("classify.yaml"), *ONE_STEP, *precision,
                f"--trainer.gradient_clip_val={clip}"], run=False)  # fmt: skip
    updates = UpdateSize()
    cli.trainer.callbacks += [probes.SaveGradients(folder), updates]
    cli.trainer.fit(cli.model, cli.datamodule)
    return torch.load(f"{folder}/rank0.pt", weights_only=True)["grads"], updates.sizes


@pytest.mark.slow
def test_fp16_gradients_are_unscaled_before_they_are_clipped(workdir):
    clip = 1e-3
    fp32_grads, _ = fit_one_step(("--trainer.precision=32-true",), str(workdir / "fp32"), clip)
    fp16_grads, updates = fit_one_step(FP16_WITH_SCALER, str(workdir / "fp16"), clip)

    # What clipping (and the logged norm) sees: the true gradient, not 65536 times it.
    norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in fp32_grads.values()]))
    fp16_norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in fp16_grads.values()]))
    assert fp16_norm.item() == pytest.approx(norm.item(), rel=0.02)
    assert norm > 100 * clip
    # Each applied step moved the weights by the clip value: clipped after unscaling. (The scaler
    # skips a step whose scaled gradients overflowed; that step moves nothing.)
    assert all(size == pytest.approx(clip, rel=1e-3) or size == 0.0 for size in updates)
    assert any(size > 0 for size in updates)
