"""The ``PL_<SUBCOMMAND>__...`` variables a command reads: each must name a setting, in upper case."""

from __future__ import annotations

import difflib
import os
from argparse import ArgumentParser
from collections.abc import Iterable, Sequence

from lightning.pytorch.cli import LightningCLI

from projkit.internals.jsonargparse import env_var_name
from projkit.internals.lightning import subcommand_parser
from projkit.internals.stdlib import parser_actions


def check_environment(cli: LightningCLI, subcommand: str) -> None:
    """A ``PL_FIT__...`` variable that names no setting would be ignored without a word.

    The names a subcommand reads come from the seams (``projkit.internals``): neither library
    exposes them.
    """
    parser = subcommand_parser(cli, subcommand)
    known = {env_var_name(parser, action) for action in parser_actions(parser)}
    prefix = f"PL_{subcommand.upper()}__"
    for name in sorted(os.environ):
        if name.startswith(prefix) and name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            parser.error(
                f"environment variable {name} names no setting of `{subcommand}`, so it would be "
                f"ignored.{hint} Fix its name or unset it."
            )


def check_environment_names(args: Sequence[str], subcommands: Iterable[str], parser: ArgumentParser) -> None:
    """Variables a command would read otherwise than meant, refused before any is read: a lower-case
    ``pl_fit__…``, which the CLI never reads (ignored without a word), and ``PL_FIT__CONFIG``, a
    config file read before the command line's ``--config`` files, whose errors name no variable."""
    subcommand = next((arg for arg in map(str, args) if arg in subcommands), None)
    if subcommand is None:
        return
    prefix = f"PL_{subcommand.upper()}__"
    for name, value in sorted(os.environ.items()):
        if name.upper().startswith(prefix) and name != name.upper():
            parser.error(
                f"environment variable {name}: the CLI reads only upper-case names, so it would be "
                f"ignored. Rename it {name.upper()}."
            )
        if name == f"{prefix}CONFIG":
            parser.error(
                f"environment variable {name}={value}: config files are given with --config, where the "
                f"command line shows them in their order. Pass `--config {value}` and unset the variable."
            )
