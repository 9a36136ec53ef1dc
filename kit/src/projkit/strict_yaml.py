"""YAML as the CLI reads it, from config files, flags and ``PL_*`` variables alike: a key given twice
is refused (YAML keeps the last without a word), and so is a document whose aliases expand past any
config's size (nested aliases, a "billion laughs", would hang the parser while memory grows).

jsonargparse loads every config file and every value through one YAML loader; ``install`` puts this
check in front of it, so no way of giving YAML escapes it. Every other YAML the kit reads (a sweep
config, a run's own ``config.yaml`` on resume) goes through ``load`` or ``read``: the same checks, and
the safe loader, so that no tag builds an object or runs code.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import get_loader, set_dumper, set_loader

# Far above any config (the largest shipped one is a few hundred nodes), far below what hangs.
MAX_NODES = 100_000


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UnsafeYAML(yaml.YAMLError):
    """YAML that parses but cannot be meant: a repeated key, or aliases expanding without bound."""


class YAMLFileError(ValueError):
    """A YAML file that cannot be read as a config; the message says where and the fix (the caller
    puts the file's name in front)."""


def load(text: str) -> Any:
    """YAML text as the CLI reads a config: no key twice, no alias bomb, no tag that builds an object."""
    check_yaml(text)
    return yaml.load(text, Loader=SAFE_LOADER)


def read(path: str | Path) -> Any:
    """The YAML file ``path`` read with ``load``; any problem with its text raised as ``YAMLFileError``
    (an ``OSError`` passes: the caller knows what the file is for)."""
    raw = Path(path).read_bytes()
    try:
        return load(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise YAMLFileError(
            f"not UTF-8 text ({error.reason} at byte {error.start}). Save it as UTF-8"
        ) from None
    except yaml.YAMLError as error:
        raise YAMLFileError(problem(error, raw.decode("utf-8"))) from None


def problem(error: yaml.YAMLError, text: str) -> str:
    """What is wrong with the YAML, by line, with the fix."""
    if isinstance(error, UnsafeYAML):
        return str(error)
    mark = getattr(error, "problem_mark", None)
    line = mark.line + 1 if mark else None
    reason = str(getattr(error, "problem", None) or error)
    if tag := re.search(r"constructor for the tag '([^']+)'", reason):
        name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        return (
            f"line {line}: the tag {name} asks for an object, which a config never holds (such a tag "
            "builds objects or runs code). Remove the tag and write the value"
        )
    at = text.splitlines()[line - 1 : line] if line else []
    tabs = "; YAML indents with spaces, not tabs" if any("\t" in part for part in at) else ""
    return f"not valid YAML{f' at line {line}' if line else ''} ({reason}){tabs}. Fix the syntax there"


def check_yaml(text: str) -> None:
    """Raise ``UnsafeYAML`` for a repeated key (naming it and both lines) or for aliases that expand
    to more than ``MAX_NODES`` nodes; syntax errors are left to the loader, which reports them."""
    try:
        node = yaml.compose(text, Loader=SAFE_LOADER)
    except yaml.YAMLError:
        return
    if node is not None:
        expanded(node, {}, [])


def expanded(node: yaml.Node, sizes: dict[int, int], path: list[str]) -> int:
    """The number of nodes ``node`` stands for once every alias is copied out, each shared node
    counted once per use (``sizes`` keeps what is known), checking every mapping's keys on the way."""
    if id(node) in sizes:
        size = sizes[id(node)]
    else:
        size = 1
        if isinstance(node, yaml.MappingNode):
            check_keys(node, path)
            for key, value in node.value:
                size += expanded(key, sizes, path) + expanded(value, sizes, [*path, str(key.value)])
        elif isinstance(node, yaml.SequenceNode):
            size += sum(expanded(item, sizes, path) for item in node.value)
        sizes[id(node)] = size
    if size > MAX_NODES:
        raise UnsafeYAML(
            f"its aliases (*name) expand to more than {MAX_NODES:,} values, more than any config holds "
            "(nested aliases?). Write the values out, or use fewer levels of aliases"
        )
    return size


def check_keys(node: yaml.MappingNode, path: list[str]) -> None:
    seen: dict[Any, int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        if key.value in seen:
            where = f" under '{'.'.join(path)}'" if path else ""
            raise UnsafeYAML(
                f"key '{key.value}'{where} is given twice (lines {seen[key.value]} and {line}); YAML "
                "would keep the last silently. Keep one of them"
            )
        seen[key.value] = line


def without_empty_arguments(value: Any) -> Any:
    """``init_args:`` or ``dict_kwargs:`` left empty (YAML's null) read as no arguments, which is what
    the line says; jsonargparse refused it with "'NoneType' object has no attribute 'keys'"."""
    if isinstance(value, dict):
        return {
            key: {} if key in ("init_args", "dict_kwargs") and item is None else without_empty_arguments(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [without_empty_arguments(item) for item in value]
    return value


def install() -> None:
    """Check every YAML jsonargparse loads, before its own loader reads it."""
    load = get_loader("yaml")
    if getattr(load, "checked", False):
        return

    def checked_load(text: str) -> Any:
        if isinstance(text, str):
            check_yaml(text)
        return without_empty_arguments(load(text))

    checked_load.checked = True
    set_loader("yaml", checked_load, (yaml.YAMLError,))
    set_dumper("yaml", dump)


def dump(data: Any) -> str:
    """YAML as jsonargparse writes it (a run's config.yaml, the values it checks a class's arguments
    with), an enum written as its value: Lightning's ``Timer`` defaults ``interval: str`` to the enum
    ``Interval.step``, which the safe dumper cannot write, so adding it to a config was a traceback."""
    return yaml.safe_dump(enum_values(data), default_flow_style=False, allow_unicode=True, sort_keys=False)


def enum_values(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: enum_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [enum_values(item) for item in value]
    return value
