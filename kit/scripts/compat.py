"""``make test-compat``: the kit's fast tests with its dependencies at both ends of their declared ranges.

kit/pyproject.toml declares ranges (``optuna>=4.9,<5``), but ``make install`` installs uv.lock's one
version of each, so a floor the kit no longer works with, or a newer release inside a range that breaks
it, goes unseen until an owner's resolver picks it. This builds two environments under ``.compat/``:
``lowest``, every direct dependency of the kit and of the project at the lowest version its range
allows (uv's ``--resolution lowest-direct``; what those pull in at its newest), and ``newest``, all at
the newest the registry has within the ranges. In both, torch and torchvision stay at uv.lock's
versions (the accelerator stack: gigabytes, the wheels ``make install`` already cached, and the build
the project trains with), and so do the test tools of the root's ``dev`` group, so that only the kit's
dependencies move. The kit and the project are installed editable, the kit's fast tests (``pytest -m
"not slow" kit/tests``) run in each, and a table of the versions each environment got and whether its
tests passed ends the output; the exit status is 1 if either failed.

Each environment is resolved again on every run (seconds: the registry's newest moves on) and synced,
from uv's cache, only when what it resolved to changed. uv resolves in the checkout, so it reads the
root pyproject's ``[tool.uv]`` as ``uv lock`` does (an index it names for torch, say).
Standard library only (``tomllib``; on Python 3.10 its twin ``tomli``, which pytest requires there). It
runs with the project's interpreter, which the environments take too: ``make test-compat``, or
``.venv/bin/python kit/scripts/compat.py [--only lowest] [-- PYTEST_ARGS]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / ".compat"
# Each environment and the resolution uv gives it.
ENDS = {"lowest": "lowest-direct", "newest": "highest"}
# At uv.lock's versions in both environments, whatever the ranges allow.
HELD = ("torch", "torchvision")
# The kit's fast tests; kit.mk passes its own xdist options instead of these.
DEFAULT_PYTEST = ("-n", "auto", "--maxprocesses=4", "--dist", "loadfile", "-p", "no:randomly")
TESTS = ("-m", "not slow", "kit/tests")
REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")
EXTRAS = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])")
PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)
# pytest's last line: "== 3 failed, 246 passed, 51 warnings in 70.12s (0:01:10) ==".
SUMMARY = re.compile(r"^=+ (.* in [\d.]+s.*?) =+$")


def normalize(name: str) -> str:
    """A distribution's name as the registry compares it (PEP 503): ``PyYAML`` and ``pyyaml`` alike."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_toml(path: Path) -> dict:
    with path.open("rb") as file:
        return tomllib.load(file)


def requirement(line: str) -> tuple[str, str]:
    """A requirement's normalized name and its version range (``any`` where it states none), without
    its extras and markers: ``jsonargparse[signatures]>=4.49,<5`` is ``('jsonargparse', '>=4.49,<5')``."""
    found = REQUIREMENT.match(line)
    if not found:
        raise ValueError(f"not a requirement: {line!r}")
    return normalize(found[1]), re.sub(r"\s+", "", found[2]) or "any"


def project_name(root: Path) -> str:
    """The ``[project]`` name of the pyproject.toml in ``root``: the project's, or in ``kit/``, the kit's."""
    return read_toml(root / "pyproject.toml")["project"]["name"]


def declared(root: Path) -> dict[str, dict[str, str]]:
    """Every direct dependency of the kit and of the project (not the kit itself), with the range each
    of them declares, by its name: ``{'lightning': {'projkit': '>=2.6,<2.7', <project>: ...}, ...}``."""
    kit = normalize(project_name(root / "kit"))
    ranges: dict[str, dict[str, str]] = {}
    for folder in (root / "kit", root):
        project = read_toml(folder / "pyproject.toml")["project"]
        for line in project.get("dependencies", []):
            name, spec = requirement(line)
            if name != kit:
                ranges.setdefault(name, {})[project["name"]] = spec
    return ranges


def locked(lock: dict, names: list[str], extras: dict[str, str] | None = None) -> list[str]:
    """Requirement lines that hold each of ``names`` at uv.lock's version, with its ``extras`` (by
    normalized name: ``{'moto': '[server]'}``). Where the lock holds several versions of one (torch
    2.14.1 for Python 3.10, 2.15.0 above), each comes with the markers the lock chose it under, so uv
    picks the one for the environment's Python as ``uv sync`` would."""
    wanted = {normalize(name) for name in names}
    packages = [package for package in lock["package"] if normalize(package["name"]) in wanted]
    missing = wanted - {normalize(package["name"]) for package in packages}
    if missing:
        raise ValueError(f"uv.lock holds no {', '.join(sorted(missing))}: run `uv lock`")
    lines = []
    for package in packages:
        line = f"{package['name']}{(extras or {}).get(normalize(package['name']), '')}=={package['version']}"
        if markers := package.get("resolution-markers"):
            line += " ; " + " or ".join(f"({marker})" for marker in markers)
        lines.append(line)
    return lines


def dev_tools(root: Path) -> tuple[list[str], dict[str, str]]:
    """The names in the root pyproject's ``dev`` group (pytest, its plugins, the tools the tests use),
    and the extras it asks of them (``moto[server]``: the S3 server the streaming tests start)."""
    groups = read_toml(root / "pyproject.toml").get("dependency-groups", {})
    lines = [line for line in groups.get("dev", []) if isinstance(line, str)]
    extras = {normalize(found[1]): found[2] for line in lines if (found := EXTRAS.match(line))}
    return [requirement(line)[0] for line in lines], extras


def inputs(root: Path, folder: Path) -> tuple[Path, Path]:
    """Write what both environments resolve: the kit and the project, editable, with the dev tools at
    the lock's versions (``requirements.in``), and torch and torchvision held there (``constraints.txt``,
    constraints rather than overrides: a range that excludes the lock's torch is an error to see)."""
    lock = read_toml(root / "uv.lock")
    folder.mkdir(exist_ok=True)
    wanted = [f"-e {root / 'kit'}", f"-e {root}", *locked(lock, *dev_tools(root))]
    requirements, constraints = folder / "requirements.in", folder / "constraints.txt"
    requirements.write_text("\n".join(wanted) + "\n", encoding="utf-8")
    constraints.write_text("\n".join(locked(lock, list(HELD))) + "\n", encoding="utf-8")
    return requirements, constraints


def pinned(resolved: str) -> dict[str, str]:
    """The versions in a file ``uv pip compile`` wrote, by normalized name."""
    return {normalize(name): version for name, version in PINNED.findall(resolved)}


@dataclass
class End:
    """One of the two environments: what it resolved to, and how its tests went."""

    name: str
    resolved: str = ""
    # Why it has no result: the step uv failed at (its reason is in the output above the table).
    error: str = ""
    outcome: str = "not run"
    passed: bool = False
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return COMPAT / self.name

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"


def uv_run(uv: str, end: End, step: str, *args: str | Path) -> bool:
    """Run uv in the checkout (so it reads the root's ``[tool.uv]``), its messages passed on, timed as
    ``end``'s ``step``; False, with the step as ``end``'s error, where it fails."""
    started = time.monotonic()
    done = subprocess.run([uv, *map(str, args)], cwd=ROOT)
    end.seconds[step] = end.seconds.get(step, 0.0) + time.monotonic() - started
    if done.returncode != 0:
        end.error = f"{step} failed: uv exited {done.returncode} (its reason is above)"
    return done.returncode == 0


def resolve(uv: str, end: End, requirements: Path, constraints: Path) -> bool:
    """Resolve ``end``'s set afresh (``--upgrade``: the newest moves on, and uv would otherwise keep the
    versions of the file it last wrote), for the project's interpreter."""
    output = COMPAT / f"{end.name}.txt"
    resolved = uv_run(
        uv, end, "resolve", "pip", "compile", requirements, "--constraints", constraints, "--upgrade",
        "--resolution", ENDS[end.name], "--python", sys.executable, "--no-header", "--no-annotate",
        "--emit-index-url", "--quiet", "--output-file", output,
    )  # fmt: skip
    end.resolved = output.read_text(encoding="utf-8") if resolved else ""
    return resolved


def sync(uv: str, end: End) -> bool:
    """Make ``end``'s environment hold exactly what it resolved to, changing only what differs, from
    uv's cache; nothing at all where it already holds that set on this Python (``synced.txt``).

    Without the root's ``[tool.uv]`` (``--no-config``; the resolved file names its indexes): its
    ``compile-bytecode`` took 1.5 to 3 minutes a new environment on 2 cores, for 15,000 files of
    which the tests import about 4,000; they compile those themselves instead, once (see ``test``)."""
    stamp = end.folder / "synced.txt"
    wanted = f"# Python {sys.version.split()[0]} at {sys.base_prefix}\n{end.resolved}"
    held = stamp.read_text(encoding="utf-8") if stamp.is_file() else ""
    if end.python.exists() and held == wanted:
        print(f"{end.name}: holds what it resolved to already; not synced")
        return True
    stamp.unlink(missing_ok=True)
    # A new environment where there is none, or where it was made with another Python.
    fresh = not end.python.exists() or held.split("\n", 1)[0] != wanted.split("\n", 1)[0]
    venv = ("venv", "--clear", "--quiet", "--python", sys.executable, end.folder)
    if fresh and not uv_run(uv, end, "sync", *venv):
        return False
    resolved = COMPAT / f"{end.name}.txt"
    if not uv_run(uv, end, "sync", "pip", "sync", "--no-config", "--python", end.python, resolved):
        return False
    stamp.write_text(wanted, encoding="utf-8")
    return True


def test(end: End, pytest_args: list[str]) -> None:
    """The kit's fast tests in ``end``'s environment, its output passed on as it comes; its processes
    (``python -m tinyproj``, torchrun) find that environment's Python first. Their bytecode is written
    once, by the first process that imports a module, to the environment's ``pycache/``
    (PYTHONPYCACHEPREFIX), also where PYTHONDONTWRITEBYTECODE is set: never beside the checkout's
    files, and read by every process after it, in this run and the next."""
    print(f"\n{end.name}: the kit's fast tests\n", flush=True)
    env = {**os.environ, "VIRTUAL_ENV": str(end.folder)}
    env["PATH"] = f"{end.python.parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(end.folder / "pycache")
    started = time.monotonic()
    process = subprocess.Popen(
        [end.python, "-m", "pytest", *pytest_args, *TESTS],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        print(line, end="", flush=True)
        if found := SUMMARY.match(line.strip()):
            end.outcome = found[1]
    end.passed = process.wait() == 0
    end.seconds["tests"] = time.monotonic() - started
    if not end.passed and end.outcome == "not run":
        end.outcome = f"pytest exited {process.returncode}"


def declared_range(ranges: dict[str, str], kit: str) -> str:
    """One dependency's range as the table shows it: the kit's, and the project's where it differs."""
    specs = list(dict.fromkeys(ranges.values()))
    if len(specs) == 1:
        return specs[0]
    return "; ".join(f"{spec} ({'kit' if who == kit else who})" for who, spec in ranges.items())


def table(ranges: dict[str, dict[str, str]], ends: list[End], kit: str) -> str:
    """The versions each environment got, by dependency, then whether its tests passed."""
    versions = {end.name: pinned(end.resolved) for end in ends}
    held = [name for name in HELD if name in ranges]
    rows = [("dependency", "declared", *(end.name for end in ends))]
    for name in [*sorted(set(ranges) - set(held)), *held]:
        note = " (held at uv.lock)" if name in held else ""
        found = [versions[end.name].get(name, "-") for end in ends]
        rows.append((name, declared_range(ranges[name], kit) + note, *found))
    rows.append(("kit's fast tests", "", *("passed" if end.passed else "FAILED" for end in ends)))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    for end in ends:
        took = ", ".join(f"{step} {seconds:.0f} s" for step, seconds in end.seconds.items())
        lines.append(f"{end.name}: {end.error or end.outcome}" + (f" ({took})" if took else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(ENDS), help="build and test one environment")
    parser.add_argument("pytest_args", nargs="*", help="pytest's options, after --: kit.mk's xdist ones")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # in order with uv's and pytest's output, into a log too
    uv = os.environ.get("UV", "uv")
    uv = str(Path(uv).resolve()) if os.sep in uv else uv
    ranges = declared(ROOT)
    requirements, constraints = inputs(ROOT, COMPAT)
    ends = [End(name) for name in ENDS if args.only in (None, name)]
    for end in ends:
        if resolve(uv, end, requirements, constraints) and sync(uv, end):
            test(end, args.pytest_args or list(DEFAULT_PYTEST))
    print("\nThe kit's fast tests with its dependencies at both ends of their ranges (torch held):\n")
    print(table(ranges, ends, project_name(ROOT / "kit")))
    return 0 if all(end.passed for end in ends) else 1


if __name__ == "__main__":
    sys.exit(main())
