"""`make upgrade-kit`: a project made from an earlier version of the template, renamed and given a
network of its own, takes the kit of this version and still tests and trains.

The earlier version is the oldest commit of this repository whose kit has this kit's major version
(semantic versions: within a major version an upgrade breaks no project); this version is the working
tree, as a repository of its own, so that the test tries the kit as it is now, committed or not.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT, copy_repo

FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?\n)```", re.DOTALL)
NEW = "mynet"


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True)
    return done.stdout.decode()


def major(pyproject: str) -> str:
    return re.search(r'(?m)^version\s*=\s*"(\d+)\.', pyproject)[1]


def earliest_kit_of_this_major() -> str:
    """The oldest commit whose kit/pyproject.toml has the working tree's major version (HEAD when the
    history holds no other, as in a shallow clone)."""
    wanted = major((ROOT / "kit" / "pyproject.toml").read_text())
    for commit in git("log", "--reverse", "--format=%H", "--", "kit/pyproject.toml", cwd=ROOT).split():
        shown = subprocess.run(["git", "show", f"{commit}:kit/pyproject.toml"], cwd=ROOT, capture_output=True)
        if shown.returncode == 0 and major(shown.stdout.decode()) == wanted:
            return commit
    return git("rev-parse", "HEAD", cwd=ROOT).strip()


def commit_all(folder: Path, message: str) -> None:
    git("add", "-A", cwd=folder)
    git("-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-qm", message, cwd=folder)


def uv() -> str:
    found = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    if not Path(found).exists():
        pytest.fail("no uv: `make install` puts it in .tools/bin/uv")
    return found


@pytest.mark.slow
def test_a_project_of_an_earlier_version_upgrades_its_kit_and_still_tests_and_trains(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.fail("needs the repository's git history (a checkout, not an export)")
    # This version of the template, as its repository.
    template = copy_repo(tmp_path / "template")
    git("init", "-q", cwd=template)
    commit_all(template, "the template now")
    # A project cloned from the earlier version: renamed, with its own network and experiment.
    old = earliest_kit_of_this_major()
    project = tmp_path / "project"
    project.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", old], cwd=ROOT, capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(project)
    git("init", "-q", cwd=project)
    env = {**os.environ, "UV_COMPILE_BYTECODE": "0"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)

    def make(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["make", *args, f"UV={uv()}"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"make {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    make("rename", f"NAME={NEW}")
    for match in FILE_BLOCK.finditer((project / "README.md").read_text()):
        if match["path"].endswith(("my_net.py", "my_experiment.yaml")):
            (project / match["path"]).write_text(match["body"])
    assert (project / "src" / NEW / "nets" / "my_net.py").is_file()
    commit_all(project, "my project, made from the template's earlier version")
    kit_before = git("rev-parse", "HEAD:kit", cwd=project).strip()

    upgraded = make("upgrade-kit", "REF=HEAD", f"FROM={template}", "TESTS=test-fast", timeout=1500)
    assert "kit/: projkit" in upgraded.stdout and "Upgraded the kit" in upgraded.stdout
    # The project's tests (its edit loop, `make test-fast`) passed on the new kit; its kit is this one.
    assert re.search(r"\d+ passed", upgraded.stdout), upgraded.stdout[-2000:]
    same = subprocess.run(["diff", "-r", "-x", "__pycache__", str(template / "kit"), str(project / "kit")])
    assert same.returncode == 0
    if old != git("rev-parse", "HEAD", cwd=ROOT).strip():
        assert git("rev-parse", "HEAD:kit", cwd=project).strip() == kit_before  # not committed by itself
    # And the project's own experiment trains on it.
    fit = subprocess.run(
        [str(project / ".venv" / "bin" / "python"), "-m", NEW, "fit", "--config",
         "configs/my_experiment.yaml", "--trainer.max_epochs=3", "--trainer.enable_progress_bar=false"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    accuracy = float(re.search(r"Test metrics: test/acc ([\d.]+)", fit.stderr)[1])
    assert accuracy > 0.5, fit.stderr[-1000:]


def test_an_edited_kit_is_refused_and_kept(tmp_path):
    """The kit is replaced whole, so local edits to it would be lost: the upgrade refuses, changing
    nothing, and says where such a change belongs."""
    project = copy_repo(tmp_path / "project")
    git("init", "-q", cwd=project)
    commit_all(project, "a project")
    edited = project / "kit" / "src" / "projkit" / "optim.py"
    edited.write_text(edited.read_text() + "# my change\n")
    done = subprocess.run(
        [sys.executable, "kit/scripts/upgrade.py", "HEAD", "--from", str(ROOT), "--tests", ""],
        cwd=project, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "error: kit/ has local changes" in done.stderr and "kit/src/projkit/optim.py" in done.stderr
    assert "subclass or configure" in done.stderr
    assert edited.read_text().endswith("# my change\n")
