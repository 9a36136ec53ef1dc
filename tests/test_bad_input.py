"""More bad input, each refused before training with the field or file and the fix in the message.
(Config keys, types, class paths, config files, datasets and checkpoints: see test_cli.py.)"""

from __future__ import annotations

import pytest
import torch

from conftest import config
from proj.cli import main


def error_of(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_yaml_syntax_error_names_file_and_line(workdir, capsys):
    (workdir / "broken.yaml").write_text("trainer:\n  max_epochs: [3\n")
    err = error_of(["fit", "--config", config("digits.yaml"), "--config", "broken.yaml"], capsys)
    assert "--config broken.yaml: not valid YAML at line 3" in err and "Fix the syntax" in err


@pytest.mark.parametrize("lr", ["0", "-0.001"])
def test_non_positive_learning_rate_is_refused(lr, workdir):
    with pytest.raises(
        ValueError, match=r"model\.init_args\.optimizer: .*(learning rate is 0\.0|Invalid learning)"
    ):
        main(["--config", config("digits.yaml"), f"--model.init_args.optimizer.init_args.lr={lr}"], run=False)


def test_bad_scheduler_setting_is_refused_when_the_model_is_built(workdir):
    with pytest.raises(ValueError, match=r"model\.init_args\.scheduler: warmup_steps must be >= 0"):
        main(
            ["--config", config("digits.yaml"), "--model.init_args.scheduler.init_args.warmup_steps=-3"],
            run=False,
        )


def test_gpu_asked_for_on_a_machine_without_one(workdir, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    err = error_of(["fit", "--config", config("digits.yaml"), "--config", config("trainer/gpu.yaml")], capsys)
    assert "trainer.accelerator=gpu but no CUDA GPU is visible" in err and "cpu.yaml" in err


def test_negative_gradient_clip_is_refused(workdir, capsys):
    err = error_of(["fit", "--config", config("digits.yaml"), "--trainer.gradient_clip_val=-1"], capsys)
    assert "trainer.gradient_clip_val=-1.0: must be positive" in err


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--data.val_fraction=1.5", r"data\.val_fraction must be in \(0, 1\)"),
        ("--data.init_args.test_fraction=0", r"data\.test_fraction must be in \(0, 1\)"),
        ("--data.num_workers=-1", r"data\.num_workers must be >= 0"),
    ],
)
def test_data_settings_out_of_range_are_refused(flag, message, workdir):
    with pytest.raises(ValueError, match=message):
        main(["--config", config("digits.yaml"), flag], run=False)


@pytest.mark.slow
def test_checkpoint_of_another_network_is_refused(workdir, capsys):
    quick = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
             "--test_after_fit=false", "--trainer.enable_progress_bar=false")  # fmt: skip
    main(["fit", "--config", config("digits.yaml"), *quick])
    saved = workdir / "runs" / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    mlp = ["--model.init_args.net=proj.nets.MLP", f"--ckpt_path={saved}"]
    err = error_of(["test", "--config", config("digits.yaml"), *mlp], capsys)
    assert "holds a proj.nets.ConvNet but model.init_args.net is proj.nets.MLP" in err
    assert "config.yaml" in err


def test_overlay_for_another_experiment_is_refused(workdir, capsys):
    (workdir / "image_data.yaml").write_text("data:\n  class_path: proj.data.DigitsDataModule\n")
    err = error_of(
        ["fit", "--config", config("shakespeare_char_cpu.yaml"), "--config", "image_data.yaml"], capsys
    )
    assert "proj.models.LanguageModel needs vocab, vocab_size" in err and "DigitsDataModule" in err
