"""The kit's table of bad input: what a user may type, point at or load, and what the CLI must answer,
whatever the project (its command line and config files, trainer settings, seeds, schedules and
optimizers, checkpoints, export, run names, YAML, numbers, environment variables), run on the
tests' tiny project.

Each row is one command line (after ``python -m tinyproj``) with what it needs written first, the
words its message must hold (the first is the message's key, which kit/docs/errors.md quotes with its
fix) and the exit code. ``test_bad_input.py`` runs every row with ``projkit.testing.bad_input``; a
test there checks the FAQ against the keys. Arguments may hold ``{classify}``, ``{lm}`` (tinyproj's
two experiments, ``VALUES``), ``{ckpt}`` (the baseline run's last checkpoint) and ``{dir}`` (the
working folder). The rows stand in four files by what they are about (``bad_rows_*.py``), made of
``bad_setups.py``'s pieces.

A project's own modules refuse their own bad input (its networks', data modules' and models'
arguments and files): the project tests those in a table of its own, with the same runner.
"""

from __future__ import annotations

import bad_rows_config
import bad_rows_environment
import bad_rows_files
import bad_rows_training
from bad_setups import VALUES, WANDB, with_payload
from projkit.testing.bad_input import MARKER, QUICK, Case, Payload

CASES: list[Case] = [
    *bad_rows_config.CASES,
    *bad_rows_training.CASES,
    *bad_rows_files.CASES,
    *bad_rows_environment.CASES,
]

__all__ = ["CASES", "MARKER", "QUICK", "VALUES", "WANDB", "Case", "Payload", "with_payload"]
