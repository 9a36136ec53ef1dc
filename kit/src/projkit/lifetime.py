"""A process that ends with the one that started it, at every phase: a sweep's trial with its worker
(though it is forked from the trials' server), a rank that Lightning's launcher started with rank 0.
Left running, such a process trains on as an orphan beside the retry or requeue that follows, or
waits for minutes for a peer that is gone (rank 0 killed while the processes initialise). This
module imports neither torch nor Lightning: it is started before either is imported."""

from __future__ import annotations

import os
import select
import signal
import threading
import time


def end_with(parent: int, grace_s: float) -> None:
    """End this process once ``parent`` has exited: SIGTERM, on which a run saves and stops, then
    SIGKILL ``grace_s`` later (a process blocked in a collective or a rendezvous runs no handler).
    Watched through a pidfd where the system has them (no PID reuse), else by polling once a second."""
    try:
        handle = os.pidfd_open(parent) if hasattr(os, "pidfd_open") else None
    except ProcessLookupError:  # gone already: the poll below finds it so at once
        handle = None

    def watch() -> None:
        if handle is not None:
            select.select([handle], [], [])
        while handle is None and alive(parent):
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def launched_rank() -> bool:
    """Whether this process is a rank other than 0 that Lightning's launcher started (rank 0 is its
    parent); torchrun's workers are watched by ``projkit.reliability.preemption`` instead."""
    local_rank = os.environ.get("LOCAL_RANK", "0").strip()
    return local_rank.isdigit() and int(local_rank) > 0 and "TORCHELASTIC_RUN_ID" not in os.environ
