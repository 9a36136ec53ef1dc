"""Every shipped YAML parses and builds, alone and stacked with every overlay."""

from __future__ import annotations

import math
import random

import pytest
import yaml

from conftest import CONFIGS, EXPERIMENTS, OVERLAYS, ROOT, SWEEPS, config, experiment_args
from proj.cli import main


def build(*configs: str, extra: tuple[str, ...] = ()):
    """Parse and instantiate model, data and trainer as `fit` would, without running it."""
    args = []
    for name in configs:
        args += ["--config", config(name)]
    return main([*args, *extra], run=False)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_builds_with_checkpointing_and_early_stopping(experiment, workdir):
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from proj.callbacks import LearningRateMonitor

    cli = build(experiment, extra=experiment_args(experiment))
    kinds = {type(cb) for cb in cli.trainer.callbacks}
    assert {ModelCheckpoint, EarlyStopping, LearningRateMonitor} <= kinds
    assert cli.config.seed_everything == 42
    assert cli.config.test_after_fit is True
    trainer_cfg = cli.config.trainer
    assert trainer_cfg.precision and trainer_cfg.gradient_clip_val == 1.0
    assert trainer_cfg.accumulate_grad_batches == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_overlay_stacks_on_experiment(experiment, overlay, workdir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    if overlay in ("trainer/gpu.yaml", "trainer/fsdp.yaml"):
        # No GPU here: parse only; building would ask for a CUDA device (Lightning's FSDP needs one).
        args = [
            "fit",
            "--config",
            config(experiment),
            "--config",
            config(overlay),
            "--print_config",
        ]
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code in (0, None)
        return
    extra = ("--trainer.accelerator=cpu", "--trainer.devices=2") if overlay == "trainer/ddp.yaml" else ()
    cli = build(experiment, overlay, extra=(*extra, *experiment_args(experiment)))
    assert cli.model is not None and cli.datamodule is not None


def test_fsdp_overlay_shards_each_transformer_block():
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import FSDPStrategy, Strategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from proj.nets.gpt import Block

    parser = ArgumentParser()
    parser.add_subclass_arguments(Strategy, "strategy")
    spec = yaml.safe_load((CONFIGS / "trainer" / "fsdp.yaml").read_text())["trainer"]["strategy"]
    strategy = parser.instantiate(parser.parse_object({"strategy": spec})).strategy
    assert isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "full"
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy) and policy._module_classes == {Block}


def test_overlay_appends_callbacks_instead_of_replacing(workdir):
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, ModelSummary

    cli = build("digits.yaml", "trainer/debug.yaml")
    kinds = [type(cb) for cb in cli.trainer.callbacks]
    assert ModelSummary in kinds
    early = next(cb for cb in cli.trainer.callbacks if isinstance(cb, EarlyStopping))
    checkpoint = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ModelCheckpoint))
    assert early.monitor == "val/loss" and early.mode == "min"
    assert checkpoint.monitor == "val/loss"


def test_logger_overlay_keeps_experiment_name(workdir):
    cli = build("digits.yaml", "logger/tensorboard.yaml")
    assert type(cli.trainer.logger).__name__ == "TensorBoardLogger"
    assert cli.trainer.logger.name == "digits"


def test_command_line_overrides_config(workdir):
    cli = build("digits.yaml", extra=("--trainer.max_epochs=3", "--data.batch_size=16"))
    assert cli.trainer.max_epochs == 3
    assert cli.datamodule.batch_size == 16


def test_environment_variable_sets_what_the_config_leaves_open(workdir, monkeypatch, capsys):
    # Environment variables name the subcommand, and config files take precedence over them.
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_STEPS", "7")
    with pytest.raises(SystemExit):
        main(["fit", "--config", config("digits.yaml"), "--print_config"])
    assert "max_steps: 7" in capsys.readouterr().out


def test_data_facts_are_linked_into_the_network(workdir):
    cli = build("cifar10.yaml")
    net = cli.model.net
    assert net.features[0][0].in_channels == 3
    assert net.head[-1].out_features == 10
    assert cli.model.hparams.net["init_args"]["input_shape"] == (3, 32, 32)


def sample(spec: dict, rng: random.Random) -> object:
    """One value from a W&B sweep parameter spec, as the sweep controller would pick it."""
    if "value" in spec:
        return spec["value"]
    if "values" in spec:
        return rng.choice(spec["values"])
    low, high = spec["min"], spec["max"]
    default = "int_uniform" if isinstance(low, int) and isinstance(high, int) else "uniform"
    distribution = spec.get("distribution", default)
    if distribution == "int_uniform":
        return rng.randint(low, high)
    if distribution == "uniform":
        return rng.uniform(low, high)
    if distribution == "log_uniform_values":
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    raise NotImplementedError(f"teach sample() the '{distribution}' distribution")


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_command_is_accepted_by_the_cli(sweep, monkeypatch, capsys):
    spec = yaml.safe_load((CONFIGS / sweep).read_text())
    assert spec["metric"]["name"] in {"val/loss", "val/acc", "val/acc_best"}
    command = spec["command"]
    assert command[:5] == ["${env}", "python", "-m", "proj", "fit"] and command[-1] == "${args}"
    rng = random.Random(0)
    values = {name: sample(param, rng) for name, param in spec["parameters"].items()}
    # What the agent puts in place of ${args} (wandb.sdk.launch.sweeps.utils.create_sweep_command_args);
    # it runs the command from the folder `wandb agent` started in, the repository root.
    args = [f"--{name}={value}" for name, value in values.items()]
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main([*command[4:-1], *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    for name, value in values.items():
        node = printed
        for key in name.split("."):
            node = node[key]
        assert node == pytest.approx(value), name
