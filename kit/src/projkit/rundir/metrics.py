"""The rows of ``metrics.csv`` kept across the commands that write into one run: Lightning's CSV
logger deletes an existing ``metrics.csv`` when it opens the folder, and a resumed run logs again
the rows after its checkpoint."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from lightning.pytorch.loggers import CSVLogger

METRICS_FILE = "metrics.csv"
# metrics.csv is moved here while a command takes over its run directory, and written back from it.
# It stays until the command ends, so that a command that fails can put the file back as it was.
METRICS_ASIDE = ".metrics.csv.resume"

Rows = list[dict[str, str]]


def take_metrics_aside(run: Path) -> Path | None:
    """Move ``metrics.csv`` out of the CSV logger's way before it opens the folder, and keep it
    there until the command ends (``KeptMetrics``): a command that fails puts it back.

    An aside file left by an earlier command means that command died: it is the complete copy and
    wins over the ``metrics.csv`` the dead command wrote, unless that command had written a
    checkpoint, which holds its rows (a resume drops the ones after it).
    """
    current, aside = run / METRICS_FILE, run / METRICS_ASIDE
    if aside.is_file() and not checkpointed_since(aside):
        current.unlink(missing_ok=True)
    elif current.is_file():
        os.replace(current, aside)
    elif not aside.is_file():
        return None
    # Its time marks when this command took the run over: the checkpoints written later are its own.
    os.utime(aside)
    KeptMetrics.asides.append(aside)
    return aside


def checkpointed_since(aside: Path) -> bool:
    """Whether a checkpoint of the run was written after ``aside`` was taken aside."""
    taken = aside.stat().st_mtime_ns
    return any(p.stat().st_mtime_ns > taken for p in (aside.parent / "checkpoints").glob("*.ckpt"))


class KeptMetrics:
    """The ``metrics.csv`` files this process took aside, each kept until its command ends.

    A command that succeeded, or failed after writing a checkpoint, keeps the rows it added; any
    other failed command (a resume refused at start, an unwritable or full checkpoint folder) puts
    the file back byte for byte, so it leaves no row of an epoch that no checkpoint holds.
    """

    asides: ClassVar[list[Path]] = []

    @classmethod
    def settle(cls, failed: bool) -> None:
        for aside in cls.asides:
            if not aside.is_file():
                continue
            if failed and not checkpointed_since(aside):
                os.replace(aside, aside.with_name(METRICS_FILE))
            else:
                aside.unlink()
        cls.asides.clear()


def read_rows(path: Path) -> tuple[Rows, list[str]]:
    """The rows of a ``metrics.csv`` and its column names."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader), list(reader.fieldnames or [])


def restore_metrics(logger: CSVLogger, aside: Path) -> None:
    """Write every row of ``aside`` into the logger's new ``metrics.csv``.

    All of them: a resumed run that fails to start must leave them all. The rows its checkpoint
    had not seen go once the resumed run starts training (``rows_before``).
    """
    for row in read_rows(aside)[0]:
        step = int(row.pop("step"))
        logger.log_metrics({k: _number(v) for k, v in row.items() if v not in ("", None)}, step=step)
    logger.save()


def rewrite_rows(logger: CSVLogger, keep: Callable[[Rows], Rows]) -> None:
    """Replace the rows of the logger's ``metrics.csv`` by ``keep(rows)``, atomically."""
    path = Path(logger.log_dir) / METRICS_FILE
    if not path.is_file():
        return
    rows, fields = read_rows(path)
    kept = keep(rows)
    if len(kept) == len(rows):
        return
    temporary = path.with_name(f".{METRICS_FILE}.{os.getpid()}.tmp")
    with open(temporary, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(temporary, path)


def has_row(logger: CSVLogger, step: int, metrics: dict) -> bool:
    """Whether the logger's ``metrics.csv`` has a row at ``step`` with each of ``metrics``' names."""
    path = Path(logger.log_dir) / METRICS_FILE
    rows = read_rows(path)[0] if path.is_file() else []
    return any(int(row["step"]) == step and all(row.get(name) for name in metrics) for row in rows)


def rows_before(step: int) -> Callable[[Rows], Rows]:
    """Rows logged before optimizer step ``step``: a checkpoint at ``global_step == step`` has seen
    them; the run that resumes it logs the later ones again. Test rows stay wherever they are: no
    training logs them again (a finished run's test, resumed to train longer)."""
    return lambda rows: [row for row in rows if int(row["step"]) < step or tested(row)]


def tested(row: dict[str, str]) -> bool:
    """Whether a row holds test metrics only (beside its step and epoch)."""
    names = [name for name, value in row.items() if value and name not in ("step", "epoch")]
    return bool(names) and all(name.startswith("test/") for name in names)


def without_repeats(step: int) -> Callable[[Rows], Rows]:
    """Rows of ``step`` logged twice (the same names) kept once, the later one.

    Rows that share the step of a checkpoint may come before or after it: whether the resumed
    run logs them again (the epoch-end metrics of an epoch whose last batch was checkpointed) is
    Lightning's to decide, so both are kept until the second copy shows.
    """

    def keep(rows: Rows) -> Rows:
        names = [
            frozenset(k for k, v in row.items() if v) if int(row["step"]) == step else None for row in rows
        ]
        return [row for i, row in enumerate(rows) if names[i] is None or names[i] not in names[i + 1 :]]

    return keep


def _number(text: str) -> int | float:
    """A CSV cell as the logger first wrote it: ``epoch`` stays ``3``, a loss keeps every digit."""
    try:
        return int(text)
    except ValueError:
        return float(text)
