"""The kit stands on its own: it imports nothing but the standard library, its own modules and the
packages its pyproject.toml depends on (never a project's package), names no project, reads top-down
(no import cycle) and keeps each file and function short enough to read whole."""

from __future__ import annotations

import importlib.metadata
import re
import sys

from conftest import KIT, ROOT
from projkit.testing.code import import_cycles, imported, too_long

PACKAGE = KIT / "src" / "projkit"
# projkit.testing runs under a project's tests: what it needs beyond the kit's dependencies (pytest)
# is the `testing` extra of kit/pyproject.toml.
TESTING = PACKAGE / "testing"


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


def kit_dependencies(block: str = r"^dependencies = \[(.*?)^\]") -> set[str]:
    """The distributions kit/pyproject.toml names in ``block`` (its dependencies by default)."""
    text = (KIT / "pyproject.toml").read_text()
    listed = re.search(f"(?ms){block}", text)[1]
    return {re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)[0] for spec in re.findall(r'"([^"]+)"', listed)}


def test_the_kit_imports_only_the_standard_library_and_its_own_dependencies():
    allowed: set[str] = set()
    for dependency in kit_dependencies():
        requirement_names(dependency, allowed)
    testing = set(allowed)
    for dependency in kit_dependencies(r"^testing = \[(.*?)\]"):
        requirement_names(dependency, testing)
    assert "pytest" in testing - allowed
    providers = importlib.metadata.packages_distributions()
    foreign = []
    for path in sorted(PACKAGE.rglob("*.py")):
        permitted = testing if path.is_relative_to(TESTING) else allowed
        for name in imported(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "projkit" or top == "__future__":
                continue
            distributions = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(top, [])}
            if not distributions & permitted:
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
    cycles = import_cycles(PACKAGE)
    assert not cycles, "\n".join(cycles)


def test_no_file_or_function_is_longer_than_it_can_be_read():
    """A function over 60 lines (its docstring included) or a module over 400 is split."""
    assert too_long([*PACKAGE.rglob("*.py"), *(KIT / "scripts").glob("*.py")], KIT) == []


def test_a_file_is_hashed_by_one_function_that_imports_no_streaming():
    """An export's checkpoint and optimize's chunks are named by the sha256 of their bytes, read a
    block at a time in one function (``projkit.files.sha256_of``), whose module imports neither
    LitData nor the streaming code: export, which uses it too, never loads them."""
    hashing = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "sha256()" in p.read_text()]
    assert hashing == ["files.py"]
    assert {m for m in imported(PACKAGE / "files.py") if m.startswith(("litdata", "projkit"))} == set()
