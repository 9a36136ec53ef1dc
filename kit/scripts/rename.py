"""Rename the project's package: ``python kit/scripts/rename.py mynewproject`` (or ``make rename NAME=…``).

The package is the one the checkout's ``pyproject.toml`` names (its ``[project]`` name, a "-" read as
"_", as ``projkit.project.of_checkout`` finds it): the kit names no project. Moves ``src/<package>`` to
``src/<name>`` and rewrites the package's name wherever it stands as a whole word, so imports,
``python -m <package>``, class paths in configs, ``pyproject.toml``, docs, tests, notebooks and CI all
follow, while words that merely contain it are left alone. The kit (``kit/``, the template's
machinery, ``projkit``) is never touched: it names no project, so that a later ``make upgrade-kit``
replaces it without a conflict. It is meant to be run once, on a fresh copy of the template: a later
run would rewrite every whole word equal to the current name, including in prose.

Only the standard library is used, so it runs before any environment exists. ``uv.lock`` is not
edited: it records the project's name, so it has to be regenerated with ``uv lock`` afterwards
(``make rename`` does that).
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Environments, caches and run outputs: never the project's own text, and often large.
SKIP_ANYWHERE = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints"}
SKIP_AT_ROOT = {".venv", ".tools", "runs", "data", "wandb", "lightning_logs", "build", "dist", "kit"}
SKIP_FILES = {"uv.lock"}


def package_name(root: Path) -> str:
    """The package of the checkout at ``root``: its pyproject.toml's ``[project]`` name, "-" as "_"
    (empty when it names none)."""
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    found = re.search(r'(?ms)^\[project\][ \t]*\n(?:(?!^\[).)*?^name\s*=\s*"([^"]+)"', text)
    return found[1].replace("-", "_") if found else ""


# The package as this checkout names it now (the tests spell the old name through it).
OLD = package_name(ROOT)


def dependencies(pyproject: Path) -> set[str]:
    """Import-style names of the packages pyproject.toml requires (runtime, dev and build)."""
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    names = set()
    for block in re.findall(r"(?ms)^(?:dependencies|dev|requires)\s*=\s*\[(.*?)\]", text):
        for requirement in re.findall(r'"([A-Za-z0-9][A-Za-z0-9._-]*)', block):
            names.add(re.sub(r"[-.]", "_", requirement.lower()))
    return names


def check_name(name: str, root: Path) -> str | None:
    """Why ``name`` cannot be the new package name, or None if it can."""
    if not name.isidentifier() or not name.isascii() or name != name.lower():
        return (
            f"'{name}' is not a lowercase Python identifier: use lowercase letters, digits and "
            "underscores, starting with a letter (e.g. mynewproject or my_project)"
        )
    if keyword.iskeyword(name):
        return f"'{name}' is a Python keyword, which cannot be imported as a package"
    old = package_name(root)
    if not old:
        return f"{root / 'pyproject.toml'} names no [project]: not a project's checkout"
    if name == old:
        return f"the package is already called '{old}'"
    if name in sys.stdlib_module_names:
        return f"'{name}' is a standard-library module: `import {name}` would find that one instead"
    if name in dependencies(root / "pyproject.toml"):
        return f"'{name}' is a package this project depends on: the two would shadow each other"
    if not (root / "src" / old).is_dir():
        return f"{root / 'src' / old} does not exist: pyproject.toml names a package this copy lacks"
    if (root / "src" / name).exists():
        return f"{root / 'src' / name} already exists: remove it or choose another name"
    return None


def text_files(root: Path) -> list[Path]:
    """The files to rewrite: everything under ``root`` but environments, caches, outputs and the lock."""
    files = []
    for folder, subfolders, names in os.walk(root):
        here = Path(folder)
        subfolders[:] = sorted(
            d
            for d in subfolders
            if d not in SKIP_ANYWHERE
            and not d.endswith(".egg-info")
            and not (here == root and d in SKIP_AT_ROOT)
        )
        for name in sorted(names):
            path = here / name
            if name not in SKIP_FILES and name not in SKIP_ANYWHERE and not path.is_symlink():
                files.append(path)
    return files


def rewrite(path: Path, pattern: re.Pattern[str], name: str) -> bool:
    """Replace the old name as a whole word in one UTF-8 text file, keeping its line endings.

    Files that are not UTF-8 text are left alone.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    new = pattern.sub(name, text)
    if new == text:
        return False
    path.write_bytes(new.encode("utf-8"))
    return True


def rename(name: str, root: Path = ROOT) -> list[Path]:
    """Rename the package to ``name`` in the copy at ``root``; returns the files rewritten."""
    problem = check_name(name, root)
    if problem:
        raise ValueError(problem)
    old = package_name(root)
    (root / "src" / old).rename(root / "src" / name)
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    return [path for path in text_files(root) if rewrite(path, pattern, name)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the new package name, a lowercase Python identifier")
    args = parser.parse_args(argv)
    try:
        changed = rename(args.name)
    except ValueError as error:
        parser.error(str(error))
    print(f"Moved src/{OLD} to src/{args.name} and rewrote {len(changed)} files:")
    for path in changed:
        print(f"  {path.relative_to(ROOT)}")
    print(
        f"uv.lock still names '{OLD}': regenerate it with `uv lock` (`make rename` runs it next), "
        "then run `make test` and review the change with `git status` and `git diff` before committing."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
