"""Every shipped YAML parses and builds, alone and stacked with every overlay; experiments state only
what differs from configs/defaults.yaml, and what they leave out comes from there."""

from __future__ import annotations

import math
import random

import pytest
import yaml
from projkit.cli import STANDARD_CALLBACKS
from projkit.testing import TINY_FIT, config

from conftest import (
    CONFIGS,
    EXPERIMENTS,
    ONE_PER_TASK,
    OPTUNA_SWEEPS,
    OVERLAYS,
    ROOT,
    WANDB_SWEEPS,
    each_experiment,
    experiment_args,
)
from proj import main


def build(*configs: str, extra: tuple[str, ...] = ()):
    """Parse and instantiate model, data and trainer as `fit` would, without running it."""
    args = []
    for name in configs:
        args += ["--config", config(name)]
    return main([*args, *extra], run=False)


@pytest.mark.parametrize("experiment", each_experiment())
def test_experiment_builds_with_checkpointing_and_early_stopping(experiment, workdir):
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint

    cli = build(experiment, extra=experiment_args(experiment))
    kinds = {type(cb) for cb in cli.trainer.callbacks}
    assert {ModelCheckpoint, EarlyStopping, LearningRateMonitor} <= kinds
    assert cli.config.seed_everything == 42
    assert cli.config.test_after_fit is True
    trainer_cfg = cli.config.trainer
    assert trainer_cfg.precision and trainer_cfg.gradient_clip_val == 1.0
    assert trainer_cfg.accumulate_grad_batches == 1


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_states_only_what_differs_in_at_most_30_lines(experiment):
    text = (CONFIGS / experiment).read_text()
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) <= 30, f"{experiment}: {len(lines)} lines; move what experiments share to defaults.yaml"
    trainer = yaml.safe_load(text).get("trainer", {})
    assert "callbacks" not in trainer, "each standard callback has a key of its own in defaults.yaml"


# A network that is nowhere in the repository, and the whole experiment that trains it.
TINY_NET = """
from torch import nn


class TinyNet(nn.Sequential):
    def __init__(self, num_classes: int, input_shape: tuple[int, int, int], hidden: int = 16) -> None:
        channels, height, width = input_shape
        inputs = channels * height * width
        super().__init__(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
"""
FEW_LINES = """
model:
  class_path: proj.models.ImageClassifier
  init_args:
    net: tiny_net.TinyNet
data: proj.data.DigitsDataModule
"""


@pytest.mark.slow
def test_an_experiment_of_a_few_lines_trains_on_the_defaults(workdir, monkeypatch):
    from lightning.pytorch.callbacks import EarlyStopping

    (workdir / "tiny_net.py").write_text(TINY_NET)
    monkeypatch.syspath_prepend(str(workdir))
    (workdir / "tiny.yaml").write_text(FEW_LINES)
    cli = main(["fit", "--config", "tiny.yaml", *TINY_FIT])
    assert cli.trainer.state.finished and "test/acc" in cli.trainer.callback_metrics
    # Named after its file; checkpoints, early stopping and clipping from configs/defaults.yaml.
    run = workdir / "runs" / "tiny" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert any(p.name.startswith("epoch000-loss") for p in (run / "checkpoints").iterdir())
    assert cli.trainer.gradient_clip_val == 1.0 and cli.config.fit.seed_everything == 42
    (early,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, EarlyStopping)]
    assert early.monitor == "val/loss" and early.patience == 5
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert set(STANDARD_CALLBACKS) <= set(saved) and saved["trainer"]["logger"]["init_args"]["name"] == "tiny"


@pytest.mark.slow
def test_an_experiment_changes_one_setting_of_a_standard_callback(workdir):
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    (workdir / "patient.yaml").write_text("early_stopping: {patience: 2}\n")
    cli = build("digits.yaml", extra=("--config", "patient.yaml"))
    (early,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, EarlyStopping)]
    assert (early.patience, early.monitor, early.mode) == (2, "val/loss", "min")
    assert len(cli.trainer.callbacks) == len(build("digits.yaml").trainer.callbacks)
    flagged = build("digits.yaml", extra=("--early_stopping.patience=3",))
    assert next(cb for cb in flagged.trainer.callbacks if isinstance(cb, EarlyStopping)).patience == 3
    dropped = build("digits.yaml", extra=("--early_stopping=null",))
    kinds = [type(cb) for cb in dropped.trainer.callbacks]
    assert EarlyStopping not in kinds and ModelCheckpoint in kinds


@pytest.mark.slow
def test_a_disabled_progress_bar_drops_the_configured_one(workdir):
    from lightning.pytorch.callbacks import ProgressBar

    cli = build("digits.yaml", extra=("--trainer.enable_progress_bar=false",))
    assert not any(isinstance(cb, ProgressBar) for cb in cli.trainer.callbacks)


def overlay_pairs() -> list:
    """The trainer overlays and the CSV and TensorBoard loggers on the offline default in the edit
    loop; in `make test`, every overlay, those that shape the training on every experiment, and a
    logger (which records what any task logs, the same way) on one experiment of each task. Importing
    W&B and MLflow (and creating MLflow's store) takes seconds: they run in `make test` only, as do
    the debug and tuning overlays, which their own tests (test_debug.py, test_tuning.py) train with,
    and FSDP's, whose wrapping test_fsdp_overlay_shards_each_transformer_block checks."""
    pairs = []
    for overlay in OVERLAYS:
        slow = overlay.startswith(("debug/", "tune/", "logger/mlflow", "logger/wandb", "trainer/fsdp"))
        for experiment in EXPERIMENTS:
            if overlay.startswith("logger/") and experiment not in ONE_PER_TASK:
                continue
            marks = [pytest.mark.slow] if slow or experiment != "digits.yaml" else []
            pairs.append(pytest.param(experiment, overlay, marks=marks, id=f"{experiment}-{overlay}"))
    return pairs


def overlay_effects() -> dict:
    """What each overlay does, as the built Trainer shows it (for those that need a GPU, the parsed
    config): one check per overlay file, so a new overlay needs its line here."""
    from lightning.pytorch import callbacks, loggers, profilers, strategies
    from projkit.callbacks import BatchSizeFinder, LearningRateFinder

    def has(kind):
        return lambda cli: any(isinstance(cb, kind) for cb in cli.trainer.callbacks)

    def logger(kind):
        return lambda cli: isinstance(cli.trainer.logger, kind)

    def apart(folder, effect):  # a debug or tuning run logs under runs/<folder>/, apart from real runs
        return lambda cli: effect(cli) and cli.trainer.logger.save_dir == f"runs/{folder}"

    return {
        "trainer/cpu.yaml": lambda cli: (
            cli.trainer.accelerator.__class__.__name__ == "CPUAccelerator"
            and cli.trainer.precision == "32-true"
        ),
        "trainer/ddp.yaml": lambda cli: (
            isinstance(cli.trainer.strategy, strategies.DDPStrategy) and cli.trainer.num_devices == 2
        ),
        "trainer/gpu.yaml": lambda config: (
            config["trainer"]["accelerator"] == "gpu" and config["trainer"]["precision"] == "bf16-mixed"
        ),
        "trainer/fsdp.yaml": lambda config: config["trainer"]["strategy"]["class_path"].endswith(
            "FSDPStrategy"
        ),
        "debug/anomaly.yaml": apart("debug", lambda cli: cli.trainer._detect_anomaly is True),
        "debug/fast_dev_run.yaml": lambda cli: (
            bool(cli.trainer.fast_dev_run) and has(callbacks.ModelSummary)(cli)
        ),
        "debug/limit.yaml": apart(
            "debug", lambda cli: (cli.trainer.max_epochs, cli.trainer.limit_train_batches) == (2, 4)
        ),
        "debug/overfit.yaml": apart(
            "debug",
            lambda cli: (
                cli.trainer.overfit_batches == 1
                and not has(callbacks.EarlyStopping)(cli)
                and cli.config.test_after_fit is False
            ),
        ),
        "debug/profile.yaml": apart(
            "debug", lambda cli: isinstance(cli.trainer.profiler, profilers.SimpleProfiler)
        ),
        "logger/csv.yaml": logger(loggers.CSVLogger),
        "logger/tensorboard.yaml": logger(loggers.TensorBoardLogger),
        "logger/mlflow.yaml": logger(loggers.MLFlowLogger),
        "logger/wandb.yaml": logger(loggers.WandbLogger),
        "tune/batch_size.yaml": apart("tune", has(BatchSizeFinder)),
        "tune/lr_find.yaml": apart("tune", has(LearningRateFinder)),
    }


def test_every_overlay_has_its_effect_checked():
    assert sorted(overlay_effects()) == OVERLAYS


@pytest.mark.parametrize(("experiment", "overlay"), overlay_pairs())
def test_overlay_stacks_on_experiment_with_its_effect(experiment, overlay, workdir, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    effect = overlay_effects()[overlay]
    if overlay in ("trainer/gpu.yaml", "trainer/fsdp.yaml"):
        # No GPU here: parse only; building would ask for a CUDA device (Lightning's FSDP needs one).
        args = ["fit", "--config", config(experiment), "--config", config(overlay), "--print_config"]
        with pytest.raises(SystemExit) as exit_info:
            main([*args, *experiment_args(experiment)])
        assert exit_info.value.code in (0, None)
        assert effect(yaml.safe_load(capsys.readouterr().out)), overlay
        return
    extra = ("--trainer.accelerator=cpu", "--trainer.devices=2") if overlay == "trainer/ddp.yaml" else ()
    cli = build(experiment, overlay, extra=(*extra, *experiment_args(experiment)))
    assert cli.model is not None and cli.datamodule is not None
    assert effect(cli), f"{overlay} stacked on {experiment} did not take effect"


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

    cli = build("digits.yaml", "debug/fast_dev_run.yaml")
    kinds = [type(cb) for cb in cli.trainer.callbacks]
    assert ModelSummary in kinds
    early = next(cb for cb in cli.trainer.callbacks if isinstance(cb, EarlyStopping))
    checkpoint = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ModelCheckpoint))
    assert early.monitor == "val/loss" and early.mode == "min"
    assert checkpoint.monitor == "val/loss"


def test_a_debug_overlay_keeps_its_runs_apart_under_any_logger(workdir):
    for order in (
        ("debug/limit.yaml", "logger/tensorboard.yaml"),
        ("logger/tensorboard.yaml", "debug/limit.yaml"),
    ):
        cli = build("digits.yaml", *order)
        assert type(cli.trainer.logger).__name__ == "TensorBoardLogger"
        assert (cli.trainer.logger.save_dir, cli.trainer.logger.name) == ("runs/debug", "digits"), order


def test_logger_overlay_keeps_experiment_name(workdir):
    cli = build("digits.yaml", "logger/tensorboard.yaml")
    assert type(cli.trainer.logger).__name__ == "TensorBoardLogger"
    assert cli.trainer.logger.name == "digits"


def test_command_line_overrides_config(workdir):
    cli = build("digits.yaml", extra=("--trainer.max_epochs=3", "--data.batch_size=16"))
    assert cli.trainer.max_epochs == 3
    assert cli.datamodule.hparams.batch_size == 16


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


@pytest.mark.slow
@pytest.mark.parametrize("sweep", WANDB_SWEEPS)
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
    assert_printed(values, capsys)


@pytest.mark.slow  # the sweep's own tests (test_sweep.py) are slow too
@pytest.mark.parametrize("sweep", OPTUNA_SWEEPS)
def test_optuna_sweep_trial_is_accepted_by_the_cli(sweep, monkeypatch, capsys):
    import optuna
    from projkit.sweep import load_sweep, suggest, trial_args

    # The sweep's config paths are the repository's, as `python -m proj sweep` runs from its root.
    monkeypatch.chdir(ROOT)
    spec = load_sweep(CONFIGS / sweep)
    assert spec.metric in {"val/loss", "val/acc"} and spec.n_trials >= 20
    values = suggest(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask(), spec.space)
    args = trial_args(spec, values, number=0)
    assert args[0] == "fit"
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = assert_printed(values, capsys)
    assert printed["trainer"]["logger"]["init_args"]["save_dir"] == f"runs/sweeps/{spec.name}"


def assert_printed(values: dict, capsys) -> dict:
    """The config ``--print_config`` printed, checked to hold each dotted key's value."""
    printed = yaml.safe_load(capsys.readouterr().out)
    for name, value in values.items():
        node = printed
        for key in name.split("."):
            node = node[key]
        assert node == pytest.approx(value), name
    return printed
