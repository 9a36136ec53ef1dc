"""What serving over HTTP costs: ``python -m <package> serve`` against onnxruntime called directly.

Two models, each exported as ``export`` does it (``model.onnx`` and ``model.json``) into a temporary
folder: the image experiment built from its config as shipped (the checkout's
``configs/digits.yaml`` by default; the weights do not change the speed, so none are trained), whose
call costs microseconds, and a ResNet-18 (torchvision's, untrained, 3x32x32 pixels: ``--larger
none`` leaves it out) whose call costs milliseconds. Each is served twice on 127.0.0.1: with
batching (``--max_batch_size``, default 8) and without (1). ``--clients`` client threads (1, 8 and
32), each on a kept-alive connection, send the same PNG files (a quarter larger than the model's
input, so each is resized and cropped) for ``--seconds`` or ``--requests`` requests each,
whichever comes first; the baseline is the same files decoded, prepared and run one at a time
through onnxruntime in this process, by the server's own code, without HTTP.

Each round measures every way once, alternating, so a slower moment of a shared machine touches
all alike; medians over ``--rounds`` are printed: requests/s, p50 and p99 latency (ms), the server's
CPU time per request (its processes' user and system time over the requests answered), and the
requests/s as a ratio to the direct baseline. The larger model's block ends with what batching
gains at the most clients; the last line is the ratio for the experiment with batching at the most
clients::

    python kit/benchmarks/serve.py --rounds 3 --seconds 3
"""

from __future__ import annotations

import http.client
import io
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import torch
import torchvision
from PIL import Image

from common import IMAGE_EXPERIMENTS, cli, cli_args, experiment_config, label, parse, parser, project_for
from projkit.deploy import pixel_classifier
from projkit.export import deployable_of, trace, write_artifacts
from projkit.preprocessing import Preprocessing
from projkit.serve.model import answerer, load_session
from projkit.serve.requests import Limits, image_request
from projkit.testing import ServedExport

CLIENTS = (1, 8, 32)
LIMITS = Limits(max_body_bytes=10 * 2**20, max_pixels=40_000_000, max_new_tokens=0)
LARGER_SHAPE = (3, 32, 32)


def exported(experiment: str, folder: Path) -> dict:
    """The experiment's untrained image model as ``export`` writes it (ONNX only): its model.json."""
    built = cli(cli_args(experiment), run=False)
    model, data = built.model.to("cpu").eval(), built.datamodule
    return write(deployable_of(model, data), model, folder)


def exported_resnet(folder: Path) -> dict:
    """An untrained torchvision ResNet-18 for 10 classes of 32x32 RGB images, behind the kit's pixel
    input as an image experiment's export is: a call that costs milliseconds on a CPU."""
    net = torchvision.models.resnet18(num_classes=10).eval()
    data = SimpleNamespace(
        mean=(0.5, 0.5, 0.5),
        std=(0.25, 0.25, 0.25),
        input_shape=LARGER_SHAPE,
        preprocessing=Preprocessing("RGB", shorter_side=36, filter="bilinear", crop=LARGER_SHAPE[1:]),
        classes=[f"c{i}" for i in range(10)],
    )
    return write(pixel_classifier(net, data, 10), SimpleNamespace(net=net), folder)


def write(deployable, model, folder: Path) -> dict:
    example = torch.rand(2, *deployable.description["input"]["shape"][1:])
    description = dict(deployable.description)
    name = description["input"]["name"]
    write_artifacts(trace(deployable, example, model), example, folder, ["onnx"], name)
    (folder / "model.json").write_text(json.dumps(description))
    return description


def files(shape: Sequence[int], count: int = 16) -> list[bytes]:
    """``count`` seeded PNG files a quarter larger than the model's input (channels, height, width)."""
    channels, height, width = shape
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        size = (height * 5 // 4, width * 5 // 4, *((3,) if channels == 3 else ()))
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def timed(clients: int, seconds: float, requests: int, ask) -> tuple[float, list[float]]:
    """``clients`` threads calling ``ask(client, i)`` for ``seconds`` or ``requests`` calls each:
    requests per second over the whole, and every call's latency in seconds."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = time.perf_counter()
    end = start + seconds

    def client(index: int) -> None:
        for i in range(requests):
            began = time.perf_counter()
            ask(index, i)
            latencies[index].append(time.perf_counter() - began)
            if began > end:
                break

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [t for own in latencies for t in own]
    return len(every) / (time.perf_counter() - start), every


def cpu_seconds(pid: int | None) -> float:
    """User and system CPU time of the server's process and its children (workers) so far."""
    if pid is None:
        return 0.0
    process = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in (process, *process.children(recursive=True)))


def http_asker(port: int, clients: int, bodies: list[bytes]):
    """``ask(client, i)`` over one kept-alive connection per client; a refusal stops the run."""
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in range(clients)]

    def ask(client: int, i: int) -> None:
        connection = connections[client]
        connection.request("POST", "/predict", bodies[i % len(bodies)], {"Content-Type": "image/png"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"the server answered {response.status}: {response.read()[:200]!r}")
        response.read()

    return ask


def direct_asker(folder: Path, spec: dict, bodies: list[bytes]):
    """``ask(client, i)``: the file prepared and answered by the server's code in this process, one
    at a time (a lock: onnxruntime's session is shared, as a worker's is)."""
    model = answerer(load_session(folder), spec)
    pre = Preprocessing.from_description(spec["preprocessing"])
    lock = threading.Lock()
    classes = len(spec["classes"])

    def ask(client: int, i: int) -> None:
        request = image_request(bodies[i % len(bodies)], "image/png", {}, pre, classes, LIMITS)
        with lock:
            model.answers([request])

    return ask


def report(name: str, clients: int, figures: dict[str, list], direct: list[float]) -> float:
    ratio = statistics.median(r / d for r, d in zip(figures["rates"], direct, strict=True))
    p50, p99 = (float(np.percentile(figures["latencies"], q)) * 1000 for q in (50, 99))
    cpu = f"cpu {statistics.median(figures['cpu']) * 1e6:>6,.0f} µs" if figures["cpu"] else "cpu      - µs"
    print(
        f"{clients:>3} clients  {name:<12} {statistics.median(figures['rates']):>9,.1f} requests/s  "
        f"p50 {p50:>8.2f} ms  p99 {p99:>8.2f} ms  {cpu}  {ratio:.3f}x direct",
        flush=True,
    )
    return ratio


def main_benchmark(argv: Sequence[str] | None = None) -> dict[tuple[str, int], float]:
    p = parser(__doc__.splitlines()[0], IMAGE_EXPERIMENTS, default="digits")
    p.add_argument("--seconds", type=float, default=2.0, help="at most this long per measurement")
    p.add_argument("--requests", type=int, default=2000, help="at most this many requests per client")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are printed")
    p.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="concurrent clients")
    p.add_argument("--max_batch_size", type=int, default=8, help="the batching server's batch")
    p.add_argument("--larger", choices=("resnet18", "none"), default="resnet18", help="the larger model")
    p.add_argument("--serve_args", nargs="*", default=[], help="more flags for both servers")
    args = parse(p, argv)
    project_for(experiment_config(args.experiment))  # whose `python -m <package> serve` runs
    ratios = {}
    models: list[tuple[str, Callable[[Path], dict]]] = [
        (label(args.experiment), lambda folder: exported(args.experiment, folder))
    ]
    if args.larger != "none":
        models.insert(0, (args.larger, exported_resnet))
    for name, export in models:
        ratios = benchmark_model(args, name, export)
    most = max(args.clients)
    print(f"ratio {ratios['batching', most]:.3f} (served with batching / direct onnxruntime, {most} clients)")
    return ratios


def benchmark_model(args, name: str, export: Callable[[Path], dict]) -> dict[tuple[str, int], float]:
    """One model exported, served both ways and measured: its ratios to direct by way and clients."""
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        spec = export(folder)
        bodies = files(spec["input"]["shape"][1:])
        servers = {
            "batching": ServedExport(
                str(folder), f"--max_batch_size={args.max_batch_size}", *args.serve_args
            ),
            "no batching": ServedExport(str(folder), "--max_batch_size=1", *args.serve_args),
        }
        print(f"{name}: {len(bodies)} PNG files, {args.rounds} rounds of {args.seconds:g} s", flush=True)
        try:
            for server in servers.values():
                server.start()
            return measure(args, folder, spec, bodies, servers)
        finally:
            for server in servers.values():
                server.stop()


def measure(args, folder: Path, spec: dict, bodies: list[bytes], servers: dict) -> dict:
    """Every way at every number of clients, ``--rounds`` times alternating; the printed figures."""
    ratios = {}
    for clients in args.clients:
        direct = direct_asker(folder, spec, bodies)
        figures = {name: {"rates": [], "latencies": [], "cpu": []} for name in ("direct", *servers)}
        for _ in range(args.rounds):
            # New connections each round: one idle for a whole round may pass the keep-alive timeout.
            ways = {"direct": (None, direct)}
            ways.update(
                {name: (s.process.pid, http_asker(s.port, clients, bodies)) for name, s in servers.items()}
            )
            for name, (pid, ask) in ways.items():
                cpu = cpu_seconds(pid)
                rate, each = timed(clients, args.seconds, args.requests, ask)
                figures[name]["rates"].append(rate)
                figures[name]["latencies"] += each
                if pid is not None:
                    figures[name]["cpu"].append((cpu_seconds(pid) - cpu) / max(1, len(each)))
        for name in figures:
            ratios[name, clients] = report(name, clients, figures[name], figures["direct"]["rates"])
    most = max(args.clients)
    gain = statistics.median(
        r / n for r, n in zip(*(figures[w]["rates"] for w in ("batching", "no batching")), strict=True)
    )
    print(f"batching gains {gain:.2f}x at {most} clients (batching / no batching requests/s)", flush=True)
    return ratios


if __name__ == "__main__":
    main_benchmark()
