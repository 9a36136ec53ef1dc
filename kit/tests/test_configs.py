"""How the CLI stacks a command's settings, on the tiny project: the defaults file first (an experiment
of a few lines trains on it), then each ``--config`` (an overlay adds its callbacks to the standard
ones, a logger overlay keeps the experiment's name), then the environment's ``PL_<SUBCOMMAND>__``
variables for what the files leave open, then flags; a standard callback changes one setting, or goes,
by its own key. Each compares what was built with what the files or flags say, never with a default.
(A project's tests check its own configs' effects: its tests/test_configs.py.)"""

from __future__ import annotations

import pytest
import yaml
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, ModelSummary, ProgressBar, Timer

from conftest import DEFAULTS, main
from projkit.cli import STANDARD_CALLBACKS
from projkit.testing import TINY_FIT, config
from projkit.testing.configs import callbacks_of, config_files, resolved, stack, stated, unlike_stated


def build(*configs: str, extra: tuple[str, ...] = ()):
    """Parse and instantiate model, data and trainer as `fit` would, without running it."""
    args = []
    for name in configs:
        args += ["--config", config(name)]
    return main([*args, *extra], run=False)


def early_stopping(cli) -> EarlyStopping:
    (early,) = callbacks_of(cli, "early_stopping")
    return early


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
  class_path: tinyproj.models.Classifier
  init_args:
    net: tiny_net.TinyNet
data: tinyproj.data.Blobs
"""


@pytest.mark.slow
def test_an_experiment_of_a_few_lines_trains_on_the_defaults(workdir, monkeypatch):
    """The few lines name a model, a network and data; the rest (seed, clipping, checkpoints, early
    stopping, the logger) comes from the defaults file, as it states them, and the run is named after
    the experiment's file."""
    (workdir / "tiny_net.py").write_text(TINY_NET)
    monkeypatch.syspath_prepend(str(workdir))
    (workdir / "tiny.yaml").write_text(FEW_LINES)
    cli = main(["fit", "--config", "tiny.yaml", *TINY_FIT])
    assert cli.trainer.state.finished and "test/acc" in cli.trainer.callback_metrics
    files = config_files(cli)
    assert DEFAULTS in files and files[-1] == (workdir / "tiny.yaml").resolve()
    said, config = stated(cli), resolved(cli)
    run = workdir / "runs" / "tiny" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert any(p.name.startswith("epoch000-loss") for p in (run / "checkpoints").iterdir())
    assert (
        cli.trainer.gradient_clip_val == said["trainer.gradient_clip_val"] == config.trainer.gradient_clip_val
    )
    assert config.seed_everything == said["seed_everything"]
    for key in set(STANDARD_CALLBACKS) - {"progress_bar"}:  # TINY_FIT turns the bar off
        callbacks = callbacks_of(cli, key)
        assert len(callbacks) == (said.get(f"{key}.class_path") is not None), key
        assert [unlike_stated(cli, key, callback) for callback in callbacks] in ([], [{}]), key
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert set(STANDARD_CALLBACKS) <= set(saved) and saved["trainer"]["logger"]["init_args"]["name"] == "tiny"


@pytest.mark.slow
def test_an_experiment_changes_one_setting_of_a_standard_callback(workdir):
    """``early_stopping: {patience: 2}`` in a file changes that one setting (the others as the files
    state them, no callback added), a flag changes it again, and ``null`` drops the callback."""
    (workdir / "patient.yaml").write_text("early_stopping: {patience: 2}\n")
    cli = build("classify.yaml", extra=("--config", "patient.yaml"))
    said = stated(cli)
    assert said["early_stopping.init_args.patience"] == 2
    assert unlike_stated(cli, "early_stopping", early_stopping(cli)) == {}
    assert (early_stopping(cli).monitor, early_stopping(cli).mode) == (
        said["early_stopping.init_args.monitor"],
        said["early_stopping.init_args.mode"],
    )
    assert len(cli.trainer.callbacks) == len(build("classify.yaml").trainer.callbacks)
    flagged = build("classify.yaml", extra=("--config", "patient.yaml", "--early_stopping.patience=3"))
    assert early_stopping(flagged).patience == 3
    dropped = build("classify.yaml", extra=("--early_stopping=null",))
    kinds = [type(cb) for cb in dropped.trainer.callbacks]
    assert EarlyStopping not in kinds and ModelCheckpoint in kinds


@pytest.mark.slow
def test_a_disabled_progress_bar_drops_the_configured_one(workdir):
    assert callbacks_of(build("classify.yaml"), "progress_bar"), "the defaults configure one"
    cli = build("classify.yaml", extra=("--trainer.enable_progress_bar=false",))
    assert not any(isinstance(cb, ProgressBar) for cb in cli.trainer.callbacks)


def test_overlay_appends_callbacks_instead_of_replacing(workdir):
    """An overlay's ``callbacks+`` adds its callback; the standard ones stay, as the files state them."""
    cli = build("classify.yaml", "debug/fast_dev_run.yaml")
    assert ModelSummary in [type(cb) for cb in cli.trainer.callbacks]
    for key in ("early_stopping", "checkpoint"):
        (callback,) = callbacks_of(cli, key)
        assert unlike_stated(cli, key, callback) == {}, key
    assert early_stopping(cli).monitor == stated(cli)["early_stopping.init_args.monitor"]


def test_a_lightning_callback_with_empty_init_args_and_an_enum_default_builds_and_saves(workdir):
    """Lightning's ``Timer`` (its ``interval`` defaults to an enum, which YAML could not write), its
    ``init_args:`` left empty as a user leaves them: it builds, and the run's config says ``step``."""
    (workdir / "timer.yaml").write_text(
        "trainer:\n  callbacks+:\n    - class_path: lightning.pytorch.callbacks.Timer\n      init_args:\n"
    )
    cli = build("classify.yaml", str(workdir / "timer.yaml"))
    assert [type(callback) for callback in cli.trainer.callbacks].count(Timer) == 1
    saved = yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))
    assert {"class_path": "lightning.pytorch.callbacks.Timer", "init_args": {"duration": None,
            "interval": "step", "verbose": True}} in saved["trainer"]["callbacks"]  # fmt: skip


def test_logger_overlay_keeps_experiment_name(workdir):
    cli = build("classify.yaml", "logger/tensorboard.yaml")
    assert type(cli.trainer.logger).__name__ == "TensorBoardLogger"
    assert cli.trainer.logger.name == "classify"


def test_command_line_overrides_config(workdir):
    said = stack([config("classify.yaml")])
    cli = build("classify.yaml", extra=("--trainer.max_epochs=3", "--data.batch_size=7"))
    assert said["trainer.max_epochs"] != 3 and cli.trainer.max_epochs == 3
    assert cli.datamodule.hparams.batch_size == 7


def test_environment_variable_sets_what_the_config_leaves_open(workdir, monkeypatch, capsys):
    """Environment variables name the subcommand, and config files take precedence over them."""
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_STEPS", "7")
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_EPOCHS", "9")
    with pytest.raises(SystemExit):
        main(["fit", "--config", config("classify.yaml"), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_steps"] == 7
    assert printed["trainer"]["max_epochs"] == stack([config("classify.yaml")])["trainer.max_epochs"]
