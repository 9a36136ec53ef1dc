"""AdamW parameter groups and the learning-rate schedule."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from conftest import main
from projkit.optim import WarmupCosineLR, fused_where_supported, param_groups
from projkit.testing import config
from tinyproj.models import Classifier
from tinyproj.nets import MLP

QUICK = ("--trainer.limit_val_batches=1", "--test_after_fit=false", "--trainer.enable_progress_bar=false")


def test_biases_and_norms_get_no_weight_decay():
    model = Classifier(MLP(4, (1, 4, 4)), num_classes=4)
    model.trainer = None
    optimizer = model.optimizer(param_groups(model))
    decayed, plain = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed_names = {names[id(p)] for p in decayed["params"]}
    plain_names = {names[id(p)] for p in plain["params"]}
    assert decayed["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    assert all(n.endswith("weight") for n in decayed_names)
    assert "net.2.weight" in plain_names, "LayerNorm gains must not decay"
    assert any(n.endswith("bias") for n in plain_names)
    assert decayed_names.isdisjoint(plain_names)
    assert decayed_names | plain_names == set(names.values())


def test_frozen_parameters_are_left_out_of_the_optimizer():
    net = MLP(4, (1, 4, 4))
    *features, head = net.children()
    for layer in features:
        layer.requires_grad_(False)
    groups = param_groups(net)
    in_optimizer = {id(p) for g in groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in head.parameters()}


def test_fused_adamw_updates_as_the_default_does_and_takes_its_checkpoint():
    """The fused kernel the kit picks agrees with torch's default to rounding and keeps the groups'
    decay; given an optimizer state the default wrote (a run of an earlier kit), it continues on the
    implementation the state names, as that run would have."""
    torch.manual_seed(0)
    net = MLP(input_shape=(1, 4, 4), num_classes=3)
    groups = param_groups(net)
    start = [p.detach().clone() for p in net.parameters()]
    default = torch.optim.AdamW([dict(g) for g in groups], lr=0.01, weight_decay=0.1)
    twin = MLP(input_shape=(1, 4, 4), num_classes=3)
    twin.load_state_dict(net.state_dict())
    net.eval(), twin.eval()  # no dropout: the same gradients on both sides
    twin_groups = param_groups(twin)
    unfused = torch.optim.AdamW([dict(g) for g in twin_groups], lr=0.01, weight_decay=0.1)
    fused = fused_where_supported(unfused, twin_groups)
    assert fused.defaults["fused"] is True and [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]
    for step in range(6):
        x = torch.randn(8, 1, 4, 4)
        for model, optimizer in ((net, default), (twin, fused)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        if step == 2:  # the fused one resumes from the default's state
            fused.load_state_dict(copy.deepcopy(default.state_dict()))  # as read from a file
            assert [g["fused"] for g in fused.param_groups] == [None, None]
            twin.load_state_dict(net.state_dict())
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(not torch.equal(p, s) for p, s in zip(net.parameters(), start, strict=True))


def test_fused_is_picked_only_for_torchs_adam_unless_the_config_chose():
    net = MLP(input_shape=(1, 4, 4), num_classes=3)
    groups = param_groups(net)

    def built(cls: type, **kwargs) -> torch.optim.Optimizer:
        return fused_where_supported(cls([dict(g) for g in groups], lr=0.01, **kwargs), groups)

    assert built(torch.optim.Adam).defaults["fused"] is True
    assert built(torch.optim.AdamW, fused=False).defaults["fused"] is False
    assert built(torch.optim.AdamW, foreach=True).defaults["fused"] is None
    assert built(torch.optim.SGD).defaults["fused"] is None


def lr_curve(steps: int, **kwargs) -> list[float]:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = WarmupCosineLR(optimizer, **kwargs)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_warmup_then_cosine_to_the_floor():
    lrs = lr_curve(120, warmup_steps=10, total_steps=100, min_lr_ratio=0.1)
    assert lrs[0] == 0.0
    assert lrs[:11] == pytest.approx([i / 10 for i in range(11)])
    assert all(a > b for a, b in itertools.pairwise(lrs[10:101]))
    assert lrs[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[100:] == pytest.approx([0.1] * 20)


@pytest.mark.slow
def test_schedule_spans_the_trainers_optimizer_steps(workdir):
    cli = main(
        [
            "fit",
            "--config",
            config("classify.yaml"),
            "--trainer.max_epochs=3",
            "--trainer.limit_train_batches=4",
            "--trainer.accumulate_grad_batches=2",
            "--model.init_args.scheduler.init_args.warmup_steps=2",
            *QUICK,
        ]
    )
    scheduler = cli.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.optimizer is cli.trainer.optimizers[0]
    assert cli.trainer.optimizers[0].defaults["fused"] is True  # torch's fused AdamW on the CPU
    assert scheduler.total_steps == 6  # 3 epochs x 4 batches / 2 accumulated
    assert cli.trainer.global_step == 6
    final_lr = cli.trainer.optimizers[0].param_groups[0]["lr"]
    assert final_lr == pytest.approx(0.01 * 0.1)  # classify.yaml's lr, WarmupCosineLR's floor


@pytest.mark.slow
def test_reduce_on_plateau_is_stepped_per_epoch_on_its_monitor(workdir):
    cli = main(
        [
            "fit",
            "--config",
            config("classify.yaml"),
            "--model.init_args.scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau",
            "--model.init_args.scheduler.init_args.patience=0",
            "--model.init_args.scheduler.init_args.threshold=10",
            "--trainer.max_epochs=3",
            "--trainer.limit_train_batches=2",
            *QUICK,
        ]
    )
    scheduler_config = cli.trainer.lr_scheduler_configs[0]
    assert scheduler_config.interval == "epoch"
    assert scheduler_config.monitor == "val/loss"
    # threshold=10 makes every epoch count as a plateau, so each epoch end cuts the LR by 10x.
    assert cli.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01 * 0.1**3)
