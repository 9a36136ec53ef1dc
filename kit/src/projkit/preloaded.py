"""``python -m <package> ARGS`` as a process forked from a server that has imported torch, Lightning and
the CLI once, for a sweep's trials: a new interpreter spends about 6 s of CPU importing them before it
parses a flag, half of a short CPU trial. The server starts with the first process and serves until
its parent exits; it imports the CLI once, so code edited meanwhile reaches the next worker, not the
next trial.

The child is what ``python -m <package> ARGS`` would be: its own pid (and session if asked), working
folder, environment, argv, ``sys.path`` (the working folder first, then ``PYTHONPATH``), standard
streams, thread count (``OMP_NUM_THREADS``, which the libraries read when imported, is applied) and
exit code (``-signum`` for a signal, as ``subprocess`` says it); ``atexit`` handlers run and
non-daemon threads are joined before it exits. CUDA is untouched by the import, so each child starts
it afresh. A variable read only while Lightning is imported (a launcher's ``LOCAL_RANK``) has the
server's value: the tests that need one start a new interpreter."""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import sys
import traceback
from pathlib import Path

from projkit.context import current
from projkit.internals.stdlib import become_main_process, run_exit_functions
from projkit.lifetime import end_with

# How long a child whose parent exited has to save and stop after SIGTERM before it is killed.
GRACE_S = 30

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["projkit.cli"])
# Imported by the server's child before multiprocessing makes it a child process: the server's main
# process, which multiprocessing has only renamed.
_MAIN_PROCESS = multiprocessing.current_process()


def _stream(fd: int, unbuffered: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=not unbuffered, write_through=unbuffered,
    )  # fmt: skip


def _become_main_process() -> None:
    """What multiprocessing set up for the server's child undone: a fresh interpreter's main process
    starts its own children (DataLoader workers) by fork, and is named MainProcess."""
    multiprocessing.set_start_method(None, force=True)
    _MAIN_PROCESS.name = "MainProcess"
    become_main_process(_MAIN_PROCESS)


def _apply_threads(env: dict[str, str]) -> None:
    import torch

    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


def _child(
    package: str,
    args: list[str],
    cwd: str,
    env: dict[str, str],
    out: str,
    err: str,
    session: bool,
    parent: int,
) -> None:
    _become_main_process()
    end_with(parent, GRACE_S)  # a sweep worker killed, even with kill -9, takes its trial with it
    if session:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(target, fd)
        os.close(target)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout, sys.stderr = _stream(1, unbuffered), _stream(2, True)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [cwd, *extra, *(p for p in sys.path if p and p not in extra)]
    sys.argv = ["-m", *args]
    try:
        _apply_threads(env)
        runpy.run_module(package, run_name="__main__", alter_sys=True)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        run_exit_functions()
        sys.stdout.flush()
        sys.stderr.flush()


class Process:
    """A started ``python -m <package>``, with the part of ``subprocess.Popen`` its callers use."""

    def __init__(
        self, args: list[str], cwd: Path, env: dict[str, str], stdout: Path, stderr: Path, session: bool
    ):
        # Plain strings: a subclass (jsonargparse's typed strings) is pickled by a class name that the
        # child, importing its module afresh, may not find.
        args = [str(arg) for arg in args]
        env = {str(name): str(value) for name, value in env.items()}
        package = current().package
        self.args = [sys.executable, "-m", package, *args]
        self._process = _CONTEXT.Process(
            target=_child, args=(package, args, str(cwd), env, str(stdout), str(stderr), session, os.getpid())
        )
        self._process.start()
        self.pid: int = self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self._process.exitcode is not None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None when ``timeout`` seconds passed first."""
        self._process.join(timeout)
        return self.poll()

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)


def start_server() -> None:
    """Start the server now, so that it imports while the caller gets ready: its first process
    waits for the import otherwise."""
    multiprocessing.forkserver.ensure_running()


def start(
    args: list[str],
    cwd: Path,
    env: dict[str, str],
    stdout: Path,
    stderr: Path | None = None,
    session: bool = False,
) -> Process:
    """``python -m <package> *args`` (the current project's) in ``cwd`` with ``env``, its output
    appended to ``stdout`` (standard error too, unless ``stderr`` names another file); ``session``: a
    session (process group) of its own."""
    return Process(args, cwd, env, stdout, stderr or stdout, session)
