"""A library the kit reaches into, installed outside the range the kit declares for it, is refused as a
command starts: one line with the range and the fix, before the library is imported."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import projkit
from projkit.testing.launch import run
from projkit.versions import HELD, declared_ranges, shown, unsupported


def shadowing(folder: Path, name: str, version: str) -> Path:
    """A folder whose distribution ``name`` at ``version`` is found before the installed one."""
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def test_each_held_library_has_a_declared_range_and_the_lock_is_inside_it():
    ranges = declared_ranges()
    assert set(ranges) == set(HELD)
    assert all(str(requirement.specifier) for requirement in ranges.values())
    assert unsupported() is None


@pytest.mark.parametrize(
    ("name", "version"),
    [("lightning", "2.99.0"), ("jsonargparse", "4.1.0"), ("torchmetrics", "2.0.0"), ("uvicorn", "1.0.0")],
)
def test_a_version_outside_the_range_is_refused_naming_range_and_fix(name, version, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(shadowing(tmp_path, name, version)))
    refusal = unsupported()
    assert refusal == (
        f"error: {name} {version} is installed, but projkit {projkit.__version__} supports "
        f"{shown(declared_ranges()[name])}: run `make install` for the versions uv.lock names, or "
        f"`make upgrade-kit` for a kit that supports {name} {version}."
    )
    assert re.fullmatch(r"lightning>=[\d.]+,<[\d.]+", shown(declared_ranges()["lightning"]))  # floor first


@pytest.mark.slow
def test_a_command_refuses_it_before_importing_lightning(workdir):
    folder = shadowing(workdir / "shadow", "lightning", "2.99.0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    result = run(["fit", "--trainer.max_epochs=1"], cwd=workdir, env=env, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: lightning 2.99.0 is installed, but projkit ")
    assert not (workdir / "runs").exists()
