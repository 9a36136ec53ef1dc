"""A request's body as the model's input, or the one line that says what is wrong with it.

Run in the server's HTTP processes, before a request is queued for the model: a bad request is
answered there (a 4xx and its line) and never reaches a batch, where it would fail the others. An
image is decoded and prepared by ``model.json``'s preprocessing (``projkit.preprocessing``, the code
``predict`` runs), after its header is checked against the pixel limit, so that a small file that
decodes to a huge image (a decompression bomb) is refused before it is decoded.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from projkit.preprocessing import Preprocessing

IMAGE_TYPES = ("image/", "application/octet-stream")
GENERATION_KEYS = ("prompt", "max_new_tokens", "temperature", "top_k", "seed")
DEFAULT_TOP_K = 5
DEFAULT_NEW_TOKENS = 100


class BadRequest(Exception):
    """A request the server refuses: its HTTP ``status`` and the one line that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    """What one request may ask: its body's bytes, an image's pixels, the tokens to generate."""

    max_body_bytes: int
    max_pixels: int
    max_new_tokens: int


def image_request(
    body: bytes, content_type: str, query: dict[str, str], pre: Preprocessing, classes: int, limits: Limits
) -> dict[str, Any]:
    """An image file's request: its pixels, by the export's preprocessing, and the ``top_k`` asked
    for in the query (``?top_k=3``)."""
    kind = content_type.split(";")[0].strip().lower()
    if not kind.startswith(IMAGE_TYPES):
        raise BadRequest(
            415,
            f"Content-Type {kind or 'none'!r}: send the image file itself as the body, with Content-Type "
            "image/png, image/jpeg, ... or application/octet-stream (curl --data-binary @FILE).",
        )
    unknown = sorted(set(query) - {"top_k"})
    if unknown:
        raise BadRequest(400, f"unknown query parameter(s) {', '.join(unknown)}: only top_k is taken.")
    top_k = query_number(query.get("top_k", str(DEFAULT_TOP_K)), "top_k")
    top_k = whole_number(top_k, "top_k", 1, classes, clip=True)
    if not body:
        raise BadRequest(400, "the body is empty: send an image file (PNG, JPEG, ...) as the request body.")
    return {"pixels": decoded_pixels(body, pre, limits.max_pixels), "top_k": top_k}


def decoded_pixels(body: bytes, pre: Preprocessing, max_pixels: int) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit decides
            image = Image.open(io.BytesIO(body))
    except UnidentifiedImageError:
        raise BadRequest(
            400, f"the body is no image that Pillow reads (it begins {body[:16]!r}): send an image file."
        ) from None
    except Image.DecompressionBombError:
        raise BadRequest(
            413, f"the image has over {max_pixels} pixels (--max_pixels): send a smaller one."
        ) from None
    width, height = image.size
    if width * height > max_pixels:
        raise BadRequest(
            413,
            f"the image is {width}x{height}, {width * height} pixels, over this server's --max_pixels "
            f"{max_pixels}: send a smaller one.",
        )
    try:
        image.load()
        return pre.pixels(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        said = " ".join(str(error).split())[:120]
        raise BadRequest(
            400, f"the {image.format or 'image'} file is truncated or damaged ({said}): send the whole file."
        ) from None


def generation_request(body: bytes, content_type: str, vocab: str, limits: Limits) -> dict[str, Any]:
    """A JSON object ``{"prompt", "max_new_tokens", "temperature", "top_k", "seed"}`` (all but the
    prompt optional) as token ids and checked settings."""
    kind = content_type.split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest(
            415,
            f"Content-Type {kind or 'none'!r}: send a JSON object with Content-Type application/json, "
            'e.g. {"prompt": "ROMEO:", "max_new_tokens": 100}.',
        )
    if not body:
        raise BadRequest(400, 'the body is empty: send a JSON object such as {"prompt": "ROMEO:"}.')
    try:
        asked = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadRequest(400, f"the body is no valid JSON ({error}): send a JSON object.") from None
    except RecursionError:
        raise BadRequest(400, "the body's JSON nests too deeply: send a flat JSON object.") from None
    if not isinstance(asked, dict):
        raise BadRequest(
            400, f'the body is a JSON {type(asked).__name__}, not an object such as {{"prompt": "ROMEO:"}}.'
        )
    if unknown := sorted(set(asked) - set(GENERATION_KEYS)):
        raise BadRequest(
            400, f"unknown field(s) {', '.join(unknown)}: the fields are {', '.join(GENERATION_KEYS)}."
        )
    return {
        "tokens": prompt_tokens(asked.get("prompt"), vocab),
        "max_new_tokens": whole_number(
            asked.get("max_new_tokens", min(DEFAULT_NEW_TOKENS, limits.max_new_tokens)),
            "max_new_tokens",
            0,
            limits.max_new_tokens,
            flag="--max_new_tokens",
        ),
        "temperature": temperature(asked.get("temperature", 1.0)),
        "top_k": None if asked.get("top_k") is None else whole_number(asked["top_k"], "top_k", 1, None),
        "seed": None if asked.get("seed") is None else whole_number(asked["seed"], "seed", 0, 2**63 - 1),
    }


def prompt_tokens(prompt: Any, vocab: str) -> list[int]:
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest(400, 'prompt: give a non-empty string to continue, e.g. "ROMEO:".')
    index = {character: i for i, character in enumerate(vocab)}
    if missing := sorted(set(prompt) - set(index)):
        shown = ", ".join(repr(c) for c in missing[:10])
        raise BadRequest(
            400,
            f"prompt: characters {shown} are not in the model's vocabulary of {len(vocab)} "
            f"characters ({vocab[:60]!r}...); use only those.",
        )
    return [index[character] for character in prompt]


def query_number(text: str, name: str) -> int:
    """A query parameter's text as a whole number."""
    try:
        return int(text)
    except ValueError:
        raise BadRequest(400, f"{name} {text!r} (query): give a whole number.") from None


def whole_number(
    value: Any, name: str, low: int, high: int | None, clip: bool = False, flag: str | None = None
) -> int:
    """``value`` as a whole number in [low, high] (``clip``: a larger one cut to ``high``); ``flag``,
    the server's option that sets ``high``. A JSON field must be a number, not a string of one."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(400, f"{name} {value!r}: give a whole number.")
    if clip and high is not None:
        value = min(value, high)
    if value < low:
        raise BadRequest(400, f"{name} {value}: give a whole number of at least {low}.")
    if high is not None and value > high:
        raise BadRequest(
            400, f"{name} {value} is over this server's limit of {high}{f' ({flag})' if flag else ''}."
        )
    return value


def temperature(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise BadRequest(400, f"temperature {value!r}: give a number >= 0 (0: the most likely character).")
    return float(value)
