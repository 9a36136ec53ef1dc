"""``python -m proj`` as most tests start it: a process of its own, forked from a server that has
imported torch, Lightning and the CLI once, instead of a new interpreter that imports them again
(about 6 s of CPU a start here, more than a short run's training).

The child is what ``python -m proj ARGS`` would be: its own pid (and process group if asked),
working folder, environment, argv, ``sys.path`` (the working folder first, then ``PYTHONPATH``),
standard streams and exit code (``-signum`` for a signal, as ``subprocess`` says it); ``atexit``
handlers run and non-daemon threads are joined before it exits. What it cannot be is a process
that imports those libraries itself: a variable they read while imported (``OMP_NUM_THREADS``, a
launcher's ``LOCAL_RANK``) has the server's value, and a warning they raise while imported was
raised in the server. The tests of those, of torchrun and of a fresh shell start a new interpreter."""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import weakref
from pathlib import Path

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["proj.cli"])
# Imported by the server's child before multiprocessing makes it a child process: the server's main
# process, which multiprocessing has only renamed.
_MAIN_PROCESS = multiprocessing.current_process()


def _stream(fd: int, unbuffered: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=not unbuffered, write_through=unbuffered,
    )  # fmt: skip


def _child(args: list[str], cwd: str, env: dict[str, str], out: str, err: str, session: bool) -> None:
    # What multiprocessing set up for the server's child: a fresh interpreter's main process starts
    # its own children (DataLoader workers) by fork, and is named MainProcess.
    multiprocessing.set_start_method(None, force=True)
    _MAIN_PROCESS.name = "MainProcess"
    multiprocessing.process._current_process = _MAIN_PROCESS
    multiprocessing.process._parent_process = None
    if session:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout, sys.stderr = _stream(1, unbuffered), _stream(2, True)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [cwd, *extra, *(p for p in sys.path if p and p not in extra)]
    sys.argv = ["-m", *args]
    try:
        runpy.run_module("proj", run_name="__main__", alter_sys=True)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


class Process:
    """A started ``python -m proj``, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None, merge: bool, session: bool):
        self.args = [sys.executable, "-m", "proj", *args]
        folder = Path(tempfile.mkdtemp(prefix="proj-launch-"))
        weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        self._out, self._err = folder / "stdout", folder / "stderr"
        self._out.touch()
        if not merge:
            self._err.touch()
        err = self._out if merge else self._err
        env = dict(os.environ if env is None else env)
        self._process = _CONTEXT.Process(
            target=_child, args=(list(args), str(cwd), env, str(self._out), str(err), session), daemon=False
        )
        self._process.start()
        self.pid = self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self._process.exitcode is not None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def output(self) -> tuple[str, str]:
        """What it has written so far to standard output and standard error."""
        read = lambda path: path.read_text(errors="backslashreplace") if path.exists() else ""  # noqa: E731
        return read(self._out), read(self._err)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.output()


def start(args: list[str], cwd: Path, env: dict[str, str] | None = None, *, merge: bool = False,
          session: bool = False) -> Process:  # fmt: skip
    """``python -m proj *args`` in ``cwd`` with ``env`` (this process's by default); ``merge``:
    standard error into standard output; ``session``: a process group of its own."""
    return Process(args, cwd, env, merge, session)


def run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600, session: bool = False
) -> subprocess.CompletedProcess:
    """``python -m proj *args`` to its end, like ``subprocess.run(..., capture_output=True)``."""
    process = start(args, cwd, env, session=session)
    try:
        stdout, stderr = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        (os.killpg if session else os.kill)(process.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
