"""A diverging run stops at the first non-finite loss and leaves only finite checkpoints."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel

from conftest import TASKS, main
from projkit.reliability import DivergenceError, StopOnDivergence
from projkit.testing import config, step_checkpoints

EVERY_STEP = "trainer:\n  callbacks+:" + step_checkpoints(1)
DIVERGE = [
    "--model.init_args.optimizer.init_args.lr=1e6",
    "--model.init_args.scheduler=null",
    "--trainer.gradient_clip_val=null",
]
# The language model's first validation ends its first epoch: the run diverges long before.
ARGS = {"image": (), "text": ("--trainer.max_steps=100",)}


@pytest.mark.slow
@pytest.mark.parametrize("task", ["image", "text"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_divergence_stops_at_the_step_and_keeps_finite_checkpoints(precision, task, workdir):
    experiment, name = TASKS[task]
    overlay = workdir / "every_step.yaml"
    overlay.write_text(EVERY_STEP)
    with pytest.raises(DivergenceError) as error:
        main(["fit", "--config", config(experiment), "--config", str(overlay), *DIVERGE, *ARGS[task],
              f"--trainer.precision={precision}", "--trainer.enable_progress_bar=false"])  # fmt: skip
    message = str(error.value)
    assert "learning rate" in message and precision in message
    assert "bad input data" in message and "--ckpt_path last" in message
    step = int(message.split(" step ")[1].split()[0])
    checkpoints = list((workdir / "runs" / name / "version_0" / "checkpoints").glob("*.ckpt"))
    assert checkpoints
    for path in checkpoints:
        state = torch.load(path, weights_only=True)
        assert state["global_step"] <= step
        # The network's weights; a metric's state (the best accuracy so far starts at -inf) is no weight.
        weights = [
            v for k, v in state["state_dict"].items() if k.startswith("net.") and v.is_floating_point()
        ]
        assert weights and all(torch.isfinite(v).all() for v in weights)


@pytest.mark.slow
def test_a_diverged_run_says_why_in_one_line_and_keeps_its_checkpoints(workdir, monkeypatch, capsys):
    """As a user sees it (no ``PROJ_DEBUG``): the reason and the way back, exit status 1, no traceback;
    the run directory stays, with the checkpoints from before the divergence to resume from."""
    overlay = workdir / "every_step.yaml"
    overlay.write_text(EVERY_STEP)
    monkeypatch.delenv("PROJ_DEBUG")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config("classify.yaml"), "--config", str(overlay), *DIVERGE,
              "--trainer.enable_progress_bar=false"])  # fmt: skip
    assert exit_info.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(
        ("error: The training loss is ", "error: The weights became")
    ), errors
    assert "learning rate" in errors[0] and "--ckpt_path last" in errors[0]
    assert list((workdir / "runs" / "classify" / "version_0" / "checkpoints").glob("*.ckpt"))


class NonFiniteAt(BoringModel):
    """Lightning's boring model, whose gradients at ``step`` get a NaN and an infinity."""

    def __init__(self, step: int | None) -> None:
        super().__init__()
        self.bad_step = step

    def on_after_backward(self) -> None:
        if self.global_step == self.bad_step:
            self.layer.weight.grad[0, 0] = float("nan")
            self.layer.bias.grad[1] = float("inf")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1)


class Gradients(Callback):
    """The gradients the optimizer is about to take, each step's, as bits."""

    def __init__(self) -> None:
        self.steps: list[list[torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.steps.append([p.grad.clone().view(torch.int32) for p in pl_module.parameters()])


def gradients_of(step: int | None, guarded: bool, steps: int = 4) -> list[list[torch.Tensor]]:
    seed_everything(0)
    seen = Gradients()
    callbacks = [StopOnDivergence(), seen] if guarded else [seen]
    trainer = Trainer(max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=50,
                      limit_val_batches=0)  # fmt: skip
    try:
        trainer.fit(NonFiniteAt(step))
    except DivergenceError:
        assert guarded and step is not None
    return seen.steps


def test_a_non_finite_steps_gradients_are_zeroed_and_a_finite_steps_are_left_bit_for_bit():
    """The guard's only effect on the gradients: the step with a NaN and an infinity in them takes
    zeros in every parameter; every other step's are the unguarded run's, to the bit."""
    plain = gradients_of(None, guarded=False)
    guarded = gradients_of(2, guarded=True)
    assert len(guarded) == 4
    for step in (0, 1):
        assert all(torch.equal(a, b) for a, b in zip(plain[step], guarded[step], strict=True)), step
    assert all(not grad.any() for grad in guarded[2])
    assert all(torch.equal(a, b) for a, b in zip(plain[0], gradients_of(None, guarded=True)[0], strict=True))
