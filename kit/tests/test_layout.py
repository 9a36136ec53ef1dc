"""A project upgraded from kit 1.0.0 keeps that kit's files outside kit/ (its full defaults, scripts,
docs pages, harness); the first command says once which of them the kit now carries itself."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import DEFAULTS as TINYPROJ_DEFAULTS
from projkit.layout import KIT_DEFAULTS, left_behind, note_left_behind


def project_of_kit_1_0(root: Path) -> Path:
    """A project laid out as kit 1.0.0 left it: the kit's defaults restated in its own, a script,
    a docs page and the copied harness, a Makefile without kit/kit.mk."""
    (root / "configs").mkdir(parents=True)
    defaults = root / "configs" / "defaults.yaml"
    defaults.write_text("seed_everything: 7\n" + KIT_DEFAULTS.read_text())
    for copy in ("scripts/slurm.sbatch", "docs/serving.md", "tests/launch.py"):
        (root / copy).parent.mkdir(exist_ok=True)
        (root / copy).write_text("# the older kit's copy\n")
    (root / "Makefile").write_text("train:\n\tpython -m mine fit\n")
    return defaults


def test_an_older_layout_is_named_once_and_this_template_has_none(tmp_path, capsys):
    defaults = project_of_kit_1_0(tmp_path / "project")
    found = left_behind(tmp_path / "project", defaults)
    assert found[0] == "configs/defaults.yaml (the kit's defaults, restated)"
    assert {"scripts/slurm.sbatch", "docs/serving.md", "tests/launch.py"} <= set(found)
    assert any(item.startswith("Makefile") for item in found)
    for _ in range(2):
        note_left_behind(tmp_path / "project", defaults, stamps=tmp_path)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "kit/CHANGELOG.md, 'Upgrading from 1.0.0'" in said[0], said
    # The owner acts on it: what was removed is not named again.
    shutil.rmtree(tmp_path / "project" / "docs")
    assert "docs/serving.md" not in left_behind(tmp_path / "project", defaults)


def test_a_project_laid_out_as_this_kit_expects_is_told_nothing(tmp_path):
    (tmp_path / "configs").mkdir()
    shutil.copy(TINYPROJ_DEFAULTS, tmp_path / "configs" / "defaults.yaml")
    (tmp_path / "Makefile").write_text("include kit/kit.mk\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_my_net.py").write_text("def test_it(): pass\n")
    assert left_behind(tmp_path, tmp_path / "configs" / "defaults.yaml") == []
