"""The kinds of bad request a server meets, for the serving fuzzer (test_serve.py): each makes a
request from a seeded random generator and says the status it must get (or the statuses it may get,
where a Pillow decoder may or may not read what is left of a cut or damaged file: never a 5xx).
Image kinds send to an image model's server, text kinds to a language model's; the servers run with
``LIMITS``' flags. Numbers are drawn at their extremes (subnormals, 400-digit numbers, NaN, negative
zero, ...), written into the JSON as raw text, and files from a decode fuzzer: what Pillow writes in
many formats and modes, whole, cut and damaged."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import numpy as np
from PIL import Image

MAX_BODY_BYTES = 200_000
MAX_PIXELS = 1_000_000
MAX_NEW_TOKENS = 50
LIMITS = (
    f"--max_body_bytes={MAX_BODY_BYTES}",
    f"--max_pixels={MAX_PIXELS}",
    f"--max_new_tokens={MAX_NEW_TOKENS}",
)

# (body, content type, query) of a request, and the status it must get (or those it may get).
Request = tuple[bytes, str, str]
Kind = Callable[[random.Random, bytes], tuple[Request, int | tuple[int, ...]]]
# What a cut or damaged image file may get: its answer, when a decoder reads what is left; or a 400,
# or a 413 when the damage makes its header claim more pixels than the limit.
READ_OR_REFUSED = (200, 400, 413)


def png(width: int, height: int, seed: int = 0, mode: str = "L") -> bytes:
    channels = {"L": (), "RGB": (3,)}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, *channels), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode).save(out, format="PNG")
    return out.getvalue()


def bomb() -> bytes:
    """A small PNG that decodes to 4,000,000 pixels: four times ``MAX_PIXELS``."""
    out = io.BytesIO()
    Image.new("L", (2000, 2000)).save(out, format="PNG", optimize=True)
    return out.getvalue()


# The formats and modes the decode fuzzer has Pillow write (the classifier served takes grey).
WRITTEN = (
    ("BMP", "RGB"),
    ("XBM", "1"),
    ("PCX", "RGB"),
    ("ICO", "RGBA"),
    ("WEBP", "RGB"),
    ("GIF", "P"),
    ("PNG", "P with transparency"),
    ("PNG", "LA"),
    ("JPEG", "CMYK"),
    ("TGA", "RGB"),
    ("PPM", "RGB"),
    ("TIFF", "CMYK"),
    ("TIFF", "I;16"),
    ("TIFF", "F"),
    ("TIFF", "YCbCr"),
    ("TIFF", "LAB"),
)
UNCONVERTIBLE = ("LAB",)  # to grey, in every Pillow


def written_image(rng: random.Random, format: str, mode: str) -> bytes:
    """A file of random pixels as Pillow writes ``format`` in ``mode``, 16 to 40 pixels a side."""
    width, height = rng.randint(16, 40), rng.randint(16, 40)
    pixels = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    if mode == "LAB":
        image = Image.merge("LAB", image.split())
    elif mode == "I;16":
        image = Image.fromarray(pixels[..., 0].astype(np.uint16) * 257)
    elif mode == "P with transparency":
        image = image.convert("P")
        image.info["transparency"] = 0
    else:
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, format=format)
    return out.getvalue()


def any_written(rng: random.Random) -> tuple[bytes, str]:
    """A ``written_image`` of a format and mode drawn from ``WRITTEN``, and its mode."""
    format, mode = rng.choice(WRITTEN)
    return written_image(rng, format, mode), mode


def whole_file(rng: random.Random, good: bytes) -> tuple[Request, int]:
    body, mode = any_written(rng)
    return (body, "application/octet-stream", ""), 400 if mode in UNCONVERTIBLE else 200


def cut_file(rng: random.Random, good: bytes) -> tuple[Request, tuple[int, ...]]:
    body, _ = any_written(rng)
    return (body[: rng.randint(1, len(body) - 1)], "application/octet-stream", ""), READ_OR_REFUSED


def damaged_file(rng: random.Random, good: bytes) -> tuple[Request, tuple[int, ...]]:
    body = bytearray(any_written(rng)[0])
    for _ in range(rng.randint(1, 8)):
        body[rng.randrange(len(body))] = rng.randrange(256)
    return (bytes(body), "application/octet-stream", ""), READ_OR_REFUSED


# Query values a whole number is not: digits past any limit, signs, points, exponents, words, and
# digits int() would take but a query's number does not hold (Arabic digits, underscores, spaces).
BAD_QUERY_NUMBERS = (
    "0", "-0", "-3", "1" * 5000, "1" * 41, "1.5", "1e2", "3.0", "inf", "nan", "NaN", "many", "0x10",
    "٣", "1_0", " 3", "", "+-1",
)  # fmt: skip

IMAGE_KINDS: dict[str, Kind] = {
    "empty body": lambda rng, good: ((b"", "image/png", ""), 400),
    "text sent as an image": lambda rng, good: (
        (b"a cat, sitting\n" * rng.randint(1, 50), "image/png", ""),
        400,
    ),
    "truncated image": lambda rng, good: ((good[: rng.randint(40, len(good) - 20)], "image/png", ""), 400),
    "damaged image": lambda rng, good: (
        (good[:60] + bytes(rng.randrange(256) for _ in range(200)), "image/png", ""),
        400,
    ),
    "random bytes": lambda rng, good: (
        (bytes(rng.randrange(256) for _ in range(rng.randint(1, 500))), "image/jpeg", ""),
        400,
    ),
    "wrong content type": lambda rng, good: (
        (good, rng.choice(["text/plain", "application/json", ""]), ""),
        415,
    ),
    "multipart form": lambda rng, good: ((b"--x\r\n" + good, "multipart/form-data; boundary=x", ""), 415),
    "oversized body": lambda rng, good: (
        (b"\0" * (MAX_BODY_BYTES + rng.randint(1, 1000)), "image/png", ""),
        413,
    ),
    "decompression bomb": lambda rng, good: ((bomb(), "image/png", ""), 413),
    "bad top_k": lambda rng, good: (
        (good, "image/png", f"?top_k={quote(rng.choice(BAD_QUERY_NUMBERS))}"),
        400,
    ),
    "unknown parameter": lambda rng, good: ((good, "image/png", "?size=large"), 400),
    "repeated parameter": lambda rng, good: ((good, "image/png", "?top_k=2&top_k=9"), 400),
    "PNG cut in its header": lambda rng, good: ((good[: rng.randint(9, 40)], "image/png", ""), 400),
    "an image file Pillow writes": whole_file,
    "a cut image file": cut_file,
    "a damaged image file": damaged_file,
}


def generation(**fields: object) -> bytes:
    return json.dumps({"prompt": "ROMEO:", **fields}).encode()


def raw_generation(field: str, number: str, **fields: object) -> bytes:
    """A request whose ``field`` is ``number`` written into the JSON as it is (1e-320, NaN, 400
    digits: what json.dumps would not write, or would write otherwise)."""
    return generation(**fields)[:-1] + f', "{field}": {number}}}'.encode()


# Numbers at their extremes that each field refuses, as JSON text.
REFUSED_NUMBERS = {
    "temperature": (
        "1e-320", "5e-324", "-1e-320", "1e-5", "-0.5", "10001", "1e400", "-1e400", "NaN", "Infinity",
        "-Infinity", "1" + "0" * 400, "0." + "0" * 400 + "1", "1" * 41, '"0.5"', "true", "null", "[1]",
    ),
    "seed": (
        "1" * 5000, "-1", "9223372036854775808", "1e3", "1.5", "0.0", "-0.0", "NaN", '"7"', "false",
    ),
    "top_k": ("0", "-0", "-1", "1" * 400, "1e2", "2.5", "Infinity", '"3"', "true"),
    "max_new_tokens": (str(MAX_NEW_TOKENS + 1), "1" * 400, "-1", "1e1", "-0.5", "8.0", "NaN", "null"),
}  # fmt: skip
# Numbers at the edges of what each field takes (a huge top_k is cut to the vocabulary's size).
TAKEN_NUMBERS = {
    "temperature": ("0", "-0", "-0.0", "0E0", "0.0001", "1e-4", "10000", "1E4", "0.7"),
    "seed": ("0", "-0", "9223372036854775807", "null"),
    "top_k": ("1", "1" * 40, "null"),
    "max_new_tokens": ("0", "-0", str(MAX_NEW_TOKENS)),
}


def refused_number(rng: random.Random, good: bytes) -> tuple[Request, int]:
    field = rng.choice(sorted(REFUSED_NUMBERS))
    return (raw_generation(field, rng.choice(REFUSED_NUMBERS[field])), "application/json", ""), 400


def taken_number(rng: random.Random, good: bytes) -> tuple[Request, int]:
    field = rng.choice(sorted(TAKEN_NUMBERS))
    fields = {} if field == "max_new_tokens" else {"max_new_tokens": 4}
    return (raw_generation(field, rng.choice(TAKEN_NUMBERS[field]), **fields), "application/json", ""), 200


TEXT_KINDS: dict[str, Kind] = {
    "empty body": lambda rng, good: ((b"", "application/json", ""), 400),
    "malformed JSON": lambda rng, good: (
        (good[: rng.randint(1, len(good) - 1)], "application/json", ""),
        400,
    ),
    "not an object": lambda rng, good: (
        (rng.choice([b"[1, 2]", b'"ROMEO:"', b"42", b"null"]), "application/json", ""),
        400,
    ),
    "not UTF-8": lambda rng, good: ((b'{"prompt": "\xff\xfe"}', "application/json", ""), 400),
    "deeply nested JSON": lambda rng, good: ((b"[" * 100_000 + b"]" * 100_000, "application/json", ""), 400),
    "wrong content type": lambda rng, good: ((good, rng.choice(["text/plain", "image/png", ""]), ""), 415),
    "no prompt": lambda rng, good: (
        (json.dumps({"max_new_tokens": 3}).encode(), "application/json", ""),
        400,
    ),
    "empty prompt": lambda rng, good: ((generation(prompt=""), "application/json", ""), 400),
    "characters outside the vocabulary": lambda rng, good: (
        (generation(prompt="ROMEO " + rng.choice("€☃🙂\t{}")), "application/json", ""),
        400,
    ),
    "huge max_new_tokens": lambda rng, good: (
        (generation(max_new_tokens=rng.choice([MAX_NEW_TOKENS + 1, 10**9, 10**30])), "application/json", ""),
        400,
    ),
    "negative max_new_tokens": lambda rng, good: (
        (generation(max_new_tokens=-1), "application/json", ""),
        400,
    ),
    "negative temperature": lambda rng, good: (
        (generation(temperature=-rng.uniform(0.001, 5)), "application/json", ""),
        400,
    ),
    "temperature not a number": lambda rng, good: (
        (
            rng.choice([generation(temperature="hot"), b'{"prompt": "R", "temperature": NaN}']),
            "application/json",
            "",
        ),
        400,
    ),
    "bad top_k": lambda rng, good: (
        (generation(top_k=rng.choice([0, -1, 2.5, "3"])), "application/json", ""),
        400,
    ),
    "bad seed": lambda rng, good: (
        (generation(seed=rng.choice([-1, 1.5, "x"])), "application/json", ""),
        400,
    ),
    "unknown field": lambda rng, good: ((generation(temprature=0.5), "application/json", ""), 400),
    "a number at an extreme": refused_number,
    "a number at the edge of its range": taken_number,
    "a field given twice": lambda rng, good: (
        (raw_generation("prompt", '"JULIET:"'), "application/json", ""),
        400,
    ),
    "a query parameter": lambda rng, good: ((good, "application/json", "?temperature=0"), 400),
}


def assert_refused(status: int, answer: object, expected: int | tuple[int, ...], kind: str) -> None:
    """A refusal's status (one of ``expected``) and its one line; where a 200 may be expected, a
    well-formed answer (a class, or a continuation of the tokens asked for)."""
    assert status in (expected if isinstance(expected, tuple) else (expected,)), (kind, status, answer)
    assert isinstance(answer, dict), (kind, answer)
    if status == 200:
        assert "class" in answer or len(answer["completion"]) == answer["tokens"], (kind, answer)
        return
    assert isinstance(answer.get("detail"), str), (kind, answer)
    assert "\n" not in answer["detail"] and 10 < len(answer["detail"]) < 400, (kind, answer)


def files_of_every_shape(folder: Path) -> list[Path]:
    """Image files as users have them: non-square, larger and smaller, grey, RGB, RGBA, 16-bit."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i, (width, height, mode) in enumerate(
        [(4, 4, "L"), (9, 5, "L"), (5, 13, "RGB"), (40, 31, "RGBA"), (3, 2, "L"), (17, 17, "I;16")]
    ):
        if mode == "I;16":
            image = Image.fromarray(rng.integers(0, 65536, (height, width), dtype=np.uint16))
        else:
            channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
            image = Image.fromarray(rng.integers(0, 256, (height, width, *channels), dtype=np.uint8), mode)
        image.save(folder / f"file{i}.png")
    return sorted(folder.iterdir())
