"""``make upgrade-kit [VERSION=1.1.0 | REF=<ref>] [FROM=<repository>]``: replace this checkout's ``kit/``
with a release of the template's (the newest by default), relock and run the tests.

The kit is replaced whole, never merged: a project never edits it (it subclasses or configures
instead), so an upgrade cannot conflict, and files the new version removed go. A release is the
commit where ``kit/pyproject.toml``'s version changes (its tag ``v<version>`` too, where tags travel),
so any clone of the template can name one. ``FROM`` is a git repository (a URL or a local folder); by
default the remote named ``template``, else ``origin``. A kit that differs from every kit the template
has had at its version, committed or not, is refused (``OVERWRITE=1`` replaces it anyway), as the
upgrade would lose the change; so is an older kit (``DOWNGRADE=1`` takes it). A kill at any moment
leaves the old kit or the new one, and the next run finishes the upgrade (upgrade_swap.py). Standard
library only: it runs before any environment exists, and from the kit it replaces, so a fix here
reaches a project from its next upgrade on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from upgrade_steps import (
    Source,
    UpgradeError,
    changes,
    edited_files,
    extract,
    git,
    kit_tree,
    parse_version,
    run_after,
    uncommitted,
    version_at,
)
from upgrade_swap import (
    INCOMING,
    KIT,
    LOCK,
    ROOT,
    Journal,
    exchange,
    finish,
    reached,
    recover,
    tidy,
    write_atomic,
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


def check_unedited(source: Source, tree: str, old: str, overwrite: bool) -> None:
    """Refuse to replace a kit that is none of the template's at its version, committed or not,
    listing what differs: from the release's files, and what git shows uncommitted."""
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


def check_older(source: Source, start: Journal, commit: str, new: str, how: str, downgrade: bool) -> bool:
    """Whether the kit goes back: an older version, or the same version's earlier commit (a project
    on a branch's tip asking for the newest release). Refused unless DOWNGRADE=1."""
    by_version = parse_version(new) < parse_version(start.old)
    first = None if by_version else source.older(commit, start.tree)
    if not (by_version or first):
        return False
    if not downgrade:
        after = f" (kit of commit {first[:12]}, which comes after it)" if first else ""
        raise UpgradeError(
            f"{how} is projkit {new} (commit {commit[:12]}), older than this project's {start.old}{after}: "
            "that is a downgrade. Add DOWNGRADE=1 to take it (make upgrade-kit ... DOWNGRADE=1)."
        )
    return True


def starting_point(tree: str) -> tuple[Journal, bytes]:
    """The kit and lock the upgrade starts from: as they are (``tree``: kit/ now), or, where a run
    was killed, as they were before it, so that this run does what that one would have done."""
    interrupted = recover()
    if interrupted is None:
        return Journal(version_at(KIT), tree, ""), LOCK.read_bytes()
    print(
        f"An upgrade of kit/ from {interrupted.old} to {interrupted.to} was stopped before it finished: "
        f"this one starts from {interrupted.old} and its uv.lock again."
    )
    return interrupted, Journal.lock()


def swap_in(commit: str, start: Journal, new: str, lock: bytes) -> None:
    """``commit``'s kit at kit/, and the lock the upgrade started from (relocked next), the journal
    written before either changes."""
    incoming = extract(commit, INCOMING)
    reached("extracted")
    Journal(start.old, start.tree, new).write(lock)
    reached("journaled")
    write_atomic(LOCK, lock)
    exchange(incoming)
    reached("swapped")
    shutil.rmtree(INCOMING)  # the kit swapped out: git has it (``start.tree``)


def upgrade(args: argparse.Namespace) -> None:
    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        raise UpgradeError(f"{ROOT} is not a git checkout: the upgrade needs git to fetch the kit")
    source = Source.fetch(args.source)
    tree = kit_tree()
    start, lock = starting_point(tree)
    commit, how = choose(source, args.ref, args.version)
    new = source.version(commit)
    check_unedited(source, tree, start.old, args.overwrite)  # first: what the owner would lose
    older = check_older(source, start, commit, new, how, args.downgrade)
    swap_in(commit, start, new, lock)
    print(f"kit/: projkit {start.old} -> {new} ({how}: commit {commit[:12]} of {source.name})")
    newer = parse_version(new) > parse_version(start.old)
    if older:
        print(f"Downgraded (DOWNGRADE=1): what {start.old} had and {new} lacks: {start.old}'s CHANGELOG.")
    elif newer and (brought := changes(KIT / "CHANGELOG.md", start.old)):
        print(f"What changed, and what to do (kit/CHANGELOG.md):\n\n{brought}\n")
    try:
        run_after(args.tests, start.old, new, start.tree, lock)
    except UpgradeError:
        finish()  # told: kit/ is the new one, and the message says how to go back
        raise
    reached("finishing")
    finish()
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
        tidy()  # what it made before kit/ changed; the journal of a stopped upgrade stays
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
