"""``make upgrade-kit REF=<ref> [FROM=<repository>]``: replace this checkout's ``kit/`` with the one at
``REF`` of the template's repository, relock and run the tests.

The kit is replaced whole, never merged: a project never edits it (it subclasses or configures
instead), so there is nothing of the project's to keep in it, an upgrade cannot conflict, and files the
new version removed go. ``FROM`` is a git repository (a URL or a local folder); by default the remote
named ``template``, else ``origin``. A kit with local changes is refused, as the upgrade would lose
them. Standard library only: it runs before any environment exists, and from the kit it replaces.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "kit"


class UpgradeError(RuntimeError):
    """The upgrade cannot go ahead; the message says why and what to do."""


def git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)


def default_source() -> str:
    remotes = git("remote").stdout.decode().split()
    for name in ("template", "origin"):
        if name in remotes:
            return name
    raise UpgradeError(
        "no FROM given and this checkout has no remote named `template` or `origin`: name the template's "
        "repository, e.g. make upgrade-kit REF=main FROM=https://github.com/<owner>/<template>.git"
    )


def kit_archive(ref: str, source: str) -> bytes:
    """The ``kit/`` folder at ``ref`` of ``source`` as a tar archive."""
    if Path(source).is_dir():
        listed = git("archive", "--format=tar", ref, "kit", cwd=Path(source))
    else:
        fetched = git("fetch", "--no-tags", "--quiet", source, ref)
        if fetched.returncode != 0:
            said = fetched.stderr.decode().strip().splitlines()
            raise UpgradeError(
                f"REF={ref} FROM={source}: git could not fetch it ({said[-1] if said else ''})"
            )
        listed = git("archive", "--format=tar", "FETCH_HEAD", "kit")
    if listed.returncode != 0:
        said = listed.stderr.decode().strip().splitlines()
        raise UpgradeError(
            f"REF={ref} FROM={source}: no kit/ there ({said[-1] if said else 'git archive failed'}). "
            "Give a branch, tag or commit of the template that has one."
        )
    return listed.stdout


def version(kit: Path) -> str:
    found = re.search(r'(?m)^version\s*=\s*"([^"]+)"', (kit / "pyproject.toml").read_text(encoding="utf-8"))
    return found[1] if found else "unknown"


def changes(changelog: Path, old: str) -> str:
    """The CHANGELOG's sections newer than ``old``: what this upgrade brings."""
    if not changelog.is_file():
        return ""
    text = changelog.read_text(encoding="utf-8")
    sections = re.split(r"(?m)^(?=## )", text)
    newer = []
    for section in sections[1:]:
        if re.match(rf"## \[?{re.escape(old)}\]?\b", section):
            break
        newer.append(section.rstrip())
    return "\n\n".join(newer)


def replace_kit(archive: bytes) -> None:
    """Swap the new kit in beside the old one, then drop the old: an interrupted upgrade leaves one
    whole kit, which ``git status`` shows."""
    with tempfile.TemporaryDirectory(dir=ROOT, prefix=".kit-upgrade-") as work:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            # The "data" filter (no links out, no devices) where this Python has it.
            tar.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        new = Path(work) / "kit"
        if not (new / "pyproject.toml").is_file():
            raise UpgradeError("the archive holds no kit/pyproject.toml: not a version of the kit")
        old = Path(work) / "old"
        os.replace(KIT, old)
        os.replace(new, KIT)


def upgrade(ref: str, source: str | None, tests: str | None) -> None:
    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        raise UpgradeError(f"{ROOT} is not a git checkout: the upgrade needs git to fetch the kit")
    edited = git("status", "--porcelain", "--", "kit").stdout.decode().strip()
    if edited:
        raise UpgradeError(
            "kit/ has local changes, which replacing it would lose:\n"
            f"{edited}\nThe kit is never edited in place: move the change into your package (subclass or "
            "configure, kit/README.md), or commit it elsewhere, then upgrade. `git diff -- kit` shows it."
        )
    source = source or default_source()
    old = version(KIT)
    replace_kit(kit_archive(ref, source))
    new = version(KIT)
    print(f"kit/: projkit {old} -> {new} (REF={ref} FROM={source})")
    if brought := changes(KIT / "CHANGELOG.md", old):
        print(f"What changed (kit/CHANGELOG.md):\n\n{brought}\n")
    uv = os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    for step in ([uv, "lock"], [uv, "sync", "--locked"], *([["make", tests]] if tests else [])):
        print("+", " ".join(step), flush=True)
        if subprocess.run(step, cwd=ROOT).returncode != 0:
            raise UpgradeError(
                f"`{' '.join(step)}` failed after the upgrade to {new}. To go back to {old}: "
                "git checkout -- kit uv.lock && git clean -fdq kit && make install"
            )
    print(
        f"Upgraded the kit to {new}. Review it (git status, git diff --stat), then commit kit/ and uv.lock."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the template's branch, tag or commit to take the kit from")
    parser.add_argument("--from", dest="source", help="the template's repository (URL or folder)")
    parser.add_argument("--tests", default="test", help="the make target run afterwards ('' for none)")
    args = parser.parse_args(argv)
    try:
        upgrade(args.ref, args.source, args.tests or None)
    except UpgradeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
