"""The package reads top-down: no module of ``src/proj`` imports, however indirectly, a module that
imports it back (each job in its own module, as the README's layout says), and each function and
module is short enough to be read whole. The checks are the kit's (``projkit.testing.code``)."""

from __future__ import annotations

from projkit.testing.code import import_cycles, too_long

from conftest import ROOT

PACKAGE = ROOT / "src" / "proj"


def test_no_import_cycle_in_the_package():
    # Imports for type checking count too: the package reads top-down for its reader as well.
    cycles = import_cycles(PACKAGE, runtime_only=False)
    assert not cycles, "\n".join(cycles)


def test_no_function_is_longer_than_a_screen():
    """A function is read whole: one over 60 lines (its docstring included) is split, and so is a
    module over 400 lines."""
    long = too_long(PACKAGE.rglob("*.py"), PACKAGE)
    assert not long, "\n".join(long)
