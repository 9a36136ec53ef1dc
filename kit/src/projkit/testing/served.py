"""A served export for a project's tests of its answers over real HTTP: ``python -m <package> serve``
in a process of its own on a free port of 127.0.0.1, started and stopped by the test."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any


class ServedExport:
    """``python -m <package> serve ARGS`` in a process of its own on a free port of 127.0.0.1, for a
    project's tests of its served answers: ``start()`` waits (bounded) until ``/health`` answers 200,
    ``request`` sends anything over real HTTP, ``stop()`` sends SIGTERM and returns the exit status
    and what the server printed. A context manager too (stopped on leaving)."""

    def __init__(self, *args: str, cwd: str | None = None, start_timeout: float = 120.0) -> None:
        from projkit.context import current

        self.port = free_port()
        self.command = [sys.executable, "-m", current().package, "serve", *args, "--port", str(self.port)]
        self.cwd, self.start_timeout = cwd, start_timeout
        self.process: subprocess.Popen | None = None
        self.health_seen: list[int] = []  # /health's statuses until it answered 200
        self.output = ""

    def start(self, healthy: bool = True) -> ServedExport:
        """Start the server; with ``healthy``, wait until ``/health`` answers 200 (a server that
        exits first fails with what it printed)."""
        self.process = subprocess.Popen(
            self.command,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout
        while healthy and time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"serve exited with {self.process.returncode}: {self.process.stdout.read()}"
                )
            with contextlib.suppress(OSError):
                self.health_seen.append(self.request("GET", "/health")[0])
                if self.health_seen[-1] == 200:
                    return self
            time.sleep(0.1)
        if healthy:
            self.stop()
            raise RuntimeError(f"serve did not answer /health in {self.start_timeout} s: {self.output}")
        return self

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict | None = None, timeout: float = 60.0
    ) -> tuple[int, Any]:
        """``(status, answer)``: the answer's JSON, or its text when it is none."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data.decode("utf-8", "replace")

    def post(self, body: bytes, content_type: str, query: str = "") -> tuple[int, Any]:
        return self.request("POST", f"/predict{query}", body, {"Content-Type": content_type})

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM to the server (its main process), then its exit status; killed with its whole
        process group if it has not stopped after ``timeout`` seconds."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.output += self.process.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.output += self.process.communicate()[0]
        return self.process.returncode

    def __enter__(self) -> ServedExport:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A port of 127.0.0.1 free now (the kernel's choice, from its ephemeral range above 1024)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
