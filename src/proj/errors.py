"""How a command that cannot work says so: one line that names the field and the fix, rather than a
traceback from deep inside Lightning or jsonargparse, and no run directory left behind.

A refused setting exits with status 2. A run directory another process holds, a lost peer of a
distributed job, a run that diverged, or an export whose artifacts fail their check exits with 1;
a diverged run keeps its run directory, whose checkpoints are from before the divergence. A run
that Lightning's own handler stops on SIGTERM (``preemption: null``) exits with 143, as one that
``proj.reliability.Preemption`` stops does, never with 0.
``PROJ_DEBUG=1`` shows the traceback as well (and raises the error as it was), as for a bug;
anything that is no user error keeps its traceback always.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import errno
import importlib
import inspect
import os
import re
import signal
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from jsonargparse import ArgumentParser
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from proj.rundir.lock import RunInUseError, RunLock

DEBUG_VARIABLE = "PROJ_DEBUG"
# What the operating system says when the disk cannot take a file: said as such, not as a traceback.
# (A save_dir that is no folder, or not writable, is refused before the run: checks.save_dir.)
DISK_ERRORS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}


class ConfigError(ValueError):
    """A setting, file or checkpoint the user gave cannot work: the message names it and the fix.

    ``proj.cli.main`` prints it without a traceback (``PROJ_DEBUG=1`` shows one), also when it is
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
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except (DivergenceError, ExportCheckError) as error:
        if debugging():
            raise
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ConfigError, OSError, ValueError, MisconfigurationException) as error:
        # A ConfigError is a ValueError too: the project's own refusals first, then Lightning's.
        refused = isinstance(error, (ConfigError, OSError))
        message = user_error(error) if refused else lightning_refusal(error)
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
        if not is_refusal(cause):
            raise cause from cause.__cause__
        raise ConfigError(refusal(error, config)) from error


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


class ShortErrorParser(LightningArgumentParser):
    """Errors in what was typed, said in a few lines: the message without jsonargparse's dumps of
    the whole parsed value (``Given value: Namespace(...)``, a screen long) or the usage of every
    option, which ``--help`` shows."""

    def error(self, message: str, ex: Exception | None = None) -> None:
        if debugging() or not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", self)  # a config key refused by the subcommand's parser
        said = unknown_name(message, parser) or one_line(message, self.env_prefix)
        sys.stderr.write(f"error: {said}\n(--help lists the options.)\n")
        raise SystemExit(2)


def unknown_name(message: str, parser: ArgumentParser) -> str | None:
    """jsonargparse's one-line refusal of a flag, key or subcommand that ``parser`` has not, with the
    closest one it has; None for any other message (a key below a class: ``one_line``). The names are
    the parser's actions (argparse's ``_actions``: neither library lists them otherwise)."""
    if match := re.fullmatch(r"unrecognized arguments: --([^\s=]+).*", message):
        name, flag = match[1], "--"
    elif match := re.fullmatch(
        r"Subcommand '[^']+' does not accept option '([^']+)'|Option '([^']+)' is not accepted", message
    ):
        name, flag = match[1] or match[2], ""
    elif match := re.fullmatch(r"Group '([^']+)' does not accept option '([^']+)'", message):
        name, flag = f"{match[1]}.{match[2]}", ""
    elif match := re.fullmatch(r"argument subcommand: invalid choice: '([^']+)' \(choose from .*\)", message):
        subcommands = [action for action in parser._actions if action.dest == "subcommand"]
        hint = closest(match[1], [name for action in subcommands for name in action.choices])
        return f"{message}.{hint}" if hint else message
    else:
        return None
    hint = closest(name, [action.dest for action in parser._actions], flag)
    return f"{message}.{hint}" if hint else message


def closest(key: str, known: list[str], prefix: str = "") -> str:
    """`` Did you mean <key>?``: dotted ``key`` with its first part that no ``known`` key has at its
    place replaced by the closest one there (the parts after it are the user's: below a class they are
    checked once the class is known); or the names there when none is close (a fix is then more than a
    typo's), as long as they fit on a line; empty when every part is known."""
    parts = key.split(".")
    known_parts = [name.split(".") for name in known]
    for depth, part in enumerate(parts):
        names = sorted({k[depth] for k in known_parts if len(k) > depth and k[:depth] == parts[:depth]})
        if not names or part in names:
            continue
        if close := difflib.get_close_matches(part, names, n=1):
            return f" Did you mean {prefix}{'.'.join([*parts[:depth], close[0], *parts[depth + 1 :]])}?"
        where = f" under {'.'.join(parts[:depth])}" if depth else ""
        return f" The names{where} are {', '.join(names)}." if len(names) <= 12 else ""
    return ""


def settings_of(class_path: str) -> list[str]:
    """The ``init_args`` names ``class_path`` takes, as jsonargparse reads them (its own and those its
    ``**kwargs`` pass on to a parent); none where it cannot be read."""
    module, _, name = class_path.rpartition(".")
    try:
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(getattr(importlib.import_module(module), name), fail_untyped=False)
        return sorted(name for name in vars(parser.get_defaults()) if not name.startswith("__"))
    except Exception:  # a class that cannot be read has no names to offer
        return []


@dataclass(frozen=True)
class _Class:
    """On the key path: the values below are the init_args of the class chosen here (its class path,
    where the report names it)."""

    path: str | None


_NOT_FINITE = {"nan", "inf", "infinity"}


def one_line(message: str, env_prefix: object = None) -> str:
    """jsonargparse's nested report (a ``Parser key`` per level, a list of every Union subtype tried)
    as one line: the full key of the innermost value refused, and why. Where the value is not a
    finite number, that is said; where it came from a ``PL_*`` variable, the variable is named; where
    the key is one its class does not take, the closest it does."""
    if "\n" not in message:
        return message
    found, given = read_report(message)
    if not found:
        return " ".join(line.strip() for line in message.splitlines() if line.strip())
    if said := not_taken(found, given, env_prefix):
        return said
    depth = max(len(path) for path, _, _ in found)
    path = next(path for path, _, _ in found if len(path) == depth)
    reasons = list(dict.fromkeys(text for p, text, _ in found if p == path))
    key = ".".join(path)
    values = [
        m[1].strip() or "''"
        for text in reasons
        if (m := re.search(r"\. Got value:(.*?)(?:\. Got value:.*)?$", text))
    ]
    value = values[0] if values else given
    reasons = [re.sub(r"\. Got value:.*$", "", text) for text in reasons]
    where = key + source(path, env_prefix)
    if value is not None and value.strip("'\" ").lower().lstrip("+-.") in _NOT_FINITE:
        if any("<class 'int'>" in text for text in reasons) and "nan" not in value.lower():
            return (
                f"{where}={value}: too large for an integer (a number such as 1e400 overflows to "
                "infinity). Give a whole number."
            )
        return f"{where}={value}: must be a finite number. Give a finite value."
    if reasons[0].startswith("Unable to load config"):
        detail = [text for text in reasons[1:] if not text.startswith('in "<unicode string>"')]
        text = value or reasons[0].removeprefix("Unable to load config ")
        return f"{where}: cannot read {text} as YAML ({'; '.join(detail)})."
    nullable = any(text.startswith("Expected a <class 'NoneType'>") for text in reasons)
    kept = [
        text
        for text in reasons
        if not text.startswith(("Expected a <class 'NoneType'>", "Expected a path but"))
    ]
    expected = kept and all(text.startswith("Expected a ") for text in kept)
    reason = "; ".join(kept or reasons) + (" or null" if nullable and expected else "")
    return f"{where}: {reason}" + (f", got {value}" if value is not None and value not in reason else "")


def read_report(message: str) -> tuple[list[tuple[tuple[str, ...], str, _Class | None]], str | None]:
    """The refusals of jsonargparse's nested report, each with its full key and the class it is
    below, and the value it was given."""
    stack: list[tuple[int, object]] = []
    found: list[tuple[tuple[str, ...], str, _Class | None]] = []
    given = None
    for line in message.splitlines():
        text = line.strip()
        if not text:
            continue
        indent = len(line) - len(line.lstrip())
        if text.startswith("- "):
            text, indent = text[2:], indent + 2
        while stack and stack[-1][0] >= indent:
            stack.pop()
        while text:
            if match := re.match(r'Parser key "([^"]+)":\s*(.*)', text):
                # The outermost key holds every line after it, indented or not.
                stack.append((indent if stack else -1, match[1]))
                text, indent = match[2], indent + 1
            elif match := re.match(
                r"(?:Problem with given class_path '([^']*)'|.* expects a function or a callable class):"
                r"\s*(.*)",
                text,
            ):
                stack.append((indent, _Class(match[1])))
                text, indent = match[2], indent + 1
            else:
                break
        if text.startswith("Given value:"):
            given = text.removeprefix("Given value:").strip()
            if nested := re.fullmatch(r"NestedArg\(key='[^']*', val=(.*)\)", given):
                given = nested[1]
        elif text and not text.startswith(
            ("Does not validate against", "Subtypes:", "Errors:", "Given value")
        ):
            below = stack[-1][1] if stack and isinstance(stack[-1][1], _Class) else None
            found.append((key_path(stack), text, below))
    return found, given


def not_taken(
    found: list[tuple[tuple[str, ...], str, _Class | None]], given: str | None, env_prefix: object
) -> str | None:
    """The report of a key that the class chosen above it does not take (``Option 'x' is not
    accepted``), as that key in full and the closest the class takes; the other Union subtypes that
    jsonargparse lists (null, another form of the value) are no fix. None for any other report."""
    refused = []
    for path, text, below in found:
        option = re.match(r"Option '([^']+)' is not accepted", text)
        if option and below is not None:
            class_path = below.path or next(iter(re.findall(r"class_path='([^']+)'", text)), "")
            refused.append((path, option[1], class_path))
    if not refused:
        return None
    named = [(path, option, c, names) for path, option, c in refused if (names := settings_of(c))]
    path, option, class_path, names = (named or [(*refused[0], [])])[0]
    key = ".".join(path)
    if (index := list_index(given, class_path)) is not None:
        key += f"[{index}]"
    hint = closest(f"{key}.init_args.{option}", [f"{key}.init_args.{name}" for name in names])
    owner = class_path or "the class given"
    where = f"{key}.init_args.{option}{source(path, env_prefix)}"
    return f"{where}: {owner} does not accept option '{option}'.{hint}"


def list_index(given: str | None, class_path: str) -> int | None:
    """Where in the list ``given`` (the value as jsonargparse shows it) the class ``class_path`` is."""
    try:
        value = ast.literal_eval(given or "")
    except (ValueError, SyntaxError):
        return None
    if not isinstance(value, list):
        return None
    chosen = [isinstance(item, dict) and item.get("class_path") == class_path for item in value]
    return chosen.index(True) if True in chosen else None


def source(path: tuple[str, ...], env_prefix: object) -> str:
    """`` (from PL_FIT__DATA)`` where the value at ``path`` came from that variable."""
    variable = f"{env_prefix}_{path[0]}".replace(".", "__").upper() if env_prefix and path else None
    return f" (from {variable})" if variable and variable in os.environ else ""


def key_path(stack: list[tuple[int, object]]) -> tuple[str, ...]:
    """The dotted key of a place in jsonargparse's report: ``init_args`` below each chosen class."""
    keys: list[str] = []
    below_class = False
    for _, key in stack:
        if isinstance(key, _Class):
            below_class = True
            continue
        keys += ["init_args", str(key)] if below_class and keys else [str(key)]
        below_class = False
    return tuple(keys)


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
    named = next((name for name in re.findall(r"`(\w+)", said) if name in settings), None)
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
