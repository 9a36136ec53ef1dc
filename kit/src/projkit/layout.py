"""A project upgraded from an older kit keeps the files that older kit had it carry (its full defaults,
scripts, docs pages, deploy examples, test harness), as the upgrade replaces ``kit/`` only. They
still work beside this kit; the first command after the upgrade says once, in one line, which of them
the kit now carries itself, so the owner may remove or move them. Imports neither torch nor Lightning.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import yaml

import projkit

# What kit 1.1.0 took into kit/: a project's copy of any of these is left from an older kit.
MOVED = {
    "scripts": ("cluster.sh", "slurm.sbatch", "sweep.sbatch", "torchrun.sh", "find_python.sh", "rename.py"),
    "examples": ("preprocess.py", "classify_image.py", "predict_pt2.py", "generate_text.py"),
    "docs": (
        "serving.md",
        "resuming.md",
        "sweeps.md",
        "export.md",
        "loggers.md",
        "clusters.md",
        "benchmarks.md",
    ),
    "tests": ("launch.py",),
}
# The trainer settings, logger and standard callbacks every project starts from; they ship and upgrade
# with the kit, and the project's defaults file, read after, holds only what the project sets.
KIT_DEFAULTS = Path(projkit.__file__).with_name("defaults.yaml")


def left_behind(root: Path, defaults: Path) -> list[str]:
    """The older kit's files in the project at ``root``: what this kit now carries itself."""
    found = [
        f"{folder}/{name}"
        for folder, names in MOVED.items()
        for name in names
        if (root / folder / name).is_file()
    ]
    try:
        own = yaml.safe_load(defaults.read_text(encoding="utf-8")) or {}
        kits = yaml.safe_load(KIT_DEFAULTS.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return found
    restated = [key for key in kits if isinstance(own, dict) and own.get(key) == kits[key]]
    if len(restated) > len(kits) // 2:
        found.insert(0, f"{defaults.relative_to(root)} (the kit's defaults, restated)")
    makefile = root / "Makefile"
    if makefile.is_file() and "kit/kit.mk" not in makefile.read_text(encoding="utf-8", errors="replace"):
        found.append("Makefile (the kit's targets are in kit/kit.mk: include it)")
    return found


def note_left_behind(root: Path, defaults: Path, stamps: Path | None = None) -> None:
    """Say once per kit version and environment (a stamp in ``stamps``, the environment's folder by
    default) what the project may now remove."""
    stamp = Path(stamps or sys.prefix) / f".projkit-layout-noted-{projkit.__version__}"
    if stamp.exists() or not (found := left_behind(root, defaults)):
        return
    print(
        f"note: kit {projkit.__version__} now carries these itself, so this project's copies may be "
        f"removed or moved: {', '.join(found)}. See kit/CHANGELOG.md, 'Upgrading from 1.0.0'.",
        file=sys.stderr,
    )
    with contextlib.suppress(OSError):  # a read-only environment: said again next time
        stamp.touch()
