"""The names fuzzer: names and paths that become a run's folders and files, or that its logs show,
of every logger and callback: CSV's and TensorBoard's ``name``, ``version``, ``sub_dir`` and
``save_dir``; W&B's ``id``, ``version``, ``project``, ``name``, ``group``, ``save_dir`` and ``dir``;
MLflow's ``run_id``, ``experiment_name``, ``run_name``, ``tracking_uri``, ``artifact_location`` and
``save_dir``; ``trainer.default_root_dir``; a checkpoint's ``filename`` and ``dirpath``. They are drawn
from letters, separators (``\\`` too), dots, ``~`` and ``$``, control and invisible characters (a
newline, NUL, U+200B, U+202E), characters that Unicode's NFKC turns into a separator or ``..``, a
byte that is not UTF-8, absolute paths and long runs. Each is either refused in one line naming its
key, exit 2, or taken, and then leads to one plain folder inside ``runs/`` (a folder name), holds
only characters a listing shows (a path or a title); either way nothing is written. And any file
name, bytes that are not UTF-8 included, becomes text every file the kit writes can hold
(``printable``).

The CLI's checks of a parsed config run on each (``ProjectCLI.check_config``, a tenth of a second),
before anything is built; seeded (``derandomize``); ``PROJ_FUZZ_EXAMPLES`` sets the number of cases
(``make fuzz`` runs many more).
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from conftest import main, seeded
from projkit import strict_yaml
from projkit.cli import ProjectCLI
from projkit.data.names import printable
from projkit.testing import config

EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "500")) // 5
SECRET = "s3cret-that-must-not-be-shown"
FOLDER, PATH, TITLE, DIRPATH = "folder", "path", "title", "dirpath"
# Each setting the fuzzer draws: the logger overlay whose config it changes (None: the experiment's
# own, with CSV), its key, and what it becomes: one folder of the run's path, a path anywhere, a
# title, or a checkpoint folder that must lie inside runs/.
FIELDS = [
    *[(None, f"trainer.logger.init_args.{field}", FOLDER) for field in ("name", "version")],
    (None, "trainer.logger.init_args.sub_dir", FOLDER),  # TensorBoard's
    (None, "trainer.logger.init_args.save_dir", PATH),
    (None, "trainer.default_root_dir", PATH),
    (None, "checkpoint.init_args.filename", FOLDER),
    (None, "last_checkpoint.init_args.dirpath", DIRPATH),
    *[("wandb", f"trainer.logger.init_args.{field}", FOLDER) for field in ("id", "version", "project")],
    *[("wandb", f"trainer.logger.init_args.{field}", PATH) for field in ("save_dir", "dir")],
    *[("wandb", f"trainer.logger.init_args.{field}", TITLE) for field in ("name", "group")],
    ("mlflow", "trainer.logger.init_args.run_id", FOLDER),
    *[("mlflow", f"trainer.logger.init_args.{field}", TITLE) for field in ("experiment_name", "run_name")],
    *[
        ("mlflow", f"trainer.logger.init_args.{field}", PATH)
        for field in ("tracking_uri", "artifact_location", "save_dir")
    ],
]
PIECES = [
    "a", "digits", "é", "日本", "🙂", " ", "-", "_", ".", "..", "/", "\\", "~", "$HOME", "${X}", "{epoch}",
    "/tmp", "C:", "\n", "\t", "\r", "\0", "\x1b", "\u200b", "\u202e", "\ufeff", "\u2028",
    os.fsdecode(b"\xe9"), "n" * 120,
    "\uff0f", "\uff3c", "\u2025", "\uff0e", "\ufe68", "\uff5e",  # NFKC: / \\ .. . \\ ~
]  # fmt: skip
SETTINGS = seeded(EXAMPLES)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> ProjectCLI:
    """The classify experiment's CLI, parsed and built once (``run=False``), in a folder of its own
    (``project/`` in a folder that holds nothing else, so that a write beside it is seen), and its
    config with each logger overlay's logger in place of CSV's (``cli.overlays``), as the overlay
    file gives it, over the experiment's ``save_dir`` and ``name``: parsing each again took seconds."""
    folder = tmp_path_factory.mktemp("names") / "project"
    folder.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        built = ProjectCLI(args=["--config", config("classify.yaml")], run=False)
    built.overlays = {}
    for name in ("wandb", "mlflow"):
        trainer = strict_yaml.load(Path(config(f"logger/{name}.yaml")).read_text())["trainer"]
        overlay = built.config.clone()
        overlay.update(trainer["logger"]["class_path"], "trainer.logger.class_path")
        settings = {f"logger.init_args.{k}": v for k, v in trainer.pop("logger")["init_args"].items()}
        for key, value in {**trainer, **settings}.items():
            overlay.update(value, f"trainer.{key}")
        built.overlays[name] = overlay
    built.folder = folder
    return built


def tree(folder: Path) -> list[Path]:
    """Every file and folder in the fuzz's own folder, ``project/``'s parent: what a case wrote."""
    return sorted(folder.parent.rglob("*"))


def plain(name: str) -> bool:
    """One file name that every listing shows, every file system takes and YAML reads back, also
    once Unicode is normalised."""
    normal = unicodedata.normalize("NFKC", name)
    single = all(text.strip(". ") != "" and "/" not in text and "\\" not in text for text in (name, normal))
    fits = len(name.encode("utf-8")) <= 255
    return shown(name) and single and fits and normal.strip() not in ("", ".")


def shown(text: str) -> bool:
    """Text every listing shows as it is, and YAML reads back."""
    visible = all(unicodedata.category(char)[0] not in "CZ" or char == " " for char in text)
    return visible and strict_yaml.load(yaml.safe_dump({"k": text}))["k"] == text


def check(
    cli: ProjectCLI, overlay: str | None, key: str, value: object, capsys, named: str = ""
) -> str | None:
    """The line in which the CLI's checks refuse ``value`` at ``key`` (naming ``named``, by default
    the key, exit 2), or None when they take it; either way, nothing is written."""
    parsed = (cli.overlays[overlay] if overlay else cli.config).clone()
    parsed.update(value, key)
    before = tree(cli.folder)
    try:
        cli.check_config(parsed, cli.parser, "fit")
    except SystemExit as exit:
        assert exit.code == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and "Traceback" not in err, err
        named = named or f"{key.split('.')[0]}.*{key.split('.')[-1]}"
        assert re.search(named, lines[0]), lines[0]
        return lines[0]
    finally:
        assert tree(cli.folder) == before, f"{key}={value!r} wrote {set(tree(cli.folder)) - set(before)}"
    capsys.readouterr()
    return None


@pytest.mark.slow
def test_fuzz_names_of_a_runs_files(cli, capsys, monkeypatch):
    monkeypatch.chdir(cli.folder)
    monkeypatch.delenv("PROJ_DEBUG")
    refused = {}

    @SETTINGS
    @given(field=st.sampled_from(FIELDS), pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=4))
    def case(field: tuple[str | None, str, str], pieces: list[str]) -> None:
        overlay, key, kind = field
        name = "".join(pieces)
        if check(cli, overlay, key, name, capsys) is not None:
            refused.setdefault(field, []).append(name)
            return
        runs = (cli.folder / "runs").resolve()
        if kind == DIRPATH:
            assert (cli.folder / os.path.expandvars(name)).resolve().is_relative_to(runs), name
        elif kind == FOLDER:
            template_free = name.replace("{epoch}", "0")
            assert plain(template_free), f"{key}={name!r} was taken"
            assert (runs / template_free).resolve().parent == runs
        else:  # a path anywhere, or a title (which no path holds)
            assert shown(name), f"{key}={name!r} was taken"
            parts = name.split("/") if kind == PATH else []
            assert all(len(part.encode("utf-8")) <= 255 for part in parts), name

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
    """A few names of each sort, in `make test-fast`: one refused per sort, a plain one taken, for
    each logger's fields."""
    monkeypatch.chdir(cli.folder)
    monkeypatch.delenv("PROJ_DEBUG")
    name, run_id = "trainer.logger.init_args.name", "trainer.logger.init_args.id"
    cases = [
        (None, name, "digits_é", False),
        (None, name, "a\u200bb", True),
        (None, name, "../x", True),
        (None, name, "n" * 256, True),
        ("wandb", run_id, "..", True),  # W&B's run folder: runs/ itself
        ("wandb", run_id, "../../x", True),
        ("wandb", run_id, "\u2025", True),  # TWO DOT LEADER, NFKC: ".."
        ("wandb", run_id, "a1b2c3", False),
        ("wandb", "trainer.logger.init_args.project", "a\uff0fb", True),  # NFKC: "a/b"
        ("wandb", name, "lr 1e-3 / batch 64", False),  # W&B's name is a title
        ("wandb", name, "two\nlines", True),
        ("mlflow", "trainer.logger.init_args.run_id", "..", True),
        ("mlflow", "trainer.logger.init_args.experiment_name", "team/digits", False),  # MLflow's hold /
        ("mlflow", "trainer.logger.init_args.tracking_uri", "sqlite:///runs/a\0b.db", True),
        (None, "trainer.logger.init_args.save_dir", "runs\n", True),
    ]
    for overlay, key, value, refused in cases:
        assert (check(cli, overlay, key, value, capsys) is not None) is refused, (overlay, key, value)
    monkeypatch.setenv("WANDB_RUN_ID", "..")  # W&B's id when the config sets none
    assert check(cli, "wandb", run_id, None, capsys, named="environment variable WANDB_RUN_ID='..'")
    assert Path(cli.folder).is_dir()


def test_a_password_or_key_in_a_logger_setting_is_refused_masked(cli, capsys, monkeypatch):
    """The run's config.yaml repeats the run, so it cannot hold a mask, and W&B and MLflow keep a copy
    of it: a setting that holds a password or key is refused before anything is written, shown
    masked, with the variables that give it instead."""
    monkeypatch.chdir(cli.folder)
    monkeypatch.delenv("PROJ_DEBUG")
    uri, settings = "trainer.logger.init_args.tracking_uri", "trainer.logger.init_args.settings"
    for overlay, key, value, shown in [
        ("mlflow", uri, f"http://ann:{SECRET}@127.0.0.1:9", "=http://ann:***@127.0.0.1:9: holds a password"),
        ("mlflow", uri, f"sqlite:///runs/ml.db?password={SECRET}", "=sqlite:///runs/ml.db?password=***: "),
        ("wandb", settings, {"api_key": SECRET}, "init_args.settings.api_key=***: holds a password"),
    ]:
        line = check(cli, overlay, key, value, capsys)
        assert line is not None and shown in line and SECRET not in line, line
        assert "MLFLOW_TRACKING_PASSWORD" in line and "WANDB_API_KEY" in line, line


def test_a_wandb_run_id_out_of_runs_is_refused_before_anything_is_written(workdir, monkeypatch, capsys):
    """W&B names the run's folder by its id: ``../../x`` was a folder beside ``runs/``, with the run's
    ``.lock`` written there before W&B refused the id (``..`` was ``runs/`` itself)."""
    monkeypatch.delenv("PROJ_DEBUG")
    monkeypatch.setenv("WANDB_MODE", "disabled")  # no network, whatever the code under test does
    wandb = ["--config", config("logger/wandb.yaml"), "--trainer.logger.init_args.id=../../x"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config("classify.yaml"), *wandb, "--trainer.max_steps=1"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(lines) == 1, err
    assert "error: trainer.logger.init_args.id='../../x': " in lines[0], lines[0]
    assert "Set --trainer.logger.init_args.id to a plain folder name" in lines[0], lines[0]
    assert list(workdir.iterdir()) == [], "something was written"
