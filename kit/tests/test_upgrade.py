"""`make upgrade-kit` as owners live: a project made from each earlier release of the template (found
in this repository's history: the commit where kit/pyproject.toml's version changes), renamed, given
its own network, config and test, its seed and early-stopping patience edited, a run killed
mid-epoch, then upgraded to this kit by that release's own `make upgrade-kit`. After it: the run
resumes, the owner's tests fail nowhere the old kit passed, `export` refuses in one line what an old
data module does not state, the kit's pages, examples and scripts are in place, the old layout is
named once, and an edit committed to the kit is refused by the next upgrade."""

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

import projkit
from conftest import ROOT

NEW = "mynet"
FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?\n)```", re.DOTALL)
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
OWN_TEST = """from mynet.nets.my_net import MyNet
import torch


def test_my_net_gives_a_score_per_class():
    assert MyNet(10, (1, 8, 8))(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
"""
# A run killed (SIGKILL) in its first epoch, after its last checkpoint at step 4.
KILLED = """last_checkpoint:
  init_args:
    every_n_train_steps: 4
trainer:
  callbacks+:
    - class_path: projkit.testing.KillAtStep
      init_args: {step: 6}
"""


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def version(text: str) -> tuple[int, ...]:
    return tuple(map(int, re.match(r"(\d+)\.(\d+)\.(\d+)", text).groups()))


def earlier_releases() -> list[tuple[str, str]]:
    """(version, commit) of each release before this kit's version, from this repository's history."""
    if not (ROOT / ".git").exists():
        return []
    found: dict[str, str] = {}
    for commit in git("log", "--reverse", "--format=%H", "--", "kit/pyproject.toml", cwd=ROOT).split():
        shown = subprocess.run(["git", "show", f"{commit}:kit/pyproject.toml"], cwd=ROOT, capture_output=True)
        said = re.search(r'(?m)^version\s*=\s*"(\d+\.\d+\.\d+)"', shown.stdout.decode())
        if said and version(said[1]) < version(projkit.__version__):
            found.setdefault(said[1], commit)
    return list(found.items())


def commit_all(folder: Path, message: str) -> None:
    git("add", "-A", cwd=folder)
    git(
        "-c",
        "user.name=o",
        "-c",
        "user.email=o@example.com",
        "commit",
        "-qm",
        message,
        "--allow-empty",
        cwd=folder,
    )


def this_template(dest: Path) -> Path:
    """This repository with the working tree as its newest commit: the template an owner upgrades from."""
    git("clone", "-q", str(ROOT), str(dest), cwd=ROOT)
    git("rm", "-rqf", ".", cwd=dest)
    listed = git("ls-files", "-co", "--exclude-standard", "-z", cwd=ROOT).split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    commit_all(dest, "the template now")
    return dest


def uv_without_bytecode(folder: Path) -> str:
    """uv, its syncs not compiling every installed file (minutes on 2 cores; nothing here needs it)."""
    real = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    wrapper = folder / "uv"
    wrapper.write_text(
        f'#!/bin/sh\nif [ "$1" = sync ]; then shift; exec {real} sync --no-compile-bytecode "$@"; fi\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


NO_HISTORY = pytest.param(
    "-",
    "-",
    marks=pytest.mark.skip(reason="no earlier release in this checkout's history"),
)


class Owner:
    """A project made from a release, and the commands its owner runs in it."""

    def __init__(self, folder: Path, release: str, uv: str) -> None:
        self.folder, self.uv = folder, uv
        folder.mkdir()
        archive = subprocess.run(["git", "archive", "--format=tar", release], cwd=ROOT, capture_output=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(folder)
        git("init", "-q", cwd=folder)
        self.env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        for name in ("PYTEST_XDIST_WORKER", "PROJ_DEBUG"):  # a user's shell: errors as a user sees them
            self.env.pop(name, None)

    def make(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["make", *args, f"UV={self.uv}"], cwd=self.folder, env=self.env, capture_output=True, text=True,
            timeout=1200,
        )  # fmt: skip
        assert not ok or done.returncode == 0, f"make {args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def run(self, *args: str) -> subprocess.CompletedProcess:
        python = str(self.folder / ".venv" / "bin" / "python")
        return subprocess.run(
            [python, *args], cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=600
        )

    def live_in(self) -> None:
        """Rename, add a network, an experiment and a test of one's own, edit the seed and the
        patience in configs/defaults.yaml (as the README says an owner may), commit."""
        self.make("rename", f"NAME={NEW}")
        for block in FILE_BLOCK.finditer((self.folder / "README.md").read_text()):
            if block["path"].endswith(("my_net.py", "my_experiment.yaml")):
                (self.folder / block["path"]).write_text(block["body"])
        defaults = self.folder / "configs" / "defaults.yaml"
        text = defaults.read_text()
        edited = re.sub(r"(?m)^seed_everything: 42", "seed_everything: 7", text)
        edited = re.sub(r"(?m)^(\s+patience:) 5\b", r"\1 8", edited)
        assert edited.count("7") > text.count("7") and "patience: 8" in edited
        defaults.write_text(edited)
        (self.folder / "tests" / "test_my_net.py").write_text(OWN_TEST)
        (self.folder / "configs" / "killed.yaml").write_text(KILLED)
        commit_all(self.folder, "my project")

    def failing(self, ids: list[str]) -> set[str]:
        done = self.run("-m", "pytest", "-p", "no:randomly", "-q", "-rfE", *ids)
        return set(FAILED.findall(done.stdout))


@pytest.mark.slow
@pytest.mark.parametrize(("release", "commit"), earlier_releases() or [NO_HISTORY])
def test_an_owner_of_an_earlier_release_upgrades_to_this_kit(release, commit, tmp_path):
    template = this_template(tmp_path / "template")
    owner = Owner(tmp_path / "project", commit, uv_without_bytecode(tmp_path))
    owner.live_in()
    owner.make("install")
    killed = owner.run("-m", NEW, "fit", "--config", "configs/my_experiment.yaml", "--config",
                       "configs/killed.yaml", "--trainer.enable_progress_bar=false")  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    run = owner.folder / "runs" / "my_experiment" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()

    # The release's own upgrade, as its Makefile has it (REF and FROM: the older scripts need both).
    upgraded = owner.make("upgrade-kit", "REF=HEAD", f"FROM={template}", "TESTS=")
    assert f"-> {projkit.__version__}" in upgraded.stdout, upgraded.stdout[-2000:]
    assert "### Upgrading from" in upgraded.stdout
    same = subprocess.run(
        ["diff", "-r", "-x", "__pycache__", str(template / "kit"), str(owner.folder / "kit")]
    )
    assert same.returncode == 0
    for own in ("src", "configs", "tests", "Makefile", "README.md"):
        assert not git("status", "--porcelain", "--", own, cwd=owner.folder), f"the upgrade changed {own}"

    # The killed run resumes on the new kit; its first command names the old layout, once.
    resumed = owner.run("-m", NEW, "fit", "--config", "configs/my_experiment.yaml", "--ckpt_path", "last",
                        "--trainer.max_epochs=2", "--trainer.enable_progress_bar=false")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stderr.count("note: kit ") == 1 and "'Upgrading from 1.0.0'" in resumed.stderr
    assert not (run.parent / "version_1").exists(), "the resume trained in the run it resumed"
    assert re.search(r"Test metrics: test/acc ([\d.]+)", resumed.stderr)

    # Its data module predates `preprocessing`: export refuses in one line rather than guessing.
    exported = owner.run("-m", NEW, "export", "--config", "configs/my_experiment.yaml", "--ckpt_path", "last")
    assert exported.returncode == 2
    refusal = [line for line in exported.stderr.splitlines() if line.startswith("error: ")]
    assert len(refusal) == 1 and "has no `preprocessing`" in refusal[0] and "kit/docs/export.md" in refusal[0]

    # The owner's tests: none fails that passed on the old kit (values the owner edited fail on both).
    tested = owner.make("test-fast", ok=False)
    assert re.search(r"\d+ passed", tested.stdout), tested.stdout[-3000:]
    failed = sorted(set(FAILED.findall(tested.stdout)))
    assert "tests/test_my_net.py::test_my_net_gives_a_score_per_class" not in failed
    if failed:
        git("stash", "push", "-u", "-q", cwd=owner.folder)
        owner.make("install")
        assert owner.failing(failed) == set(failed), f"passed on {release}, fail on the new kit: {failed}"
        git("stash", "pop", "-q", cwd=owner.folder)
        owner.make("install")

    # The kit's pages, examples and scripts came with it.
    for carried in ("docs/serving.md", "examples/preprocess.py", "scripts/slurm.sbatch", "kit.mk"):
        assert (owner.folder / "kit" / carried).is_file(), carried

    # The next upgrade (this kit's own script now) refuses an edit committed to the kit.
    commit_all(owner.folder, "the kit upgraded")
    edited = owner.folder / "kit" / "src" / "projkit" / "optim.py"
    edited.write_text(edited.read_text() + "# my change\n")
    commit_all(owner.folder, "an edit to the kit")
    refused = subprocess.run(
        [sys.executable, "kit/scripts/upgrade.py", "HEAD", "--from", str(template), "--tests", ""],
        cwd=owner.folder, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "M kit/src/projkit/optim.py" in refused.stderr, refused.stderr
    assert edited.read_text().endswith("# my change\n")
