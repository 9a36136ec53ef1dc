"""`make upgrade-kit` (kit/scripts/upgrade.py) on a template repository of three commits, 1.0.0, a
later commit still at 1.0.0 and 1.1.0, and a project whose kit is that later commit's: which release
it takes, what it refuses, and its report when the tests fail after it. No environment is built (uv
is a stand-in that runs pytest), so it runs in seconds; test_upgrade.py upgrades real projects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import KIT

OWNER_TESTS = """
from pathlib import Path

def test_fails_on_any_kit():
    assert False, "the owner's own failure"

def test_passes_on_the_kit_it_was_written_for():
    assert "1.0.0 later" in Path("kit/src/feature.py").read_text()
"""
# uv as the upgrade calls it: `lock` and `sync` do nothing, `run ... pytest ARGS` runs pytest.
FAKE_UV = f"""#!/bin/sh
case "$1" in
  run) shift; while [ "${{1#--}}" != "$1" ]; do shift; done; shift; exec {sys.executable} -m pytest "$@";;
  *) exit 0;;
esac
"""


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit(folder: Path, message: str) -> str:
    git(folder, "add", "-A")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", message)
    return git(folder, "rev-parse", "HEAD")


def write_kit(folder: Path, version: str, feature: str) -> None:
    kit = folder / "kit"
    (kit / "src").mkdir(parents=True, exist_ok=True)
    (kit / "scripts").mkdir(exist_ok=True)
    for script in ("upgrade.py", "upgrade_steps.py"):
        shutil.copy(KIT / "scripts" / script, kit / "scripts" / script)
    (kit / "pyproject.toml").write_text(f'[project]\nname = "projkit"\nversion = "{version}"\n')
    (kit / "src" / "feature.py").write_text(f"# {feature}\n")
    sections = (
        ["## 1.1.0\n\n### Upgrading from 1.0.0\n\nAdd `preprocessing`.\n"] if version == "1.1.0" else []
    )
    (kit / "CHANGELOG.md").write_text("# Changelog\n\n" + "\n".join([*sections, "## 1.0.0\n\nFirst.\n"]))


@pytest.fixture
def repos(tmp_path: Path) -> dict:
    template, project = tmp_path / "template", tmp_path / "project"
    template.mkdir()
    git(template, "init", "-q")
    shas = {}
    for name, version in (("1.0.0", "1.0.0"), ("1.0.0 later", "1.0.0"), ("1.1.0", "1.1.0")):
        write_kit(template, version, name)
        shas[name] = commit(template, name)
    project.mkdir()
    git(project, "init", "-q")
    git(template, "checkout", "-q", shas["1.0.0 later"], "--", "kit")
    shutil.copytree(template / "kit", project / "kit")
    git(template, "checkout", "-q", "HEAD", "--", "kit")
    (project / "tests").mkdir()
    (project / "tests" / "test_owner.py").write_text(OWNER_TESTS)
    (project / "Makefile").write_text(f"check:\n\t{sys.executable} -m pytest -p no:randomly -rfE -q tests\n")
    (project / "uv.lock").write_text("")
    (project / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")  # as a project's has: bytecode
    commit(project, "a project of the kit's later 1.0.0 commit")
    (tmp_path / "uv").write_text(FAKE_UV)
    (tmp_path / "uv").chmod(0o755)
    return {"template": template, "project": project, "uv": tmp_path / "uv", **shas}


def upgrade(repos: dict, *args: str, tests: str = "", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "kit/scripts/upgrade.py", *args, "--from", str(repos["template"]), "--tests", tests],
        cwd=repos["project"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "UV": str(repos["uv"]), **env},
    )  # fmt: skip


def kit_says(repos: dict) -> str:
    return (repos["project"] / "kit" / "src" / "feature.py").read_text()


def test_no_ref_takes_the_newest_release_and_prints_what_to_do(repos):
    done = upgrade(repos)
    assert done.returncode == 0, done.stderr
    assert f"projkit 1.0.0 -> 1.1.0 (the newest release, 1.1.0: commit {repos['1.1.0'][:12]}" in done.stdout
    assert "### Upgrading from 1.0.0\n\nAdd `preprocessing`." in done.stdout
    assert "## 1.0.0" not in done.stdout  # the sections since the project's version only
    assert kit_says(repos) == "# 1.1.0\n"


def test_a_release_by_version_and_a_downgrade_only_when_asked(repos):
    assert upgrade(repos, "--version", "1.1.0").returncode == 0
    refused = upgrade(repos, "--version", "1.0.0")
    assert (
        refused.returncode == 2 and "older than this project's 1.1.0: that is a downgrade" in refused.stderr
    )
    assert "DOWNGRADE=1" in refused.stderr and kit_says(repos) == "# 1.1.0\n"
    assert upgrade(repos, "--version", "1.0.0", DOWNGRADE="1").returncode == 0
    assert kit_says(repos) == "# 1.0.0\n"  # the release: the first commit at that version


def test_unknown_names_are_said(repos, tmp_path):
    for args, said in (
        (("--version", "9.9.9"), "VERSION=9.9.9: no such release in"),
        (("nosuch",), "REF=nosuch: no branch, tag or commit of that name"),
        (("--version", "1.1.0", "main"), "give REF or VERSION, not both"),
    ):
        done = upgrade(repos, *args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
    repos["template"] = tmp_path / "nowhere"
    done = upgrade(repos)
    assert done.returncode == 2 and f"FROM={tmp_path / 'nowhere'}: git could not fetch" in done.stderr
    assert "does not appear to be a git repository" in done.stderr


@pytest.mark.parametrize("committed", [False, True])
def test_an_edited_kit_is_refused_committed_or_not_unless_overwritten(repos, committed):
    edited = repos["project"] / "kit" / "src" / "feature.py"
    edited.write_text("# my change\n")
    if committed:
        commit(repos["project"], "an edit to the kit")
    done = upgrade(repos)
    assert done.returncode == 2
    assert (
        "kit/ has local changes, which replacing it would lose (against the template's kit 1.0.0"
        in done.stderr
    )
    assert "M kit/src/feature.py" in done.stderr
    assert "subclass or configure" in done.stderr and "OVERWRITE=1" in done.stderr
    assert edited.read_text() == "# my change\n"
    assert upgrade(repos, OVERWRITE="1").returncode == 0 and kit_says(repos) == "# 1.1.0\n"


@pytest.mark.slow
def test_failing_tests_are_told_apart_as_caused_by_the_upgrade_or_failing_before(repos):
    done = upgrade(repos, tests="check")
    assert done.returncode == 2, done.stdout
    assert (
        "caused by the upgrade (passed on 1.0.0): tests/test_owner.py::test_passes_on_the_kit" in done.stderr
    )
    assert "failing before it too (on 1.0.0): tests/test_owner.py::test_fails_on_any_kit" in done.stderr
    assert kit_says(repos) == "# 1.1.0\n", "the kit is the new one again after the check on the old"
    assert not list(repos["project"].glob(".kit-upgrade-*"))
