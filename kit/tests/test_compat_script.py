"""`make test-compat` (kit/scripts/compat.py), the parts that build no environment: the ranges it reads
from the kit's and the project's pyproject.toml, the versions it holds at uv.lock's, what it asks uv
to resolve, and the table it ends with. `make test-compat` itself builds the two environments."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import version
from pathlib import Path

from packaging.markers import Marker

from conftest import KIT, ROOT

spec = importlib.util.spec_from_file_location("compat", KIT / "scripts" / "compat.py")
compat = importlib.util.module_from_spec(spec)
sys.modules["compat"] = compat  # dataclasses look their module up by name
spec.loader.exec_module(compat)

KIT_PYPROJECT = """[project]
name = "projkit"
dependencies = [
    # a comment beside a range
    "Lightning>=2.6.1,<2.7",
    "jsonargparse[signatures]>=4.51,<5",
    "PyYAML",
    "onnxruntime>=1.20 ; platform_machine != 's390x'",
]
"""
PROJECT_PYPROJECT = """[project]
name = "myproject"
dependencies = ["projkit", "lightning>=2.6,<2.7", "torchmetrics>=1.6.2,<2"]

[dependency-groups]
dev = ["pytest>=8.3", "pytest-xdist>=3.6"]
"""
# A lock of two Pythons' worth: torch at one version for 3.10, another above; pytest at one.
LOCK = """version = 1

[[package]]
name = "pytest"
version = "9.2.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "pytest-xdist"
version = "3.8.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "torch"
version = "2.14.1"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version < '3.11'"]

[[package]]
name = "torch"
version = "2.15.0"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version >= '3.12'", "python_full_version == '3.11.*'"]

[[package]]
name = "torchvision"
version = "0.29.2"
source = { registry = "https://pypi.org/simple" }
"""


def checkout(folder: Path) -> Path:
    (folder / "kit").mkdir()
    (folder / "kit" / "pyproject.toml").write_text(KIT_PYPROJECT)
    (folder / "pyproject.toml").write_text(PROJECT_PYPROJECT)
    (folder / "uv.lock").write_text(LOCK)
    return folder


def test_the_ranges_are_read_by_name_without_extras_or_markers_from_the_kit_and_the_project(tmp_path):
    assert compat.declared(checkout(tmp_path)) == {
        "lightning": {"projkit": ">=2.6.1,<2.7", "myproject": ">=2.6,<2.7"},
        "jsonargparse": {"projkit": ">=4.51,<5"},
        "pyyaml": {"projkit": "any"},
        "onnxruntime": {"projkit": ">=1.20"},
        "torchmetrics": {"myproject": ">=1.6.2,<2"},
    }


def test_every_range_the_kit_declares_is_tested():
    ranges = compat.declared(ROOT)
    kit = compat.read_toml(KIT / "pyproject.toml")["project"]["dependencies"]
    for line in kit:
        name, spec = compat.requirement(line)
        assert ranges[name]["projkit"] == spec
    assert "projkit" not in ranges
    assert {"torch", "torchvision", "lightning", "onnxruntime"} <= set(ranges)


def test_the_lock_versions_come_with_the_markers_the_lock_chose_them_under(tmp_path):
    lock = compat.read_toml(checkout(tmp_path) / "uv.lock")
    assert compat.locked(lock, ["torch", "torchvision"]) == [
        "torch==2.14.1 ; (python_full_version < '3.11')",
        "torch==2.15.0 ; (python_full_version >= '3.12') or (python_full_version == '3.11.*')",
        "torchvision==0.29.2",
    ]


def test_the_held_torch_is_the_one_this_environment_runs():
    """uv.lock's torch for this Python, as compat.py hands it to uv, is the torch `make install` put
    here: exactly one of its lines applies, and it names the installed version (its local label, such
    as +cu132, aside)."""
    lock = compat.read_toml(ROOT / "uv.lock")
    for name in compat.HELD:
        lines = compat.locked(lock, [name])
        applying = [line for line in lines if " ; " not in line or Marker(line.split(" ; ")[1]).evaluate()]
        assert len(applying) == 1, lines
        assert applying[0].split(" ; ")[0] == f"{name}=={version(name).split('+')[0]}"


def test_what_uv_resolves_is_the_kit_and_the_project_with_the_test_tools_and_torch_held(tmp_path):
    root = checkout(tmp_path)
    requirements, constraints = compat.inputs(root, root / ".compat")
    assert requirements.read_text().splitlines() == [
        f"-e {root / 'kit'}",
        f"-e {root}",
        "pytest==9.2.0",
        "pytest-xdist==3.8.0",
    ]
    assert constraints.read_text().splitlines()[-1] == "torchvision==0.29.2"
    assert len(constraints.read_text().splitlines()) == 3


def test_the_table_has_a_row_a_dependency_the_held_ones_last_and_each_environments_result():
    ranges = {
        "torch": {"projkit": ">=2.6,<3"},
        "lightning": {"projkit": ">=2.6.1,<2.7", "myproject": ">=2.6,<2.7"},
        "onnx": {"projkit": ">=1.17"},
    }
    lowest = compat.End("lowest", "-e ./kit\nlightning==2.6.1\nonnx==1.17.0\ntorch==2.15.0\n", passed=True)
    lowest.outcome, lowest.seconds = "249 passed in 70.00s (0:01:10)", {"resolve": 4.2, "tests": 71.0}
    newest = compat.End("newest", "Lightning==2.6.6\nonnx==1.21.0\ntorch==2.15.0\n", outcome="1 failed")
    shown = compat.table(ranges, [lowest, newest], "projkit").splitlines()
    assert [line.split() for line in shown[:5]] == [
        ["dependency", "declared", "lowest", "newest"],
        ["lightning", ">=2.6.1,<2.7", "(kit);", ">=2.6,<2.7", "(myproject)", "2.6.1", "2.6.6"],
        ["onnx", ">=1.17", "1.17.0", "1.21.0"],
        ["torch", ">=2.6,<3", "(held", "at", "uv.lock)", "2.15.0", "2.15.0"],
        ["kit's", "fast", "tests", "passed", "FAILED"],
    ]
    assert len({line.index("2.15.0") for line in shown[1:4] if "torch" in line}) == 1
    assert shown[5:] == [
        "lowest: 249 passed in 70.00s (0:01:10) (resolve 4 s, tests 71 s)",
        "newest: 1 failed",
    ]


def test_an_environment_that_could_not_be_resolved_says_why_and_fails():
    end = compat.End("lowest", error="resolve failed: no wheel for Python 3.11")
    shown = compat.table({"onnx": {"projkit": ">=1.17"}}, [end], "projkit").splitlines()
    assert shown[1].split() == ["onnx", ">=1.17", "-"]
    assert shown[2].split()[-1] == "FAILED"
    assert shown[3] == "lowest: resolve failed: no wheel for Python 3.11"
