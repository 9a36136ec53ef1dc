"""`make rename NAME=…`: the package gets a new name everywhere, and the renamed copy still works."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, copy_repo


def load_rename_script():
    spec = importlib.util.spec_from_file_location("rename", ROOT / "kit" / "scripts" / "rename.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rename = load_rename_script()
# Spelled through the script's own constant, so these tests read the same after a rename.
OLD = rename.OLD
OLD_NAME = re.compile(rf"\b{OLD}\b")
NEW = "mynewproject" if OLD != "mynewproject" else "othernewproject"
UNTOUCHABLE = ("uv.lock", f".venv/lib/{OLD}.pth", ".git/HEAD", "runs/digits/config.yaml")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())


def readme(name: str) -> str:
    return f"# {name}, a project template\n`python -m {name}` in my_{OLD}/\n"


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """A miniature of the template, with the folders the rename must leave alone."""
    # The script takes the name to replace from here, as the kit finds a checkout's package.
    write(tmp_path / "pyproject.toml", f'[project]\nname = "{OLD}"\ndependencies = [\n    "torch>=2.6",\n]\n')
    write(tmp_path / "src" / OLD / "__main__.py", f"from {OLD}.cli import main\r\n")
    write(tmp_path / "README.md", readme(OLD))
    for untouchable in UNTOUCHABLE:
        write(tmp_path / untouchable, f"{OLD}\n")
    return tmp_path


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("MyProject", "not a lowercase Python identifier"),
        ("my-project", "not a lowercase Python identifier"),
        ("2fast", "not a lowercase Python identifier"),
        ("class", "Python keyword"),
        ("json", "standard-library module"),
        ("torch", "depends on"),
        (OLD, "already called"),
        ("taken", "already exists"),
    ],
)
def test_rename_refuses_a_bad_name_and_changes_nothing(template, name, reason):
    (template / "src" / "taken").mkdir()
    with pytest.raises(ValueError, match=reason):
        rename.rename(name, template)
    assert (template / "src" / OLD / "__main__.py").is_file()
    assert (template / "README.md").read_text() == readme(OLD)


def test_rename_rewrites_whole_words_only_and_skips_environment_and_lock(template):
    changed = rename.rename(NEW, template)
    assert sorted(p.relative_to(template).as_posix() for p in changed) == [
        "README.md",
        "pyproject.toml",
        f"src/{NEW}/__main__.py",
    ]
    assert not (template / "src" / OLD).exists()
    assert (template / "src" / NEW / "__main__.py").read_bytes() == f"from {NEW}.cli import main\r\n".encode()
    assert (template / "README.md").read_text() == readme(NEW)
    for untouchable in UNTOUCHABLE:
        assert (template / untouchable).read_text() == f"{OLD}\n"


def digests(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` by its path there, with its bytes' SHA-256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def words_starting_with_project(root: Path) -> int:
    return sum(
        len(re.findall(r"\bproject", p.read_text(errors="replace"))) for p in root.rglob("*") if p.is_file()
    )


@pytest.mark.slow
def test_renamed_copy_keeps_no_old_name_lints_tests_and_trains(tmp_path):
    copy = copy_repo(tmp_path / "copy")
    projects = words_starting_with_project(copy)
    kit = digests(copy / "kit")
    renamed = subprocess.run(
        [sys.executable, "kit/scripts/rename.py", NEW], cwd=copy, capture_output=True, text=True, timeout=60
    )
    assert renamed.returncode == 0, renamed.stderr
    assert "uv lock" in renamed.stdout

    leftovers = [
        f"{path.relative_to(copy)}:{number}: {line}"
        for path in sorted(copy.rglob("*"))
        if path.is_file() and path.name != "uv.lock"
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OLD_NAME.search(line)
    ]
    assert leftovers == []
    assert words_starting_with_project(copy) == projects
    # The kit is the template's, renamed never: a later upgrade replaces it whole, without a conflict.
    assert digests(copy / "kit") == kit
    pyproject = (copy / "pyproject.toml").read_text()
    assert f'name = "{NEW}"' in pyproject and f'{NEW} = "{NEW}:run"' in pyproject
    assert f'packages = ["src/{NEW}"]' in pyproject

    def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        # The current environment's packages, with the copy's source first on the path.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy / "src"), str(copy / "kit" / "src")])}
        return subprocess.run(
            [sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )

    # What the rename rewrote must still lint (a longer name lengthens lines); the copy's other files
    # are as they were, and a file of the owner's own that `make lint` refuses is `make lint`'s to say.
    rewritten = [line.strip() for line in renamed.stdout.splitlines() if line.startswith("  ")]
    python = [name for name in rewritten if name.endswith((".py", ".ipynb"))]
    assert python, renamed.stdout
    for lint in (["check", "--no-cache"], ["format", "--no-cache", "--check"]):
        result = run("-m", "ruff", *lint, *python, timeout=60)
        said = f"ruff {lint[0]} on the files the rename rewrote:\n{result.stdout[-3000:]}"
        assert result.returncode == 0, said
    selection = "test_data_facts_are_linked_into_the_network or (test_fast_dev_run and digits)"
    tests = run("-m", "pytest", "-m", "not slow", "-q", "-x", "-p", "no:cacheprovider", "-k", selection)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert "2 passed" in tests.stdout
    fit = run("-m", NEW, "fit", "--config", "configs/digits.yaml", "--trainer.fast_dev_run=true")
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "Test metrics: test/acc" in fit.stderr
