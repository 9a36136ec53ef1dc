"""The kit's seams: every use of another library's private names, one module per library
(``lightning``, ``torchmetrics``, ``jsonargparse``, ``torch``, ``stdlib``, ``litdata``).

Each function there is small and named for what the kit needs; its docstring says which public API is
missing, the versions it was checked with, and what breaks if the name changes. A name that is gone
raises ``LibraryChanged`` (one line: the library, its version, the name, and what it served) instead
of doing nothing: an assignment to a renamed attribute would make a new one, and a read with a default
would take the default. ``kit/tests/test_internals.py`` holds a contract test per function, on its
effect; ``kit/tests/test_seams.py`` fails on a private name used anywhere else in the kit.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any


def installed(distribution: str) -> str:
    """The installed version of ``distribution``, or ``"not installed"``."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


class LibraryChanged(RuntimeError):
    """A private name the kit relies on is gone or no longer means what the kit relies on: the
    installed library is outside what the kit was checked with."""

    def __init__(self, distribution: str, name: str, purpose: str) -> None:
        super().__init__(
            f"{distribution} {installed(distribution)} changed `{name}`, which projkit uses to {purpose}: "
            f"install the {distribution} version the lock names (`make install`), or a kit that supports "
            "this one (`make upgrade-kit`)."
        )


def existing(owner: Any, name: str, distribution: str, purpose: str) -> Any:
    """``owner.name``, which must exist: a private attribute that is gone raises ``LibraryChanged``."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise LibraryChanged(distribution, f"{type(owner).__name__}.{name}", purpose) from None


def replace(owner: Any, name: str, value: Any, distribution: str, purpose: str) -> None:
    """``owner.name = value`` for an attribute that must exist already: never a new attribute that
    nothing reads."""
    existing(owner, name, distribution, purpose)
    setattr(owner, name, value)
