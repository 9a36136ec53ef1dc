"""An export folder as ``serve`` runs it: checked whole (``folder``), ``model.onnx`` in
onnxruntime, and the two kinds of answer (an image's classes, a prompt's continuation) computed from
the logits as ``predict`` computes them. The benchmark calls the same classes in-process, without
HTTP, for its baseline. numpy, onnx (to read the model's declarations) and onnxruntime only: no
torch in the server's processes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from projkit.serve.folder import (
    IMAGE_TASK,
    MAX_ONNX_BYTES,
    ServeError,
    check_model,
    probe,
    read_bounded,
    read_export,
)


def load_session(folder: Path, device: str = "cpu", threads: int | None = None, spinning: bool = True) -> Any:
    """``model.onnx`` in an onnxruntime session on ``device`` ("cpu", "cuda:<i>"), once the export
    is checked whole (``projkit.serve.folder``: model.json, then model.onnx against it) and the
    model has run once on the largest input serving gives it; refused in one line otherwise. The
    file is read once, here, and those bytes are what is checked and handed over, so a model
    arriving slowly (a network disk, a pipe) is read as it comes. Without ``spinning`` its threads
    sleep as soon as a call ends instead of spinning for the next one: a server's event loop needs
    those cores to read the next requests (on 2 cores, spinning halved the requests/s served)."""
    import onnxruntime

    spec = read_export(folder)
    path = folder / "model.onnx"
    data = read_bounded(path, MAX_ONNX_BYTES)
    check_model(data, spec, path)
    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only: onnxruntime's warnings name graph internals
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    try:
        session = onnxruntime.InferenceSession(data, options, providers=providers)
    except Exception as error:  # onnxruntime raises its own exception classes for a bad file
        said = " ".join(str(error).split())[:200]
        raise ServeError(
            f"{path}: onnxruntime cannot load it ({type(error).__name__}: {said}); export the checkpoint "
            "again."
        ) from None
    probe(session, spec, path)
    return session


def cpu_threads(workers: int) -> int:
    """onnxruntime threads for each of ``workers`` CPU workers: the cores shared out, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, workers))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class Classifier:
    """An image classifier's answers: the class, its probability and the ``top_k`` most likely."""

    def __init__(self, session: Any, spec: dict[str, Any]) -> None:
        self.session = session
        self.input_name = spec["input"]["name"]
        self.classes = list(spec["classes"])

    def probabilities(self, pixels: np.ndarray) -> np.ndarray:
        """Each class's probability for a batch of pixels (N, C, H, W)."""
        return softmax(self.session.run(None, {self.input_name: pixels})[0])

    def answers(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One answer per request (``pixels`` and ``top_k``), the images run as one batch."""
        probs = self.probabilities(np.stack([request["pixels"] for request in requests]))
        return [self.answer(p, request["top_k"]) for p, request in zip(probs, requests, strict=True)]

    def answer(self, probs: np.ndarray, top_k: int) -> dict[str, Any]:
        order = np.argsort(-probs, kind="stable")[: max(1, top_k)]
        best = int(probs.argmax())
        return {
            "class": self.classes[best],
            "probability": float(probs[best]),
            "top_k": [{"class": self.classes[i], "probability": float(probs[i])} for i in order],
        }


class Generator:
    """A character model's continuations, token by token, as ``predict`` draws them: the most likely
    character at temperature 0; otherwise sampled from the softmax of logits / temperature, among
    the ``top_k`` most likely only when given, by numpy's generator seeded with ``seed``."""

    def __init__(self, session: Any, spec: dict[str, Any]) -> None:
        self.session = session
        self.input_name = spec["input"]["name"]
        self.vocab = spec["vocab"]
        self.context = int(spec["input"]["max_T"])

    def answers(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One continuation per request (its ``tokens`` and settings), each generated in turn."""
        return [self.answer(**request) for request in requests]

    def answer(
        self, tokens: list[int], max_new_tokens: int, temperature: float, top_k: int | None, seed: int | None
    ) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        tokens = list(tokens)
        prompt_length = len(tokens)
        for _ in range(max_new_tokens):
            window = np.array([tokens[-self.context :]], dtype=np.int64)
            logits = self.session.run(None, {self.input_name: window})[0][0, -1].astype(np.float64)
            tokens.append(self.next_token(logits, temperature, top_k, rng))
        text = "".join(self.vocab[t] for t in tokens)
        return {"text": text, "completion": text[prompt_length:], "tokens": max_new_tokens}

    @staticmethod
    def next_token(
        logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator
    ) -> int:
        """The next token for ``logits``. The largest logit is subtracted before the division by the
        temperature, as docs/export.md's example does: the quotients are then at most 0, so none
        overflows (the requests' checks keep the temperature in projkit.sampling's range besides).
        A model whose logits are not finite fails the request that met them, not a wrong token."""
        if not np.isfinite(logits).all():
            raise ValueError("the model's logits for this prompt are not finite (NaN or infinite)")
        if temperature == 0:
            return int(logits.argmax())
        scaled = (logits - logits.max()) / temperature
        if top_k is not None and top_k < len(scaled):
            kth = np.partition(scaled, -top_k)[-top_k]
            scaled = np.where(scaled < kth, -math.inf, scaled)
        probs = np.exp(scaled)
        return int(rng.choice(len(probs), p=probs / probs.sum()))


def answerer(session: Any, spec: dict[str, Any]) -> Classifier | Generator:
    """The answering object for an export's task."""
    return Classifier(session, spec) if spec["task"] == IMAGE_TASK else Generator(session, spec)
