"""What the kit takes from the standard library's internals (argparse, multiprocessing, atexit).

Checked with CPython 3.10 to 3.13; ``kit/tests/test_internals.py`` tests each function's effect.
"""

from __future__ import annotations

import atexit
import multiprocessing.process
from argparse import Action, ArgumentParser
from typing import Any

from projkit.internals import LibraryChanged, existing

PYTHON = "python"
FORKED = "run a command in a forked process"


def parser_actions(parser: ArgumentParser) -> list[Action]:
    """Every action of ``parser``: argparse lists them nowhere public (a refusal names the closest)."""
    return existing(parser, "_actions", PYTHON, "suggest the closest option")


def choice_help_actions(subcommands: Any) -> list[Action]:
    """The actions whose ``help`` is each subcommand's line in ``--help``."""
    return existing(subcommands, "_choices_actions", PYTHON, "give each subcommand its help line")


def become_main_process(main: multiprocessing.process.BaseProcess) -> None:
    """This process, forked as multiprocessing's child, is a main process again: ``main`` is the one
    multiprocessing names, and it has no parent (its children then start as a main process's)."""
    process = multiprocessing.process
    for name in ("_current_process", "_parent_process"):
        if not hasattr(process, name):
            raise LibraryChanged(PYTHON, f"multiprocessing.process.{name}", FORKED)
    process._current_process = main
    process._parent_process = None


def run_exit_functions() -> None:
    """What ``atexit`` would run at the interpreter's exit, run now: a forked child leaves by
    ``os._exit``, which runs none (the loggers' and W&B's flushes among them)."""
    existing(atexit, "_run_exitfuncs", PYTHON, "flush a forked command's output")()
