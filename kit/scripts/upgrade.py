"""``make upgrade-kit [VERSION=1.1.0 | REF=<ref>] [FROM=<repository>]``: replace this checkout's ``kit/``
with a release of the template's (the newest by default), relock and run the tests.

The kit is replaced whole, never merged: a project never edits it (it subclasses or configures
instead), so an upgrade cannot conflict, and files the new version removed go. A release is the
commit where ``kit/pyproject.toml``'s version changes (its tag ``v<version>`` too, where tags travel),
so any clone of the template can name one. ``FROM`` is a git repository (a URL or a local folder); by
default the remote named ``template``, else ``origin``. A kit that differs from every kit the template
has had at its version, committed or not, is refused (``OVERWRITE=1`` replaces it anyway), as the
upgrade would lose the change. Standard library only: it runs before any environment exists, and
from the kit it replaces, so a fix here reaches a project from its next upgrade on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from upgrade_steps import (
    KIT,
    ROOT,
    Source,
    UpgradeError,
    changes,
    edited_files,
    git,
    kit_tree,
    parse_version,
    replace_kit,
    run_after,
    uncommitted,
    version_at,
)

KEEP_A_CHANGE = (
    "The kit is never edited in place: subclass or configure instead (a subclass in your package named "
    "by class path in a config, or a config key: kit/README.md, 'Never edited in place'), then upgrade; "
    "or replace the kit anyway with OVERWRITE=1 (make upgrade-kit ... OVERWRITE=1), losing the change."
)


def choose(source: Source, ref: str | None, wanted: str | None) -> tuple[str, str]:
    """The commit to take the kit from and how it was chosen: a named version's release, a ref, or
    (neither given) the newest release, never a branch's tip unasked."""
    releases = source.releases()
    if ref and wanted:
        raise UpgradeError("give REF or VERSION, not both")
    if wanted:
        if wanted not in releases:
            known = ", ".join(releases) or "none"
            raise UpgradeError(f"VERSION={wanted}: no such release in {source.name} (its releases: {known})")
        return releases[wanted], f"VERSION={wanted}"
    if ref:
        return source.commit(ref), f"REF={ref}"
    if not releases:
        raise UpgradeError(f"{source.name} has no release (no kit/pyproject.toml version): name a REF=")
    newest = max(releases, key=parse_version)
    return releases[newest], f"the newest release, {newest}"


def check_unedited(source: Source, old: str, overwrite: bool) -> None:
    """Refuse to replace a kit that is none of the template's at its version, committed or not,
    listing what differs: from the release's files, and what git shows uncommitted."""
    tree = kit_tree()
    if source.has_kit(tree):
        return
    release = source.releases().get(old)
    listed = edited_files(release, tree) if release else []
    listed += [line for line in uncommitted() if line not in listed]
    against = (
        f"the template's kit {old} (commit {release[:12]})"
        if release
        else f"kit {old}, which {source.name} never released"
    )
    found = f"kit/ has local changes, which replacing it would lose (against {against}):\n"
    found += "".join(f"  {line}\n" for line in listed)
    if overwrite:
        print(f"warning: {found}OVERWRITE=1: replacing it anyway.", file=sys.stderr)
        return
    raise UpgradeError(f"{found}{KEEP_A_CHANGE}")


def upgrade(args: argparse.Namespace) -> None:
    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        raise UpgradeError(f"{ROOT} is not a git checkout: the upgrade needs git to fetch the kit")
    source = Source.fetch(args.source)
    old = version_at(KIT)
    commit, how = choose(source, args.ref, args.version)
    new = source.version(commit)
    check_unedited(source, old, args.overwrite)  # first: what the owner would lose
    if parse_version(new) < parse_version(old) and not args.downgrade:
        raise UpgradeError(
            f"{how} is projkit {new}, older than this project's {old}: that is a downgrade. "
            "Add DOWNGRADE=1 to take it (make upgrade-kit ... DOWNGRADE=1)."
        )
    old_tree, old_lock = kit_tree(), (ROOT / "uv.lock").read_bytes()
    replace_kit(commit)
    print(f"kit/: projkit {old} -> {new} ({how}: commit {commit[:12]} of {source.name})")
    if parse_version(new) > parse_version(old) and (brought := changes(KIT / "CHANGELOG.md", old)):
        print(f"What changed, and what to do (kit/CHANGELOG.md):\n\n{brought}\n")
    elif parse_version(new) < parse_version(old):
        print(f"Downgraded: what {old} had and {new} lacks is in the CHANGELOG of {old}.")
    run_after(args.tests, old, new, old_tree, old_lock)
    print(
        f"Upgraded the kit to {new}. Review it (git status, git diff --stat), then commit kit/ and uv.lock."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "ref", nargs="?", help="the template's branch, tag or commit (default: newest release)"
    )
    parser.add_argument("--version", help="a release of the kit, e.g. 1.1.0")
    parser.add_argument("--from", dest="source", help="the template's repository (URL or folder)")
    parser.add_argument("--tests", default="test", help="the make target run afterwards ('' for none)")
    parser.add_argument("--overwrite", action="store_true", help="replace a kit/ with local changes")
    parser.add_argument("--downgrade", action="store_true", help="take an older version of the kit")
    args = parser.parse_args(argv)
    args.ref, args.version = args.ref or None, args.version or None
    args.overwrite = args.overwrite or bool(os.environ.get("OVERWRITE"))
    args.downgrade = args.downgrade or bool(os.environ.get("DOWNGRADE"))
    try:
        upgrade(args)
    except UpgradeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
