"""The workers of a sweep on this machine: each registered by name, counted, and sharing the cores."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from projkit.sweep.config import Sweep

HOST = socket.gethostname()


def cpu_cores() -> int:
    """The cores this process may run on: a container's or a batch job's share, not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def register_worker(sweep: Sweep) -> Path:
    """A file naming this worker (``<host>:<pid>``) in ``runs/sweeps/<name>/workers/``, from which the
    workers on one machine count each other (``workers_here``)."""
    path = sweep.folder / "workers" / this_worker()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def workers_here(sweep: Sweep) -> int:
    """The live workers of this sweep on this machine, this one included. A killed worker's file
    outlives it; its process does not, and the file goes."""
    alive = 0
    for path in (sweep.folder / "workers").glob("*:*"):
        pid = local_pid(path.name)
        if pid is None:  # another machine's, on a shared file system
            continue
        if process_alive(pid):
            alive += 1
        else:
            path.unlink(missing_ok=True)
    return max(alive, 1)


def trial_threads(sweep: Sweep) -> tuple[int, int] | None:
    """The CPU threads each trial here may use, and the workers they are shared among: this machine's
    cores divided among its workers, as Lightning divides them among the processes of a DDP run.
    Left alone, each trial's torch starts a thread per core, and two workers' trials on 2 cores took
    a median 3.8 times as long as with one thread each (``kit/benchmarks/sweep_workers.py``). None when
    ``OMP_NUM_THREADS`` is set: the user's choice, which the trials inherit."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    workers = workers_here(sweep)
    return max(1, cpu_cores() // workers), workers


def this_worker() -> str:
    """This worker's name, ``<host>:<pid>``: in its trials' ``worker`` attribute and its registration."""
    return f"{HOST}:{os.getpid()}"


def local_pid(worker: str) -> int | None:
    """The process id of the worker named ``worker`` (``<host>:<pid>``) when it ran on this machine."""
    host, _, pid = worker.rpartition(":")
    return int(pid) if host == HOST and pid.isdigit() else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
