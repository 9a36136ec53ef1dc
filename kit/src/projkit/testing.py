"""What a project's own tests use to try the kit's promises on their code: a kill at a chosen step,
so that a test can resume the run and compare it with an uninterrupted one (a data module of your
own resumes exactly, say), and a served export to ask over real HTTP (``ServedExport``). The kill is
named in an overlay by class path::

    trainer:
      callbacks+:
        - class_path: projkit.testing.KillAtStep
          init_args: {step: 30}
"""

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from projkit.step_syncs import Event, Watch, Window


class KillAtStep(Callback):
    """SIGKILLs its own process (``group``: its whole process group, every DDP rank; ``rank``: on
    that rank only) as the batch after optimizer step ``step`` begins: no handler runs, nothing is
    flushed, as when a node dies or the OOM killer strikes. ``wait`` seconds pass first: time for
    what runs beside training (a logger's own process) to do its periodic work."""

    def __init__(self, step: int, group: bool = False, rank: int | None = None, wait: float = 0.0) -> None:
        self.step = step
        self.group = group
        self.rank = rank
        self.wait = wait

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            time.sleep(self.wait)
            if self.group:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


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
                if self.request("GET", "/health")[0] == 200:
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


class SyncCounter(Callback):
    """Counts, in each training batch, what would hold up a GPU: the host's reads of device values
    (``Tensor.item``, ``bool``, ``float``, ``.tolist()``, ``.cpu()``, ``nonzero``, a boolean mask...)
    and the collectives issued from Python, on any device, the CPU included
    (``projkit.step_syncs`` says how). ``ordinary()`` gives those of the ordinary steps, the ones that
    neither log nor validate nor checkpoint nor end an epoch nor are the first: what every step
    pays. A project's test runs a few steps of its config with this callback
    (``--trainer.callbacks+=projkit.testing.SyncCounter``) and asserts that they pay nothing.

    ``path``: where each rank writes its ordinary steps' events as JSON when training ends
    (``{rank}`` in it is replaced by the rank), for a test that runs the training in processes of
    its own (DDP). ``cuda``: on a GPU, count the synchronisations CUDA itself reports
    (``torch.cuda.set_sync_debug_mode("warn")``), each one whatever made the value.
    """

    def __init__(self, path: str | None = None, cuda: bool = False) -> None:
        self.path = path
        self.cuda = cuda
        self.windows: list[Window] = []
        self._watch: Watch | None = None

    def _record(self, event: Event) -> None:
        if self.windows:
            self.windows[-1].events.append(event)

    def _mark(self, reason: str) -> None:
        if self.windows:
            self.windows[-1].special.add(reason)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.windows = []
        self._watch = Watch(self._record, self.cuda).__enter__()
        modules = [vars(module) for module in pl_module.modules()]
        self._watch.values.mark([*pl_module.parameters(), *pl_module.buffers()], modules)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int
    ) -> None:
        self.windows.append(Window(len(self.windows), trainer.global_step))
        if len(self.windows) == 1:
            self._mark("first")
        if self._watch is not None:
            self._watch.values.mark(batch)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        every, step = trainer.log_every_n_steps, trainer.global_step
        if step != self.windows[-1].global_step and every > 0 and step % every == 0:
            self._mark("logs")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._mark("validates")

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._mark("checkpoints")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._mark("ends an epoch")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._mark("ends training")
        self._stop()
        if self.path is not None:
            path = Path(self.path.replace("{rank}", str(trainer.global_rank)))
            events = {window.batch: [asdict(e) for e in window.events] for window in self.ordinary()}
            path.write_text(json.dumps(events, indent=1))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self._watch = None

    def ordinary(self) -> list[Window]:
        """The windows of the ordinary steps, each with its events."""
        return [window for window in self.windows if not window.special]
