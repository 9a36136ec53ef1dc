"""One process at a time in a run directory: two commands writing one run would mix their
checkpoints and logs."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from typing import ClassVar

LOCK_FILE = ".lock"


class RunInUseError(RuntimeError):
    """Another live process holds the run directory."""


class RunLock:
    """An exclusive ``flock`` on ``<run>/.lock``, holding the holder's PID.

    The operating system drops the lock when its process ends, however it ends, so a killed run
    never leaves a stale lock behind. A forked child (a DataLoader worker) closes its copy at once:
    the lock is its file's, so a killed run's workers would hold it until they noticed. Locks are per
    process and re-entrant: the commands of one notebook or test take the same folder one after the
    other.
    """

    _held: ClassVar[dict[Path, int]] = {}
    # The run directories this process made, each with the folders made for it (runs/, runs/<name>/):
    # a command refused once it started leaves none behind.
    _created: ClassVar[dict[Path, list[Path]]] = {}

    @classmethod
    def acquire(cls, run: Path) -> None:
        run = run.resolve()
        if run in cls._held:
            return
        if not run.exists():
            cls._created[run] = [folder for folder in run.parents if not folder.exists()]
        run.mkdir(parents=True, exist_ok=True)
        fd = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunInUseError(
                f"The run directory {run} is in use by another process (PID {holder}): two commands "
                "writing one run would mix their checkpoints and logs. Wait for it to end (or stop it), "
                "then run this again; to evaluate a checkpoint meanwhile, copy it outside runs/ first."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        cls._held[run] = fd

    @classmethod
    def release_all(cls) -> None:
        for fd in cls._held.values():
            os.close(fd)
        cls._held.clear()
        cls._created.clear()

    @classmethod
    def remove_new_runs(cls) -> None:
        """Delete the run directories this process made, unless a checkpoint was saved there, and the
        folders made for them once empty: for a command refused after it started, so that a fixed
        rerun gets the same version number."""
        for run, folders in cls._created.items():
            if any(run.glob("checkpoints/*.ckpt")):
                continue
            shutil.rmtree(run, ignore_errors=True)
            for folder in folders:  # innermost first; another run may have been made there since
                with contextlib.suppress(OSError):
                    folder.rmdir()
        cls._created.clear()


os.register_at_fork(after_in_child=RunLock.release_all)
