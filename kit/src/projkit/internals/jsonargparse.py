"""What the kit takes from jsonargparse's internals: the environment variable of a setting, and a
parser's subcommands.

Checked with jsonargparse 4.49 to 4.53; ``kit/tests/test_internals.py`` tests both on the kit's CLI.
"""

from __future__ import annotations

from argparse import Action
from typing import Any

from projkit.internals import LibraryChanged, existing

JSONARGPARSE = "jsonargparse"
ENV = "check the PL_<SUBCOMMAND>__ variables"


def env_var_name(parser: Any, action: Action) -> str:
    """The ``PL_<SUBCOMMAND>__<KEY>`` variable that sets ``action``, named as the parser names it
    (``default_env``); jsonargparse has no public function for it."""
    try:
        from jsonargparse._formatters import get_env_var
    except ImportError:
        raise LibraryChanged(JSONARGPARSE, "jsonargparse._formatters.get_env_var", ENV) from None
    return get_env_var(parser, action)


def subcommands_action(parser: Any) -> Any:
    """The parser's subcommands action (its ``choices`` are the subcommands' parsers): the only way to
    set a subcommand's help line after LightningCLI added it."""
    return existing(parser, "_subcommands_action", JSONARGPARSE, "give each subcommand its help line")
