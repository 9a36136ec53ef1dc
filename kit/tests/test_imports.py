"""The kit stands on its own: it imports nothing but the standard library, its own modules and the
packages its pyproject.toml depends on (never a project's package), names no project, reads top-down
(no import cycle) and keeps each file and function short enough to read whole."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from conftest import KIT, ROOT

PACKAGE = KIT / "src" / "projkit"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which never run."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        yield node
        yield from runtime_nodes(node)


def imported(path: Path) -> set[str]:
    """Every module name ``path`` imports when it runs, at the top or inside a function."""
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def requirement_names(distribution: str, seen: set[str]) -> set[str]:
    """``distribution`` and every distribution it requires, transitively (extras left out)."""
    name = re.sub(r"[-_.]+", "-", distribution).lower()
    if name in seen:
        return seen
    seen.add(name)
    try:
        requires = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return seen
    for requirement in requires:
        if "extra ==" not in requirement:
            requirement_names(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)[0], seen)
    return seen


def kit_dependencies() -> set[str]:
    text = (KIT / "pyproject.toml").read_text()
    block = re.search(r"(?ms)^dependencies = \[(.*?)^\]", text)[1]
    return {re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)[0] for spec in re.findall(r'"([^"]+)"', block)}


def test_the_kit_imports_only_the_standard_library_and_its_own_dependencies():
    allowed: set[str] = set()
    for dependency in kit_dependencies():
        requirement_names(dependency, allowed)
    providers = importlib.metadata.packages_distributions()
    foreign = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in imported(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "projkit" or top == "__future__":
                continue
            distributions = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(top, [])}
            if not distributions & allowed:
                foreign.append(f"{path.relative_to(KIT)} imports {name} ({', '.join(distributions) or '?'})")
    assert foreign == []


def test_a_project_package_import_is_found(tmp_path):
    """The check above fails on a project's package: one that no dependency of the kit provides."""
    allowed: set[str] = set()
    for dependency in kit_dependencies():
        requirement_names(dependency, allowed)
    assert "torch" in allowed and "lightning" in allowed and "optuna" in allowed
    providers = importlib.metadata.packages_distributions()
    assert not {d.lower() for d in providers.get("tinyproj", [])} & allowed
    sample = tmp_path / "sample.py"
    sample.write_text("from tinyproj.models import Classifier\nimport torch\n")
    assert imported(sample) == {"tinyproj.models", "tinyproj.models.Classifier", "torch"}


def test_the_kit_names_no_project():
    """`make rename` leaves kit/ byte-identical, so the kit must not name the project whose checkout
    holds it: messages say `python -m <package>` from ``projkit.project.current()``."""
    pyproject = ROOT / "pyproject.toml"
    if not pyproject.is_file() or pyproject.parent == KIT:
        return  # the kit checked out on its own: no project around it
    name = re.search(r'(?ms)^\[project\]\s.*?^name\s*=\s*"([^"]+)"', pyproject.read_text())[1]
    word = re.compile(rf"\b{re.escape(name.replace('-', '_'))}\b")
    named = [
        f"{path.relative_to(KIT)}:{number}"
        for path in sorted(KIT.rglob("*"))
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.suffix in (".py", ".md", ".toml", ".yaml", ".sh")
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if word.search(line)
    ]
    assert named == []


def test_no_import_cycle_in_the_kit():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph = {
        module_name(path): {m for m in imported(path) if m in modules} - {module_name(path)} for path in paths
    }
    for name in graph:  # a package imports its own __init__ on the way to a submodule: no cycle
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


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    found = []
    for node in ast.iter_child_nodes(tree):
        name = f"{prefix}{getattr(node, 'name', '')}"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((name, node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found += functions(node, f"{name}.")
    return found


def test_no_file_or_function_is_longer_than_it_can_be_read():
    """A function over 60 lines (its docstring included) or a module over 400 is split."""
    long = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(KIT / "scripts").glob("*.py")]):
        lines = path.read_text().count("\n")
        if lines > MAX_FILE_LINES:
            long.append(f"{path.relative_to(KIT)} has {lines} lines")
        for name, node in functions(ast.parse(path.read_text())):
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(KIT)}: {name} has {node.end_lineno - node.lineno + 1} lines")
    assert long == []
