"""Image files as a data set meets them: found under a folder (links followed once, hidden files
left out), and each one read whole before the first step, so that a truncated, empty or foreign
file is named with its fix rather than stopping a run partway."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from torchvision.datasets.folder import IMG_EXTENSIONS

from projkit.errors import ConfigError
from projkit.preprocessing import MODES, conversion_problem


def predict_files(folder: Path) -> list[Path]:
    """The files directly in ``folder`` (``data.predict_path``), in name order, hidden ones left out;
    refused with the field and the fix when there is no such folder or it holds none."""
    fix = "point data.init_args.predict_path at a folder of image files"
    if not folder.is_dir():
        raise ConfigError(
            f"data.predict_path: no folder at '{folder}'. Check the path, or {fix} "
            "(PNG, JPEG, …), or leave it unset to predict on the test split."
        )
    # Everything but subfolders and hidden names: a FIFO, a device or a broken link is named as such
    # by ``image_problem`` rather than skipped without a word.
    paths = sorted(p for p in folder.iterdir() if not p.is_dir() and not p.name.startswith("."))
    if not paths:
        raise ConfigError(
            f"data.predict_path: '{folder}' holds no files (subfolders are not searched). Put the "
            f"images to classify directly in it, or {fix}."
        )
    return paths


# How the image formats' files begin: a file that begins so but does not open is one of them, broken.
SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF8": "GIF",
    b"BM": "BMP",
    b"II*\0": "TIFF",
    b"MM\0*": "TIFF",
    b"RIFF": "WebP",
}


# At most this many unreadable files are named in the message that refuses them (all are counted).
LISTED_BAD_FILES = 20


def image_problems(paths: Sequence[Path], modes: Sequence[str] = MODES) -> dict[Path, str]:
    """Each path that is no readable image, with what is wrong with it and its fix (``image_problem``;
    ``modes``: those the files are converted to, the data's ``Preprocessing.mode``).

    Every file is decoded once, so that a bad one is found before the first step rather than
    stopping training partway, and all are named at once rather than one per run."""
    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:  # Pillow decodes without the GIL
        found = pool.map(image_problem, paths, [modes] * len(paths))
    return {path: problem for path, problem in zip(paths, found, strict=True) if problem is not None}


def refused_images(problems: dict[Path, str], field: str, root: Path, hint: str = "") -> ConfigError:
    """The refusal naming each unreadable file (``LISTED_BAD_FILES`` of them) and its fix."""
    named = [f"'{_relative(path, root)}' {problem}" for path, problem in problems.items()]
    more = len(named) - LISTED_BAD_FILES
    listed = "; ".join(named[:LISTED_BAD_FILES]) + (f"; and {more} more" if more > 0 else "")
    return ConfigError(
        f"{field}: {len(problems)} file(s) under '{root}' cannot be read as images: {listed}.{hint}"
    )


def _relative(path: Path, root: Path) -> Path:
    return path.relative_to(root) if path.is_relative_to(root) else path


def image_problem(path: Path, modes: Sequence[str] = MODES) -> str | None:
    """What keeps ``path`` from being read as an image, with the fix that suits it, or None when
    Pillow reads it whole and can convert it to each of ``modes`` (by default both grey and RGB, as
    a data module's ``Preprocessing.mode`` may be either). Every byte is read, since a truncated
    file has an intact header: a PNG is verified (each chunk's CRC, through its end chunk), anything
    else decoded (a JPEG at an eighth of its size, which reads all of its data all the same)."""
    try:
        if path.is_symlink() and not path.exists():
            return f"is a link to nothing ('{os.readlink(path)}'): fix or delete the link"
        if not path.is_file():
            return "is not a regular file (a device, pipe or socket): move it out of the folder"
        size = path.stat().st_size
        if size == 0:
            return "is empty (0 bytes): an interrupted copy or download? Copy it again, or delete it"
        with Image.open(path) as image:
            if image.format == "PNG":
                image.verify()  # every chunk's checksum, through the end: a tenth of decoding it
            else:
                image.draft(image.mode, (1, 1))
                image.load()
            unconvertible = conversion_problem(image.mode, modes)
    except UnidentifiedImageError:
        return not_an_image(path)
    except PermissionError as error:
        return f"cannot be read ({error.strerror}): fix its permissions"
    except Exception as error:  # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError,
        # NotImplementedError, DecompressionBombError, ... for a broken file: all of them its fault
        said = str(error).splitlines()[0] if str(error) else type(error).__name__
        if "truncated" in said.lower() or isinstance(error, EOFError):
            return (
                f"is truncated ({size:,} bytes; Pillow: {said}): an interrupted copy or download? "
                "Copy it again, or delete it"
            )
        return f"is damaged (Pillow: {said}): export it again, or delete it"
    if unconvertible:
        return (
            f"is an image, but {unconvertible}: save it as RGB or grey (PNG, JPEG), or move it out of "
            "the folder"
        )
    return None


def not_an_image(path: Path) -> str:
    """Why Pillow recognised no image in ``path``: text (a note, an HTML error page saved under an
    image's name) or some other format, and the fix for each."""
    with open(path, "rb") as file:
        head = file.read(512)
    # A file cut inside the signature itself begins as a part of it.
    kind = next(
        (name for sign, name in SIGNATURES.items() if head.startswith(sign) or sign.startswith(head)), None
    )
    if kind:
        return (
            f"is truncated or damaged: a {kind} file whose header does not read ({path.stat().st_size:,} "
            "bytes). An interrupted copy or download? Copy it again, or delete it"
        )
    if looks_like_text(head):
        return "is a text file, not an image: move it out of the folder"
    return (
        f"is in no image format Pillow reads (it begins {head[:8]!r}): convert it to PNG or JPEG, or move "
        "it out of the folder"
    )


def looks_like_text(head: bytes) -> bool:
    """Whether a file's first bytes are UTF-8 text (ASCII included) without NUL bytes."""
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start >= len(head) - 3  # only the last character, cut by the read
    return True


def image_files(folder: Path, walked: set[str], seen: set[str]) -> list[Path]:
    """The image files under ``folder`` (by extension; hidden names left out, such as macOS's
    ``._x.png``), in torchvision's ``ImageFolder`` order: folders by path, files by name.

    Links are followed, but a folder whose real path is in ``walked`` (walked already, or one the
    caller walks itself) is not entered, so a loop ends and no folder is read twice; a file whose
    real path is in ``seen`` (reached by another link) is not listed again. Both sets grow.
    """
    listed: list[tuple[str, list[Path]]] = []
    pending = [folder]
    while pending:
        directory = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as error:
            raise ConfigError(
                f"data.root: cannot read the folder '{directory}' ({error.strerror}). Fix its "
                "permissions, or move it out of the data set."
            ) from error
        files = []
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith("."):
                continue
            real = os.path.realpath(path)
            if path.is_dir():
                if real not in walked:
                    walked.add(real)
                    pending.append(path)
            elif path.suffix.lower() in IMG_EXTENSIONS and real not in seen:
                seen.add(real)
                files.append(path)
        listed.append((str(directory), files))
    return [path for _, files in sorted(listed) for path in files]
