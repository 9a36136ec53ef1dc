"""The steps of ``make upgrade-kit`` (kit/scripts/upgrade.py): the template's repository and its
releases, the kit's files as git sees them, the fetched kit's files, and the tests after it (the
swap is upgrade_swap.py's). Standard library only."""

from __future__ import annotations

import io
import os
import posixpath
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from upgrade_swap import INCOMING, LOCK, ROOT, exchange, reached, write_atomic

# Where the template's branches and tags are fetched to, apart from the project's own.
NAMESPACE = "refs/projkit-template"
VERSION_LINE = re.compile(r'(?m)^version\s*=\s*"([^"]+)"')
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


class UpgradeError(RuntimeError):
    """The upgrade cannot go ahead; the message says why and what to do."""


def git(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    """git in this checkout, its output as text."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, env=env, input=stdin, text=True)


def last_line(done: subprocess.CompletedProcess) -> str:
    """git's own reason: its first ``fatal:`` or ``error:`` line, else its last."""
    said = done.stderr.strip().splitlines()
    reasons = [line for line in said if line.startswith(("fatal:", "error:"))]
    return (reasons or said or [f"git exited {done.returncode}"])[0 if reasons else -1]


def parse_version(text: str) -> tuple[int, ...]:
    """``1.10.0`` as ``(1, 10, 0)``, so versions compare as numbers; anything else sorts first."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(map(int, found.groups())) if found else (-1,)


def version_at(kit: Path) -> str:
    found = VERSION_LINE.search((kit / "pyproject.toml").read_text(encoding="utf-8"))
    return found[1] if found else "unknown"


@dataclass
class Source:
    """The template's repository, its branches, tags and HEAD fetched under ``NAMESPACE``."""

    name: str

    @classmethod
    def fetch(cls, given: str | None) -> Source:
        name = given or default_source()
        refspecs = [f"+refs/heads/*:{NAMESPACE}/heads/*", f"+refs/tags/*:{NAMESPACE}/tags/*"]
        where = located(name)
        fetched = git("fetch", "--quiet", "--no-tags", "--prune", where, *refspecs, f"+HEAD:{NAMESPACE}/HEAD")
        if fetched.returncode != 0:
            raise UpgradeError(
                f"FROM={name}: git could not fetch the template from it ({last_line(fetched)}). Give its "
                "repository as a URL or folder: make upgrade-kit FROM=https://github.com/<owner>/<template>.git"
            )
        return cls(name)

    def commits(self, *paths: str) -> list[str]:
        """The fetched commits (oldest first) that change ``paths``."""
        listed = git("log", "--reverse", "--topo-order", "--format=%H", f"--glob={NAMESPACE}/*", "--", *paths)
        return listed.stdout.split()

    def version(self, commit: str) -> str:
        shown = git("show", f"{commit}:kit/pyproject.toml")
        if shown.returncode != 0:
            raise UpgradeError(
                f"commit {commit[:12]} of {self.name} has no kit/: not a version of the template"
            )
        found = VERSION_LINE.search(shown.stdout)
        return found[1] if found else "unknown"

    def releases(self) -> dict[str, str]:
        """Each version and its release: the tag ``v<version>`` where it was fetched, else the first
        commit whose kit/pyproject.toml says that version."""
        found: dict[str, str] = {}
        for commit in self.commits("kit/pyproject.toml"):
            shown = git("show", f"{commit}:kit/pyproject.toml")
            version = VERSION_LINE.search(shown.stdout) if shown.returncode == 0 else None
            if version and parse_version(version[1]) != (-1,):
                found.setdefault(version[1], commit)
        for version in found:
            tagged = git("rev-parse", "--verify", "--quiet", f"{NAMESPACE}/tags/v{version}^{{commit}}")
            if tagged.returncode == 0:
                found[version] = tagged.stdout.strip()
        return found

    def commit(self, ref: str) -> str:
        """``ref`` as the template's branch, tag, HEAD or (full or short) commit id: a commit of the
        template's history, never one of this checkout's own."""
        for candidate in (f"{NAMESPACE}/heads/{ref}", f"{NAMESPACE}/tags/{ref}", f"{NAMESPACE}/{ref}"):
            found = git("rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}")
            if found.returncode == 0:
                return found.stdout.strip()
        if re.fullmatch(r"[0-9a-fA-F]{4,40}", ref):
            listed = git("rev-list", f"--glob={NAMESPACE}/*").stdout.split()
            found = [commit for commit in listed if commit.startswith(ref.lower())]
            if len(found) == 1:
                return found[0]
            if found:
                raise UpgradeError(
                    f"REF={ref}: {len(found)} commits of {self.name} start with {ref}; give more digits"
                )
            raise UpgradeError(
                f"REF={ref}: no commit {ref} in {self.name} (on its branches and tags). Name one of its "
                "commits, branches or tags, or a release with VERSION="
            )
        raise UpgradeError(
            f"REF={ref}: no branch, tag or commit of that name in {self.name}. Name one it has, or a "
            "release with VERSION= (no REF and no VERSION takes the newest release)"
        )

    def kit_commits(self, tree: str) -> list[str]:
        """The fetched commits (oldest first) whose kit/ is ``tree`` (a kit/ folder as a git tree)."""
        commits = self.commits("kit")
        asked = "".join(f"{commit}:kit\n" for commit in commits)
        listed = git("cat-file", "--batch-check=%(objectname)", stdin=asked).stdout.split("\n")
        return [commit for commit, kit in zip(commits, listed, strict=False) if kit == tree]

    def has_kit(self, tree: str) -> bool:
        """Whether ``tree`` is the kit of any fetched commit."""
        return bool(self.kit_commits(tree))

    def older(self, commit: str, tree: str) -> str | None:
        """The first commit with the kit ``tree`` where ``commit``'s kit differs and comes before it
        in the template's history (taking it goes back), else None."""
        first = next(iter(self.kit_commits(tree)), None)
        if first is None or git("rev-parse", f"{commit}:kit").stdout.strip() == tree:
            return None
        return first if git("merge-base", "--is-ancestor", commit, first).returncode == 0 else None


def default_source() -> str:
    remotes = git("remote").stdout.split()
    for name in ("template", "origin"):
        if name in remotes:
            return name
    raise UpgradeError(
        "no FROM given and this checkout has no remote named `template` or `origin`: name the template's "
        "repository, e.g. make upgrade-kit FROM=https://github.com/<owner>/<template>.git"
    )


def located(name: str) -> str:
    """``name`` as git fetches it: a remote or a URL as given, a folder made absolute (this script
    runs git in the checkout, not where it was called from); a folder that does not exist is said."""
    remotes = git("remote").stdout.split()
    if name in remotes or re.match(r"[^/]*:", name):  # a remote, a URL or host:path
        return name
    folder = Path(name).expanduser().absolute()
    if not folder.exists():
        raise UpgradeError(
            f"FROM={name}: no such folder ({folder}), and this checkout has no remote of that name (its "
            f"remotes: {', '.join(remotes) or 'none'}). Give the template's repository as a URL, a "
            "folder or a remote: make upgrade-kit FROM=https://github.com/<owner>/<template>.git"
        )
    return str(folder)


def kit_tree() -> str:
    """This checkout's kit/ as it is on disk, committed or not, as a git tree (ignored files left out)."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        for step in (("read-tree", "--empty"), ("add", "-A", "--", "kit"), ("write-tree", "--prefix=kit/")):
            done = git(*step, env=env)
            if done.returncode != 0:
                raise UpgradeError(f"git {step[0]} could not read kit/ ({last_line(done)})")
        return done.stdout.strip()


def edited_files(release: str, tree: str) -> list[str]:
    """What differs between the release's kit and ``tree``: ``M kit/<file>`` lines."""
    listed = git("diff-tree", "-r", "--name-status", f"{release}:kit", tree)
    rows = (line.split("\t", 1) for line in listed.stdout.splitlines())
    return [f"{status} kit/{path}" for status, path in rows]


def uncommitted() -> list[str]:
    """kit/'s changes not committed, as ``M kit/<file>`` lines."""
    listed = git("status", "--porcelain", "--untracked-files=all", "--", "kit").stdout.splitlines()
    return [f"{line[:2].strip().replace('??', 'A')} {line[3:]}" for line in listed]


def leaving(member: tarfile.TarInfo) -> str | None:
    """Why the archive's ``member`` may not be a file of kit/: a path or a link that leaves it, or
    something other than a file, a folder or a link."""
    parts = posixpath.normpath(member.name).split("/")
    if member.name.startswith("/") or parts[0] != "kit" or ".." in parts:
        return f"{member.name} is a path that leaves kit/"
    if member.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
        if member.linkname.startswith("/") or target.split("/")[0] != "kit":
            return f"{member.name} is a link to {member.linkname}, which leaves kit/"
    elif not (member.isfile() or member.isdir()):
        return f"{member.name} is neither a file, a folder nor a link"
    return None


def inside(link: Path, folder: Path) -> bool:
    """Whether ``link``, its links followed, ends in ``folder`` (a loop of links does not)."""
    try:
        return link.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def extract(treeish: str, into: Path) -> Path:
    """The kit/ of ``treeish`` (a commit, or a kit/ folder's tree) as files in ``into``/kit. A link
    or a path that leaves kit/ (or a link through links that does) is refused in one line before
    kit/ changes: after the swap it would read or write the owner's files."""
    commit = git("cat-file", "-t", treeish).stdout.strip() == "commit"
    args = [treeish, "kit"] if commit else ["--prefix=kit/", treeish]
    archive = subprocess.run(["git", "archive", "--format=tar", *args], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise UpgradeError(f"git archive {treeish[:12]}: {archive.stderr.decode(errors='replace').strip()}")
    refused = "the fetched kit is refused, kit/ is unchanged: {} (a kit's files stay inside kit/)"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        members = tar.getmembers()
        if reason := next(filter(None, map(leaving, members)), None):
            raise UpgradeError(refused.format(reason))
        try:
            tar.extractall(into, members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        except (tarfile.TarError, OSError) as error:
            raise UpgradeError(refused.format(error)) from None
    for member in filter(tarfile.TarInfo.issym, members):
        if not inside(into / member.name, into / "kit"):
            raise UpgradeError(refused.format(f"{member.name} is a link that leaves kit/ through a link"))
    if not (into / "kit" / "pyproject.toml").is_file():
        raise UpgradeError("the fetched folder holds no kit/pyproject.toml: not a version of the kit")
    return into / "kit"


def changes(changelog: Path, old: str) -> str:
    """The CHANGELOG's sections newer than ``old``: what this upgrade brings and asks."""
    if not changelog.is_file():
        return ""
    sections = re.split(r"(?m)^(?=## )", changelog.read_text(encoding="utf-8"))
    newer = []
    for section in sections[1:]:
        if re.match(rf"## \[?{re.escape(old)}\]?\b", section):
            break
        newer.append(section.rstrip())
    return "\n\n".join(newer)


def uv() -> str:
    return os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")


def run(step: list[str], echo: bool = True) -> tuple[int, str]:
    """``step`` in the checkout, its output shown as it comes and returned."""
    if echo:
        print("+", " ".join(step), flush=True)
    try:
        done = subprocess.Popen(step, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except FileNotFoundError:
        raise UpgradeError(f"{step[0]}: not found (`make install` puts uv in .tools/bin/uv)") from None
    said = []
    for line in done.stdout:
        print(line, end="", flush=True)
        said.append(line)
    return done.wait(), "".join(said)


def failing_before(failed: list[str], old_tree: str, old_lock: bytes) -> set[str]:
    """Which of ``failed`` (pytest ids) fail on the kit and lock the project had before: kit/ and
    uv.lock are put back for that run, then the new ones again (a kill meanwhile leaves the old
    ones, and the journal, from which the next upgrade starts again)."""
    new_lock = LOCK.read_bytes()
    pytest = [uv(), "run", "--frozen", "--no-sync", "pytest", "-p", "no:randomly", "-q", "-rfE"]
    swapped = extract(old_tree, INCOMING)
    try:
        exchange(swapped)
        try:
            write_atomic(LOCK, old_lock)
            reached("rechecking")
            run([uv(), "sync", "--locked", "--quiet"])
            _, said = run([*pytest, *failed])
        finally:
            exchange(swapped)
    finally:
        write_atomic(LOCK, new_lock)
        shutil.rmtree(INCOMING, ignore_errors=True)
        run([uv(), "sync", "--locked", "--quiet"])
    return set(FAILED.findall(said))


def run_after(tests: str | None, old: str, new: str, old_tree: str, old_lock: bytes) -> None:
    """Relock, install and run ``make <tests>``; a failure names what the upgrade broke apart from
    what was failing before it."""
    back = f"To go back to {old}: git checkout -- kit uv.lock && git clean -fdq kit && make install"
    for step in ([uv(), "lock"], [uv(), "sync", "--locked"]):
        if run(step)[0] != 0:
            raise UpgradeError(f"`{' '.join(step)}` failed after the upgrade to {new}. {back}")
        reached(f"after uv {step[1]}")
    if not tests:
        return
    status, said = run(["make", tests])
    if status == 0:
        return
    failed = sorted(set(FAILED.findall(said)))
    if not failed:
        raise UpgradeError(f"`make {tests}` failed after the upgrade to {new}. {back}")
    print(f"{len(failed)} tests failed on {new}; running them on {old}, the kit before:", flush=True)
    before = failing_before(failed, old_tree, old_lock)
    caused = [test for test in failed if test not in before]
    report = [f"`make {tests}` after the upgrade to {new}:"]
    report += [f"  caused by the upgrade (passed on {old}): {test}" for test in caused]
    report += [f"  failing before it too (on {old}): {test}" for test in failed if test in before]
    if caused:
        raise UpgradeError("\n".join([*report, back]))
    print("\n".join([*report, f"The upgrade caused none of these failures; the kit is {new}."]))
