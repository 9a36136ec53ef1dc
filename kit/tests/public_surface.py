"""The kit's public surface as a release freezes it: the names of kit/README.md's public API table,
the kit's config keys, each subcommand's flags and ``model.json``'s fields. A release writes its own
(``python kit/tests/public_surface.py --write``, run with the checkout's environment, writes
``kit/tests/surface/<version>.json``); test_public_surface.py holds the code against the previous
release's, so nothing goes without a deprecation.

Runs on any release's checkout (it reads the kit's README and the project's defaults, and asks the
command line for its help), so a release that predates this file can be frozen from its own checkout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

API_ROW = re.compile(r"^\| `(projkit[\w.]*)` \| (.*) \|$", re.MULTILINE)
NAME = re.compile(r"`([A-Za-z_]\w*)")
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w.-]*)")
SUBCOMMANDS = ("fit", "validate", "test", "predict", "export", "sweep", "serve")
# Flags and keys under these belong to the project's classes or to Lightning, not to the kit.
NOT_THE_KITS = ("model", "data", "trainer", "optimizer", "lr_scheduler", "help", "print_config")
# model.json fields whose children name a project's packages or a format's figures.
OPEN_FIELDS = ("versions", "check")


def api_names(readme: Path) -> dict[str, list[str]]:
    """Each module of the README's public API table and the names its row gives that it has."""
    rows = {}
    for module, what in API_ROW.findall(readme.read_text(encoding="utf-8")):
        found = importlib.import_module(module)
        rows[module] = sorted({name for name in NAME.findall(what) if hasattr(found, name)})
    return rows


def kit_flags(help_text: str) -> list[str]:
    """The kit's flags in a subcommand's ``--help``."""
    flags = set(FLAG.findall(help_text))
    return sorted(flag for flag in flags if flag[2:].split(".")[0] not in NOT_THE_KITS)


def config_keys(*defaults: Path) -> list[str]:
    """The keys the defaults files set, with each class's ``init_args`` one level down."""
    keys = set()
    for path in defaults:
        for key, value in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).items():
            keys.add(key)
            init_args = value.get("init_args") if isinstance(value, dict) else None
            keys.update(f"{key}.init_args.{name}" for name in init_args or {})
    return sorted(key for key in keys if key.split(".")[0] not in NOT_THE_KITS)


def fields(spec: dict, prefix: str = "") -> list[str]:
    """``model.json``'s fields as dotted paths (into mappings, not lists)."""
    found = []
    for key, value in spec.items():
        path = f"{prefix}{key}"
        found.append(path)
        if isinstance(value, dict) and key not in OPEN_FIELDS:
            found += fields(value, f"{path}.")
    return found


def help_of(python: str, package: str, subcommand: str, cwd: Path) -> str:
    done = subprocess.run(
        [python, "-m", package, subcommand, "--help"], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    return done.stdout


def missing(previous: dict, now: dict, deprecated: set[str]) -> list[str]:
    """What ``previous`` (a release's surface) has that ``now`` lacks and no deprecation names."""
    gone = []
    for part, listed in previous.items():
        for group, names in listed.items() if isinstance(listed, dict) else [("", listed)]:
            have = now.get(part, {}).get(group, []) if isinstance(listed, dict) else now.get(part, [])
            gone += [f"{part} {group} {n}".replace("  ", " ") for n in names if n not in have]
    return [name for name in gone if name.split()[-1] not in deprecated]


def freeze(root: Path, package: str, model_json: dict[str, Path]) -> dict:
    """The surface of the checkout at ``root`` (its kit, its project's defaults), with the fields of
    the given model.json files by kind (``image``, ``text``)."""
    kit_defaults = root / "kit" / "src" / "projkit" / "defaults.yaml"
    defaults = [path for path in (kit_defaults, root / "configs" / "defaults.yaml") if path.is_file()]
    return {
        "api": api_names(root / "kit" / "README.md"),
        "config_keys": config_keys(*defaults),
        "flags": {sub: kit_flags(help_of(sys.executable, package, sub, root)) for sub in SUBCOMMANDS},
        "model_json": {kind: fields(json.loads(path.read_text())) for kind, path in model_json.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Write kit/tests/surface/<version>.json for a release.")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    parser.add_argument("--package", required=True, help="its project's package, for `python -m`")
    parser.add_argument("--model-json", nargs="+", required=True, help="KIND=PATH: image=..., text=...")
    parser.add_argument("--version", required=True)
    args = parser.parse_args()
    out = Path(__file__).with_name("surface") / f"{args.version}.json"
    out.parent.mkdir(exist_ok=True)
    exports = {kind: Path(path) for kind, _, path in (item.partition("=") for item in args.model_json)}
    out.write_text(json.dumps(freeze(args.root, args.package, exports), indent=1) + "\n")
    print(f"Wrote {out}")


if __name__ == "__main__":
    main()
