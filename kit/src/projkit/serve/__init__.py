"""``python -m <package> serve EXPORT_FOLDER``: an export (``model.onnx`` and ``model.json``) behind an
HTTP server that answers as ``predict`` does: uvicorn and Starlette in the process that holds the
onnxruntime session, so a request is answered where the model is (``server``).

``POST /predict`` takes an image file (image models) or a JSON prompt with generation settings (the
language model); ``GET /health`` answers 200 once a model is loaded (503 before), ``GET /info`` gives
``model.json`` and the server's settings. ``serve --config ... --ckpt_path best`` exports the
checkpoint first (in a process of its own, as ``export`` would) and serves that export.

This module is dispatched before torch and Lightning are imported and imports neither: the server
runs numpy, Pillow, onnx and onnxruntime only. The start is refused in one line (exit 2) for a
missing, damaged or inconsistent export (``folder`` checks it whole), a bad setting or a port in
use; SIGTERM and Ctrl-C stop taking requests, answer those in flight and exit 0. ``--workers N``
runs N such servers on one socket (``workers``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

from projkit.context import current
from projkit.serve.model import IMAGE_TASK, ServeError, load_session, read_export
from projkit.serve.requests import Limits

DESCRIPTION = (
    "Serve an export over HTTP (uvicorn, onnxruntime): POST /predict answers as `predict` does, "
    "GET /health, GET /info. Give the folder `export` wrote, or --config and --ckpt_path to export first."
)
# A CPU's cores serve one onnxruntime session best, in one process; a GPU takes larger batches, and
# a server runs one process per GPU it sees. Batches form only from requests already waiting.
DEFAULTS = {"cpu": {"max_batch_size": 8}, "cuda": {"max_batch_size": 32}}
BATCH_TIMEOUT_GONE = (
    "--batch_timeout is deprecated and has no effect (it goes in 1.3): a request no longer waits for "
    "company; those that arrive while the model is busy are batched, up to --max_batch_size."
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The server's options on ``parser``: also the CLI's, whose ``--help`` lists ``serve``."""
    parser.add_argument("export", nargs="?", help="the export folder (<run>/export/<checkpoint>/)")
    parser.add_argument(
        "-c", "--config", action="append", default=[], help="with --ckpt_path: export this experiment first"
    )
    parser.add_argument(
        "--ckpt_path", help="with --config: the checkpoint to export first (best, last, a path)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (0.0.0.0: every address)")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on (1024-65535)")
    parser.add_argument(
        "--accelerator",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the model runs (auto: cuda when onnxruntime has CUDA and a GPU is seen)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="server processes, each with the model, on one socket (default: 1 on a CPU, one per GPU)",
    )
    parser.add_argument(
        "--max_batch_size",
        type=int,
        help="requests that arrived while the model was busy, run together at most; 1 turns batching "
        "off (default: 8 on a CPU, 32 on a GPU)",
    )
    parser.add_argument("--batch_timeout", type=float, help="deprecated, no effect: a request never waits")
    parser.add_argument(
        "--max_body_bytes", type=int, default=10 * 2**20, help="the largest request body accepted"
    )
    parser.add_argument(
        "--max_pixels",
        type=int,
        default=40_000_000,
        help="the most pixels an image may have (its header is checked before decoding)",
    )
    parser.add_argument(
        "--max_new_tokens", type=int, default=1000, help="the most tokens a request may ask for"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds a request may wait for the model (then 504)"
    )
    parser.add_argument(
        "--read_timeout",
        type=float,
        default=30.0,
        help="seconds a client may take to send a request's headers, and as long again for its body "
        "(then 408)",
    )
    parser.add_argument(
        "--log_level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="the server's log (info: a line per request)",
    )
    return parser


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusal of what was typed (a flag without its value, a value of another type) in
    one line, as every other refusal at start, rather than after the usage of every option."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; `{self.prog} --help` lists the options.", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m <package> serve [EXPORT] [options]``, or with ``--config``/``--ckpt_path`` (any
    other flag goes to ``export`` then, written as ``--key=value``)."""
    parser = add_arguments(OneLineParser(prog=f"{current().command} serve", description=DESCRIPTION))
    args, rest = parser.parse_known_args(argv)
    exporting = bool(args.config or args.ckpt_path)
    try:
        device, settings = device_settings(args)
        limits = check_settings(args, settings)
        sock = bound(args.host, args.port) if exporting else None  # it answers 503 while exporting
        with Exporting(sock) if sock else contextlib.nullcontext():
            folder = export_folder(args, rest)
        # The folder checked whole, its model run once, before the server listens (or, exporting,
        # takes the socket over): a bad one is one line here, not a failure in each worker or request.
        spec = read_export(folder)
        load_session(folder)
        sock = sock or bound(args.host, args.port)
    except ServeError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    serve(folder, spec, args, device, settings, limits, sock)


def export_folder(args: argparse.Namespace, rest: list[str]) -> Path:
    """The folder to serve: the one given, or the one ``export`` writes for ``rest`` (``--config``,
    ``--ckpt_path`` and other flags of export's), run first in a process of its own."""
    exporting = bool(args.config or args.ckpt_path)
    if args.export is not None and not exporting:
        if rest:
            raise ServeError(
                f"unknown option(s) {' '.join(rest)}: `{current().command} serve --help` lists them."
            )
        return Path(args.export)
    if args.export is not None or not (args.config and args.ckpt_path):
        raise ServeError(
            "give either the export folder to serve (<run>/export/<checkpoint>/) or --config and "
            "--ckpt_path to export a checkpoint first (export's own flags as --key=value), not both."
        )
    configs = [part for config in args.config for part in ("--config", config)]
    rest = [*configs, f"--ckpt_path={args.ckpt_path}", *rest]
    command = [sys.executable, "-m", current().package, "export", *rest, "--formats=onnx"]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(done.stdout)
    found = re.findall(r"^Exported (.+)/model\.json$", done.stdout, re.M)
    if done.returncode != 0 or not found:
        raise SystemExit(done.returncode or 1)  # export said why
    return Path(found[-1])


# What every request gets while `serve --config ... --ckpt_path ...` exports: /health is 503 until the
# model is loaded, from the moment the port is taken, rather than a refused connection.
NOT_YET = b"not ready: exporting the checkpoint"
EXPORTING_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nRetry-After: 5\r\nConnection: close\r\n\r\n%s" % (len(NOT_YET), NOT_YET)
)


class Exporting:
    """Answers 503 on the server's socket while the export runs, from a thread; the server takes the
    socket over afterwards (the connections waiting then are its)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.stopped = sock, threading.Event()
        self.thread = threading.Thread(target=self.answer, name="exporting", daemon=True)

    def __enter__(self) -> Exporting:
        self.sock.settimeout(0.1)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.sock.settimeout(None)

    def answer(self) -> None:
        while not self.stopped.is_set():
            try:
                connection, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection, contextlib.suppress(OSError):
                connection.settimeout(1.0)
                connection.recv(65536)
                connection.sendall(EXPORTING_ANSWER)


def device_settings(args: argparse.Namespace) -> tuple[str, dict]:
    """The device the model runs on, and the workers and batch size for it: flags over defaults."""
    device, gpus = args.accelerator, 0
    if device != "cpu":
        import onnxruntime

        gpus = gpu_count() if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else 0
        device = "cuda" if device == "cuda" or gpus > 0 else "cpu"
    if args.batch_timeout is not None:
        print(f"warning: {BATCH_TIMEOUT_GONE}", file=sys.stderr, flush=True)
    settings = {**DEFAULTS[device], "workers": max(1, gpus) if device == "cuda" else 1}
    given = {key: getattr(args, key) for key in settings if getattr(args, key) is not None}
    return device, {**settings, **given, "gpus": max(1, gpus) if device == "cuda" else 0}


def gpu_count() -> int:
    """The GPUs ``nvidia-smi -L`` lists that ``CUDA_VISIBLE_DEVICES`` (when set) leaves visible; 0
    without the tool: torch, which would say it directly, is not imported in the server."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    indices = re.findall(r"^GPU (\d+):", listed, re.M)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        indices = [index for index in indices if index in visible.split(",")]
    return len(indices)


def check_settings(args: argparse.Namespace, settings: dict) -> Limits:
    """The flags no server could run with, refused by name."""
    if not 1024 <= args.port <= 65535:
        raise ServeError(f"--port {args.port}: give a port from 1024 to 65535.")
    for name in ("workers", "max_batch_size", "max_body_bytes", "max_pixels"):
        value = settings.get(name, getattr(args, name, None))
        if value is not None and value < 1:
            raise ServeError(f"--{name} {value}: give a whole number of at least 1.")
    if args.max_new_tokens < 0:
        raise ServeError(f"--max_new_tokens {args.max_new_tokens}: give a whole number of at least 0.")
    if not (math.isfinite(args.timeout) and args.timeout > 0):  # /info says it, and JSON has no inf
        raise ServeError(f"--timeout {args.timeout}: give a finite number of seconds above 0.")
    if not (math.isfinite(args.read_timeout) and args.read_timeout > 0):
        raise ServeError(f"--read_timeout {args.read_timeout}: give a finite number of seconds above 0.")
    if settings["workers"] > 1 and os.name == "nt":
        raise ServeError("--workers above 1 shares a socket between processes, which needs Linux or macOS.")
    return Limits(args.max_body_bytes, args.max_pixels, args.max_new_tokens)


def bound(host: str, port: int) -> socket.socket:
    """The listening socket, bound once here: the server (or each worker, which inherits it) accepts
    on it, so a port in use is refused before anything starts."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise ServeError(f"--host {host}: no address by that name ({error.strerror}).") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise ServeError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror}); choose another port, "
            "or an address of this machine (0.0.0.0: every one)."
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(
    folder: Path,
    spec: dict,
    args: argparse.Namespace,
    device: str,
    settings: dict,
    limits: Limits,
    sock: socket.socket,
) -> None:
    """Run the server until SIGTERM or Ctrl-C, which drain it: in this process, or in
    ``--workers`` processes on the same socket."""
    from projkit.serve import workers

    count, batch = settings["workers"], settings["max_batch_size"]
    what = (
        f"{len(spec['classes'])} classes"
        if spec["task"] == IMAGE_TASK
        else f"{len(spec['vocab'])} characters"
    )
    batching = f"batches of up to {batch} when requests wait" if batch > 1 else "no batching"
    print(
        f"Serving {folder} ({spec['task']}, {what}) at http://{args.host}:{args.port} on {device}: "
        f"POST /predict, GET /health, GET /info; {count} process(es), {batching}.",
        flush=True,
    )
    plan = workers.Plan(
        folder=str(folder),
        device=device,
        gpus=settings["gpus"],
        workers=count,
        max_batch_size=batch,
        timeout=args.timeout,
        limits=asdict(limits),
        log_level=args.log_level,
        read_timeout=args.read_timeout,
    )
    code = workers.serve(plan, sock)
    print("Server stopped.", flush=True)
    raise SystemExit(code)
