"""`make upgrade-kit` (kit/scripts/upgrade.py) on a template repository of three commits, 1.0.0, a
later commit still at 1.0.0 and 1.1.0, and a project whose kit is that later commit's: which release
it takes, what it refuses, its report when the tests fail after it, and a kill at each of its steps.
No environment is built (uv is a stand-in that runs pytest and marks uv.lock relocked), so it runs
in seconds; test_upgrade.py upgrades real projects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import KIT, ROOT

OWNER_TESTS = """
from pathlib import Path

def test_fails_on_any_kit():
    assert False, "the owner's own failure"

def test_passes_on_the_kit_it_was_written_for():
    assert "1.0.0 later" in Path("kit/src/feature.py").read_text()
"""
# uv as the upgrade calls it: `lock` adds a line to uv.lock, `sync` does nothing, `run ... pytest
# ARGS` runs pytest.
FAKE_UV = f"""#!/bin/sh
case "$1" in
  run) shift; while [ "${{1#--}}" != "$1" ]; do shift; done; shift; exec {sys.executable} -m pytest "$@";;
  lock) echo relocked >> uv.lock;;
  *) exit 0;;
esac
"""
SCRIPTS = ("upgrade.py", "upgrade_steps.py", "upgrade_swap.py")


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
    for script in SCRIPTS:
        shutil.copy(KIT / "scripts" / script, kit / "scripts" / script)
    shutil.copy(KIT / "kit.mk", kit / "kit.mk")
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
    (project / "Makefile").write_text(
        f"check:\n\t{sys.executable} -m pytest -p no:randomly -rfE -q tests\n"
        "failed:  # what `check` says of a failure, without pytest's start (seconds): for the kill test\n"
        "\t@echo FAILED tests/test_owner.py::test_fails_on_any_kit; exit 1\n"
    )
    (project / "uv.lock").write_text("as the project had it\n")
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
    assert done.returncode == 2 and f"FROM={tmp_path / 'nowhere'}: no such folder" in done.stderr
    assert "and this checkout has no remote of that name (its remotes: none)" in done.stderr
    repos["template"] = tmp_path  # a folder, not a repository: git says so
    done = upgrade(repos)
    assert done.returncode == 2 and f"FROM={tmp_path}: git could not fetch" in done.stderr
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
    assert not (repos["project"] / ".kit-upgrade").exists()


# Each boundary between the upgrade's steps, in order (upgrade.py's `reached`), and the kit/ a kill
# there leaves: the old one before the swap, the new one after it. "rechecking" is during the run of
# the failed tests on the old kit, which is then in kit/ again.
KILLS = [
    ("extracted", "# 1.0.0 later\n"),
    ("journaled", "# 1.0.0 later\n"),
    ("swapped", "# 1.1.0\n"),
    ("after uv lock", "# 1.1.0\n"),
    ("after uv sync", "# 1.1.0\n"),
    ("rechecking", "# 1.0.0 later\n"),
    ("finishing", "# 1.1.0\n"),
]


@pytest.mark.parametrize(("point", "left"), KILLS, ids=[point for point, _ in KILLS])
def test_a_kill_at_each_step_leaves_a_whole_kit_and_the_next_upgrade_finishes_it(repos, point, left):
    """A real SIGKILL of the upgrade at that point (PROJKIT_UPGRADE_KILL_AT makes it kill itself);
    the rerun starts from the kit and uv.lock the owner had: it prints what changed since 1.0.0,
    relocks once from the lock as it was, and leaves no work folder."""
    killed = upgrade(repos, tests="failed" if point == "rechecking" else "", PROJKIT_UPGRADE_KILL_AT=point)
    assert killed.returncode == -9, killed.stderr
    assert kit_says(repos) == left
    done = upgrade(repos)
    assert done.returncode == 0, done.stderr
    if point != "extracted":
        assert "An upgrade of kit/ from 1.0.0 to 1.1.0 was stopped before it finished" in done.stdout
    assert "projkit 1.0.0 -> 1.1.0" in done.stdout and "Add `preprocessing`." in done.stdout
    assert kit_says(repos) == "# 1.1.0\n"
    assert (repos["project"] / "uv.lock").read_text() == "as the project had it\nrelocked\n"
    assert not (repos["project"] / ".kit-upgrade").exists()


def test_where_folders_cannot_be_exchanged_make_puts_back_the_kit_a_kill_left_aside(repos):
    """The swap in two renames (as on a file system without an exchange), killed between them: no
    kit/, so `include kit/kit.mk` has nothing to include; the template's Makefile puts kit/ back, and
    the same `make upgrade-kit` goes on to finish the upgrade."""
    killed = upgrade(repos, PROJKIT_UPGRADE_SWAP="renames", PROJKIT_UPGRADE_KILL_AT="aside")
    assert killed.returncode == -9 and not (repos["project"] / "kit").exists()
    shutil.copy(ROOT / "Makefile", repos["project"] / "Makefile")
    done = subprocess.run(
        ["make", "upgrade-kit", f"FROM={repos['template']}", "TESTS=", f"UV={repos['uv']}"],
        cwd=repos["project"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "mv .kit-upgrade/aside kit" in done.stdout and "was stopped before it finished" in done.stdout
    assert kit_says(repos) == "# 1.1.0\n" and not (repos["project"] / ".kit-upgrade").exists()


def test_an_earlier_commit_of_the_same_version_is_a_downgrade_and_says_so(repos):
    refused = upgrade(repos, repos["1.0.0"][:12])
    assert refused.returncode == 2 and "that is a downgrade" in refused.stderr, refused.stderr
    assert f"kit of commit {repos['1.0.0 later'][:12]}, which comes after it" in refused.stderr
    assert "DOWNGRADE=1" in refused.stderr and kit_says(repos) == "# 1.0.0 later\n"
    done = upgrade(repos, repos["1.0.0"], DOWNGRADE="1")
    assert done.returncode == 0 and kit_says(repos) == "# 1.0.0\n"
    assert "Downgraded (DOWNGRADE=1)" in done.stdout and "What changed" not in done.stdout


# Links in a fetched kit that leave kit/ (to an absolute path, above it, through another link), and
# the refusal's reason.
LEAVING = [
    ({"etc": "/etc/hostname"}, "kit/src/etc is a link to /etc/hostname, which leaves kit/"),
    ({"up": "../../Makefile"}, "kit/src/up is a link to ../../Makefile, which leaves kit/"),
    ({"here": ".", "up": "here/../.."}, "kit/src/up is a link that leaves kit/ through a link"),
]


def test_a_link_that_leaves_kit_is_refused_in_one_line_and_one_inside_it_is_taken(repos):
    template = repos["template"]
    (template / "kit" / "src" / "readme").symlink_to("../CHANGELOG.md")
    inside = commit(template, "a kit with a link inside it")
    assert upgrade(repos, inside).returncode == 0
    assert (repos["project"] / "kit" / "src" / "readme").read_text().startswith("# Changelog")
    for case, (links, said) in enumerate(LEAVING):
        git(template, "checkout", "-q", "--detach", inside)
        for name, target in links.items():
            (template / "kit" / "src" / name).symlink_to(target)
        git(template, "tag", f"case{case}", commit(template, said))  # a tag: fetched with the template
        done = upgrade(repos, f"case{case}")
        assert done.returncode == 2 and done.stderr.splitlines() == [
            f"error: the fetched kit is refused, kit/ is unchanged: {said} (a kit's files stay inside kit/)"
        ], done.stderr
        assert (repos["project"] / "kit" / "src" / "readme").is_symlink(), "kit/ is the one before"
        assert not (repos["project"] / ".kit-upgrade").exists()


def test_a_short_commit_id_is_the_templates_or_named(repos):
    short = repos["1.1.0"][:7]
    done = upgrade(repos, short)
    assert done.returncode == 0 and f"REF={short}: commit {repos['1.1.0'][:12]}" in done.stdout, done.stderr
    own = git(repos["project"], "rev-parse", "--short=8", "HEAD")  # the project's, not the template's
    for ref in (own, "deadbee"):
        refused = upgrade(repos, ref)
        assert refused.returncode == 2, refused.stdout
        assert (
            f"REF={ref}: no commit {ref} in {repos['template']} (on its branches and tags)" in refused.stderr
        )
