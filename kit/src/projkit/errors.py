"""How a command that cannot work says so: one line that names the field and the fix, rather than a
traceback from deep inside Lightning or jsonargparse, and no run directory left behind.

A refused setting exits with status 2. A run directory another process holds, a lost peer of a
distributed job, a run that diverged, or an export whose artifacts fail their check exits with 1;
a diverged run keeps its run directory, whose checkpoints are from before the divergence. A run
that Lightning's own handler stops on SIGTERM (``preemption: null``) exits with 143, as one that
``projkit.reliability.Preemption`` stops does, never with 0.
``PROJ_DEBUG=1`` shows the traceback as well (and raises the error as it was), as for a bug;
anything that is no user error keeps its traceback always.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import inspect
import os
import re
import signal
import sys
import traceback
from collections.abc import Iterator

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from projkit.credentials import masked
from projkit.rundir.lock import RunInUseError, RunLock

DEBUG_VARIABLE = "PROJ_DEBUG"


# What the operating system says when the disk cannot take a file: said as such, not as a traceback.
# (A save_dir that is no folder, or not writable, is refused before the run: checks.save_dir.)
DISK_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}


class ConfigError(ValueError):
    """A setting, file or checkpoint the user gave cannot work: the message names it and the fix.

    ``projkit.cli.main`` prints it without a traceback (``PROJ_DEBUG=1`` shows one), also when it is
    found only once the run has started, such as a checkpoint that Lightning loads itself.
    """


class DivergenceError(FloatingPointError):
    """Training produced a NaN or infinite loss or weight; the run stopped."""


class ExportCheckError(RuntimeError):
    """An exported artifact computes other logits than the checkpoint it came from."""


def debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def reported_errors() -> Iterator[None]:
    """Around a whole command: a user's error printed as one line and a clean exit."""
    try:
        yield
    except SIGTERMException:
        # Lightning's own stop on SIGTERM (with `preemption: null`) exits with 0: a success to a
        # scheduler, which would requeue nothing.
        print("error: stopped by SIGTERM; nothing was saved since the last checkpoint.", file=sys.stderr)
        raise SystemExit(128 + signal.SIGTERM) from None
    except RunInUseError as error:
        print(f"error: {masked(str(error))}", file=sys.stderr)
        raise SystemExit(1) from None
    except (DivergenceError, ExportCheckError) as error:
        if debugging():
            raise
        print(f"error: {masked(str(error))}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ConfigError, OSError, ValueError, MisconfigurationException) as error:
        # A ConfigError is a ValueError too: the project's own refusals first, then Lightning's.
        refused = isinstance(error, (ConfigError, OSError))
        message = user_error(error) if refused else lightning_refusal(error)
        if message is None or debugging():
            raise
        RunLock.remove_new_runs()
        print(f"error: {masked(message)}\n({DEBUG_VARIABLE}=1 shows where it was raised.)", file=sys.stderr)
        raise SystemExit(2) from None
    except RuntimeError as error:
        if not lost_a_peer(error):
            raise
        print(
            f"error: another process of this distributed job stopped ({masked(str(error).splitlines()[0])}). "
            "Its checkpoints are intact: resume with `fit --config <same configs> --ckpt_path last`.",
            file=sys.stderr,
        )
        raise SystemExit(1) from None


@contextlib.contextmanager
def named_refusals(config) -> Iterator[None]:
    """Around building the config's classes: a constructor's refusal of its arguments becomes a
    ``ConfigError`` that names the config key and class it came from (jsonargparse gives neither);
    a bug keeps its traceback, shown as raised rather than inside jsonargparse's wrapping.

    What counts as a refusal (``is_refusal``): the project's ``ConfigError``; an ``OSError``, a file
    the arguments name that is missing or unreadable, which the message names; and a ``ValueError``
    or ``TypeError`` raised by a ``raise`` statement, which is how Python code (the project's, torch's,
    a user's) refuses an argument. Anything else is a bug in someone's code: a ``NameError``,
    ``AttributeError``, ``KeyError``, ``RuntimeError``, ``AssertionError``, and the ``TypeError`` or
    ``ValueError`` the interpreter or a C function raises for a call it cannot make (a missing
    argument, ``int("x")``), since those point at the line that made the call. An error that only
    jsonargparse raised is its refusal of the config.
    """
    try:
        yield
    except Exception as error:
        if debugging() or isinstance(error, ConfigError):
            raise
        cause = unwrapped(error)
        if (asked := allocation_refused(cause)) is not None:
            raise ConfigError(refusal(error, config, asked)) from None
        if not is_refusal(cause):
            raise cause from cause.__cause__
        raise ConfigError(refusal(error, config)) from error


def allocation_refused(error: BaseException) -> str | None:
    """What a constructor that asked for more memory than the machine can give was told, in a few
    words (a network's size setting far too large: torch's message is a C++ assertion); else None."""
    said = str(error)
    if not isinstance(error, (MemoryError, torch.OutOfMemoryError)) and "can't allocate memory" not in said:
        return None
    size = re.search(r"allocate (\d+) bytes", said) or re.search(r"allocate ([\d.]+ \w+)", said)
    amount = f"{int(size.group(1)) / 1e9:,.0f} GB" if size and size.group(1).isdigit() else None
    amount = amount or (size.group(1) if size else "more memory than this machine has")
    return (
        f"building it asks for {amount} of memory, more than this machine can give. A size setting "
        "too large (a width, a depth, a vocabulary)? Lower it"
    )


def unwrapped(error: BaseException) -> BaseException:
    """The error a constructor raised, beneath those jsonargparse wraps it in ("Does not validate
    against any of the Union subtypes", a dump of every subtype it tried)."""
    while raised_in(error, "jsonargparse") and (inner := error.__cause__ or error.__context__) is not None:
        error = inner
    return error


def raised_in(error: BaseException, package: str) -> bool:
    return any(f"{os.sep}{package}{os.sep}" in frame.filename for frame in innermost(error))


def innermost(error: BaseException) -> list[traceback.FrameSummary]:
    """The frame that raised ``error``, as a one-item list (empty without a traceback)."""
    frames = traceback.extract_tb(error.__traceback__)
    return frames[-1:]


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` refuses an argument rather than shows a bug (see ``named_refusals``)."""
    if isinstance(error, (ConfigError, OSError)) or raised_in(error, "jsonargparse"):
        return True
    if not isinstance(error, (ValueError, TypeError)):
        return False
    return any((frame.line or "").startswith("raise") for frame in innermost(error))


def refusal(error: BaseException, config, said: str | None = None) -> str:
    """What a constructor refused, as ``"<key> (<class path>): <its message>"`` for the class from the
    config that raised it, found on the traceback of ``error`` or of the error it wraps (jsonargparse
    wraps it in a dump of every subtype it tried). The key is left out when the message starts
    with it already, and is unknown when no class of the config raised ``error``. ``said`` replaces
    the error's message."""
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
                text = said or str(cause)
                named = text.startswith((f"{key}.", f"{key}:"))
                return text if named else f"{key} ({class_path}): {text}"
            frame = frame.tb_next
        cause = cause.__cause__ or cause.__context__
    return said or str(error)


def lightning_refusal(error: BaseException) -> str | None:
    """The message for a setting Lightning refused once the command was under way (a
    ``val_check_interval`` above an epoch's batches, known only once the data is loaded), naming
    the Trainer setting when its message does; None for anything else.

    A refusal is Lightning's ``MisconfigurationException`` or ``ValueError`` raised in Lightning's
    own code, which Lightning called, perhaps through a set-up hook of the model's
    (``configure_optimizers`` reads ``estimated_stepping_batches``). One raised inside a step or an
    ``on_*`` hook of a model or callback (a misused ``self.log``) is a bug there and keeps its traceback.
    """
    frames = traceback.extract_tb(error.__traceback__)
    ours = [not _in_lightning(frame) for frame in frames]
    if not frames or ours[-1] or False not in ours:
        return None
    called = frames[ours.index(False) :]
    if any(not _in_lightning(f) and (f.name.endswith("_step") or f.name.startswith("on_")) for f in called):
        return None
    said = " ".join(str(error).split())
    settings = inspect.signature(Trainer.__init__).parameters
    # Lightning quotes the setting (`max_epochs`) or names it bare ("... for limit_val_batches, ...").
    named = next((name for name in re.findall(r"`(\w+)", said) if name in settings), None)
    named = named or next((name for name in re.findall(r"\b(\w+)\b", said) if name in settings), None)
    where = f"trainer.{named}" if named else "the Trainer's settings"
    return f"{where}: Lightning refused it: {said}"


def _in_lightning(frame: traceback.FrameSummary) -> bool:
    return f"{os.sep}lightning{os.sep}" in frame.filename


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
    if isinstance(error, PermissionError) and error.filename:
        return (
            f"no permission to use '{error.filename}' ({error.strerror}): a folder made read-only "
            "(chattr +i, a read-only mount, its mode?). Make it writable (`chattr -i`, `chmod u+w`), "
            "or point trainer.logger.init_args.save_dir at a folder you can write to."
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
