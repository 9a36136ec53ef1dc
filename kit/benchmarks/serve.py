"""What serving over HTTP costs: ``python -m <package> serve`` against onnxruntime called directly.

For an image experiment built from its config as shipped (the checkout's ``configs/digits.yaml`` by
default; the weights do not change the speed, so none are trained), the model is exported as
``export`` does it (``model.onnx`` and ``model.json``) into a temporary folder and served twice on
127.0.0.1: with dynamic batching (``--max_batch_size``, default 8) and without (1). ``--clients``
client threads (1, 8 and 32), each on a kept-alive connection, send the same PNG files (a quarter
larger than the model's input, so each is resized and cropped) for ``--seconds`` or ``--requests``
requests each, whichever comes first; the baseline is the same files decoded, prepared and run one
at a time through onnxruntime in this process, by the server's own code, without HTTP.

Each round measures every way once, alternating, so a slower moment of a shared machine touches
all alike; medians over ``--rounds`` are printed: requests/s, p50 and p99 latency (ms), and the
requests/s as a ratio to the direct baseline. The last line is that ratio for batching at the most
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
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from common import IMAGE_EXPERIMENTS, cli, cli_args, label, parse, parser
from projkit.export import deployable_of, trace, write_artifacts
from projkit.serve.model import answerer, load_session
from projkit.serve.requests import Limits, image_request
from projkit.testing import ServedExport

CLIENTS = (1, 8, 32)
LIMITS = Limits(max_body_bytes=10 * 2**20, max_pixels=40_000_000, max_new_tokens=0)


def exported(experiment: str, folder: Path) -> dict:
    """The experiment's untrained image model as ``export`` writes it (ONNX only): its model.json."""
    built = cli(cli_args(experiment), run=False)
    model, data = built.model.to("cpu").eval(), built.datamodule
    deployable = deployable_of(model, data)
    example = torch.rand(2, *data.input_shape)
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
    from projkit.preprocessing import Preprocessing

    model = answerer(load_session(folder), spec)
    pre = Preprocessing.from_description(spec["preprocessing"])
    lock = threading.Lock()
    classes = len(spec["classes"])

    def ask(client: int, i: int) -> None:
        request = image_request(bodies[i % len(bodies)], "image/png", {}, pre, classes, LIMITS)
        with lock:
            model.answers([request])

    return ask


def report(name: str, clients: int, rates: list[float], latencies: list[float], direct: list[float]) -> float:
    ratio = statistics.median(r / d for r, d in zip(rates, direct, strict=True))
    p50, p99 = (float(np.percentile(latencies, q)) * 1000 for q in (50, 99))
    print(
        f"{clients:>3} clients  {name:<12} {statistics.median(rates):>9,.1f} requests/s  "
        f"p50 {p50:>8.2f} ms  p99 {p99:>8.2f} ms  {ratio:.3f}x direct"
    )
    return ratio


def main_benchmark(argv: Sequence[str] | None = None) -> dict[tuple[str, int], float]:
    p = parser(__doc__.splitlines()[0], IMAGE_EXPERIMENTS, default="digits")
    p.add_argument("--seconds", type=float, default=2.0, help="at most this long per measurement")
    p.add_argument("--requests", type=int, default=2000, help="at most this many requests per client")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are printed")
    p.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="concurrent clients")
    p.add_argument("--max_batch_size", type=int, default=8, help="the batching server's batch")
    args = parse(p, argv)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        spec = exported(args.experiment, folder)
        bodies = files(spec["input"]["shape"][1:])
        servers = {
            "batching": ServedExport(str(folder), f"--max_batch_size={args.max_batch_size}"),
            "no batching": ServedExport(str(folder), "--max_batch_size=1"),
        }
        print(
            f"{label(args.experiment)}: {len(bodies)} PNG files, {args.rounds} rounds of {args.seconds:g} s"
        )
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
        ways = {"direct": direct_asker(folder, spec, bodies)}
        ways.update({name: http_asker(server.port, clients, bodies) for name, server in servers.items()})
        rates: dict[str, list[float]] = {name: [] for name in ways}
        latencies: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, ask in ways.items():
                rate, each = timed(clients, args.seconds, args.requests, ask)
                rates[name].append(rate)
                latencies[name] += each
        for name in ways:
            ratios[name, clients] = report(name, clients, rates[name], latencies[name], rates["direct"])
    most = max(args.clients)
    print(f"ratio {ratios['batching', most]:.3f} (served with batching / direct onnxruntime, {most} clients)")
    return ratios


if __name__ == "__main__":
    main_benchmark()
