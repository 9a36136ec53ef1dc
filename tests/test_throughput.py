"""Throughput on this project's experiments: the GPT's FLOPs, counted on the meta device, match its
closed form, and every experiment config logs samples/s (and tokens/s for text). The callback itself
is the kit's (kit/tests/test_throughput.py)."""

from __future__ import annotations

import pytest
import torch
from projkit.callbacks import TrainingThroughput
from projkit.callbacks.throughput import training_flops
from projkit.testing import config

from conftest import each_experiment, experiment_args
from proj import main
from proj.nets import GPT


@pytest.mark.slow
def test_gpt_flops_counted_on_the_meta_device_match_the_closed_form():
    vocab, block, layers, width, batch = 65, 64, 4, 128, 12
    gpt = GPT(vocab, block_size=block, n_layer=layers, n_head=4, n_embd=width)
    weights = {name: p.clone() for name, p in gpt.named_parameters()}
    flops = training_flops(gpt, torch.zeros(batch, block, dtype=torch.long))
    # Forward + backward = 3 × forward: 2 FLOPs per multiply-add with every matrix (12·d² per
    # layer, and the output layer tied to the embedding), plus attention's two T×T products.
    matrices = layers * 12 * width**2 + vocab * width
    expected = 6 * batch * block * matrices + 12 * layers * batch * block**2 * width
    assert flops == pytest.approx(expected, rel=1e-3)
    assert all(p.grad is None and torch.equal(p, weights[name]) for name, p in gpt.named_parameters())


@pytest.mark.slow
@pytest.mark.parametrize("experiment", each_experiment(fast=("digits.yaml",)))
def test_every_experiment_logs_throughput(experiment, workdir):
    cli = main(["--config", config(experiment), *experiment_args(experiment)], run=False)
    (monitor,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, TrainingThroughput)]
    assert monitor.count_tokens == experiment.startswith("shakespeare")
