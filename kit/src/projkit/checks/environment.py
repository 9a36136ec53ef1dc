"""The ``PL_<SUBCOMMAND>__...`` variables a command reads: each must name a setting."""

from __future__ import annotations

import difflib
import os

from jsonargparse._formatters import get_env_var
from lightning.pytorch.cli import LightningCLI


def check_environment(cli: LightningCLI, subcommand: str) -> None:
    """A ``PL_FIT__...`` variable that names no setting would be ignored without a word.

    The names a subcommand reads come from private API, used here alone since neither library
    exposes them: LightningCLI's ``_subcommand_parsers`` and jsonargparse's ``get_env_var``. The
    misspelt-variable case of ``tests/test_bad_input.py`` fails if either changes.
    """
    parser = cli._subcommand_parsers[subcommand]
    known = {get_env_var(parser, action) for action in parser._actions}
    prefix = f"PL_{subcommand.upper()}__"
    for name in sorted(os.environ):
        if name.startswith(prefix) and name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            parser.error(
                f"environment variable {name} names no setting of `{subcommand}`, so it would be "
                f"ignored.{hint} Fix its name or unset it."
            )
