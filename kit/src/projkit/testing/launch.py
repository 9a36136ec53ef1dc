"""``python -m <package>`` (the current project's, ``projkit.context``) as a test starts it:
``projkit.preloaded``'s process, forked from a server that has imported torch, Lightning and the CLI
once, instead of a new interpreter that imports them again (about 6 s of CPU a start, more than a
short run's training), with what ``subprocess`` gives a test: its output captured, a timeout. A test
of what a process does while it imports (a launcher's ``LOCAL_RANK``, a warning raised at import),
of torchrun or of a fresh shell starts a new interpreter instead."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import weakref
from pathlib import Path

from projkit import preloaded


class Process:
    """A started ``python -m <package>``, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(
        self, args: list[str], cwd: Path, env: dict[str, str] | None, merge: bool, session: bool
    ) -> None:
        folder = Path(tempfile.mkdtemp(prefix="projkit-launch-"))
        weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        self._out, self._err = folder / "stdout", folder / "stderr"
        env = dict(os.environ if env is None else env)
        self._process = preloaded.start(args, cwd, env, self._out, self._out if merge else self._err, session)
        self.args, self.pid = self._process.args, self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._process.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._process.wait(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.poll()

    def send_signal(self, signum: int) -> None:
        self._process.send_signal(signum)

    def output(self) -> tuple[str, str]:
        """What it has written so far to standard output and standard error."""
        read = lambda path: path.read_text(errors="backslashreplace") if path.exists() else ""  # noqa: E731
        return read(self._out), read(self._err)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.output()


def start(args: list[str], cwd: Path, env: dict[str, str] | None = None, *, merge: bool = False,
          session: bool = False) -> Process:  # fmt: skip
    """``python -m <package> *args`` in ``cwd`` with ``env`` (this process's by default); ``merge``:
    standard error into standard output; ``session``: a process group of its own."""
    return Process(args, cwd, env, merge, session)


def run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600, session: bool = False
) -> subprocess.CompletedProcess:
    """``python -m <package> *args`` to its end, like ``subprocess.run(..., capture_output=True)``."""
    process = start(args, cwd, env, session=session)
    try:
        stdout, stderr = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        (os.killpg if session else os.kill)(process.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
