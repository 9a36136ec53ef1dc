"""``export`` as a project's tests try it on their own models: a tiny fit exported, the artifacts run
as a deployment runs them (onnxruntime, ``torch.export.load``), and their answers compared with the
checkpoint's at several batch sizes, so a model whose export computes something else fails its tests
rather than its deployment."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from projkit.context import current
from projkit.testing.runs import TINY_FIT

# TINY_FIT's two batches, untested: a checkpoint to export, in seconds.
UNTESTED = ("--test_after_fit=false",)
BATCH_SIZES = (1, 7)
FILES = ["model.onnx", "model.pt2", "model.json"]


def fit_and_export(
    *args: str, export: tuple[str, ...] = (), run: Callable[[list[str]], Any] | None = None
) -> tuple[Path, Path, str]:
    """A tiny ``fit`` with the arguments ``args``, then ``export`` of its last checkpoint with ``args``
    and ``export``: the checkpoint, its export folder and what export printed."""
    run = run or current().main
    fitted = run(["fit", *args, *TINY_FIT, *UNTESTED])
    ckpt = (Path(fitted.trainer.checkpoint_callbacks[-1].dirpath) / "last.ckpt").resolve()
    folder, printed = export_of(ckpt, *args, *export, run=run)
    return ckpt, folder, printed


def export_of(ckpt: Path, *args: str, run: Callable[[list[str]], Any] | None = None) -> tuple[Path, str]:
    """``export --ckpt_path ckpt`` with ``args`` in this process (``run``: the command line to run it
    with, the current project's by default): the folder it wrote, checked to hold the three files
    beside the checkpoint's run (``<run>/export/<checkpoint>/``), and what it printed."""
    out = io.StringIO()
    with redirect_stdout(out):
        (run or current().main)(["export", *args, f"--ckpt_path={ckpt}"])
    printed = out.getvalue()
    paths = re.findall(r"^Exported (.+)$", printed, re.M)
    assert [Path(p).name for p in paths] == FILES, printed
    folder = Path(paths[0]).parent
    expected = ckpt.resolve().parent.parent if ckpt.resolve().parent.name == "checkpoints" else ckpt.parent
    assert folder == expected.resolve() / "export" / ckpt.stem
    return folder, printed


def artifacts(folder: Path) -> dict[str, Callable[[Any], Any]]:
    """The exported model as onnxruntime and ``torch.export.load`` run it: logits for an input."""
    import onnxruntime
    import torch

    session = onnxruntime.InferenceSession(str(folder / "model.onnx"))
    program = torch.export.load(folder / "model.pt2").module()
    name = session.get_inputs()[0].name
    return {
        "onnx": lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0]),
        "pt2": lambda x: program(x).detach(),
    }


def assert_same_as_checkpoint(
    folder: Path,
    reference: Callable[[Any], Any],
    inputs: Any,
    model_inputs: Any,
    batch_sizes: Sequence[int] = BATCH_SIZES,
) -> None:
    """Each artifact of ``folder`` on ``inputs`` (what a deployment gives it) answers as the
    checkpoint's module ``reference`` on ``model_inputs`` (the same, as the model takes them): the
    same shape, logits within 1e-4 and the same argmax, at each batch size."""
    import torch

    for name, run in artifacts(folder).items():
        for size in batch_sizes:
            with torch.no_grad():
                expected = reference(model_inputs[:size])
            got = run(inputs[:size])
            assert got.shape == expected.shape, name
            assert (got - expected).abs().max().item() <= 1e-4, (name, size)
            assert torch.equal(got.argmax(-1), expected.argmax(-1)), (name, size)


def variant(
    ckpt: Path, path: Path, net: dict | None = None, state: dict | None = None, **hparams: Any
) -> Path:
    """A copy of checkpoint ``ckpt`` at ``path`` with another network (its config and weights, the
    keys ``fit`` would save) or other hyperparameters: a checkpoint of a model the test need not
    train (a large network's, fresh weights), for its export."""
    import torch

    checkpoint = torch.load(ckpt, weights_only=True)
    if net is not None:
        hparams["net"] = net
    if state is not None:
        kept = {key: value for key, value in checkpoint["state_dict"].items() if not key.startswith("net.")}
        checkpoint["state_dict"] = {**kept, **{f"net.{key}": value for key, value in state.items()}}
    checkpoint["hyper_parameters"].update(hparams)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path
