"""How ``make upgrade-kit`` (kit/scripts/upgrade.py) changes kit/ so that a kill at any moment leaves
a whole kit there, the old one or the new one, and the next upgrade finishes the interrupted one.

POSIX ``rename`` cannot replace a folder that holds files, so a plain swap takes two renames with no
kit/ between them, and the Makefile's ``include kit/kit.mk`` fails there. Where the system can
exchange two folders in one step (Linux ``renameat2``, macOS ``renamex_np``), the swap is that step.
Elsewhere (some network file systems) kit/ waits in ``.kit-upgrade/aside`` between the renames, where
the Makefile's ``kit/kit.mk`` rule puts it back (this script, in kit/, cannot run without it).

``.kit-upgrade/journal.json``, written before kit/ changes and removed when the upgrade is done,
holds where it started (the kit's version and git tree, and uv.lock beside it): a rerun starts from
there, not from the half-done state. Standard library only."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "kit"
LOCK = ROOT / "uv.lock"
WORK = ROOT / ".kit-upgrade"
INCOMING = WORK / "incoming"  # the kit to swap in (its kit/ folder), then the one swapped out
ASIDE = WORK / "aside"  # kit/ between the two renames of a swap without an exchange
JOURNAL = WORK / "journal.json"
LOCK_BEFORE = WORK / "uv.lock"
# The kill test's hooks (kit/tests/test_upgrade_script.py): this process SIGKILLs itself at the named
# point, as a kill from outside would; "renames" swaps as a system without an exchange does.
KILL_AT = "PROJKIT_UPGRADE_KILL_AT"
SWAP = "PROJKIT_UPGRADE_SWAP"
RENAME_EXCHANGE, RENAME_SWAP, AT_FDCWD = 2, 2, -100


def reached(point: str) -> None:
    """A point the kill test can stop this process at (``PROJKIT_UPGRADE_KILL_AT=<point>``)."""
    if os.environ.get(KILL_AT) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds the old bytes or the new ones, never a part: a relock reads it after a kill."""
    WORK.mkdir(exist_ok=True)
    partial = WORK / f"{path.name}.partial"  # in the work folder, which a later run clears
    partial.write_bytes(data)
    os.replace(partial, path)


def exchanged_in_one_step(one: Path, other: Path) -> bool:
    """Whether the system swapped the two folders in one step; False where it cannot."""
    if os.environ.get(SWAP) == "renames":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, TypeError):  # no C library to load (Windows)
        return False
    paths = (os.fsencode(one), os.fsencode(other))
    if hasattr(libc, "renameat2"):
        done = libc.renameat2(AT_FDCWD, paths[0], AT_FDCWD, paths[1], RENAME_EXCHANGE)
    elif hasattr(libc, "renamex_np"):
        done = libc.renamex_np(paths[0], paths[1], RENAME_SWAP)
    else:
        return False
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # the file system cannot (NFS, some FUSE)
    raise OSError(code, os.strerror(code), str(one))


def exchange(other: Path) -> None:
    """kit/ and ``other`` (a folder holding another kit) trade places."""
    if exchanged_in_one_step(KIT, other):
        return
    os.replace(KIT, ASIDE)
    reached("aside")
    try:
        os.replace(other, KIT)
    except OSError:
        os.replace(ASIDE, KIT)
        raise
    os.replace(ASIDE, other)


@dataclass
class Journal:
    """Where an upgrade started: the kit's version and git tree, and (beside it) uv.lock."""

    old: str
    tree: str
    to: str

    def write(self, lock: bytes) -> None:
        write_atomic(LOCK_BEFORE, lock)
        write_atomic(JOURNAL, json.dumps(asdict(self)).encode())

    @staticmethod
    def lock() -> bytes:
        return LOCK_BEFORE.read_bytes()


def recover() -> Journal | None:
    """Clear what a killed run left (kit/ is whole: this script runs from it) and return the journal
    of the upgrade it did not finish, if one did not."""
    tidy()
    if not JOURNAL.is_file():
        return None
    return Journal(**json.loads(JOURNAL.read_text(encoding="utf-8")))


def tidy() -> None:
    """The work folder goes, but for the journal of an upgrade that has not finished (and a kit/
    waiting aside, which the Makefile puts back)."""
    if not KIT.is_dir():
        return
    for leftover in (INCOMING, ASIDE):
        shutil.rmtree(leftover, ignore_errors=True)
    with_journal = JOURNAL.is_file() and LOCK_BEFORE.is_file()
    if WORK.is_dir() and not with_journal:
        shutil.rmtree(WORK, ignore_errors=True)


def finish() -> None:
    """The upgrade is done (or failed with its message): the next one starts from kit/ as it is."""
    JOURNAL.unlink(missing_ok=True)
    tidy()
