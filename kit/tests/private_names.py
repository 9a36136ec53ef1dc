"""Finds the kit's uses of other libraries' private names, read from its source: an attribute, an
imported name or module, or a string naming one (``getattr(x, "_name")``, a checkpoint's key),
that starts with one underscore and that the kit does not define itself, and the few internal
attributes that have no underscore (``UNMARKED``: LitData's loader's). A class of the kit that
overrides a private method of another library's class is found by ``private_overrides``.

``python kit/tests/private_names.py`` prints them, with counts per file and library: the measure the
seams (``projkit.internals``) are held to."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "projkit"
SEAMS = PACKAGE / "internals"
# Underscore names the standard library documents as public API.
DOCUMENTED = {"_exit", "_asdict", "_replace", "_fields", "_make", "_field_defaults", "_missing_"}
# Internals without an underscore: LitData's StreamingDataLoader replays a restored position while
# its ``restore`` flag is set, and starts the epoch after its ``current_epoch`` (which Lightning's
# trainer and module also name, read-only: only an assignment is LitData's).
UNMARKED = {"restore"}
UNMARKED_WHEN_SET = {"current_epoch"}


@dataclass(frozen=True)
class Use:
    path: Path
    line: int
    name: str
    code: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(PACKAGE.parent)}:{self.line}: {self.name} ({self.code})"


def private(name: str) -> bool:
    return (
        name.startswith("_") and not name.startswith("__") and name.isidentifier() and name not in DOCUMENTED
    )


def own_names(paths: list[Path]) -> set[str]:
    """The private names the kit defines: functions, classes, module-level names, and attributes
    assigned on ``self``/``cls``."""
    own = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
    return {name for name in own if private(name)}


def unmarked(node: ast.Attribute) -> bool:
    """Whether ``node`` uses a library's internal attribute that has no underscore."""
    return node.attr in UNMARKED or (node.attr in UNMARKED_WHEN_SET and isinstance(node.ctx, ast.Store))


def f_string_parts(tree: ast.AST) -> set[int]:
    return {id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for value in node.values}


def uses_in(path: Path, source: str, own: set[str]) -> Iterator[Use]:
    """Every private name of another library that ``source`` names."""
    tree = ast.parse(source)
    in_f_strings = f_string_parts(tree)
    for node in ast.walk(tree):
        found: list[tuple[str, str]] = []
        foreign = isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in own
        if foreign or (isinstance(node, ast.Attribute) and unmarked(node)):
            found.append((node.attr, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            module = node.module or ""
            if not module.startswith("projkit") and any(private(part) for part in module.split(".")):
                found.append((module, f"from {module} import ..."))
            if not module.startswith("projkit"):
                found += [
                    (alias.name, f"from {module} import {alias.name}")
                    for alias in node.names
                    if private(alias.name)
                ]
        elif isinstance(node, ast.Import):
            found += [
                (a.name, f"import {a.name}") for a in node.names if any(private(p) for p in a.name.split("."))
            ]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in in_f_strings
            and private(node.value)
            and node.value not in own
        ):
            found.append((node.value, repr(node.value)))
        for name, code in found:
            yield Use(path, node.lineno, name, code)


def private_uses(paths: list[Path] | None = None) -> list[Use]:
    """The uses in the kit's package (``paths``: its modules by default), the seams' among them."""
    paths = sorted(PACKAGE.rglob("*.py")) if paths is None else paths
    own = own_names([p for p in paths if not p.is_relative_to(SEAMS)])
    return [use for path in paths for use in uses_in(path, path.read_text(), own)]


def private_overrides(module_names: list[str]) -> list[str]:
    """``module.Class._method`` for each method a kit class defines whose name is private to a base
    class from another library (an override of that library's internals)."""
    found = []
    for module_name in module_names:
        module = importlib.import_module(module_name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module_name:
                continue
            foreign = [
                base for base in cls.__mro__[1:] if not base.__module__.startswith(("projkit", "builtins"))
            ]
            source = inspect.getsource(cls)  # names a metaclass or __init_subclass__ sets are not the kit's
            for name in vars(cls):
                written = f"def {name}(" in source or f"{name} =" in source
                if private(name) and written and any(name in vars(base) for base in foreign):
                    found.append(f"{module_name}.{cls.__name__}.{name}")
    return found


def library(use: Use) -> str:
    """The library a use's name belongs to, by the seam it lives in (outside one: "outside")."""
    return use.path.stem if use.path.is_relative_to(SEAMS) else "outside the seams"


if __name__ == "__main__":
    uses = private_uses()
    for use in uses:
        print(use)
    print(f"{len(uses)} uses in {len({u.path for u in uses})} files")
    for name, count in Counter(map(library, uses)).most_common():
        names = {u.name for u in uses if library(u) == name}
        print(f"  {name}: {count} uses, {len(names)} names")
    sys.exit(0)
