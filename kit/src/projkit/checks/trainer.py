"""Checks of the Trainer's settings that Lightning accepts but that cannot work or silently
misbehave, or refuses only deep inside with a message that does not name the setting. What Lightning
refuses itself as the Trainer is built (``max_epochs`` or ``max_steps`` below -1, a ``limit_*_batches``
out of range) is left to it: ``projkit.errors.lightning_refusal`` names the setting in its message."""

from __future__ import annotations

import torch
from lightning.pytorch.cli import LightningArgumentParser

# The least value of each integer setting, and what it takes.
INTEGERS = {
    "accumulate_grad_batches": (1, "a positive integer"),
    "check_val_every_n_epoch": (1, "a positive integer or null"),
    "log_every_n_steps": (0, "0 or more"),
}


def check_trainer(trainer, parser: LightningArgumentParser, subcommand: str) -> None:
    """The Trainer's counts and limits, the length of the run, and the devices it asks for."""
    check_counts(trainer, parser)
    check_loggers(trainer, parser)
    check_length(trainer, parser, subcommand)
    check_devices(trainer, parser)


def check_counts(trainer, parser: LightningArgumentParser) -> None:
    """Each count, interval and norm in its range."""
    for name, (least, allowed) in INTEGERS.items():
        value = trainer.get(name)
        if isinstance(value, int) and value < least:
            parser.error(f"trainer.{name}={value}: must be {allowed}.")
    interval = trainer.get("val_check_interval")
    if isinstance(interval, (int, float)) and interval <= 0:
        parser.error(
            f"trainer.val_check_interval={interval}: must be a positive count of batches or fraction."
        )
    clip = trainer.get("gradient_clip_val")
    if clip is not None and clip < 0:  # 0, as null, turns clipping off (Lightning clips above 0 only)
        parser.error(
            f"trainer.gradient_clip_val={clip}: must be 0 or more (a negative norm would flip the "
            "gradients' sign). Use a value such as 1.0, or null to turn clipping off."
        )


def check_loggers(trainer, parser: LightningArgumentParser) -> None:
    """A CSV logger's flush interval, which Lightning divides by at the first logged row."""
    loggers = trainer.get("logger")
    for index, logger in enumerate(loggers if isinstance(loggers, list) else [loggers]):
        init_args = logger.get("init_args") if hasattr(logger, "get") else None
        flush = init_args.get("flush_logs_every_n_steps") if hasattr(init_args, "get") else None
        if isinstance(flush, int) and flush < 1:
            key = "trainer.logger" + (f"[{index}]" if isinstance(loggers, list) else "")
            parser.error(
                f"{key}.init_args.flush_logs_every_n_steps={flush}: must be a positive number of steps "
                "(the logger writes its rows every that many steps). Use 1 to write at every step."
            )


def check_length(trainer, parser: LightningArgumentParser, subcommand: str) -> None:
    """A minimum within the maximum, and a ``fit`` that trains something."""
    for unit in ("epochs", "steps"):  # Lightning stops at the maximum and ignores the minimum
        least, most = trainer.get(f"min_{unit}"), trainer.get(f"max_{unit}")
        if isinstance(least, int) and isinstance(most, int) and most != -1 and least > most:
            parser.error(
                f"trainer.min_{unit}={least} exceeds trainer.max_{unit}={most}: the run would stop there "
                f"regardless. Raise trainer.max_{unit} or lower trainer.min_{unit}."
            )
    if subcommand != "fit":
        return
    for name in ("max_steps", "max_epochs", "limit_train_batches"):
        if trainer.get(name) == 0:
            parser.error(
                f"trainer.{name}={trainer.get(name)}: `fit` would train nothing and then test the "
                "weights it started with. Give it steps to train, or evaluate a checkpoint with "
                "`validate` or `test --ckpt_path ...`."
            )


def check_devices(trainer, parser: LightningArgumentParser) -> None:
    """A device count that exists, and GPUs only where there are some."""
    devices = trainer.get("devices")
    if isinstance(devices, str) and devices.lstrip("-").isdigit():  # "-3" arrives as a string
        devices = int(devices)
    if isinstance(devices, int) and (devices < -1 or devices == 0):
        parser.error(f"trainer.devices={devices}: must be a positive count, -1 or auto (all of them).")
    accelerator, devices = trainer.get("accelerator"), trainer.get("devices")
    if accelerator not in ("gpu", "cuda"):
        return
    available = torch.cuda.device_count()
    if available == 0:
        parser.error(
            f"trainer.accelerator={accelerator} but no CUDA GPU is visible on this machine. Use "
            "--trainer.accelerator=auto (or stack configs/trainer/cpu.yaml instead of gpu.yaml)."
        )
    if isinstance(devices, int) and devices > available:
        parser.error(
            f"trainer.devices={devices} but this machine has {available} GPU(s). Use "
            f"--trainer.devices={available} or --trainer.devices=auto."
        )
