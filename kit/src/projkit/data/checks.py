"""The argument checks every data module makes, in one place, so each message reads the same and
names the ``data.`` field to fix."""

from __future__ import annotations


def positive(field: str, value: int, extra: str = "") -> None:
    if value < 1:
        raise ValueError(f"data.{field} must be a positive integer{extra}, got {value}")


def non_negative(field: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"data.{field} must be >= 0, got {value}")


def fraction(field: str, value: float) -> None:
    """A share of the data that leaves some for the other split: strictly between 0 and 1."""
    if not 0.0 < value < 1.0:
        raise ValueError(f"data.{field} must be in (0, 1), got {value}")


def loader_settings(batch_size: int, num_workers: int) -> None:
    """What every module's loaders take."""
    positive("batch_size", batch_size)
    non_negative("num_workers", num_workers)
