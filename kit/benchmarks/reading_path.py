"""How much code a reader goes through to follow one training step, measured rather than guessed: the
project's own package and the kit's (``projkit``), each apart.

Runs ``fit`` on an experiment for one optimizer step, records every function of the project's
package and of the kit that is called from the command's start until that step's
``optimizer.step()`` returns, and prints each file's share: the lines of those functions, without
blank lines, comments and docstrings. A function counts whole, as a reader reads it, whichever of
its branches ran. The project's package is the one whose ``PROJECT`` the config's model names (or
the checkout's, ``projkit.project.of_checkout``), with any other package the config's class paths
name that is neither the kit nor an installed library.

    python kit/benchmarks/reading_path.py [configs/digits.yaml]
"""

from __future__ import annotations

import ast
import importlib
import sys
import sysconfig
import tempfile
from collections import defaultdict
from pathlib import Path
from types import FrameType

from torch.optim.optimizer import register_optimizer_step_post_hook

import projkit
from common import ROOT, experiment_config, project_for
from projkit import strict_yaml

KIT = Path(projkit.__file__).resolve().parent
# Modules that run beside the step without changing what it computes: a reader may skip them. The
# checks of what the user gave (checks, data/checks) and how a refusal is reported (errors); the
# run directory (rundir); safety against kills and divergence (reliability); callbacks.
BESIDE_THE_STEP = ("callbacks/", "checks/", "data/checks.py", "errors.py", "reliability/", "rundir/")
INSTALLED = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}


def class_paths(node: object) -> set[str]:
    """Every ``class_path`` a config states, at any depth."""
    if isinstance(node, dict):
        found = {node["class_path"]} if isinstance(node.get("class_path"), str) else set()
        return found.union(*(class_paths(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(class_paths(value) for value in node))
    return set()


def package_folder(name: str) -> Path | None:
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    file = getattr(module, "__file__", None)
    return Path(file).resolve().parent if file else None


def owner_packages(config: Path, package: str) -> dict[str, Path]:
    """The project's package, and each other package the config's class paths name that is neither
    the kit nor installed among the libraries: name → folder."""
    names = {package} | {path.split(".")[0] for path in class_paths(strict_yaml.read(config))}
    found = {}
    for name in sorted(names - {"projkit"}):
        folder = package_folder(name)
        installed = folder is not None and any(folder.is_relative_to(place) for place in INSTALLED)
        if folder is not None and folder != KIT and (name == package or not installed):
            found[name] = folder
    return found


def called_functions(config: Path, folders: list[Path]) -> set[tuple[str, int, str]]:
    project = project_for(config)
    prefixes = tuple(f"{folder}/" for folder in folders)
    called: set[tuple[str, int, str]] = set()

    def record(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(prefixes):
            called.add((code.co_filename, code.co_firstlineno, code.co_name))

    register_optimizer_step_post_hook(lambda *args: sys.setprofile(None))
    with tempfile.TemporaryDirectory() as runs:
        sys.setprofile(record)
        try:
            project.main(["fit", "--config", str(config), "--trainer.max_steps=1",
                          "--trainer.num_sanity_val_steps=0", "--test_after_fit=false",
                          "--trainer.enable_progress_bar=false",
                          f"--trainer.logger.init_args.save_dir={runs}"])  # fmt: skip
        finally:
            sys.setprofile(None)
    return called


def code_lines(source: str, node: ast.AST) -> int:
    lines = source.splitlines()
    docstrings = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for number in range(node.lineno, node.end_lineno + 1)
        if (text := lines[number - 1].strip()) and not text.startswith("#") and number not in docstrings
    )


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def print_package(name: str, folder: Path, per_file: dict[str, int]) -> tuple[int, int]:
    """A package's files with their lines, those of the step apart from those beside it; its totals."""
    kind = "the kit" if name == "projkit" else "the project's package"
    print(f"{name}, {kind} ({shown(folder)}):")
    step = {f: n for f, n in per_file.items() if not f.startswith(BESIDE_THE_STEP)}
    beside = {f: n for f, n in per_file.items() if f not in step}
    for part, files in (("the step", step), ("beside the step", beside)):
        if not files:
            continue
        print(f"  {part}:")
        for file, lines in sorted(files.items()):
            print(f"    {lines:5d}  {shown(folder / file)}")
        print(f"    {sum(files.values()):5d}  in {len(files)} files")
    total = sum(per_file.values())
    print(f"  {total:5d}  in {len(per_file)} files of {name}")
    return total, len(per_file)


def main(config: str) -> None:
    path = experiment_config(config)
    package = project_for(path).package
    owners = owner_packages(path, package)
    packages = {**owners, "projkit": KIT}
    per_file: dict[str, dict[str, int]] = {name: defaultdict(int) for name in packages}
    for filename, first_line, name in called_functions(path, list(packages.values())):
        file = Path(filename)
        owner = next(n for n, folder in packages.items() if file.is_relative_to(folder))
        source = file.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if start <= first_line <= node.end_lineno:
                    per_file[owner][str(file.relative_to(packages[owner]))] += code_lines(source, node)
                    break
    totals = {}
    for name, folder in packages.items():
        totals[name] = print_package(name, folder, per_file[name])
    parts = ", ".join(f"{lines} lines in {files} files of {name}" for name, (lines, files) in totals.items())
    lines = sum(lines for lines, _ in totals.values())
    files = sum(files for _, files in totals.values())
    print(f"{parts}: {lines} lines in {files} files from `fit` to the first optimizer.step()")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "configs" / "digits.yaml"))
