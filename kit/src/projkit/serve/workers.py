"""Where the server runs: in this process (``run_here``, the default), or in ``--workers`` processes
that share the socket this one bound (``supervise``), for a CPU with cores to spare or several GPUs.

Each worker is a whole server, its own session and model thread, started as ``python -m
projkit.serve.workers PLAN FD`` with the listening socket inherited; the kernel hands each new
connection to one of them. The parent forwards SIGTERM and Ctrl-C (each worker drains), starts a
worker again if one dies after it had started, and exits 0 once every worker did. A worker ends
with its parent (``projkit.lifetime.end_with``): a parent killed by ``kill -9`` leaves no process
behind and no port held.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# A worker that exits sooner than this after its start failed to start: the server stops rather
# than start it again and again.
START_S = 10.0
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

    def settings(self) -> dict:
        """What ``/info`` says of the server."""
        return {
            "accelerator": self.device,
            "workers": self.workers,
            "max_batch_size": self.max_batch_size,
            "timeout": self.timeout,
            **self.limits,
        }


def run_here(plan: Plan, sock: socket.socket, index: int = 0, force: bool = True) -> int:
    """Serve in this process until a signal's drain is done; 0. Worker ``index`` takes GPU
    ``index`` modulo the GPUs, and a CPU's cores shared out among the workers."""
    from projkit.serve.batching import ModelThread
    from projkit.serve.model import answerer, cpu_threads, load_session, read_export
    from projkit.serve.requests import Limits
    from projkit.serve.server import Endpoints, run

    folder = Path(plan.folder)
    spec = read_export(folder)
    device = f"cuda:{index % plan.gpus}" if plan.device == "cuda" else "cpu"
    threads = cpu_threads(plan.workers) if plan.device == "cpu" else 0
    model = ModelThread(
        lambda: answerer(load_session(folder, device, threads, spinning=False), spec), plan.max_batch_size
    )
    endpoints = Endpoints(spec, Limits(**plan.limits), model, plan.timeout, plan.settings())
    run(endpoints, sock, plan.log_level, force)
    counts = model.counts
    print(
        f"Process {os.getpid()} answered {counts['requests']} requests in {counts['batches']} model calls "
        f"(largest batch {counts['largest_batch']}).",
        flush=True,
    )
    return 0


def supervise(plan: Plan, sock: socket.socket) -> int:
    """Run ``plan.workers`` worker processes on ``sock`` until SIGTERM or SIGINT, then drain them;
    0 when each drained and exited 0, else 1."""
    signals: list[int] = []
    woken = threading.Event()

    def note(signum: int, frame: object) -> None:
        signals.append(signum)
        woken.set()

    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)
    workers = [start(plan, sock, index) for index in range(plan.workers)]
    started = [time.monotonic()] * plan.workers
    failed = False
    while not signals and not failed:
        woken.wait(0.5)
        for index, worker in enumerate(workers):
            if worker.poll() is None:
                continue
            print(f"Worker {worker.pid} exited with {worker.returncode}.", file=sys.stderr, flush=True)
            failed = time.monotonic() - started[index] < START_S
            if not failed:
                workers[index], started[index] = start(plan, sock, index), time.monotonic()
    sock.close()  # the workers hold it; with none accepting, a new connection is refused, not queued
    return stop(workers, signals, woken)


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
    return 0 if handled and all(worker.returncode == 0 for worker in workers) else 1


def start(plan: Plan, sock: socket.socket, index: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "projkit.serve.workers", json.dumps(asdict(plan))]
    command += [str(sock.fileno()), str(index), str(os.getpid())]
    return subprocess.Popen(command, pass_fds=[sock.fileno()])


def worker_main(argv: list[str]) -> None:
    """A worker: the server on the inherited socket, ended with its parent. Its own SIGINT (Ctrl-C
    reaches the whole process group) starts the same drain as the parent's SIGTERM, and a second
    signal does not cut it short: the parent decides."""
    from projkit.lifetime import end_with

    plan = Plan(**json.loads(argv[0]))
    end_with(int(argv[3]), plan.timeout + DRAIN_GRACE_S)
    sock = socket.socket(fileno=int(argv[1]))
    raise SystemExit(run_here(plan, sock, int(argv[2]), force=False))


if __name__ == "__main__":
    worker_main(sys.argv[1:])
