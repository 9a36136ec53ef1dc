"""The kinds of bad request a server meets, for the serving fuzzer (test_serve.py): each makes a
request from a seeded random generator and says the status it must get. Image kinds send to an image
model's server, text kinds to a language model's; the servers run with ``LIMITS``' flags."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable

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

# (body, content type, query) of a request, and the status it must get.
Request = tuple[bytes, str, str]
Kind = Callable[[random.Random, bytes], tuple[Request, int]]


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
        (good, "image/png", f"?top_k={rng.choice(['0', '-3', 'many', '1.5'])}"),
        400,
    ),
    "unknown parameter": lambda rng, good: ((good, "image/png", "?size=large"), 400),
}


def generation(**fields: object) -> bytes:
    return json.dumps({"prompt": "ROMEO:", **fields}).encode()


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
}
