"""How a command that cannot work says so: one line that names the field and the fix, rather than a
traceback from deep inside Lightning or jsonargparse, and no run directory left behind.

A refused setting exits with status 2. A run directory another process holds, a lost peer of a
distributed job, a run that diverged, or an export whose artifacts fail their check exits with 1;
a diverged run keeps its run directory, whose checkpoints are from before the divergence.
``PROJ_DEBUG=1`` shows the traceback as well (and raises the error as it was), as for a bug;
anything that is no user error keeps its traceback always.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Iterator

import torch
from lightning.pytorch.cli import LightningArgumentParser

from proj.export import ExportCheckError
from proj.preflight import ConfigError
from proj.reliability.divergence import DivergenceError
from proj.runs import RunInUseError, RunLock

DEBUG_VARIABLE = "PROJ_DEBUG"
# What the operating system says when the disk cannot take a file: said as such, not as a traceback.
# (A save_dir that is no folder, or not writable, is refused before the run: preflight.check_save_dir.)
DISK_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}


def debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def reported_errors() -> Iterator[None]:
    """Around a whole command: a user's error printed as one line and a clean exit."""
    try:
        yield
    except RunInUseError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except (DivergenceError, ExportCheckError) as error:
        if debugging():
            raise
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ConfigError, OSError) as error:
        message = user_error(error)
        if message is None or debugging():
            raise
        RunLock.remove_new_runs()
        print(f"error: {message}\n({DEBUG_VARIABLE}=1 shows where it was raised.)", file=sys.stderr)
        raise SystemExit(2) from None
    except RuntimeError as error:
        if not lost_a_peer(error):
            raise
        print(
            f"error: another process of this distributed job stopped ({str(error).splitlines()[0]}). "
            "Its checkpoints are intact: resume with `fit --config <same configs> --ckpt_path last`.",
            file=sys.stderr,
        )
        raise SystemExit(1) from None


@contextlib.contextmanager
def named_refusals(config) -> Iterator[None]:
    """Around building the config's classes: a constructor's refusal becomes a ``ConfigError`` that
    names the config key and class it came from (jsonargparse gives neither)."""
    try:
        yield
    except Exception as error:
        if debugging() or isinstance(error, ConfigError):
            raise
        raise ConfigError(refusal(error, config)) from error


class ShortErrorParser(LightningArgumentParser):
    """Errors in what was typed, said in a few lines: the message without jsonargparse's dumps of
    the whole parsed value (``Given value: Namespace(...)``, a screen long) or the usage of every
    option, which ``--help`` shows."""

    def error(self, message: str, ex: Exception | None = None) -> None:
        if debugging() or not self.exit_on_error:
            super().error(message, ex)
        lines = [line for line in message.splitlines() if not line.strip().startswith("Given value")]
        sys.stderr.write("error: " + "\n".join(lines) + "\n(--help lists the options.)\n")
        raise SystemExit(2)


def refusal(error: BaseException, config) -> str:
    """What a constructor refused, as ``"<key> (<class path>): <its message>"`` for the class from the
    config that raised it, found on the traceback of ``error`` or of the error it wraps (jsonargparse
    wraps it in a dump of every subtype it tried). The key is left out when the message starts
    with it already, and is unknown when no class of the config raised ``error``."""
    classes = {}
    for key in ("model", "model.init_args.net", "data"):
        spec = config
        for part in key.split("."):
            spec = spec.get(part) if hasattr(spec, "get") else None
        class_path = spec.get("class_path") if hasattr(spec, "get") else None
        if class_path:
            module, name = class_path.rsplit(".", 1)
            with contextlib.suppress(ImportError, AttributeError):
                classes[getattr(importlib.import_module(module), name)] = (key, class_path)
    cause: BaseException | None = error
    while cause is not None:
        frame = cause.__traceback__
        while frame is not None:
            code = frame.tb_frame.f_code
            built = frame.tb_frame.f_locals.get("self") if code.co_name == "__init__" else None
            if type(built) in classes:
                key, class_path = classes[type(built)]
                named = str(cause).startswith((f"{key}.", f"{key}:"))
                return str(cause) if named else f"{key} ({class_path}): {cause}"
            frame = frame.tb_next
        cause = cause.__cause__ or cause.__context__
    return str(error)


def user_error(error: BaseException) -> str | None:
    """The message for an error in what the user gave (a setting, a file, a checkpoint) or a disk
    that cannot take the run's files; None for anything else, which keeps its traceback."""
    if isinstance(error, ConfigError):
        return str(error)
    if isinstance(error, OSError) and error.errno in DISK_ERRORS:
        where = f"'{error.filename}'" if error.filename else "the run's files"
        return (
            f"cannot write {where}: {error.strerror or error}. Free disk space, or point "
            "trainer.logger.init_args.save_dir at a writable folder with room."
        )
    return None


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank died (``kill -9``, a lost node)."""
    if not torch.distributed.is_available():
        return False
    text = str(error)
    return isinstance(error, torch.distributed.DistError) or any(
        sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )
