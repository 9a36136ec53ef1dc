"""Every shipped YAML parses and builds, alone and stacked with every overlay, with the effect its
files state (checked against the files, so an owner's edit of a setting holds); experiments state
only what differs from configs/defaults.yaml, and what they leave out comes from there. How the CLI
stacks files, overlays, variables and flags is the kit's, tested on its tiny project in
kit/tests/test_configs.py."""

from __future__ import annotations

import math
import os
import random

import pytest
import yaml
from projkit.cli import STANDARD_CALLBACKS
from projkit.testing import config
from projkit.testing.configs import callbacks_of, config_files, stack, stated, unlike_stated

from conftest import (
    CONFIGS,
    DEFAULTS,
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


def same(written: object, held: object) -> bool:
    """A value as a config file states it and as the CLI holds it: a YAML list is a tuple there."""
    if isinstance(written, list | tuple) and isinstance(held, list | tuple):
        return len(written) == len(held) and all(same(a, b) for a, b in zip(written, held, strict=True))
    return written == held


@pytest.mark.parametrize("experiment", each_experiment())
def test_experiment_builds_what_its_files_state(experiment, workdir):
    """Every setting the files of an experiment state (the defaults the CLI stacks first, then the
    experiment's own) is in its resolved config, and the trainer, the seed and each standard callback
    are built from it: compared with what the files say, never with a value, so an owner's edit of a
    default (``seed_everything``, ``early_stopping.patience``) holds here."""
    flags = experiment_args(experiment)
    cli = build(experiment, extra=flags)
    assert {DEFAULTS, CONFIGS / experiment} <= set(config_files(cli))
    config, flagged = cli.config, {flag.removeprefix("--").split("=")[0] for flag in flags}
    unlike = {
        k: (v, config.get(k))
        for k, v in stated(cli).items()
        if k not in flagged and not same(v, config.get(k))
    }
    assert not unlike, unlike
    assert os.environ["PL_GLOBAL_SEED"] == str(int(config.seed_everything))
    trainer = config.trainer
    built = (cli.trainer.precision, cli.trainer.gradient_clip_val, cli.trainer.accumulate_grad_batches)
    assert built == (trainer.precision, trainer.gradient_clip_val, trainer.accumulate_grad_batches)
    for key in STANDARD_CALLBACKS:
        callbacks = callbacks_of(cli, key)
        assert len(callbacks) == (config[key] is not None), key
        assert [unlike_stated(cli, key, callback) for callback in callbacks] in ([], [{}]), key


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_states_only_what_differs_in_at_most_30_lines(experiment):
    text = (CONFIGS / experiment).read_text()
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) <= 30, f"{experiment}: {len(lines)} lines; move what experiments share to defaults.yaml"
    trainer = yaml.safe_load(text).get("trainer", {})
    assert "callbacks" not in trainer, "each standard callback has a key of its own in defaults.yaml"


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


SAVE_DIR = "trainer.logger.init_args.save_dir"


def said(overlay: str, key: str) -> object:
    """What the overlay file itself states for ``key``: its effect is checked against its own file."""
    return stack([CONFIGS / overlay])[key]


def apart(overlay: str, effect):
    """A debug or tuning run logs under the overlay's own folder of runs, apart from the real runs'
    (where the files without it would log), and has the overlay's ``effect``."""

    def check(cli) -> bool:
        others = stack(path for path in config_files(cli) if path != CONFIGS / overlay)
        save_dir = said(overlay, SAVE_DIR)
        return effect(cli) and cli.trainer.logger.save_dir == save_dir != others.get(SAVE_DIR)

    return check


def overlay_effects() -> dict:
    """What each overlay does, as the built Trainer shows it (for those that need a GPU, the parsed
    config), against what the overlay file states: one check per overlay file, so a new overlay needs
    its line here."""
    from lightning.pytorch import callbacks, loggers, profilers, strategies
    from projkit.callbacks import BatchSizeFinder, LearningRateFinder

    def has(kind):
        return lambda cli: any(isinstance(cb, kind) for cb in cli.trainer.callbacks)

    def logger(kind):
        return lambda cli: isinstance(cli.trainer.logger, kind)

    def trainer(overlay: str, *names: str):  # the built trainer's settings, as the overlay states them
        return lambda cli: all(getattr(cli.trainer, n) == said(overlay, f"trainer.{n}") for n in names)

    def printed(overlay: str, *names: str):  # the same, in the parsed config
        return lambda config: all(config["trainer"][n] == said(overlay, f"trainer.{n}") for n in names)

    return {
        "trainer/cpu.yaml": lambda cli: (
            cli.trainer.accelerator.__class__.__name__ == "CPUAccelerator"
            and trainer("trainer/cpu.yaml", "precision")(cli)
        ),
        "trainer/ddp.yaml": lambda cli: (
            isinstance(cli.trainer.strategy, strategies.DDPStrategy) and cli.trainer.num_devices == 2
        ),
        "trainer/gpu.yaml": printed("trainer/gpu.yaml", "accelerator", "precision"),
        "trainer/fsdp.yaml": lambda config: config["trainer"]["strategy"]["class_path"].endswith(
            "FSDPStrategy"
        ),
        "debug/anomaly.yaml": apart("debug/anomaly.yaml", lambda cli: cli.trainer._detect_anomaly is True),
        "debug/fast_dev_run.yaml": lambda cli: (
            bool(cli.trainer.fast_dev_run) and has(callbacks.ModelSummary)(cli)
        ),
        "debug/limit.yaml": apart(
            "debug/limit.yaml", trainer("debug/limit.yaml", "max_epochs", "limit_train_batches")
        ),
        "debug/overfit.yaml": apart(
            "debug/overfit.yaml",
            lambda cli: (
                trainer("debug/overfit.yaml", "overfit_batches")(cli)
                and not has(callbacks.EarlyStopping)(cli)
                and cli.config.test_after_fit is said("debug/overfit.yaml", "test_after_fit")
            ),
        ),
        "debug/profile.yaml": apart(
            "debug/profile.yaml", lambda cli: isinstance(cli.trainer.profiler, profilers.SimpleProfiler)
        ),
        "logger/csv.yaml": logger(loggers.CSVLogger),
        "logger/tensorboard.yaml": logger(loggers.TensorBoardLogger),
        "logger/mlflow.yaml": logger(loggers.MLFlowLogger),
        "logger/wandb.yaml": logger(loggers.WandbLogger),
        "tune/batch_size.yaml": apart("tune/batch_size.yaml", has(BatchSizeFinder)),
        "tune/lr_find.yaml": apart("tune/lr_find.yaml", has(LearningRateFinder)),
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


def test_a_debug_overlay_keeps_its_runs_apart_under_any_logger(workdir):
    for order in (
        ("debug/limit.yaml", "logger/tensorboard.yaml"),
        ("logger/tensorboard.yaml", "debug/limit.yaml"),
    ):
        cli = build("digits.yaml", *order)
        assert type(cli.trainer.logger).__name__ == "TensorBoardLogger"
        expected = (said("debug/limit.yaml", SAVE_DIR), "digits")
        assert (cli.trainer.logger.save_dir, cli.trainer.logger.name) == expected, order


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
