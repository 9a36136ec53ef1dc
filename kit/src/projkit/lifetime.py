"""A process that ends with the one that started it, at every phase: a sweep's trial with its worker
(though it is forked from the trials' server), a rank that Lightning's launcher started with rank 0.
Left running, such a process trains on as an orphan beside the retry or requeue that follows, or
waits for minutes for a peer that is gone (rank 0 killed while the processes initialise). And a
process signalled while it starts, before a run's ``Preemption`` takes SIGTERM over, whose Slurm job
must start again rather than end. This module imports neither torch nor Lightning: it is started
before either is imported."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

# How long a process stopping on a SIGTERM while it starts may take to leave before it is ended.
STARTING_GRACE_S = 30


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


def handle_sigterm_while_starting() -> None:
    """Until a run's ``Preemption`` takes SIGTERM over, a SIGTERM (a Slurm job's time-limit warning, a
    preemption, ``kill``) comes while the process imports, builds or prepares its data: nothing has
    trained since the last save, so the process exits at once with 143, as the default handler would,
    but its Slurm job is requeued first (rank 0), to start again with ``--ckpt_path auto`` rather than
    end FAILED. ``requeue_while_starting`` settles it once the run's callbacks are known; from the
    run's setup on (``defer_sigterm_while_starting``) the signal is kept for ``Preemption`` instead.
    For ``python -m <package>`` only (a test's or notebook's process keeps its own handlers); main
    thread only; a handler the process set itself is kept."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        _STARTING.requeue, _STARTING.deferred, _STARTING.received = True, False, 0
        signal.signal(signal.SIGTERM, _STARTING)


def requeue_while_starting(requeue: bool | None) -> None:
    """The run's ``Preemption(requeue=...)`` for the handler above, where it is installed; ``None``
    (a run without ``Preemption``) puts the default handler back."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _STARTING:
        if requeue is None:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:
            _STARTING.requeue = requeue


def defer_sigterm_while_starting() -> None:
    """From now on a SIGTERM that reaches the handler above (Lightning's own calls it too) is kept for
    ``Preemption`` (``sigterm_while_starting``), which saves after the first step: the run is set up."""
    _STARTING.deferred = True


def sigterm_while_starting() -> int:
    """The signal kept since ``defer_sigterm_while_starting`` (then forgotten), or 0."""
    signum, _STARTING.received = _STARTING.received, 0
    return signum


class _StopWhileStarting:
    def __init__(self) -> None:
        self.requeue, self.deferred, self.received = True, False, 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.deferred:
            self.received = signum
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # srun forwards the signal Slurm sent the steps too
        ender = threading.Timer(STARTING_GRACE_S, os._exit, args=(128 + signum,))
        ender.daemon = True
        ender.start()
        say(f"Received {signal.Signals(signum).name} while starting, before any step: nothing to save.")
        if (lock := sys.modules.get("projkit.rundir.lock")) is not None:
            lock.RunLock.remove_new_runs()  # the requeued start takes the same version number
        job = os.environ.get("SLURM_JOB_ID")
        if self.requeue and job and os.environ.get("SLURM_PROCID", "0") == "0":
            requeue_slurm_job(job, say)
        raise SystemExit(128 + signum)


_STARTING = _StopWhileStarting()


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def requeue_slurm_job(job: str, say: Callable[[str], None] = say) -> None:
    """Put the job back in the queue (it starts again from the top of its script) when it is still
    running: the signal came before its time limit (``--signal``) or from a ``kill``. A job that
    Slurm is already ending was either requeued by Slurm (``scontrol requeue``, preemption) or
    cancelled, and ``scontrol requeue`` would requeue a cancelled job too, undoing ``scancel``."""
    state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    if state.stdout.strip() != "RUNNING":
        say(
            f"Slurm job {job} is {state.stdout.strip() or 'not in the queue'}: Slurm is ending it "
            "(requeued or cancelled), so it is not requeued here."
        )
        return
    requeue = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    # Slurm ends the job's processes as it requeues it, `scontrol` among them when it has not
    # returned yet (seen on a loaded machine): killed by a signal, it was the requeue under way.
    if requeue.returncode == 0 or requeue.returncode < 0:
        say(f"Requeued Slurm job {job}: it resumes from its last checkpoint when it starts again.")
    else:
        reason = requeue.stderr.strip() or f"scontrol exited with {requeue.returncode}"
        say(f"Slurm job {job} was not requeued ({reason}): resume it by hand.")
