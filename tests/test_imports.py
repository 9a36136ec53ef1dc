"""The package reads top-down: no module of ``src/proj`` imports, however indirectly, a module that
imports it back (each job in its own module, as the README's layout says)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "src" / "proj"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found |= {name for name in names if name in modules}
    return found


def test_no_import_cycle_in_the_package():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph = {module_name(path): imports(path, modules) - {module_name(path)} for path in paths}
    # A package imports its own __init__ on the way to a submodule: that edge is no cycle.
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
    assert not cycles, "\n".join(sorted(set(cycles))[:10])


MAX_FUNCTION_LINES = 60


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


MAX_FILE_LINES = 400


def test_no_function_is_longer_than_a_screen():
    """A function is read whole: one over 60 lines (its docstring included) is split, and so is a
    module over 400 lines."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE))
        if (lines := path.read_text().count("\n")) > MAX_FILE_LINES:
            long.append(f"{module} has {lines} lines")
        for name, node in functions(ast.parse(path.read_text())):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{module}: {name} has {lines} lines")
    assert not long, "\n".join(long)
