"""The names fuzzer: names and paths that become a run's folders and files (a logger's ``name``,
``version`` and ``sub_dir``, a checkpoint's ``filename`` and ``dirpath``), drawn from letters,
separators, dots, ``~`` and ``$``, control and invisible characters (a newline, U+200B, U+202E), a
byte that is not UTF-8 and long runs. Each is either refused in one line naming its key, or leads
to one plain file or folder inside ``runs/`` that YAML holds and reads back. And any file name,
bytes that are not UTF-8 included, becomes text every file the kit writes can hold (``printable``).

The CLI's checks of a parsed config run on each (``ProjectCLI.check_config``, a tenth of a second);
seeded (``derandomize``); ``PROJ_FUZZ_EXAMPLES`` sets the number of cases (``make fuzz`` runs many
more).
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from projkit import strict_yaml
from projkit.cli import ProjectCLI
from projkit.data.names import printable
from projkit.testing import config

EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "500")) // 5
KEYS = [
    "trainer.logger.init_args.name",
    "trainer.logger.init_args.version",
    "trainer.logger.init_args.sub_dir",
    "checkpoint.init_args.filename",
    "last_checkpoint.init_args.dirpath",
]
PIECES = [
    "a", "digits", "é", "日本", "🙂", " ", "-", "_", ".", "..", "/", "\\", "~", "$HOME", "${X}", "{epoch}",
    "\n", "\t", "\r", "\0", "\x1b", "\u200b", "\u202e", "\ufeff", "\u2028", os.fsdecode(b"\xe9"), "n" * 120,
]  # fmt: skip
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> ProjectCLI:
    """The classify experiment's CLI, parsed and built once (``run=False``), in a folder of its own."""
    folder = tmp_path_factory.mktemp("names")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        built = ProjectCLI(args=["--config", config("classify.yaml")], run=False)
    built.folder = folder
    return built


def plain(name: str) -> bool:
    """One file name that every listing shows, every file system takes and YAML reads back."""
    shown = all(unicodedata.category(char)[0] not in "CZ" or char == " " for char in name)
    single = name.strip(". ") != "" and "/" not in name and "\\" not in name
    fits = len(name.encode("utf-8")) <= 255
    return shown and single and fits and strict_yaml.load(yaml.safe_dump({"k": name}))["k"] == name


@pytest.mark.slow
def test_fuzz_names_of_a_runs_files(cli, capsys, monkeypatch):
    monkeypatch.chdir(cli.folder)
    monkeypatch.delenv("PROJ_DEBUG")
    refused = []

    @SETTINGS
    @given(key=st.sampled_from(KEYS), pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=4))
    def case(key: str, pieces: list[str]) -> None:
        name = "".join(pieces)
        parsed = cli.config.clone()
        parsed.update(name, key)
        try:
            cli.check_config(parsed, cli.parser, "fit")
        except SystemExit as exit:
            assert exit.code == 2
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if line.startswith("error: ")]
            assert len(lines) == 1 and "Traceback" not in err, err
            assert key.split(".")[0] in lines[0] and key.split(".")[-1] in lines[0], lines[0]
            refused.append(name)
            return
        capsys.readouterr()
        runs = (cli.folder / "runs").resolve()
        if key.endswith("dirpath"):
            assert (cli.folder / os.path.expandvars(name)).resolve().is_relative_to(runs), name
        else:
            template_free = name.replace("{epoch}", "0")
            assert plain(template_free), f"{key}={name!r} was taken"
            assert (runs / template_free).resolve().parent == runs

    case()
    assert refused, "no name was refused"


@pytest.mark.slow
@SETTINGS
@given(name=st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_fuzz_any_file_name_becomes_text_every_file_holds(name: bytes):
    """A name the file system gives (bytes, decoded as Python decodes them) as it reaches a config, a
    checkpoint's hyperparameters or predictions.csv."""
    text = printable(os.fsdecode(name))
    text.encode("utf-8")  # no lone surrogate left
    assert strict_yaml.load(yaml.safe_dump({"classes": [text]}))["classes"] == [text]
    if name.decode("utf-8", "replace").encode("utf-8") == name:
        assert text == os.fsdecode(name), "a UTF-8 name is kept as it is"


def test_a_few_names_quickly(cli, capsys, monkeypatch):
    """A few names of each sort, in `make test-fast`: one refused per sort, a plain one taken."""
    monkeypatch.chdir(cli.folder)
    monkeypatch.delenv("PROJ_DEBUG")
    for name, refused in [("digits_é", False), ("a\u200bb", True), ("../x", True), ("n" * 256, True)]:
        parsed = cli.config.clone()
        parsed.update(name, "trainer.logger.init_args.name")
        if refused:
            with pytest.raises(SystemExit):
                cli.check_config(parsed, cli.parser, "fit")
        else:
            cli.check_config(parsed, cli.parser, "fit")
        assert ("error: trainer.logger.init_args.name=" in capsys.readouterr().err) is refused, name
    assert Path(cli.folder).is_dir()
