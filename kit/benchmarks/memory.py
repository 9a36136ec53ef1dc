"""Peak memory of a GPT training step with activation checkpointing, against without.

The GPT, batch size, context length and precision are the experiment's (``--experiment``: a name of
the checkout's configs or a config's path; by default ``shakespeare_char`` on a GPU, the CPU-sized
``shakespeare_char_cpu`` otherwise), built by the project's CLI from its config with the network's
``activation_checkpointing`` set each way (a network that has none cannot be measured here). After
one warm-up step (which creates the optimizer's state), one training step is measured: zero_grad,
forward, loss, backward, clipping, AdamW step. The peak counts everything live at its worst moment:
weights, gradients, optimizer state, and the activations kept for the backward pass or recomputed in
it.

On CUDA the peak is ``torch.cuda.max_memory_allocated`` (reset before the step). A CPU has no such
counter, so there the peak comes from PyTorch's ``MemTracker`` (``torch.distributed._tools``), a
dispatch mode that sees every tensor an operation creates and follows its storage until it is freed:
the live bytes after each operation, and their maximum, are what the CUDA counter reports, short of
the CUDA allocator's rounding to 512-byte blocks. It counts the checkpointed blocks' inputs, which
stay alive until their backward, and the one block recomputed at a time in the backward pass: the
bytes saved for backward (``saved_tensors_hooks``) see neither, nor gradients and optimizer state.
The process's resident memory would count the allocator's and the interpreter's slack too. On CUDA
the script prints the tracker's figure beside the counter's, as a check of the CPU method.

The last line is the ratio of the peaks, with checkpointing over without (below 1: memory saved)::

    python kit/benchmarks/memory.py
    python kit/benchmarks/memory.py -- --model.init_args.net.init_args.n_layer=12   # another size
"""

from __future__ import annotations

import gc

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from common import TEXT_EXPERIMENTS, PlainStep, build, cli_args, label, parse, parser, synchronize


def peak_memory(
    experiment: str, corpus: str | None, checkpointing: bool, overrides: list[str]
) -> dict[str, float]:
    """Peak bytes of one training step: by CUDA's counter on a GPU, and always by the tracker."""
    flag = f"--model.init_args.net.init_args.activation_checkpointing={str(checkpointing).lower()}"
    cli = build([*cli_args(experiment, corpus), *overrides, flag])
    datamodule = cli.datamodule
    step = PlainStep(cli.model, cli.trainer, total_steps=cli.trainer.max_steps)
    x, y = (t.to(step.device) for t in next(iter(datamodule.train_dataloader())))
    step(x, y)
    peaks = {}
    if step.device.type == "cuda":
        synchronize(step.device)
        torch.cuda.reset_peak_memory_stats(step.device)
        step(x, y)
        synchronize(step.device)
        peaks["cuda"] = torch.cuda.max_memory_allocated(step.device)
    tracker = MemTracker()
    tracker.track_external(step.net, step.optimizer, x, y)
    with tracker:
        step(x, y)
    snapshot = tracker.get_tracker_snapshot("peak")[step.device]
    peaks["tracker"] = snapshot["Total"]
    peaks["tracker: activations and temporaries"] = sum(
        value for kind, value in snapshot.items() if kind in ("Activation", "Temp")
    )
    return peaks


def main_benchmark(argv: list[str] | None = None) -> None:
    default = "shakespeare_char" if torch.cuda.is_available() else "shakespeare_char_cpu"
    options = parser(__doc__, TEXT_EXPERIMENTS, default=default)
    options.add_argument(
        "overrides",
        nargs="*",
        help="config changes after --, e.g. -- --model.init_args.net.init_args.n_layer=12",
    )
    args = parse(options, argv)
    peaks = {}
    for checkpointing in (False, True):
        peaks[checkpointing] = peak_memory(args.experiment, args.corpus, checkpointing, args.overrides)
        gc.collect()
        torch.cuda.empty_cache()
        shown = ", ".join(f"{name} {value / 2**20:,.1f} MiB" for name, value in peaks[checkpointing].items())
        print(f"{label(args.experiment)}, activation_checkpointing={checkpointing}: peak {shown}")
    measure = "cuda" if "cuda" in peaks[False] else "tracker"
    ratio = peaks[True][measure] / peaks[False][measure]
    print(f"ratio {ratio:.3f} (peak with checkpointing / without, {measure})")


if __name__ == "__main__":
    main_benchmark()
