"""How many times faster the exported model predicts than the eager module, on the CPU.

For an image experiment built from its config as shipped (the checkout's ``configs/digits.yaml`` by
default, ``--experiment`` another name or a config's path; the weights do not change the speed, so
none are trained), the network behind the data's normalisation (the task module's ``deployable``,
what ``python -m <package> export`` traces) is exported as ``export`` does it, into a temporary
folder, and three ways of running it are timed on the same random pixels, in images per second at
batch sizes 1 and 64:

- ``onnxruntime``: ``model.onnx`` in an onnxruntime CPU session;
- ``exported``: ``model.pt2`` loaded by ``torch.export.load`` and called under ``torch.inference_mode``;
- ``eager``: the module itself, under ``torch.inference_mode``.

Each round times the three one after the other, each for at least ``--seconds`` (so a slower
moment of a shared machine touches all three alike), and a ratio against eager is taken per round;
the median over ``--rounds`` rounds is printed. The last line is onnxruntime against eager at batch
64::

    python kit/benchmarks/inference.py --threads 2
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from common import IMAGE_EXPERIMENTS, cli, cli_args, label, parse, parser
from projkit.export import FORMATS, deployable_of, trace, write_artifacts

BATCH_SIZES = (1, 64)
NAMES = {"onnx": "onnxruntime", "pt2": "exported"}


def images_per_second(run: Callable[[torch.Tensor], object], x: torch.Tensor, seconds: float) -> float:
    """Images per second of ``run`` on ``x``, over as many calls as fill ``seconds`` after a warm-up call."""
    start = time.perf_counter()
    run(x)
    once = time.perf_counter() - start
    calls = max(1, math.ceil(seconds / max(once, 1e-9)))
    start = time.perf_counter()
    for _ in range(calls):
        run(x)
    return calls * len(x) / (time.perf_counter() - start)


def main_benchmark(argv: Sequence[str] | None = None) -> dict[tuple[str, int], float]:
    p = parser(__doc__.splitlines()[0], IMAGE_EXPERIMENTS, default="digits")
    p.add_argument("--seconds", type=float, default=1.0, help="at least this long per measurement")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; the median ratio is printed")
    args = parse(p, argv)
    built = cli(cli_args(args.experiment), run=False)
    model, data = built.model.to("cpu").eval(), built.datamodule
    deployable = deployable_of(model, data)
    net = deployable.net
    example = torch.rand(2, *data.input_shape)
    with tempfile.TemporaryDirectory() as folder:
        name = deployable.description["input"]["name"]
        runners = write_artifacts(trace(deployable, example, model), example, Path(folder), FORMATS, name)
        ways = {NAMES[name]: runners[name] for name in ("onnx", "pt2")}

        def eager(x: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return net(x)

        ways["eager"] = eager
        print(
            f"{label(args.experiment)}: {type(model.net).__name__} on {data.input_shape} pixels, "
            f"{torch.get_num_threads()} torch threads, {args.rounds} rounds of {args.seconds:g} s each"
        )
        ratios: dict[tuple[str, int], float] = {}
        for batch in BATCH_SIZES:
            x = torch.rand(batch, *data.input_shape)
            rates: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, run in ways.items():
                    rates[name].append(images_per_second(run, x, args.seconds))
            for name in ways:
                median = statistics.median(rates[name])
                ratio = statistics.median(r / e for r, e in zip(rates[name], rates["eager"], strict=True))
                ratios[name, batch] = ratio
                print(f"batch {batch:>3}  {name:<12} {median:>12,.0f} images/s  {ratio:.2f}x eager")
    largest = BATCH_SIZES[-1]
    print(f"ratio {ratios['onnxruntime', largest]:.2f} (onnxruntime / eager, batch {largest})")
    return ratios


if __name__ == "__main__":
    main_benchmark()
