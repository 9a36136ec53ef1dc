"""Names the data takes from the file system, as text every file the kit writes can hold."""

from __future__ import annotations

from collections.abc import Sequence


def printable(name: object) -> str:
    """A file or folder name as text any file holds: a byte that is not UTF-8 (Python keeps it as a
    lone surrogate, which YAML, JSON and CSV writers refuse or cannot read back) shown as ``\\xe9``.
    Class names and predicted file names pass here before a config, checkpoint or table takes them."""
    return str(name).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def printable_names(names: Sequence[object] | None) -> Sequence[str] | None:
    """``printable`` of each name (a data module's ``classes``), keeping a tuple a tuple."""
    return None if names is None else type(names)(printable(name) for name in names)
