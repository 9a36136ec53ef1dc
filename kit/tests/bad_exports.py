"""Export folders that steer a server, for test_serve_start.py and the model.json fuzzer of
test_serve.py: a small classifier written as ``export`` writes one (an 8x8 grey image, 10 classes,
as the digits), built with onnx's helpers in milliseconds, which a crafted model.json or model.onnx
then changes; the fuzzer's mutations of a real export's model.json; and ``outcome``, what a server's
start makes of a folder, served or refused, each asserted to be what a user is owed.
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from projkit.preprocessing import Preprocessing
from projkit.serve.model import IMAGE_TASK, ServeError, answerer, load_session, read_export
from projkit.serve.requests import Limits, generation_request, image_request
from projkit.serve.server import json_body

SHAPE = (1, 8, 8)
CLASSES = 10


def classifier_onnx(
    shape: tuple[int, int, int] = SHAPE, classes: int = CLASSES, location: str = "", constant: bool = False
) -> bytes:
    """pixels ``(N, *shape)`` -> Flatten -> MatMul by a seeded weight -> logits ``(N, classes)``, the
    batch of any size. The weight is an initializer, or with ``constant`` a Constant node's tensor;
    with a ``location`` its data is kept in that file (ONNX external data, which onnxruntime looks
    up relative to where the model was loaded from)."""
    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((math.prod(shape), classes)).astype(np.float32), "weight"
    )
    if location:
        weight.ClearField("raw_data")
        weight.data_location = TensorProto.EXTERNAL
        weight.external_data.add(key="location", value=location)
    nodes = [
        helper.make_node("Flatten", ["pixels"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "weight"], ["logits"]),
    ]
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["weight"], value=weight))
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", *shape])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        initializer=[] if constant else [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def classifier_json(shape: tuple[int, int, int] = SHAPE, classes: int = CLASSES) -> dict[str, Any]:
    """model.json as ``export`` writes it for ``classifier_onnx``'s model (what serving reads)."""
    return {
        "task": IMAGE_TASK,
        "input": {"name": "pixels", "shape": ["N", *shape], "dtype": "float32", "range": [0.0, 1.0]},
        "output": {"name": "logits", "shape": ["N", classes]},
        "classes": [str(i) for i in range(classes)],
        "preprocessing": Preprocessing.stretch(shape).describe(),
    }


def write_export(folder: Path, spec: dict[str, Any] | str | None = None, model: bytes | None = None) -> Path:
    """``folder`` (made) holding model.json (``spec``, or its text) and model.onnx (``model``): the
    classifier's by default."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = classifier_json() if spec is None else spec
    (folder / "model.json").write_text(spec if isinstance(spec, str) else json.dumps(spec))
    (folder / "model.onnx").write_bytes(classifier_onnx() if model is None else model)
    return folder


# The fuzzer's values for a field: each type, the extremes, what JSON has not, and Raw texts that
# json.dumps cannot write (a number past a float, an integer past Python's digits, a deep nesting).
class Raw(str):
    """Text put into model.json as it is, not as a JSON string."""


ODD_VALUES = [
    None, True, False, 0, -1, 1, 3, 9, 10**9, 2**63, -(2**63), 0.5, 8.0, 1e308, math.nan, math.inf,
    "", "8", "x", "\ud800", "L", "RGB", "bicubic", "float32", "int64", "N", [], {}, [0], [9, 9],
    [10**9, 10**9], [8, 8, 8], ["N", 3, 8, 8], {"size": [8, 8]}, {"shorter_side": 8, "filter": "box"},
    ["a"] * 3, "ab" * 3000, Raw("1e999"), Raw("-1e999"), Raw("1" * 5000), Raw("[" * 100_000 + "]" * 100_000),
    Raw('{"a": ' * 40 + "1" + "}" * 40),
]  # fmt: skip
SPOILS = [
    lambda text: text[: len(text) // 2],
    lambda text: "\ufeff" + text,
    lambda text: text.replace('"', "\udcff", 1),
    lambda text: "[" + text + "]",
    lambda text: "",
    lambda text: text[:-1] + ', "task": "image classification"}',
]


def nudged(value: Any) -> list[Any]:
    """Values near a field's own: one off, twice, of another type, shorter or longer."""
    if isinstance(value, bool) or value is None:
        return [not value]
    if isinstance(value, (int, float)):
        return [value + 1, value - 1, value * 2, -value, float(value), str(value)]
    if isinstance(value, str):
        return [value + "x", value[:-1], value.upper(), value * 2]
    if isinstance(value, list):
        return [value[:-1], value + value[-1:], value[::-1], [value]]
    return [list(value.values()), {**value, "unknown": 1}]


def paths(document: Any, at: tuple = ()) -> list[tuple]:
    """Every key path of a JSON document, parents before children."""
    found = [at] if at else []
    if not isinstance(document, (dict, list)):
        return found
    items = document.items() if isinstance(document, dict) else enumerate(document)
    for key, value in items:
        found += paths(value, (*at, key))
    return found


@st.composite
def mutated(draw: st.DrawFn, spec: dict[str, Any]) -> bytes:
    """model.json's bytes with one change: a field replaced, removed or renamed, or its text spoilt."""
    spec = json.loads(json.dumps(spec))
    path = draw(st.sampled_from(paths(spec)))
    *parents, key = path
    parent = spec
    for part in parents:
        parent = parent[part]
    action = draw(st.sampled_from(["replace", "replace", "nudge", "remove", "rename", "spoil"]))
    raw = None
    if action in ("replace", "nudge"):
        value = draw(st.sampled_from(ODD_VALUES if action == "replace" else nudged(parent[key])))
        raw, parent[key] = (value, "\x00raw\x00") if isinstance(value, Raw) else (None, value)
    elif action == "remove":
        del parent[key]
    elif action == "rename" and isinstance(parent, dict):
        parent[str(key) + draw(st.sampled_from(["_", " ", "\u200b"]))] = parent.pop(key)
    text = json.dumps(spec)
    text = text.replace('"\\u0000raw\\u0000"', raw) if raw is not None else text
    if action == "spoil":
        text = draw(st.sampled_from(SPOILS))(text)
    return text.encode("utf-8", "surrogatepass")


def png(width: int, height: int) -> bytes:
    pixels = np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="PNG")
    return out.getvalue()


LIMITS = Limits(max_body_bytes=10 * 2**20, max_pixels=40_000_000, max_new_tokens=1000)


def outcome(folder: Path) -> str:
    """What a server's start makes of ``folder``: "refused" when serve's checks refuse it (a
    ServeError: one line naming the file, which serve prints with exit status 2), "served" when they
    pass and it answers (``answered``). Any other exception is what a user would have met as a
    traceback at start or a 5xx: it fails the caller."""
    try:
        spec = read_export(folder)
        session = load_session(folder)
    except ServeError as error:
        said = str(error)
        assert "\n" not in said and said.startswith(str(folder)) and len(said) < 1000, said
        return "refused"
    answered(session, spec)
    return "served"


def answered(session: Any, spec: dict[str, Any]) -> None:
    """A request prepared, run and answered by the server's own code (a language model's on its
    full context), and /info's body, rendered as JSON as the server renders them: an exception
    here is a request's 5xx."""
    if spec["task"] == IMAGE_TASK:
        pre = Preprocessing.from_description(spec["preprocessing"])
        asked = image_request(png(5, 13), "image/png", [("top_k", "3")], pre, len(spec["classes"]), LIMITS)
    else:
        context = spec["input"]["max_T"]
        prompt = (spec["vocab"] * context)[:context]
        body = json.dumps({"prompt": prompt, "max_new_tokens": 2, "temperature": 0}).encode()
        asked = generation_request(body, "application/json", spec["vocab"], LIMITS)
    (answer,) = answerer(session, spec).answers([asked])
    for body in (answer, {"model": spec, "server": {"pid": os.getpid()}}):
        json_body(body)  # as /predict and /info render it: it raises where they fail


def fuzz_starts(export: Path, folder: Path, examples: int) -> collections.Counter:
    """``examples`` mutations of ``export``'s model.json, each started beside its model.onnx in
    ``folder`` (``outcome``, which fails on a traceback or a 5xx; a start may take 10 s at most):
    how many were served and how many refused."""
    shutil.copy(export / "model.onnx", folder)
    seen: collections.Counter = collections.Counter()
    quiet = {"deadline": None, "database": None, "suppress_health_check": list(HealthCheck)}

    @settings(max_examples=examples, derandomize=True, **quiet)
    @given(mutated(json.loads((export / "model.json").read_text())))
    def start(model_json: bytes) -> None:
        (folder / "model.json").write_bytes(model_json)
        began = time.monotonic()
        seen[outcome(folder)] += 1
        assert time.monotonic() - began < 10, "a start took over 10 s"

    start()
    return seen
