"""``projkit.preprocessing.Preprocessing``, the one statement of how a file becomes an image model's
pixels: what ``model.json`` says of it (``describe``) is enough to repeat it byte for byte. A
seeded fuzzer draws specs and files (sizes, modes, 16-bit grey) and compares the kit's pixels with
an implementation written here from the description's words alone, as a deployment writes one.
``predict``'s check of its files meets the serving fuzzer's decode files: each is read or named."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bad_requests import UNCONVERTIBLE, WRITTEN, cut_file, damaged_file, written_image
from projkit.data.image_files import image_problem
from projkit.preprocessing import FILTERS, Preprocessing

CASES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "60"))


def from_words(file: bytes, pre: dict) -> np.ndarray:
    """``pre["steps"]``, as a deployer reads them: numpy and Pillow, nothing of the kit."""
    image = Image.open(io.BytesIO(file))
    if image.mode.startswith("I"):
        image = Image.fromarray(
            np.clip((np.asarray(image, np.float64) / 257).round(), 0, 255).astype(np.uint8)
        )
    image = image.convert(pre["mode"])
    resize, (w, h) = pre["resize"], image.size
    if "size" in resize:
        size = tuple(resize["size"])
    else:
        s = resize["shorter_side"]
        size = (s, int(s * h / w)) if w <= h else (int(s * w / h), s)
    image = image.resize(size, Image.Resampling[resize["filter"].upper()])
    if pre["crop"]:
        (w, h), (cw, ch) = image.size, pre["crop"]
        image = image.crop(((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch))
    levels = pre["levels"]
    values = np.round(np.asarray(image, np.float32) / 255 * levels) / levels
    return values.reshape(*values.shape[:2], -1).transpose(2, 0, 1)


def random_file(rng: random.Random) -> bytes:
    width, height = rng.randint(1, 70), rng.randint(1, 70)
    kind = rng.choice(["L", "RGB", "RGBA", "P", "I;16", "LA"])
    generator = np.random.default_rng(rng.randrange(2**32))
    if kind == "I;16":
        image = Image.fromarray(generator.integers(0, 65536, (height, width), dtype=np.uint16))
    else:
        channels = {"L": 1, "RGB": 3, "RGBA": 4, "P": 1, "LA": 2}[kind]
        pixels = generator.integers(0, 256, (height, width, channels), dtype=np.uint8).squeeze(
            -1 if channels == 1 else ()
        )
        image = Image.fromarray(pixels, {"P": "L"}.get(kind, kind))
        image = image.convert("P") if kind == "P" else image
    out = io.BytesIO()
    image.save(out, format=rng.choice(["PNG", "TIFF"]) if kind != "LA" else "PNG")
    return out.getvalue()


def random_spec(rng: random.Random) -> Preprocessing:
    crop = (rng.randint(1, 20), rng.randint(1, 20)) if rng.random() < 0.5 else None
    if crop is None or rng.random() < 0.5:
        low = max(crop) if crop else 1
        size = (rng.randint(low, 40), rng.randint(low, 40))
        resize = {"size": size}
    else:
        resize = {"shorter_side": rng.randint(max(crop), 40)}
    return Preprocessing(
        rng.choice(["L", "RGB"]),
        filter=rng.choice(FILTERS),
        crop=crop,
        levels=rng.choice([255, 16, 1, 100]),
        **resize,
    )


def test_the_description_alone_repeats_the_pixels_byte_for_byte():
    rng = random.Random(0)
    for case in range(CASES):
        pre, file = random_spec(rng), random_file(rng)
        described = pre.describe()
        assert Preprocessing.from_description(described) == pre
        mine = pre.pixels(Image.open(io.BytesIO(file)))
        theirs = from_words(file, described)
        assert mine.dtype == theirs.dtype == np.float32, case
        assert mine.shape == theirs.shape == (1 if pre.mode == "L" else 3, *pre.output_size[::-1]), case
        assert np.array_equal(mine, theirs), (case, pre)
        assert mine.min() >= 0.0 and mine.max() <= 1.0


def test_stored_levels_and_sixteen_bit_grey():
    ramp = np.tile(np.linspace(0, 65535, 8).round().astype(np.uint16), (8, 1))
    stored = Preprocessing.stretch((1, 8, 8), levels=16).stored(Image.fromarray(ramp))
    assert stored.dtype == np.uint8 and stored[0, 0].tolist() == [
        0,
        2,
        5,
        7,
        9,
        11,
        14,
        16,
    ]  # scaled, not clipped
    shorter = Preprocessing("RGB", shorter_side=4, filter="box", crop=(4, 4))
    assert shorter.pixels(Image.new("L", (12, 6), 255)).shape == (3, 4, 4)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mode": "CMYK", "size": (4, 4)}, "mode must be one of"),
        ({"mode": "L"}, "exactly one of size"),
        ({"mode": "L", "size": (4, 4), "shorter_side": 4}, "exactly one of size"),
        ({"mode": "L", "size": (4, 4), "filter": "cubic"}, "filter must be one of"),
        ({"mode": "L", "size": (0, 4)}, "positive whole numbers"),
        ({"mode": "L", "size": (4, 4), "levels": 256}, "levels must be a whole number in 1..255"),
    ],
)
def test_a_spec_no_image_can_follow_is_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        Preprocessing(**settings)


def pillow_reads(path: Path) -> bool:
    """Whether the installed Pillow decodes the whole file."""
    try:
        with Image.open(path) as image:
            image.load()
    except Exception:  # any decoder's error: what image_problem catches too
        return False
    return True


def test_fuzz_predict_reads_a_decoded_file_or_names_its_problem(tmp_path):
    """Files of the decode fuzzer (every format and mode Pillow writes there, whole; then cut and
    damaged ones): ``image_problem``, which ``predict`` asks of each file before it reads any, names
    the problem of each it cannot take (a mode it cannot convert to grey or RGB by name) and raises
    on none, and each it passes, the preprocessing of grey and of RGB read."""
    rng = random.Random(0)
    path = tmp_path / "file"
    for case in range(max(CASES, len(WRITTEN))):
        if case < len(WRITTEN):
            body, mode = written_image(rng, *WRITTEN[case]), WRITTEN[case][1]
        else:
            (body, _, _), _ = rng.choice([cut_file, damaged_file])(rng, b"")
            mode = None
        path.write_bytes(body)
        problem = image_problem(path)
        if mode in UNCONVERTIBLE:
            assert problem and f"its mode {mode} is one Pillow cannot convert to L (grey)" in problem, problem
        elif mode is not None:
            # A file this Pillow wrote but cannot read back (a YCbCr TIFF on Pillow 10.0) is named too.
            assert (problem is None) == pillow_reads(path), (WRITTEN[case], problem)
        if problem is None:
            for target in ("L", "RGB"):
                with Image.open(path) as image:
                    Preprocessing(target, size=(5, 3)).pixels(image)
