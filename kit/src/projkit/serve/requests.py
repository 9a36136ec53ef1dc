"""A request's body as the model's input, or the one line that says what is wrong with it.

Run in the server's HTTP processes, before a request is queued for the model: a bad request is
answered there (a 4xx and its line) and never reaches a batch, where it would fail the others. An
image is decoded and prepared by ``model.json``'s preprocessing (``projkit.preprocessing``, the code
``predict`` runs), after its header is checked against the pixel limit, so that a small file that
decodes to a huge image (a decompression bomb) is refused before it is decoded; an image in a mode
Pillow cannot convert to the model's (LAB to grey) is refused by name, as ``predict`` refuses it.

Every number a request carries (a JSON field, a query parameter) stays the text it was written as
(``Written``) until the field that takes it converts it, here and only here (``whole_number``,
``temperature``), so that each is refused with its field and accepted range before any conversion:
a number of thousands of digits, one a float cannot hold (1e400), a subnormal temperature. A JSON
field or a query parameter given twice is refused rather than one of them silently kept.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from projkit.preprocessing import Preprocessing, conversion_problem
from projkit.sampling import TEMPERATURES, is_temperature

IMAGE_TYPES = ("image/", "application/octet-stream")
GENERATION_KEYS = ("prompt", "max_new_tokens", "temperature", "top_k", "seed")
DEFAULT_TOP_K = 5
DEFAULT_NEW_TOKENS = 100
# No setting needs a longer number; int() and float() of thousands of digits cost time, and overflow.
MAX_NUMBER_CHARS = 40
WHOLE = re.compile(r"-?[0-9]+")
NUMBER_LIKE = re.compile(r"[-+0-9.eE]+|-?Infinity|NaN")
LARGEST_SEED = 2**63 - 1


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


@dataclass(frozen=True)
class Written:
    """A number as the request wrote it, a JSON body's (json's parse hooks make every number one)
    or a query parameter's: the field that takes it converts it, knowing its type and range."""

    text: str

    def __repr__(self) -> str:
        return self.text


def image_request(
    body: bytes,
    content_type: str,
    query: Iterable[tuple[str, str]],
    pre: Preprocessing,
    classes: int,
    limits: Limits,
) -> dict[str, Any]:
    """An image file's request: its pixels, by the export's preprocessing, and the ``top_k`` asked
    for in the query (``?top_k=3``; ``query`` as its (name, value) pairs, a name repeated or not)."""
    kind = content_type.split(";")[0].strip().lower()
    if not kind.startswith(IMAGE_TYPES):
        raise BadRequest(
            415,
            f"Content-Type {kind or 'none'!r}: send the image file itself as the body, with Content-Type "
            "image/png, image/jpeg, ... or application/octet-stream (curl --data-binary @FILE).",
        )
    asked = query_parameters(query, ("top_k",), "only top_k is taken")
    accepts = f"a whole number of at least 1 (one above the {classes} classes lists them all)"
    top_k = whole_number(asked.get("top_k", Written(str(DEFAULT_TOP_K))), "top_k (query)", 1, None, accepts)
    if not body:
        raise BadRequest(400, "the body is empty: send an image file (PNG, JPEG, ...) as the request body.")
    return {"pixels": decoded_pixels(body, pre, limits.max_pixels), "top_k": min(top_k, classes)}


def decoded_pixels(body: bytes, pre: Preprocessing, max_pixels: int) -> np.ndarray:
    """The body's image through ``pre``: refused when Pillow finds no image in it, when its header
    says it is too large, when its data does not decode, and when it is in a mode ``pre`` cannot
    convert (``conversion_problem``, which ``predict``'s check of its files asks too)."""
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
    except Exception as error:  # any of Pillow's decoders' complaints about a header: the body's fault
        raise BadRequest(
            400, f"the body's image header does not read ({said(error)}): send the whole image file."
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
    except Exception as error:  # Pillow's decoders raise OSError, ValueError, SyntaxError, EOFError, ...
        raise BadRequest(
            400,
            f"the {image.format or 'image'} file is truncated or damaged ({said(error)}): send the whole "
            "file.",
        ) from None
    if unconvertible := conversion_problem(image.mode, (pre.mode,)):  # the mode as loaded
        raise BadRequest(
            400,
            f"the {image.format or 'image'} file is an image, but {unconvertible}, which this model takes: "
            "send it as RGB or grey (PNG, JPEG).",
        )
    return pre.pixels(image)


def said(error: BaseException) -> str:
    """An exception's message on one short line (its class's name when it has none)."""
    return " ".join(str(error).split())[:120] or type(error).__name__


def generation_request(
    body: bytes, content_type: str, vocab: str, limits: Limits, query: Iterable[tuple[str, str]] = ()
) -> dict[str, Any]:
    """A JSON object ``{"prompt", "max_new_tokens", "temperature", "top_k", "seed"}`` (all but the
    prompt optional) as token ids and checked settings; the settings go in the body, not the query."""
    kind = content_type.split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest(
            415,
            f"Content-Type {kind or 'none'!r}: send a JSON object with Content-Type application/json, "
            'e.g. {"prompt": "ROMEO:", "max_new_tokens": 100}.',
        )
    query_parameters(query, (), "a language model's settings go in the JSON body")
    asked = json_object(body)
    if unknown := sorted(set(asked) - set(GENERATION_KEYS)):
        raise BadRequest(
            400, f"unknown field(s) {listed(unknown)}: the fields are {', '.join(GENERATION_KEYS)}."
        )
    most = limits.max_new_tokens
    default_tokens = Written(str(min(DEFAULT_NEW_TOKENS, most)))
    top_k, seed = asked.get("top_k"), asked.get("seed")
    return {
        "tokens": prompt_tokens(asked.get("prompt"), vocab),
        "max_new_tokens": whole_number(
            asked.get("max_new_tokens", default_tokens),
            "max_new_tokens",
            0,
            most,
            f"a whole number from 0 to {most} (this server's --max_new_tokens)",
        ),
        "temperature": temperature(asked.get("temperature", Written("1.0"))),
        "top_k": None
        if top_k is None
        else min(whole_number(top_k, "top_k", 1, None, "a whole number of at least 1, or null"), len(vocab)),
        "seed": None
        if seed is None
        else whole_number(seed, "seed", 0, LARGEST_SEED, f"a whole number from 0 to {LARGEST_SEED}, or null"),
    }


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, its numbers ``Written``, a field given twice refused."""
    if not body:
        raise BadRequest(400, 'the body is empty: send a JSON object such as {"prompt": "ROMEO:"}.')
    try:
        asked = json.loads(
            body,
            parse_int=Written,
            parse_float=Written,
            parse_constant=Written,  # NaN, Infinity, -Infinity: refused by the field that takes them
            object_pairs_hook=unique_fields,
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadRequest(400, f"the body is no valid JSON ({error}): send a JSON object.") from None
    except RecursionError:
        raise BadRequest(400, "the body's JSON nests too deeply: send a flat JSON object.") from None
    if not isinstance(asked, dict):
        raise BadRequest(
            400, f'the body is a JSON {type(asked).__name__}, not an object such as {{"prompt": "ROMEO:"}}.'
        )
    return asked


def unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if repeated := repeated_names(pairs):
        raise BadRequest(400, f"field(s) {listed(repeated)} given twice or more: give each once.")
    return dict(pairs)


def query_parameters(
    query: Iterable[tuple[str, str]], known: tuple[str, ...], fix: str
) -> dict[str, Written]:
    """The query's parameters by name, each ``Written``; one unknown or repeated refused by name."""
    pairs = list(query)
    if unknown := sorted({name for name, _ in pairs} - set(known)):
        raise BadRequest(400, f"unknown query parameter(s) {listed(unknown)}: {fix}.")
    if repeated := repeated_names(pairs):
        raise BadRequest(400, f"query parameter(s) {listed(repeated)} given twice or more: give each once.")
    return {name: Written(value) for name, value in pairs}


def repeated_names(pairs: list[tuple[str, Any]]) -> list[str]:
    """The names given more than once, in order (counted in one pass: a body may hold a million)."""
    return sorted(name for name, count in Counter(name for name, _ in pairs).items() if count > 1)


def listed(names: list[str]) -> str:
    """Names a client chose, for a message: five at most, each cut to 30 characters."""
    shown = [name if name.isprintable() else repr(name) for name in names[:5]]
    shown = [name if len(name) <= 30 else f"{name[:27]}..." for name in shown]
    return ", ".join(shown) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


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


def number_text(value: Any, name: str, accepts: str) -> str:
    """The text of a ``Written`` number, refused when ``value`` is none (a JSON string, bool, list,
    object or null) or when it runs past ``MAX_NUMBER_CHARS``, before anything converts it."""
    if not isinstance(value, Written):
        written = json.dumps(value) if value is None or isinstance(value, bool) else repr(value)
        written = written if len(written) <= 40 else f"{written[:30]}..."
        raise BadRequest(400, f"{name} {written}: give {accepts}.")
    if len(value.text) > MAX_NUMBER_CHARS:
        raise BadRequest(
            400, f"{name} {shown(value.text[:12])}... has {len(value.text)} characters: give {accepts}."
        )
    return value.text


def shown(text: str) -> str:
    """A number's text as a message shows it: as written when it looks like one, else quoted."""
    return text if NUMBER_LIKE.fullmatch(text) else repr(text)


def whole_number(value: Any, name: str, low: int, high: int | None, accepts: str) -> int:
    """``value`` as a whole number in [low, high] (``high`` None: no bound but the digits'), refused
    with ``accepts`` (the range in words) otherwise. A JSON field must be a number, not a string of
    one, and a whole one as written (3, not 3.0)."""
    text = number_text(value, name, accepts)
    number = int(text) if WHOLE.fullmatch(text) else None
    if number is None or number < low or (high is not None and number > high):
        raise BadRequest(400, f"{name} {shown(text)}: give {accepts}.")
    return number


def temperature(value: Any) -> float:
    """``value`` as the temperature: 0 or a finite number in projkit.sampling's range."""
    text = number_text(value, "temperature", TEMPERATURES)
    number = float(text)  # JSON's syntax (or NaN, Infinity): float() reads it; 1e400 is inf, refused
    if not is_temperature(number):
        raise BadRequest(400, f"temperature {shown(text)}: give {TEMPERATURES}.")
    return abs(number)
