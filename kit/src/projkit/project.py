"""The project a command runs for: the owner's package, started as ``python -m <package>``, and the
defaults file every experiment starts from.

The kit never imports the owner's package; the package hands itself over instead, in a few lines of
its own (``Project(__name__, defaults)``, then ``run`` or ``main``), and the kit reads what it needs
from here: the command to name in messages, the defaults to read first, the module a sweep's trial
runs. This module imports neither torch nor Lightning, so ``sweep`` and ``serve`` start without them.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from projkit import library_warnings
from projkit.context import use
from projkit.layout import note_left_behind
from projkit.lifetime import end_with, handle_sigterm_while_starting, launched_rank
from projkit.versions import check_supported_versions

# The PID of the process whose command started this one's ranks (Lightning's launcher runs the same
# command again for each rank, with this environment).
LAUNCHER_PID = "PROJ_LAUNCHER_PID"

# What a distributed launcher (torchrun, SLURM, Lightning itself) passes as whole numbers; Lightning
# reads LOCAL_RANK with int() while it is imported, so a bad value is refused before that.
INTEGER_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class Project:
    """An owner's package (``package``, its import name) and its ``defaults`` config file."""

    package: str
    defaults: Path

    @property
    def command(self) -> str:
        """How a user starts a command of this project: ``python -m <package>``."""
        return f"python -m {self.package}"

    def run(self, argv: Sequence[str] | None = None) -> None:
        """``python -m <package> ARGS``: the subcommand of ``argv`` (``sys.argv[1:]`` by default).
        ``sweep`` and ``serve`` are dispatched before torch and Lightning are imported: they need neither."""
        use(self)
        library_warnings.install()
        args = list(sys.argv[1:] if argv is None else argv)
        check_supported_versions()
        check_launcher_variables()
        if launched_rank():
            end_with(launcher(), grace_s=10)  # rank 0, also while the processes initialise
        else:
            os.environ[LAUNCHER_PID] = str(os.getpid())  # for the ranks it starts
            note_left_behind(self.defaults.parent.parent, self.defaults)
        if args[:1] == ["sweep"]:
            from projkit.sweep import main as sweep

            sweep(args[1:])
        elif args[:1] == ["serve"]:
            from projkit.serve import main as serve

            serve(args[1:])
        else:
            handle_sigterm_while_starting()  # until the run's Preemption takes the signal over
            from projkit.cli import main

            main(None if argv is None else args)
        if threading.current_thread() is threading.main_thread():
            # Everything is written: a SIGTERM now (a scheduler's, at the job's end) must not turn the
            # finished command into one killed by a signal, which reads as a failure.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def main(self, args: Sequence[str] | None = None, run: bool = True) -> Any:
        """The command line in this process, for tests and notebooks: ``main(["fit", ...])`` returns
        the CLI object (its ``trainer``, ``model``, ``datamodule``), ``run=False`` builds them only."""
        use(self)
        library_warnings.install()
        check_supported_versions()
        from projkit.cli import main

        return main(args, run)


def launcher() -> int:
    """The process that started this rank: rank 0 names itself in ``LAUNCHER_PID`` before it starts
    any. Not ``os.getppid()`` alone, which is init's (1) when rank 0 died before this rank asked, and
    would be watched for ever."""
    named = os.environ.get(LAUNCHER_PID, "")
    return int(named) if named.isdigit() else os.getppid()


def of_checkout(root: Path) -> Project:
    """The project of the checkout at ``root``, found by the package its pyproject.toml names: for the
    kit's own scripts (benchmarks, the reading path), which run on a project without naming it."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    project = re.search(r'(?ms)^\[project\]\s.*?^name\s*=\s*"([^"]+)"', text)
    if project is None:
        raise RuntimeError(f"{root / 'pyproject.toml'} names no [project]: not a project's checkout")
    package = importlib.import_module(project[1].replace("-", "_"))
    found = getattr(package, "PROJECT", None)
    if not isinstance(found, Project):
        raise RuntimeError(f"{package.__name__} has no PROJECT = projkit.Project(...) to run commands for")
    use(found)
    return found


def check_launcher_variables() -> None:
    for name in INTEGER_VARIABLES:
        value = os.environ.get(name)
        if value is not None and not value.strip().isdigit():
            print(
                f"error: environment variable {name}={value!r}: must be a whole number >= 0, as a "
                f"launcher (torchrun, SLURM) sets it. Unset it (`unset {name}`) or set it to a number.",
                file=sys.stderr,
            )
            raise SystemExit(2)
