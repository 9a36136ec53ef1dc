"""Read what an offline W&B run recorded: its ``run-<id>.wandb`` file, the stream ``wandb sync``
uploads.

The wandb package ships no reader for it. The file is a 7-byte header, then LevelDB's log format
(32 KiB blocks of records, each with a 7-byte header: crc32, length, type; a record may be split
over blocks as FIRST, MIDDLE..., LAST), and every record is a ``wandb.proto`` ``Record`` message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wandb.proto import wandb_internal_pb2

HEADER = b":W&B"
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    # Imported here: test_wandb imports this module at collection, where wandb costs seconds.
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data.startswith(HEADER), f"{path} is not a W&B run file"
    pos, parts = 7, []
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        parts.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record
        elif kind not in (FIRST, MIDDLE):
            parts = []  # zero-filled padding


def offline_runs(save_dir: Path) -> list[Path]:
    """The ``wandb/offline-run-*`` folders under a logger's ``save_dir``, oldest first."""
    return sorted((save_dir / "wandb").glob("offline-run-*"))


def run_file(run: Path) -> Path:
    return next(run.glob("run-*.wandb"))


def run_id(run: Path) -> str:
    return next(r.run.run_id for r in records(run_file(run)) if r.HasField("run"))


def config(run: Path) -> dict:
    """The run's W&B config: every config update merged, values decoded from JSON."""
    merged: dict = {}
    for record in records(run_file(run)):
        if record.HasField("config"):
            for item in record.config.update:
                key = item.key or "/".join(item.nested_key)
                merged[key] = json.loads(item.value_json)
    return merged


def artifacts(run: Path) -> list[wandb_internal_pb2.ArtifactRecord]:
    return [r.artifact for r in records(run_file(run)) if r.HasField("artifact")]


def logged_steps(run: Path) -> list[int]:
    """The ``trainer/global_step`` of each history row the run's file holds, in order."""
    steps = []
    for record in records(run_file(run)):
        if record.HasField("history"):
            items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            steps.append(int(json.loads(items["trainer/global_step"])))
    return steps
