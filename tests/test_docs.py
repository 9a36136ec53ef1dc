"""The README and docs/, and the kit's pages (kit/README.md, kit/docs/), stay true: every relative
link resolves (the file, and an ``#anchor`` to one of its headings as GitHub names them), and every
``python -m proj …`` line of their bash blocks is one the CLI accepts (the kit's pages write it
``python -m <package> …``: the kit names no project)."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import types
from pathlib import Path

import pytest

from conftest import ROOT

KIT_PAGES = [ROOT / "kit" / "README.md", *sorted((ROOT / "kit" / "docs").glob("*.md"))]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *KIT_PAGES]
FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
# A fenced block right after `<!-- file: PATH -->` is the whole content of the file at PATH.
FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?\n)```", re.S)


def prose(text: str) -> str:
    """The page without its code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation dropped, spaces
    as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", page.read_text()), re.M):
        name, n = slug(heading), 1
        while name in found:  # GitHub numbers a repeated heading: name-1, name-2, ...
            name, n = f"{slug(heading)}-{n}", n + 1
        found.add(name)
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading '#{anchor}' in {file.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path):
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## A `code` heading: twice\n\n## A `code` heading: twice\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-code-heading-twice-1) [ok](#page) [gone](missing.md) [typo](other.md#other-pag)\n"
        "`[not a link](nowhere.md)`\n\n# Page\n\n```bash\n[x](inside-code.md)\n```\n"
    )
    assert broken_links(page) == [
        f"missing.md: no file {tmp_path / 'missing.md'}",
        "other.md#other-pag: no heading '#other-pag' in other.md",
    ]


def code_blocks(page: Path, language: str) -> list[str]:
    """The page's fenced blocks of ``language`` (``bash``, ``python``), in order, as written."""
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.M | re.S)


def bash_lines(block: str) -> list[str]:
    """A bash block's lines as the shell reads them: a line ending in a backslash joined to the next."""
    return block.replace("\\\n", " ").splitlines()


def proj_commands() -> list[tuple[str, dict[str, str], list[str]]]:
    """Each ``python -m proj`` line of the pages' bash blocks (``python -m <package>`` on the kit's
    pages): (where, environment, arguments)."""
    commands = []
    for page in PAGES:
        package = "<package>" if page in KIT_PAGES else "proj"
        for block in code_blocks(page, "bash"):
            for line in bash_lines(block):
                words = shlex.split(line, comments=True)
                where = f"{page.relative_to(ROOT)}: {shlex.join(words)}"
                env = {}
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                    name, _, value = words.pop(0).partition("=")
                    env[name] = value
                if words[-1:] == ["&"]:
                    words.pop()
                if words[:3] in (["python", "-m", package], ["python3", "-m", package]):
                    if (env, words[3:]) not in [(e, a) for _, e, a in commands]:  # each once
                        commands.append((where, env, words[3:]))
                elif package in words:
                    # the package started some other way, which no check here covers
                    raise AssertionError(f"{where}: not a `python -m {package} …` line")
    return commands


COMMANDS = proj_commands()


def readme_files(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's own files, as its commands expect them: configs written into the working
    folder, modules importable by the names their paths give."""
    for match in FILE_BLOCK.finditer((ROOT / "README.md").read_text()):
        path, body = match["path"], match["body"]
        if path.startswith("configs/"):
            (workdir / path).write_text(body)
        else:
            name = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
            module = types.ModuleType(name)
            module.__file__ = str(ROOT / path)
            exec(compile(body, path, "exec"), module.__dict__)
            monkeypatch.setitem(sys.modules, name, module)


def option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
    return None


def refusal(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """Run ``proj.main(args)``; its exit code and what it printed to stderr."""
    from proj import main  # Lightning's import: only for the test that runs commands

    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err


def tail(err: str) -> str:
    """The end of a refusal, where its reason is, without the usage it starts with."""
    return "\n".join(err.strip().splitlines()[-3:])


def check_sweep(where: str, args: list[str], capsys: pytest.CaptureFixture) -> None:
    """``sweep`` is no LightningCLI subcommand and has no --print_config: its options must be ones
    its parser lists, and its config one that the sweep accepts (it is checked before any trial)."""
    from projkit.sweep import load_sweep
    from projkit.sweep import main as sweep

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        sweep(["--help"])
    assert exit_info.value.code == 0
    known = set(re.findall(r"--\w+", capsys.readouterr().out))
    given = [arg.partition("=")[0] for arg in args[1:] if arg.startswith("--")]
    assert set(given) <= known, (
        f"{where}: options {sorted(set(given) - known)} are not sweep's {sorted(known)}"
    )
    load_sweep(option(args, "--config"))
    if (n_trials := option(args, "--n_trials")) is not None:
        assert int(n_trials) > 0, where


def check_serve(where: str, args: list[str], capsys: pytest.CaptureFixture) -> None:
    """``serve`` starts a server: its options must be ones its parser lists; an export folder must
    be where ``export`` writes one; with --config the export it runs first is checked as ``export``
    lines are (as far as looking for the checkpoint)."""
    from projkit.serve import main as serve

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        serve(["--help"])
    assert exit_info.value.code == 0
    known = set(re.findall(r"--\w+", capsys.readouterr().out))
    given = [arg.partition("=")[0] for arg in args[1:] if arg.startswith("--")]
    assert set(given) <= known, f"{where}: options {sorted(set(given) - known)} are not serve's"
    if option(args, "--config") is None:
        assert re.fullmatch(r"runs/\w+/version_\d+/export/\w+", args[1]), where
        return
    code, err = refusal(["export", *args[1:]], capsys)
    assert code == 2 and "no readable checkpoint under" in err, f"{where}\n{tail(err)}"


def test_the_pages_commands_are_found():
    """The commands below are read from the pages: a change to the pages' markup that hid them
    would otherwise leave nothing to check."""
    assert len(COMMANDS) >= 40 and any(args[0] == "sweep" for _, _, args in COMMANDS), COMMANDS


@pytest.mark.slow
@pytest.mark.parametrize(("where", "env", "args"), COMMANDS, ids=[where for where, _, _ in COMMANDS])
def test_each_proj_command_in_the_pages_is_accepted(where, env, args, workdir, monkeypatch, capsys):
    """The line with --print_config added, which parses and checks it and builds nothing. What
    that cannot reach is checked the way the command would meet it: --ckpt_path last or best in an
    empty folder gets as far as looking for the checkpoint (every other check passed), auto there
    starts afresh (one fast_dev_run batch), and a sweep line against the sweep's own parser."""
    shutil.copytree(ROOT / "configs", workdir / "configs")
    readme_files(workdir, monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    keyword = option(args, "--ckpt_path")
    # A file named here would have to exist; the pages name the keywords only.
    assert keyword in (None, "last", "best", "auto"), f"{where}: --ckpt_path {keyword}"
    if args[0] == "sweep":
        check_sweep(where, args, capsys)
    elif args[0] == "serve":
        check_serve(where, args, capsys)
    elif keyword in ("last", "best") and "--print_config" not in args:
        code, err = refusal(args, capsys)
        assert code == 2 and f"--ckpt_path {keyword}: no readable checkpoint under" in err, (
            f"{where}\n{tail(err)}"
        )
    elif keyword == "auto":
        code, err = refusal([*args, "--trainer.fast_dev_run=true"], capsys)
        assert code == 0, f"{where}\n{tail(err)}"
    else:
        code, err = refusal(args if "--print_config" in args else [*args, "--print_config"], capsys)
        assert code == 0, f"{where}\n{tail(err)}"
