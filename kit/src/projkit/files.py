"""Files as the kit identifies them: by the sha256 of their bytes (an export's checkpoint, a streamed
dataset's chunks)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """The hex sha256 of ``path``'s bytes, read a block at a time: a checkpoint or a chunk may be
    larger than memory."""
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()
