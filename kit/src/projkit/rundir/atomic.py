"""Files and folders replaced in one step: a kill or a full disk at any moment leaves either the
previous version or the new one, never an empty or half-written file, and a full disk is an
``OSError`` naming the file (said in one line by ``projkit.errors``), not a crash."""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
from collections.abc import Callable
from pathlib import Path

# renameat2(2)'s flag that swaps two paths in one step (Linux 3.15); AT_FDCWD: paths as given.
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write ``content`` to a temporary file beside ``path``, sync it, then rename it over ``path``."""
    data = content.encode() if isinstance(content, str) else content
    replace_atomic(path, lambda temporary: temporary.write_bytes(data))


def replace_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Have ``write`` write a whole file at the temporary path it is given, beside ``path``, sync it,
    then rename it over ``path``: for writers that open their file themselves."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        try:
            write(temporary)
            with open(temporary, "rb") as file:
                os.fsync(file.fileno())
        except OSError as error:
            # A write's or close's error names no file: named here, as the one that could not be written.
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def swap_folder(new: Path, folder: Path) -> None:
    """Put the complete folder ``new`` where ``folder`` is, in one step where the system can swap two
    paths (Linux), and remove the previous one. Elsewhere it takes two renames, and a kill between
    them leaves the previous folder as ``.<name>.<pid>.old``, which ``restore_folder`` puts back."""
    for file in new.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    sync_folder(new)
    if not folder.exists():
        os.replace(new, folder)
    elif not exchanged(new, folder):
        old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
        os.replace(folder, old)
        os.replace(new, folder)
        shutil.rmtree(old, ignore_errors=True)
    sync_folder(folder.parent)
    shutil.rmtree(new, ignore_errors=True)  # the previous folder, after an exchange


def exchanged(first: Path, second: Path) -> bool:
    """Swap two paths with renameat2(RENAME_EXCHANGE); False where the system or file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    done = renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE)
    if done == 0:
        return True
    number = ctypes.get_errno()
    if number in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(number, os.strerror(number), str(second))


def restore_folder(folder: Path) -> None:
    """Undo what a process killed while replacing ``folder`` left: the previous folder, moved aside
    as ``.<name>.<pid>.old``, is put back when ``folder`` is missing, and the temporary folders of
    processes that no longer run are removed."""
    left = sorted(folder.parent.glob(f".{glob.escape(folder.name)}.*.old"), key=lambda p: p.stat().st_mtime)
    if left and not folder.exists() and not running(left[-1]):
        os.replace(left[-1], folder)
        left.pop()
    for leftover in [*left, *folder.parent.glob(f".{glob.escape(folder.name)}.*.tmp")]:
        if not running(leftover):
            shutil.rmtree(leftover, ignore_errors=True)


def running(leftover: Path) -> bool:
    """Whether the process whose id a temporary name carries (``.<name>.<pid>.tmp``) still runs."""
    pid = leftover.name.rsplit(".", 2)[-2]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
