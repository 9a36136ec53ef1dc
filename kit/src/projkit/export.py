"""``export``: a checkpoint as files that a deployment runs without the template.

A checkpoint is for resuming; a deployment needs the function alone. ``export`` writes, into the
checkpoint's run directory, under ``export/best/`` or ``export/last/`` for ``--ckpt_path best`` or
``last`` (a folder that scripts and pages can name), ``export/<checkpoint file name>/`` for a path:

- ``model.onnx``, for onnxruntime and the other ONNX runtimes (``torch.onnx.export(dynamo=True)``);
- ``model.pt2``, a ``torch.export`` program, which ``torch.export.load`` reads with nothing but torch;
- ``model.json``, what a deployer needs besides: the class names or the vocabulary, the input's
  shape, dtype and range, an image's preprocessing, the checkpoint it came from (its path, deprecated
  for its file name in 1.2.0, and sha256) and the versions that made it, the kit's among them.

Image models take float pixels in [0, 1], ``(N, C, H, W)``, with the data's normalisation inside the
graph (``projkit.deploy.PixelInput``); the language model takes int64 token ids ``(N, T)``, any ``T`` up
to its ``block_size``. Both return logits, for any batch size. Export needs what the checkpoint and
the data module's settings hold, not the data: before anything is kept, every artifact runs on
seeded inputs (``Deployable.examples``; a batch of the test split for a deployable without them), at
batch size 1 and an odd size, and is compared with the checkpoint's own forward: the largest logit
difference and the share of equal predictions are printed, and over the tolerance the export fails
with exit status 1, leaving an earlier export of the checkpoint as it was.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer

import projkit
from projkit.checks.checkpoint import load_checkpoint
from projkit.context import current
from projkit.deploy import EXAMPLES, Deployable
from projkit.errors import DISK_ERRORS, ConfigError, ExportCheckError
from projkit.files import sha256_of
from projkit.protocol import DEPLOYABLE
from projkit.rundir.atomic import restore_folder, swap_folder, write_atomic
from projkit.rundir.ckpt_path import keyword_of
from projkit.rundir.lock import RunLock

FORMATS = ("onnx", "pt2")
EXPORT_DIR = "export"
# fp32 on the same CPU: the artifacts compute what the checkpoint does, up to summation order.
TOLERANCE = 1e-4

Runner = Callable[[torch.Tensor], torch.Tensor]


class ExportingTrainer(Trainer):
    """Lightning's ``Trainer`` with one more command: LightningCLI's subcommands are Trainer methods,
    so ``export`` gets its parser (``--ckpt_path``, ``--formats``) and ``--help`` entry as the
    others do.

    The batch limits are Lightning's own arguments, declared here with ``int`` before ``float``:
    Lightning's annotation lists ``float`` first, so the command line read ``=1`` as 1.0, the whole
    epoch, where Lightning's docs (and the user) mean one batch."""

    def __init__(
        self,
        *,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        **kwargs: Any,
    ) -> None:
        """Lightning's ``Trainer``, its other arguments as it documents them.

        Args:
            limit_train_batches: how much of the training set an epoch takes: an int is a number
                of batches, a float a fraction (``1`` is one batch, ``1.0`` all of them).
            limit_val_batches: likewise for each validation.
            limit_test_batches: likewise for ``test``.
            limit_predict_batches: likewise for ``predict``.
            overfit_batches: train and validate on this many training batches (an int) or this
                fraction of them (a float), to check that the model can fit them.
        """
        super().__init__(
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            overfit_batches=overfit_batches,
            **kwargs,
        )

    def export(
        self,
        model: LightningModule,
        datamodule: LightningDataModule | None = None,
        ckpt_path: str | None = None,
        formats: str = ",".join(FORMATS),
        tolerance: float = TOLERANCE,
    ) -> dict[str, Path]:
        """Export a checkpoint for deployment: ONNX, a torch.export program and model.json.

        Args:
            ckpt_path: ``best``, ``last`` or the path of a ``.ckpt`` file, as for ``test``.
            formats: comma-separated, any of ``onnx`` and ``pt2`` (``model.json`` is always written).
            tolerance: the largest absolute logit difference from the checkpoint that passes the check.
        """
        if ckpt_path is None:
            raise ConfigError("`export` needs --ckpt_path: last, best or the path of a .ckpt file.")
        return export_checkpoint(self, model, datamodule, Path(ckpt_path), parse_formats(formats), tolerance)

    def optimize(
        self,
        model: LightningModule,
        datamodule: LightningDataModule | None = None,
        output: str | None = None,
        chunk_bytes: str = "64MB",
    ) -> dict[str, Any]:
        """Write the data's splits as streaming chunks, for data.init_args.stream_from.

        Args:
            output: a new local folder, or an object-store prefix (s3://BUCKET/PREFIX).
            chunk_bytes: the size a chunk file grows to before the next begins: bytes, or e.g. 64MB.
        """
        if output is None:
            raise ConfigError("`optimize` needs --output: a new folder or s3://BUCKET/PREFIX.")
        from projkit.data.streaming import optimize_datamodule  # LitData: for streaming commands only

        return optimize_datamodule(datamodule, output, chunk_bytes)


def parse_formats(formats: str) -> list[str]:
    """``--formats`` as a list, refused with the choices when it names another format or none."""
    chosen = [name.strip() for name in str(formats).split(",") if name.strip()]
    unknown = [name for name in chosen if name not in FORMATS]
    if unknown or not chosen:
        raise ConfigError(
            f"--formats: {', '.join(map(repr, unknown)) or 'nothing'} is no export format. Choose from "
            f"{', '.join(FORMATS)}, comma-separated (e.g. --formats onnx)."
        )
    return list(dict.fromkeys(chosen))


def export_folder(ckpt_path: Path, keyword: str | None = None) -> Path:
    """``<run>/export/<name>/`` for a checkpoint of a run (``<run>/checkpoints/x.ckpt``),
    ``export/<name>/`` beside any other checkpoint file; ``name`` is the ``--ckpt_path`` keyword that
    found it (``best``, ``last``), else the file's name. Best and last of a run never overwrite each
    other's export, and ``export/best/`` is where the best is whatever its file is called (the
    file's name holds its epoch and step, which no page or script can know). Relative as
    ``ckpt_path`` is: it is printed as the user gave it."""
    ckpt_path = Path(os.path.normpath(ckpt_path))
    in_run = ckpt_path.resolve().parent.name == "checkpoints"
    run = ckpt_path.parent.parent if in_run else ckpt_path.parent
    return run / EXPORT_DIR / (keyword or ckpt_path.stem)


def export_checkpoint(
    trainer: Trainer,
    model: LightningModule,
    datamodule: LightningDataModule | None,
    ckpt_path: Path,
    formats: Sequence[str],
    tolerance: float = TOLERANCE,
) -> dict[str, Path]:
    """Write the checkpoint's artifacts and ``model.json``, check them, print their paths; returns
    them by format (``json`` included)."""
    if datamodule is None:
        raise ConfigError("`export` needs the data (data.class_path): it checks itself on the test split.")
    checkpoint = load_checkpoint(ckpt_path, "--ckpt_path")
    model.load_state_dict(checkpoint["state_dict"])
    model.to("cpu").eval()
    trainer.strategy.connect(model)
    datamodule.trainer = trainer
    deployable = deployable_of(model, datamodule)
    description = dict(deployable.description)
    # What the checkpoint computes on the check's inputs, and what the artifacts are given for them.
    model_inputs = check_inputs(deployable, datamodule)
    artifact_inputs = deployable.inputs(model_inputs)
    program = trace(deployable, artifact_inputs[:2], model)

    folder = export_folder(ckpt_path, keyword_of(ckpt_path))
    if ckpt_path.resolve().parent.name == "checkpoints":  # a run's: no other command writes there meanwhile
        RunLock.acquire(folder.parent.parent)
    folder.parent.mkdir(parents=True, exist_ok=True)
    restore_folder(folder)
    work = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        runners = write_artifacts(program, artifact_inputs[:2], work, formats, description["input"]["name"])
        kind = "seeded" if deployable.examples is not None else "test"
        description["check"] = check(model, runners, model_inputs, artifact_inputs, tolerance, kind)
        description["checkpoint"] = checkpoint_facts(ckpt_path, checkpoint)
        description["deprecated"] = DEPRECATED_FIELDS
        description["versions"] = versions(formats)
        write_atomic(work / "model.json", json.dumps(description, indent=2, ensure_ascii=False) + "\n")
        swap_folder(work, folder)
    except OSError as error:  # named as the export it was for (ONNX's writer names no file)
        if error.errno not in DISK_ERRORS:
            raise
        raise OSError(error.errno, error.strerror or str(error), str(folder)) from error
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):  # export/ itself, when this failed export made it
            folder.parent.rmdir()
    paths = {name: folder / f"model.{name}" for name in [*formats, "json"]}
    for path in paths.values():
        print(f"Exported {path}")
    return paths


def check_inputs(deployable: Deployable, datamodule: LightningDataModule) -> torch.Tensor:
    """The task module's inputs that the check runs: the deployable's seeded examples, which need no
    data; a batch of the test split for a deployable that makes none."""
    if deployable.examples is not None:
        return deployable.examples(EXAMPLES)
    datamodule.setup("test")
    batch = datamodule.on_after_batch_transfer(next(iter(datamodule.test_dataloader())), 0)
    return batch[0] if isinstance(batch, (list, tuple)) else batch


def deployable_of(model: LightningModule, datamodule: LightningDataModule) -> Deployable:
    """What the task module exports (its ``deployable(datamodule)``), refused with the fix when it
    does not say."""
    deployable = DEPLOYABLE.of(model, "export")
    return deployable(datamodule)


def trace(
    deployable: Deployable, example: torch.Tensor, model: LightningModule
) -> torch.export.ExportedProgram:
    """The deployable's network as a ``torch.export`` program with a dynamic batch (and, for token
    ids, a dynamic length up to ``max_length``); a network that cannot be traced is refused with the
    reason."""
    batch = torch.export.Dim("batch", min=1)
    dims: dict[int, Any] = {0: batch}
    if deployable.max_length is not None:
        dims[1] = torch.export.Dim("tokens", min=1, max=deployable.max_length)
    try:
        with torch.no_grad():
            return torch.export.export(deployable.net, (example,), dynamic_shapes=(dims,))
    except Exception as error:
        inner = model.net
        reason = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise ConfigError(
            f"model.init_args.net ({type(inner).__module__}.{type(inner).__qualname__}): torch.export "
            f"cannot trace its forward ({type(error).__name__}: {reason[:300]}). Export needs a forward "
            "whose Python control flow does not depend on tensor values (use torch.where or torch.cond "
            "there); PROJ_DEBUG=1 shows the whole trace."
        ) from error


def write_artifacts(
    program: torch.export.ExportedProgram,
    example: torch.Tensor,
    folder: Path,
    formats: Sequence[str],
    input_name: str,
) -> dict[str, Runner]:
    """Write each format into ``folder`` and load it back as a deployment would: the runners that
    compute logits from an input batch (named ``input_name`` in the ONNX graph), by format."""
    runners: dict[str, Runner] = {}
    if "pt2" in formats:
        # Into memory, then to disk from Python: torch's C++ writer aborts the process on a full disk.
        archive = io.BytesIO()
        torch.export.save(program, archive)
        write_atomic(folder / "model.pt2", archive.getvalue())
        loaded = torch.export.load(folder / "model.pt2").module()

        def run_pt2(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return loaded(x)

        runners["pt2"] = run_pt2
    if "onnx" in formats:
        import onnxruntime

        torch.onnx.export(
            program,
            (example,),
            str(folder / "model.onnx"),
            dynamo=True,
            input_names=[input_name],
            output_names=["logits"],
            external_data=False,
            verbose=False,
        )
        session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])

        def run_onnx(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(session.run(None, {input_name: x.numpy()})[0])

        runners["onnx"] = run_onnx
    return runners


def check(
    model: LightningModule,
    runners: dict[str, Runner],
    model_inputs: torch.Tensor,
    artifact_inputs: torch.Tensor,
    tolerance: float,
    kind: str = "seeded",
) -> dict[str, dict[str, Any]]:
    """Each artifact against the checkpoint on the check's inputs (``kind``: seeded or test), at
    batch size 1 and an odd size (the batch less one sample when it is even), token ids also at an
    odd shorter length: the figures, printed and returned. An artifact over the tolerance raises
    ``ExportCheckError``."""
    odd = len(model_inputs) - (len(model_inputs) % 2 == 0)
    cuts = [(slice(0, 1),), (slice(0, odd),)]
    if not model_inputs.is_floating_point() and model_inputs.shape[1] > 2:
        cuts.append((slice(0, odd), slice(0, model_inputs.shape[1] // 2 | 1)))
    with torch.no_grad():
        expected = [model(model_inputs[cut]).float() for cut in cuts]
    shapes = " and ".join("x".join(map(str, model_inputs[cut].shape)) for cut in cuts)
    figures = {}
    for name, run in runners.items():
        got = [run(artifact_inputs[cut]) for cut in cuts]
        difference = max((g - e).abs().max().item() for g, e in zip(got, expected, strict=True))
        agreement = (got[1].argmax(-1) == expected[1].argmax(-1)).float().mean().item()
        figures[name] = {
            "max_abs_logit_difference": difference,
            "argmax_agreement": agreement,
            "inputs": shapes,
        }
        print(
            f"Check {name}: max |Δlogit| {difference:.2e}, argmax agreement {agreement:.2%} on {kind} inputs "
            f"of shape {shapes} (tolerance {tolerance:g})"
        )
        if not difference <= tolerance:
            raise ExportCheckError(
                f"the exported model.{name} differs from the checkpoint by up to {difference:.3g} in a logit "
                f"(tolerance {tolerance:g}), so it was not kept. Report this with the config; "
                "--formats can leave that format out."
            )
    return figures


# model.json's fields that are going, each with what replaces it; written into model.json itself
# (its `deprecated`), as a reader of the file sees no warning, and listed in the CHANGELOG.
DEPRECATED_FIELDS = {
    "checkpoint.path": (
        "the trainer's absolute path to the checkpoint; 1.2.0 replaces it by checkpoint.file, the "
        "checkpoint's file name (a deployment carries no path of the machine that trained it)"
    ),
}


def checkpoint_facts(path: Path, checkpoint: dict) -> dict[str, Any]:
    """The checkpoint by its path and sha256, as 1.0.0 wrote them (``path`` is deprecated:
    ``DEPRECATED_FIELDS``)."""
    return {
        "path": str(path.resolve()),
        "step": checkpoint.get("global_step"),
        "epoch": checkpoint.get("epoch"),
        "sha256": sha256_of(path),
    }


def versions(formats: Sequence[str]) -> dict[str, str]:
    """The versions that made the artifacts; a project run from its checkout without being installed
    as a distribution has none of its own, and is left out."""
    names = [current().package, *(["onnx", "onnxruntime"] if "onnx" in formats else [])]
    found = {"torch": torch.__version__, "projkit": projkit.__version__}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found
