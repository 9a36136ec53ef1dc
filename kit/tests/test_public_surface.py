"""Nothing a release made public goes without a deprecation: the previous release's surface (its
public API names, config keys, subcommand flags and model.json fields, frozen in
kit/tests/surface/<version>.json) is held against the code, and the version is stated once."""

from __future__ import annotations

import json
import re
from contextlib import redirect_stdout
from io import StringIO

import pytest

import projkit
from conftest import DEFAULTS, KIT, main
from projkit.cli import KIT_DEFAULTS
from projkit.export import DEPRECATED_FIELDS
from public_surface import SUBCOMMANDS, api_names, config_keys, fields, kit_flags, missing
from tinyproj import PROJECT

SURFACES = KIT / "tests" / "surface"
# Names the kit deprecated (still working, with a warning naming the replacement) and may drop in the
# next minor version after.
DEPRECATED = {*DEPRECATED_FIELDS}


def version(text: str) -> tuple[int, ...]:
    return tuple(map(int, re.match(r"(\d+)\.(\d+)\.(\d+)", text).groups()))


def previous_release() -> dict:
    """The surface of the newest release before this version."""
    this = version(projkit.__version__)
    frozen = sorted((version(p.stem), p) for p in SURFACES.glob("*.json") if version(p.stem) < this)
    assert frozen, f"no surface of a release before {projkit.__version__} in {SURFACES}"
    return json.loads(frozen[-1][1].read_text())


def help_text(subcommand: str) -> str:
    out = StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as ended:
        if subcommand in ("sweep", "serve"):
            PROJECT.run([subcommand, "--help"])
        else:
            main([subcommand, "--help"])
    assert ended.value.code == 0
    return out.getvalue()


def test_the_version_is_stated_once():
    stated = re.search(r'(?m)^version = "(.+)"', (KIT / "pyproject.toml").read_text())[1]
    assert projkit.__version__ == stated


def test_nothing_public_in_the_previous_release_is_gone_without_a_deprecation():
    previous = previous_release()
    now = {
        "api": api_names(KIT / "README.md"),
        "config_keys": config_keys(KIT_DEFAULTS, DEFAULTS),
        "flags": {sub: kit_flags(help_text(sub)) for sub in SUBCOMMANDS},
    }
    previous.pop("model_json")  # held by the export tests (assert_fields_kept), which write one
    gone = missing(previous, now, DEPRECATED)
    assert not gone, f"removed without a deprecation (kit/CHANGELOG.md's rule): {gone}"


def assert_fields_kept(spec: dict, kind: str) -> None:
    """A model.json of ``kind`` (image, text) written now has every field the previous release's
    had, or a deprecation of it."""
    gone = [
        f for f in previous_release()["model_json"][kind] if f not in fields(spec) and f not in DEPRECATED
    ]
    assert not gone, f"the {kind} model.json lost {gone} without a deprecation"
