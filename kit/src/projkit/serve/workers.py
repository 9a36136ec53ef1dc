"""Where the server runs: in this process (``run_here``, the default), or in ``--workers`` processes
that share the socket this one bound (``supervise``), for a CPU with cores to spare or several GPUs.

Each worker is a whole server, its own session and model thread, started as ``python -m
projkit.serve.workers PLAN FD INDEX PARENT READY`` with the listening socket inherited; the kernel
hands each new connection to one of them. The parent forwards SIGTERM and Ctrl-C (each worker
drains) and exits 0 once every worker did. A worker that dies once its model was loaded (``kill
-9``, the OOM killer, a crash) is started again on the same socket, so the port goes on answering:
the other workers meanwhile, and it once it has loaded; its own connections close with it (the
kernel closes them, so their clients see it at once and no one waits on them). One that dies
before it loaded its model failed to start, and would again: the server stops, exit 1. A worker
ends with its parent (``projkit.lifetime.end_with``): a parent killed by ``kill -9`` leaves no
process behind and no port held.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

# How long a worker whose parent died drains before it is killed (beyond the request --timeout).
DRAIN_GRACE_S = 5.0


@dataclass(frozen=True)
class Plan:
    """What every server process needs to serve: a JSON line on a worker's command line."""

    folder: str
    device: str
    gpus: int
    workers: int
    max_batch_size: int
    timeout: float
    limits: dict
    log_level: str
    read_timeout: float

    def settings(self) -> dict:
        """What ``/info`` says of the server."""
        return {
            "accelerator": self.device,
            "workers": self.workers,
            "max_batch_size": self.max_batch_size,
            "timeout": self.timeout,
            "read_timeout": self.read_timeout,
            **self.limits,
        }


def serve(plan: Plan, sock: socket.socket) -> int:
    """Serve ``plan`` on ``sock``, in this process or in its workers, warning first (once) when
    other machines can reach the socket; the exit code."""
    if (warning := exposure(sock)) is not None:
        print(warning, file=sys.stderr, flush=True)
    return run_here(plan, sock) if plan.workers == 1 else supervise(plan, sock)


def exposure(sock: socket.socket) -> str | None:
    """The warning a server bound beyond the loopback gets: it has no authentication."""
    host, port = sock.getsockname()[:2]
    if ipaddress.ip_address(host.split("%")[0]).is_loopback:
        return None
    return (
        f"warning: the server listens on {host} port {port}, which other machines can reach, and it "
        "has no authentication: anyone who reaches it can use the model. Bind the loopback only "
        "(--host 127.0.0.1, the default) and put a reverse proxy with authentication in front of it "
        "(kit/docs/serving.md, 'Behind a reverse proxy')."
    )


def run_here(
    plan: Plan, sock: socket.socket, index: int = 0, force: bool = True, ready_fd: int | None = None
) -> int:
    """Serve in this process until a signal's drain is done; 0. Worker ``index`` takes GPU
    ``index`` modulo the GPUs, and a CPU's cores shared out among the workers; once its model is
    loaded it writes a byte to ``ready_fd``, for its parent."""
    from projkit.serve.batching import ModelThread
    from projkit.serve.model import answerer, cpu_threads, load_session, read_export
    from projkit.serve.requests import Limits
    from projkit.serve.server import Endpoints, run

    folder = Path(plan.folder)
    spec = read_export(folder)
    device = f"cuda:{index % plan.gpus}" if plan.device == "cuda" else "cpu"
    threads = cpu_threads(plan.workers) if plan.device == "cpu" else 0

    def load() -> object:
        loaded = answerer(load_session(folder, device, threads, spinning=False), spec)
        if ready_fd is not None:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        return loaded

    model = ModelThread(load, plan.max_batch_size)
    endpoints = Endpoints(spec, Limits(**plan.limits), model, plan.timeout, plan.settings())
    run(endpoints, sock, plan.log_level, plan.read_timeout, force)
    counts = model.counts
    print(
        f"Process {os.getpid()} answered {counts['requests']} requests in {counts['batches']} model calls "
        f"(largest batch {counts['largest_batch']}).",
        flush=True,
    )
    return 0


@dataclass
class Worker:
    """A worker process and the read end of the pipe it writes a byte to once its model is loaded."""

    process: subprocess.Popen
    ready: int

    def loaded(self) -> bool:
        """Whether the worker, now dead, had loaded its model (its byte is in the pipe; else the
        pipe is at its end, every write end closed)."""
        with os.fdopen(self.ready, "rb") as pipe:
            return pipe.read(1) == b"1"


def supervise(plan: Plan, sock: socket.socket) -> int:
    """Run ``plan.workers`` worker processes on ``sock`` until SIGTERM or SIGINT, then drain them;
    0 when each drained and exited 0, else 1. A worker that dies is started again if it had loaded
    its model, else the server stops (it failed to start, and would again)."""
    signals: list[int] = []
    woken = threading.Event()

    def note(signum: int, frame: object) -> None:
        signals.append(signum)
        woken.set()

    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)
    workers = [start(plan, sock, index) for index in range(plan.workers)]
    failed = False
    while not signals and not failed:
        woken.wait(0.5)
        for index, worker in enumerate(workers):
            if worker.process.poll() is None:
                continue
            said = f"Worker {worker.process.pid} {ended(worker.process.returncode)}"
            if worker.loaded():
                print(f"{said}: starting another on the same port.", file=sys.stderr, flush=True)
                workers[index] = start(plan, sock, index)
            else:
                print(
                    f"error: {said} before its model was loaded: the server stops.",
                    file=sys.stderr,
                    flush=True,
                )
                failed = True
    sock.close()  # the workers hold it; with none accepting, a new connection is refused, not queued
    return stop([worker.process for worker in workers], signals, woken)


def ended(code: int) -> str:
    """How a process ended, from its return code."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with {code}"


def stop(workers: list[subprocess.Popen], signals: list[int], woken: threading.Event) -> int:
    """SIGTERM to each worker, then wait for all; a second signal kills them."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    handled = len(signals)
    while any(worker.poll() is None for worker in workers):
        woken.clear()
        woken.wait(0.2)
        if len(signals) > handled > 0:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
    # Ended by SIGTERM itself: it was still importing, before its drain was set, and held nothing.
    clean = (0, -signal.SIGTERM)
    return 0 if handled and all(worker.returncode in clean for worker in workers) else 1


def start(plan: Plan, sock: socket.socket, index: int) -> Worker:
    reader, writer = os.pipe()
    command = [sys.executable, "-m", "projkit.serve.workers", json.dumps(asdict(plan))]
    command += [str(sock.fileno()), str(index), str(os.getpid()), str(writer)]
    try:
        process = subprocess.Popen(command, pass_fds=[sock.fileno(), writer])
    finally:
        os.close(writer)  # the worker's copy alone: the pipe ends when the worker does
    return Worker(process, reader)


def worker_main(argv: list[str]) -> None:
    """A worker: the server on the inherited socket, ended with its parent. Its own SIGINT (Ctrl-C
    reaches the whole process group) starts the same drain as the parent's SIGTERM, and a second
    signal does not cut it short: the parent decides. Either signal before the server runs (the
    imports, a restarted worker stopped at once) ends it with 0: it holds no request yet."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopped_while_starting)
    from projkit.lifetime import end_with

    plan = Plan(**json.loads(argv[0]))
    end_with(int(argv[3]), plan.timeout + DRAIN_GRACE_S)
    sock = socket.socket(fileno=int(argv[1]))
    raise SystemExit(run_here(plan, sock, int(argv[2]), force=False, ready_fd=int(argv[4])))


def stopped_while_starting(signum: int, frame: object) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
