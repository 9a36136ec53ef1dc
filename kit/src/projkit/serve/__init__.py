"""``python -m <package> serve EXPORT_FOLDER``: an export (``model.onnx`` and ``model.json``) behind an
HTTP server that answers as ``predict`` does, on LitServe with onnxruntime.

``POST /predict`` takes an image file (image models) or a JSON prompt with generation settings (the
language model); ``GET /health`` answers 200 once a model is loaded (503 before), ``GET /info`` gives
``model.json`` and the server's settings. ``serve --config ... --ckpt_path best`` exports the
checkpoint first (in a process of its own, as ``export`` would) and serves that export.

This module is dispatched before torch and Lightning are imported and imports neither: the server's
processes run numpy, Pillow and onnxruntime only. The start is refused in one line (exit 2) for a
missing or damaged export, a bad setting or a port in use; SIGTERM and Ctrl-C stop taking requests,
answer those in flight and exit 0.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from projkit.context import current
from projkit.serve.model import IMAGE_TASK, ServeError, cpu_threads, load_session, read_export
from projkit.serve.requests import Limits

DESCRIPTION = (
    "Serve an export over HTTP (LitServe, onnxruntime): POST /predict answers as `predict` does, "
    "GET /health, GET /info. Give the folder `export` wrote, or --config and --ckpt_path to export first."
)
HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # what LitServe binds
# Batching and workers by device: a CPU's cores serve one onnxruntime session best, which batches a
# little; a GPU takes larger batches, for which a request may wait a little longer.
DEFAULTS = {
    "cpu": {"workers": 1, "max_batch_size": 8, "batch_timeout": 0.002},
    "cuda": {"workers": 1, "max_batch_size": 32, "batch_timeout": 0.005},
}


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The server's options on ``parser``: also the CLI's, whose ``--help`` lists ``serve``."""
    parser.add_argument("export", nargs="?", help="the export folder (<run>/export/<checkpoint>/)")
    parser.add_argument(
        "-c", "--config", action="append", default=[], help="with --ckpt_path: export this experiment first"
    )
    parser.add_argument(
        "--ckpt_path", help="with --config: the checkpoint to export first (best, last, a path)"
    )
    parser.add_argument("--host", default="127.0.0.1", help=f"the address to bind: one of {', '.join(HOSTS)}")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on (1024-65535)")
    parser.add_argument(
        "--accelerator",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the model runs (auto: cuda when onnxruntime has CUDA and a GPU is seen)",
    )
    parser.add_argument("--workers", type=int, help="inference processes per device (default: 1)")
    parser.add_argument(
        "--max_batch_size",
        type=int,
        help="requests batched together at most; 1 turns batching off (default: 8 on a CPU, 32 on a GPU)",
    )
    parser.add_argument(
        "--batch_timeout",
        type=float,
        help="seconds a batch waits for more requests (default: 0.002 on a CPU, 0.005 on a GPU)",
    )
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
        "--timeout", type=float, default=30.0, help="seconds a request may wait for a worker (then 504)"
    )
    parser.add_argument(
        "--log_level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="the server's log (info: a line per request)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m <package> serve [EXPORT] [options]``, or with ``--config``/``--ckpt_path`` (any
    other flag goes to ``export`` then, written as ``--key=value``)."""
    parser = add_arguments(
        argparse.ArgumentParser(prog=f"{current().command} serve", description=DESCRIPTION)
    )
    args, rest = parser.parse_known_args(argv)
    try:
        folder = export_folder(args, rest)
        spec = read_export(folder)
        device, settings = device_settings(args)
        limits = check_settings(args, settings)
        load_session(folder)  # a model onnxruntime cannot load is refused now, not by each worker
        check_port(args.host, args.port)
    except ServeError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    serve(folder, spec, args, device, settings, limits)


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


def device_settings(args: argparse.Namespace) -> tuple[str, dict]:
    """The device the model runs on and the workers and batching for it, flags over defaults."""
    device = args.accelerator
    if device == "auto":
        import onnxruntime
        from litserve.connector import check_cuda_with_nvidia_smi

        has_cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
        device = "cuda" if has_cuda and check_cuda_with_nvidia_smi() > 0 else "cpu"
    given = {key: getattr(args, key) for key in DEFAULTS[device] if getattr(args, key) is not None}
    return device, {**DEFAULTS[device], **given}


def check_settings(args: argparse.Namespace, settings: dict) -> Limits:
    """The flags no server could run with, refused by name."""
    if args.host not in HOSTS:
        raise ServeError(
            f"--host {args.host}: LitServe binds one of {', '.join(HOSTS)} only (0.0.0.0: every address)."
        )
    if not 1024 <= args.port <= 65535:
        raise ServeError(f"--port {args.port}: give a port from 1024 to 65535.")
    for name in ("workers", "max_batch_size", "max_body_bytes", "max_pixels"):
        value = settings.get(name, getattr(args, name, None))
        if value is not None and value < 1:
            raise ServeError(f"--{name} {value}: give a whole number of at least 1.")
    if args.max_new_tokens < 0:
        raise ServeError(f"--max_new_tokens {args.max_new_tokens}: give a whole number of at least 0.")
    if not settings["batch_timeout"] >= 0 or not args.timeout > 0:
        raise ServeError("--batch_timeout must be >= 0 and --timeout > 0 (seconds).")
    return Limits(args.max_body_bytes, args.max_pixels, args.max_new_tokens)


def check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ServeError(
                f"--port {port}: cannot listen on {host}:{port} ({error.strerror}); choose another port."
            ) from None


def serve(
    folder: Path, spec: dict, args: argparse.Namespace, device: str, settings: dict, limits: Limits
) -> None:
    """Run the server until SIGTERM or Ctrl-C, which stop it as LitServe's own shutdown does: the
    HTTP processes answer what is in flight, then the workers stop."""
    from projkit.serve.server import ExportedModel, Server

    workers, batch = settings["workers"], settings["max_batch_size"]
    threads = cpu_threads(workers) if device == "cpu" else 0
    api = ExportedModel(folder, spec, limits, batch, settings["batch_timeout"], threads)
    server = Server(
        api,
        accelerator=device,
        devices="auto" if device == "cuda" else 1,
        workers_per_device=workers,
        timeout=args.timeout,
        model_metadata=spec,
        disable_openapi_url=True,
        restart_workers=True,
    )
    stop_on_signals(server)
    what = (
        f"{len(spec['classes'])} classes"
        if spec["task"] == IMAGE_TASK
        else f"{len(spec['vocab'])} characters"
    )
    batching = (
        f"batches of up to {batch} ({settings['batch_timeout'] * 1000:g} ms)" if batch > 1 else "no batching"
    )
    print(
        f"Serving {folder} ({spec['task']}, {what}) at http://{args.host}:{args.port} on {device}: "
        f"POST /predict, GET /health, GET /info; {workers} worker(s), {batching}.",
        flush=True,
    )
    try:
        server.run(host=args.host, port=args.port, generate_client_file=False, log_level=args.log_level)
    except KeyboardInterrupt:  # before the server was up: its workers go with it
        for worker in getattr(server, "inference_workers", []):
            worker.terminate()
    print("Server stopped.", flush=True)


def stop_on_signals(server: object) -> None:
    """SIGTERM and SIGINT set LitServe's shutdown event, from a thread of their own (the main thread
    may be waiting on that event's manager connection); before the event exists they interrupt.
    The processes forked from this one inherit the handler and ignore the signal by it: the HTTP
    processes set their own, and LitServe's manager must outlive the drain."""
    from projkit.internals.litserve import shutdown_event

    shutdown_event(server)  # the attribute is there before a signal needs it
    main = os.getpid()

    def stop(signum: int, frame: object) -> None:
        if os.getpid() != main:
            return
        event = shutdown_event(server)
        if event is None:
            raise KeyboardInterrupt
        threading.Thread(target=event.set, name="shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
