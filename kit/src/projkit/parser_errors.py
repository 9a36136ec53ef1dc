"""What was typed, refused in a few lines: jsonargparse's nested reports of a refused flag, key or
value read as one line that names the full key, and the closest name where a key is misspelt."""

from __future__ import annotations

import ast
import difflib
import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.cli import LightningArgumentParser

from projkit import moved_classes
from projkit.credentials import masked
from projkit.data.names import printable
from projkit.errors import debugging
from projkit.internals.stdlib import parser_actions


class ShortErrorParser(LightningArgumentParser):
    """Errors in what was typed, said in a few lines: the message without jsonargparse's dumps of
    the whole parsed value (``Given value: Namespace(...)``, a screen long) or the usage of every
    option, which ``--help`` shows."""

    def error(self, message: str, ex: Exception | None = None) -> None:
        if debugging() or not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", self)  # a config key refused by the subcommand's parser
        said = masked(printable(unknown_name(message, parser) or one_line(message, self.env_prefix)))
        sys.stderr.write(f"error: {said}\n(--help lists the options.)\n")
        raise SystemExit(2)

    def parse_object(
        self, obj: Namespace | dict, namespace: Namespace | None = None, *args: Any, **kwargs: Any
    ) -> Namespace:
        """jsonargparse's, with a class path from before the kit's split read as the kit's
        (``moved_classes``): a checkpoint's hyperparameters come this way, which YAML does not."""
        return super().parse_object(moved_classes.read(obj), namespace, *args, **kwargs)


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
        subcommands = [action for action in parser_actions(parser) if action.dest == "subcommand"]
        hint = closest(match[1], [name for action in subcommands for name in action.choices])
        return f"{message}.{hint}" if hint else message
    else:
        return None
    hint = closest(name, [action.dest for action in parser_actions(parser)], flag)
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
