"""What the kit takes from LitData's internals: how its loader replays a restored position, and how
it reads a chunk size.

Checked with litdata 0.2.76; ``kit/tests/test_internals_libraries.py`` tests each on a real
``StreamingDataLoader`` over chunks written with LitData's ``Cache``. ``StreamingDataLoader`` has no
public way to say that a restored epoch is over, or to start after a given epoch without a saved
position: its ``restore`` flag (set by ``load_state_dict``, kept until an epoch is read to its end)
and its ``current_epoch`` counter (raised by each ``__iter__`` that is not restoring) are what it
reads. ``--chunk_bytes`` is read as LitData's writer reads it, by its ``_convert_bytes_to_int``.
Imported by streamed commands only, as LitData is.
"""

from __future__ import annotations

from typing import Any

from litdata.utilities import format as litdata_format

from projkit.internals import LibraryChanged, existing, replace

LITDATA = "litdata"
RESUME = "resume a streamed run at the batch and epoch its checkpoint holds"
SIZES = "read --chunk_bytes as LitData's writer does"


def restoring(loader: Any) -> bool:
    """Whether ``loader``'s next epoch replays a position restored by ``load_state_dict``."""
    return bool(existing(loader, "restore", LITDATA, RESUME))


def end_restore(loader: Any) -> None:
    """``loader``'s next epoch is a new one, not the restored position replayed again."""
    replace(loader, "restore", False, LITDATA, RESUME)


def resume_epoch_end(loader: Any, epoch: int) -> None:
    """``loader`` starts after ``epoch``, which a checkpoint saw read to its end: its next epoch is
    ``epoch + 1``, shuffled as such."""
    replace(loader, "current_epoch", epoch, LITDATA, RESUME)


def bytes_of(text: str) -> int | None:
    """``text`` as LitData's writer reads a chunk size with a unit (``"64MB"``: 64,000,000, ``"1.5g"``,
    ``" 2 Kb "``), None where it refuses it. It may be zero or negative (``"-5MB"``)."""
    convert = getattr(litdata_format, "_convert_bytes_to_int", None)
    if convert is None:
        raise LibraryChanged(LITDATA, "litdata.utilities.format._convert_bytes_to_int", SIZES)
    try:
        return int(convert(text))
    except (ValueError, OverflowError):  # no unit or no number; infinity
        return None
