"""An export folder checked whole before a server takes requests from it: ``model.json`` against the
schema of what serving reads, and ``model.onnx`` against ``model.json``.

Both files are data that may come from anyone (kit/docs/export.md), so neither may steer the
server: ``model.json``'s fields are checked for their types and bounds (a resize that no memory
holds, a nesting that no parser survives, a number JSON has not), and ``model.onnx``'s declared
input and output must be what ``model.json`` says (its input's name, dtype and shape, one logit per
class or character). The model's bytes go to onnxruntime from memory, where a tensor kept in
another file would be looked up from the server's working directory: the kit's export writes every
weight inside ``model.onnx`` (``external_data=False``: no export of it has such a tensor), so a
model that names another file is refused, whatever the file. A bad folder is a ``ServeError``:
one line, naming the file and the field, printed by ``serve`` with exit status 2.
"""

from __future__ import annotations

import json
import os
import reprlib
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from projkit.preprocessing import FILTERS, MODES, Preprocessing

IMAGE_TASK = "image classification"
TEXT_TASK = "next-token prediction"
FIX = "export the checkpoint again (model.json and model.onnx come from one export)"
# Bounds that no export of a working model reaches: a resize's or crop's side, the classes or the
# characters a model scores, a language model's context (the server runs it once at start), the
# nesting of model.json (the kit writes 4 levels) and the two files' sizes.
MAX_SIDE = 8192
MAX_CLASSES = 100_000
MAX_CONTEXT = 65_536
MAX_DEPTH = 32
MAX_JSON_BYTES = 32 * 2**20
MAX_ONNX_BYTES = 2 * 2**30  # protobuf's own limit: a larger model.onnx needs external data
MISSING = object()
Test = Callable[[Any], bool]


class ServeError(ValueError):
    """A server that cannot start as asked: printed as one line, exit status 2."""


def whole(low: int, high: int) -> Test:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def optional(test: Test) -> Test:
    return lambda value: value is MISSING or test(value)


def one_of(choices: tuple[str, ...]) -> Test:
    return lambda value: isinstance(value, str) and value in choices


def is_object(value: Any) -> bool:
    return isinstance(value, dict)


def sides(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(map(whole(1, MAX_SIDE), value))


def image_shape(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 4
        and isinstance(value[0], str)
        and whole(1, 3)(value[1])
        and value[1] != 2
        and sides(value[2:])
    )


def class_names(value: Any) -> bool:
    return isinstance(value, list) and 0 < len(value) <= MAX_CLASSES and all(map(is_text, value))


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def crop(value: Any) -> bool:
    return value is None or sides(value)


def vocabulary(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= MAX_CLASSES and len(set(value)) == len(value)


SIDES = f"whole numbers from 1 to {MAX_SIDE}"
# What serving reads of model.json, in order (a field's parent is checked before it): the field,
# its test, and what to give. Other fields (checkpoint, versions, ...) are only shown by /info.
COMMON = [
    ("task", one_of((IMAGE_TASK, TEXT_TASK)), f"{IMAGE_TASK!r} or {TEXT_TASK!r}"),
    ("input", is_object, "an object with the model's input: name, shape, dtype"),
    ("input.name", lambda v: isinstance(v, str) and 0 < len(v) <= 1000, "the ONNX model's input name"),
]
FIELDS = {
    IMAGE_TASK: [
        ("input.shape", image_shape, f'["N", channels (1 or 3), height, width], sides {SIDES}'),
        ("input.dtype", optional(one_of(("float32",))), '"float32"'),
        ("classes", class_names, f"a list of 1 to {MAX_CLASSES} class names (strings)"),
        ("preprocessing", is_object, "an object: mode, resize, crop, levels"),
        ("preprocessing.mode", one_of(MODES), " or ".join(map(repr, MODES))),
        ("preprocessing.resize", is_object, 'an object: "size" or "shorter_side", and "filter"'),
        ("preprocessing.resize.size", optional(sides), f"[width, height], {SIDES}"),
        ("preprocessing.resize.shorter_side", optional(whole(1, MAX_SIDE)), f"one of the {SIDES}"),
        ("preprocessing.resize.filter", one_of(FILTERS), f"one of {', '.join(FILTERS)}"),
        ("preprocessing.crop", optional(crop), f"null or [width, height] ({SIDES})"),
        ("preprocessing.levels", whole(1, 255), "a whole number from 1 to 255"),
    ],
    TEXT_TASK: [
        ("input.max_T", whole(1, MAX_CONTEXT), f"the model's context, from 1 to {MAX_CONTEXT} tokens"),
        ("input.dtype", optional(one_of(("int64",))), '"int64"'),
        ("vocab", vocabulary, f"a string of 1 to {MAX_CLASSES} different characters"),
    ],
}


def read_export(folder: Path) -> dict[str, Any]:
    """``folder/model.json``, read and checked against what serving reads of it; ``model.onnx``
    must be there beside it (``check_model`` checks it, as ``load_session`` reads it)."""
    fix = "give the folder `export` wrote (it prints it: <run>/export/<checkpoint>/) or run export again"
    if not folder.is_dir():
        raise ServeError(f"{folder}: no such export folder; {fix}.")
    for name in ("model.json", "model.onnx"):
        if not (folder / name).exists() or (folder / name).is_dir():
            raise ServeError(f"{folder}: no {name} in it, so it is no complete export; {fix}.")
    path = folder / "model.json"
    spec = parsed(read_bounded(path, MAX_JSON_BYTES), path)
    check_fields(spec, COMMON, path)
    check_fields(spec, FIELDS[spec["task"]], path)
    if spec["task"] == IMAGE_TASK:
        check_preprocessing(spec, path)
    return spec


def check_fields(spec: dict[str, Any], fields: list[tuple[str, Test, str]], path: Path) -> None:
    for field, test, what in fields:
        value = found(spec, field)
        if not test(value):
            said = "is missing" if value is MISSING else reprlib.repr(value)
            raise ServeError(f"{path}: {field} {said}: give {what}; {FIX}.")


def found(spec: dict[str, Any], field: str) -> Any:
    """The value at a dotted ``field`` of ``spec`` (its parents are objects), or ``MISSING``."""
    *parents, key = field.split(".")
    for parent in parents:
        spec = spec[parent]
    return spec.get(key, MISSING)


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, refused when it is over ``limit`` or is no file (a device, such as
    /dev/zero, would be read for ever); a pipe is read as it comes."""
    try:
        kind = os.stat(path).st_mode
        if not (stat.S_ISREG(kind) or stat.S_ISFIFO(kind)):
            raise ServeError(f"{path} is no file (a device or a socket): {FIX}.")
        chunks, size = [], 0
        with open(path, "rb") as file:
            while chunk := file.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise ServeError(f"{path} is over {limit} bytes, more than any export writes: {FIX}.")
                chunks.append(chunk)
    except OSError as error:
        raise ServeError(f"{path} cannot be read ({error.strerror}): {FIX}.") from None
    return b"".join(chunks)


def refuse_constant(text: str) -> float:
    raise ValueError(f"{text} is no JSON number")


def finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:20]} is too large for a number")
    return number


def parsed(data: bytes, path: Path) -> dict[str, Any]:
    """``model.json``'s object, refused when it is no JSON, holds what JSON has not (NaN,
    Infinity, a number past a float, text that is no UTF-8) or nests deeper than ``MAX_DEPTH``."""
    try:
        spec = json.loads(data.decode("utf-8"), parse_constant=refuse_constant, parse_float=finite)
    except RecursionError:
        raise ServeError(f"{path} nests deeper than JSON can be read: {FIX}.") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError among them
        said = " ".join(str(error).split())[:200]
        raise ServeError(f"{path} is no valid JSON ({said}); {FIX}.") from None
    if not isinstance(spec, dict):
        raise ServeError(f"{path} holds a JSON {type(spec).__name__}, not an object: {FIX}.")
    for item, depth in walk(spec):
        if depth > MAX_DEPTH:
            raise ServeError(f"{path} nests over {MAX_DEPTH} levels deep (an export, 4): {FIX}.")
        if isinstance(item, str) and not encodable(item):
            raise ServeError(f"{path}: the text {reprlib.repr(item)} holds a lone surrogate: {FIX}.")
    return spec


def encodable(text: str) -> bool:
    """Whether ``text`` can be sent as UTF-8: JSON's escapes can spell a lone surrogate, which no
    answer can then hold (``/info`` and ``/predict`` would fail on it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def walk(document: Any) -> Iterator[tuple[Any, int]]:
    """Every value, key and string of a JSON document with its depth, without recursion."""
    stack = [(document, 1)]
    while stack:
        item, depth = stack.pop()
        yield item, depth
        if isinstance(item, dict):
            stack.extend((part, depth + 1) for pair in item.items() for part in pair)
        elif isinstance(item, list):
            stack.extend((part, depth + 1) for part in item)


def check_preprocessing(spec: dict[str, Any], path: Path) -> None:
    """The image's way in agrees with itself and with ``input.shape``: one resize, a fixed size
    out, as many channels as the mode has."""
    pre, shape = spec["preprocessing"], spec["input"]["shape"]
    resize = pre["resize"]
    if ("size" in resize) == ("shorter_side" in resize):
        raise ServeError(f"{path}: preprocessing.resize needs exactly one of size and shorter_side; {FIX}.")
    if "size" not in resize and pre.get("crop") is None:
        raise ServeError(
            f"{path}: preprocessing resizes the shorter side without a crop, so images come out in "
            f"many sizes and the model takes one: give preprocessing.crop [width, height]; {FIX}."
        )
    preprocessing = Preprocessing.from_description(pre)
    channels = 1 if preprocessing.mode == "L" else 3
    if [channels, *preprocessing.output_size[::-1]] != shape[1:]:
        width, height = preprocessing.output_size
        raise ServeError(
            f"{path}: preprocessing gives {width}x{height} (width x height) {preprocessing.mode} images, "
            f"{channels} channel(s), but input.shape {shape} takes {shape[3]}x{shape[2]}, {shape[1]} "
            f"channel(s); {FIX}."
        )


# ONNX's element types that serving meets: the input's (by task), a float for the logits.
TYPES = {1: "float32", 7: "int64", 10: "float16", 11: "float64"}
INPUT_TYPE = {IMAGE_TASK: 1, TEXT_TASK: 7}
LOGIT_TYPES = (1, 10, 11)


def check_model(data: bytes, spec: dict[str, Any], path: Path) -> None:
    """``model.onnx``'s bytes, refused unless they are an ONNX model that keeps every tensor inside
    itself and declares the input and the output that ``spec`` (its model.json) says."""
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as error:  # protobuf's backends raise their own classes for a damaged file
        said = " ".join(str(error).split())[:200]
        raise ServeError(f"{path} is no ONNX model ({type(error).__name__}: {said}); {FIX}.") from None
    for name, tensor in stored_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
            place = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
            raise ServeError(
                f"{path}: its tensor {name!r} keeps its data in another file ({place!r}), which serve "
                f"never reads: the kit's export keeps every weight inside model.onnx; {FIX}."
            )
    check_declared(model, spec, path)


def stored_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """Every tensor a model holds, with its name: its graphs' initializers (sparse ones too) and
    its nodes' tensor attributes, in subgraphs, functions and training graphs as well."""
    trained = [graph for info in model.training_info for graph in (info.initialization, info.algorithm)]
    graphs = [model.graph, *trained]
    nodes = [node for function in model.functions for node in function.node]
    while graphs or nodes:
        if graphs:
            graph = graphs.pop()
            yield from ((tensor.name, tensor) for tensor in graph.initializer)
            yield from sparse_parts(graph.sparse_initializer)
            nodes.extend(graph.node)
            continue
        for attribute in nodes.pop().attribute:
            tensors = [*attribute.tensors, *single(attribute, "t")]
            yield from ((tensor.name or attribute.name, tensor) for tensor in tensors)
            yield from sparse_parts([*attribute.sparse_tensors, *single(attribute, "sparse_tensor")])
            graphs.extend([*attribute.graphs, *single(attribute, "g")])


def single(message: Any, field: str) -> list[Any]:
    return [getattr(message, field)] if message.HasField(field) else []


def sparse_parts(tensors: Any) -> Iterator[tuple[str, Any]]:
    for sparse in tensors:
        yield from ((sparse.values.name, part) for part in (sparse.values, sparse.indices))


def check_declared(model: Any, spec: dict[str, Any], path: Path) -> None:
    """The model's one input is ``input.name`` with its dtype and shape, and its first output the
    logits of ``classes`` or of ``vocab``'s characters; a batch (and a length) of any size."""
    image = spec["task"] == IMAGE_TASK
    name = spec["input"]["name"]
    stored = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in stored]
    if [value.name for value in inputs] != [name] or not model.graph.output:
        raise ServeError(
            f"{path} takes the input(s) {[value.name for value in inputs]} and gives "
            f"{len(model.graph.output)} output(s), but model.json's input.name is {name!r}: serve feeds "
            f"that one input and reads the first output; {FIX}."
        )
    wanted = [None, *spec["input"]["shape"][1:]] if image else [None, None]
    got = declared(inputs[0])
    if got != (INPUT_TYPE[spec["task"]], wanted):
        raise ServeError(
            f"{path}: its input {name!r} is {shown(*got)}, but model.json says "
            f"{shown(INPUT_TYPE[spec['task']], wanted)} (N: any batch); {FIX}."
        )
    count = len(spec["classes"]) if image else len(spec["vocab"])
    wanted = [None, count] if image else [None, None, count]
    got = declared(model.graph.output[0])
    if got[0] not in LOGIT_TYPES or got[1] != wanted:
        what = f"{count} classes" if image else f"a vocab of {count} characters"
        raise ServeError(
            f"{path}: its output {model.graph.output[0].name!r} is {shown(*got)}, but model.json has "
            f"{what}, one logit each: {shown(1, wanted)} (N: any batch); {FIX}."
        )


def declared(value: Any) -> tuple[int, list[int | None] | None]:
    """An input's or output's element type and dims as its model declares them: a dim of any size
    is None; no dims at all when it declares no shape."""
    if not value.type.HasField("tensor_type"):
        return 0, None
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return tensor.elem_type, None
    dims = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor.shape.dim]
    return tensor.elem_type, dims


def shown(element: int, dims: list[int | None] | None) -> str:
    """``float32 [N, 1, 8, 8]``: a dim of any size as N (the batch), T (a length) or ?."""
    kind = TYPES.get(element, f"element type {element}")
    if dims is None:
        return f"{kind} with no declared shape"
    names = [str(dim) if dim is not None else "NT"[i] if i < 2 else "?" for i, dim in enumerate(dims)]
    return f"{kind} [{', '.join(names)}]"


def probe(session: Any, spec: dict[str, Any], path: Path) -> None:
    """The model run once on two inputs of the largest shape serving gives it (a language model's
    whole context), refused unless it answers each with finite logits of the declared shape: a
    model that fails or answers otherwise fails at start, not on every request."""
    import numpy as np

    image = spec["task"] == IMAGE_TASK
    if image:
        inputs = np.zeros((2, *spec["input"]["shape"][1:]), np.float32)
        wanted = (2, len(spec["classes"]))
    else:
        inputs = np.zeros((2, spec["input"]["max_T"]), np.int64)
        wanted = (2, spec["input"]["max_T"], len(spec["vocab"]))
    size = "x".join(map(str, inputs.shape))
    try:
        logits = np.asarray(session.run(None, {spec["input"]["name"]: inputs})[0])
    except Exception as error:  # onnxruntime's own exception classes
        said = " ".join(str(error).split())[:200]
        field = "input.shape" if image else "input.max_T (the model's context)"
        raise ServeError(
            f"{path} fails on a {size} input, the largest that model.json's {field} lets in "
            f"({type(error).__name__}: {said}); {FIX}."
        ) from None
    if logits.shape != wanted or not np.isfinite(logits).all():
        raise ServeError(
            f"{path} answers a {size} input with logits of shape {logits.shape} "
            f"({'all' if np.isfinite(logits).all() else 'not all'} finite), where serving needs "
            f"finite ones of shape {wanted}; {FIX}."
        )
