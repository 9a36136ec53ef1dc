"""Checks of a package's source that keep it readable, for a project's tests of its own package and
the kit's of itself: no import cycle (a package reads top-down), and no function longer than a screen
or module longer than a few screens (each read whole)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400


def module_name(path: Path, package: Path) -> str:
    """The dotted name of the module at ``path`` in the package folder ``package``."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which never run."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        yield node
        yield from runtime_nodes(node)


def imported(path: Path, runtime_only: bool = True) -> set[str]:
    """Every module name ``path`` imports (absolutely), at the top or inside a function; with
    ``runtime_only``, not those imported for type checking only."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in runtime_nodes(tree) if runtime_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def import_cycles(package: Path, runtime_only: bool = True) -> list[str]:
    """Each import cycle among the modules of the package folder ``package`` (``a -> b -> a``), at most
    ten. A module importing its own package's ``__init__`` on the way to a submodule is no cycle."""
    paths = sorted(package.rglob("*.py"))
    modules = {module_name(path, package) for path in paths}
    graph = {
        module_name(path, package): {m for m in imported(path, runtime_only) if m in modules}
        - {module_name(path, package)}
        for path in paths
    }
    for name in graph:
        graph[name] = {dep for dep in graph[name] if not name.startswith(f"{dep}.")}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        for dep in sorted(graph[name]):
            if dep in trail:
                cycles.append(" -> ".join([*trail[trail.index(dep) :], dep]))
            elif len(trail) < len(graph):
                visit(dep, [*trail, dep])

    for name in sorted(graph):
        visit(name, [name])
    return sorted(set(cycles))[:10]


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """Every function and method of a module, by qualified name (``Class.method``)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        name = f"{prefix}{getattr(node, 'name', '')}"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((name, node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found += functions(node, f"{name}.")
    return found


def too_long(
    paths: Iterable[Path],
    root: Path,
    max_function_lines: int = MAX_FUNCTION_LINES,
    max_file_lines: int = MAX_FILE_LINES,
) -> list[str]:
    """The files of ``paths`` over ``max_file_lines`` lines and their functions over
    ``max_function_lines`` (docstring included), each named relative to ``root``."""
    long = []
    for path in sorted(paths):
        text = path.read_text()
        if (lines := text.count("\n")) > max_file_lines:
            long.append(f"{path.relative_to(root)} has {lines} lines")
        for name, node in functions(ast.parse(text)):
            if (lines := node.end_lineno - node.lineno + 1) > max_function_lines:
                long.append(f"{path.relative_to(root)}: {name} has {lines} lines")
    return long
