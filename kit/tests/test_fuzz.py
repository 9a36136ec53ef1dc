"""The configuration fuzzer: every key the CLI accepts, taken from its own parser (a new key is
covered without editing this file), given typed garbage. Each case must either be refused with exit
2 and one line naming the key, or be accepted with the value as given; never a traceback. The same
keys misspelt (one edit to one part, at any depth), as a flag or in a config, must be refused in one
line that names the misspelt key and a real one.

On the tiny project's classify experiment. Most cases parse the one flag onto its parsed config and
run the CLI's checks of a parsed config (``ProjectCLI.check_config``), a tenth of a second each; a
sample runs whole commands through ``main``, a tiny fit where the value is accepted, and checks that
nothing was written outside ``runs/`` and ``data/`` and that an earlier run stayed byte-identical.
Seeded (``derandomize``); ``PROJ_FUZZ_EXAMPLES`` sets the number of cases (``make fuzz`` runs many
more).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonargparse import Namespace

from conftest import main
from projkit.checks.config import check_special_files
from projkit.cli import ProjectCLI
from projkit.testing import TINY_FIT, config

EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "300"))
MISSPELT_EXAMPLES = EXAMPLES // 5  # of them, misspelt keys; the rest garbage values
WHOLE_COMMANDS = 4  # of them, run through `main` as a user would
CLASSIFY = config("classify.yaml")
FIFO = "/tmp/projkit-fuzz-fifo"

GARBAGE = [
    "nan",
    ".nan",
    "inf",
    "-inf",
    ".inf",
    "1e400",
    "-1e400",
    "-1",
    "0",
    "-0.5",
    "1.5",
    str(2**70),
    str(-(2**70)),
    "true",
    "null",
    "",
    "[]",
    "[1, 2]",
    "{}",
    "{a: 1}",
    "abc",
    "../../escape",
    "/dev/zero",
    FIFO,
    "{{{",
]


def leaves(namespace: Namespace, prefix: str = "") -> list[str]:
    """The dotted key of every value in a parsed config."""
    keys = []
    for name, value in vars(namespace).items():
        key = f"{prefix}{name}"
        if isinstance(value, Namespace):
            keys += leaves(value, f"{key}.")
        elif name not in ("config", "__path__", "__default_config__"):
            keys.append(key)
    return keys


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> ProjectCLI:
    """The classify experiment's CLI, parsed and built once (``run=False``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("fuzz"))
        return ProjectCLI(args=["--config", CLASSIFY], run=False)


@pytest.fixture(scope="module")
def fifo() -> str:
    with contextlib.suppress(FileExistsError):
        os.mkfifo(FIFO)
    yield FIFO
    os.unlink(FIFO)


def value_at(config: Namespace, key: str) -> object:
    for part in key.split("."):
        config = config.get(part) if isinstance(config, Namespace) else None
    return config


def as_given(parsed: object, text: str) -> bool:
    """Whether the parser kept ``text`` as the value it says (a number, a string, a list...)."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        loaded = text
    if isinstance(parsed, Namespace):
        return True  # a class given by path or mapping: the parser built its init_args
    return same(parsed, loaded) or str(parsed) == text


def same(parsed: object, loaded: object) -> bool:
    """``parsed`` is ``loaded`` as its type holds it: ``1`` as ``1.0``, a list as a tuple."""
    if isinstance(parsed, (int, float)) and isinstance(loaded, (int, float)):
        return math.isclose(parsed, loaded) or parsed == loaded
    if isinstance(parsed, (list, tuple)) and isinstance(loaded, (list, tuple)):
        return len(parsed) == len(loaded) and all(map(same, parsed, loaded))
    return parsed == loaded


def check_refusal(err: str, key: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    part = key.split(".")[-1]
    assert part in lines[0] or key.split(".")[0] in lines[0], f"{key}: {lines[0]}"


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROJ_DEBUG")


@pytest.mark.slow
def test_fuzz_keys_with_garbage(cli, fifo, quiet, capsys, workdir):
    keys = sorted(leaves(cli.config))
    assert len(keys) > 100  # every key of the experiment, from the parser: trainer, model, data, callbacks
    cases, refused = [], []

    @settings(
        max_examples=EXAMPLES - MISSPELT_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(key=st.sampled_from(keys), text=st.sampled_from(GARBAGE) | st.integers().map(str))
    def case(key: str, text: str) -> None:
        cases.append(key)
        try:
            check_special_files([f"--{key}={text}"], cli.parser)  # as ProjectCLI.parse_arguments does first
            parsed = cli.parser.parse_args(
                [f"--{key}={text}"], namespace=cli.config.clone(), defaults=False, env=False
            )
            cli.check_config(parsed, cli.parser, "fit")
        except SystemExit as exit:
            assert exit.code == 2
            check_refusal(capsys.readouterr().err, key)
            refused.append(key)
            return
        capsys.readouterr()
        assert as_given(value_at(parsed, key), text), f"--{key}={text} became {value_at(parsed, key)!r}"

    case()
    assert len(cases) >= min(EXAMPLES - MISSPELT_EXAMPLES, 240)
    assert 0 < len(refused) < len(cases)
    print(f"{len(cases)} cases over {len(set(cases))} keys, {len(refused)} refused")
    assert not any(workdir.iterdir()), f"a parse wrote {list(workdir.iterdir())}"


def misspelt(part: str, edit: int, at: int, letter: str) -> str:
    """``part`` after one typing mistake: a letter dropped, doubled, swapped with the next or replaced."""
    at %= len(part)
    if edit == 0:
        return part[:at] + part[at + 1 :]
    if edit == 1:
        return part[:at] + part[at] + part[at:]
    if edit == 2 and at + 1 < len(part):
        return part[:at] + part[at + 1] + part[at] + part[at + 2 :]
    return part[:at] + letter + part[at + 1 :]


def nested(key: str, value: object) -> dict:
    """``{a: {b: value}}`` for the key ``a.b``: how a config file holds it."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


@pytest.mark.slow
def test_fuzz_misspelt_keys(cli, quiet, capsys):
    """A misspelt key goes to the parser's error, whatever its depth (a Trainer setting, a class's
    init_args, a network's inside a model's) and whether a flag or a config holds it."""
    keys = sorted(leaves(cli.config))
    real = set(keys) | {action.dest for action in cli.parser._actions}
    cases = []

    @settings(
        max_examples=MISSPELT_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        key=st.sampled_from(keys),
        depth=st.integers(0, 9),
        edit=st.integers(0, 3),
        at=st.integers(0, 99),
        letter=st.sampled_from("abcdefghijklmnopqrstuvwxyz_"),
        as_flag=st.booleans(),
    )
    def case(key: str, depth: int, edit: int, at: int, letter: str, as_flag: bool) -> None:
        parts = key.split(".")
        # The names of the key: init_args and class_path are jsonargparse's words for every class.
        places = [i for i, part in enumerate(parts) if part not in ("init_args", "class_path")]
        place = places[depth % len(places)]
        wrong = [*parts[:place], misspelt(parts[place], edit, at, letter), *parts[place + 1 :]]
        typed = ".".join(wrong)
        # Another real name, or a flag's unambiguous abbreviation of one (argparse takes those), is no
        # misspelling.
        siblings = {k.split(".")[place] for k in real if k.split(".")[:place] == parts[:place] and "." in k}
        assume(wrong[place] and wrong[place] not in siblings | {parts[place]})
        assume(not any(k.startswith(".".join(wrong[: place + 1])) for k in real))
        cases.append(typed)
        arg = f"--{typed}=1" if as_flag else f"--config={nested(typed, 1)}"  # the key is refused, not 1
        with pytest.raises(SystemExit) as exit:
            cli.parser.parse_args([arg], namespace=cli.config.clone(), defaults=False, env=False)
        assert exit.value.code == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and "Traceback" not in err, err
        said = lines[0]
        assert typed in said or ".".join(wrong[place:]) in said, f"{arg}: {said}"
        if meant := re.search(r"Did you mean (?:--)?(\S+)\?", said):
            suggested = meant[1].replace("[0]", "")
            assert suggested in real or any(k.startswith(f"{suggested}.") for k in real), f"{arg}: {said}"
        else:
            assert re.search(rf"The names( under \S+)? are .*\b{parts[place]}\b", said), f"{arg}: {said}"

    case()
    assert len(cases) >= MISSPELT_EXAMPLES // 2
    below = [typed for typed in cases if ".init_args." in typed]
    assert below, "no misspelt key below a class"
    print(f"{len(cases)} misspelt keys, {len(below)} below a class, e.g. {', '.join(below[:5])}")


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# Whole commands: one accepted (a tiny fit that must use the value) and refused ones of each stage.
COMMANDS = [
    ("--model.init_args.optimizer.init_args.weight_decay=0", 0),
    ("--trainer.gradient_clip_val=.inf", 2),
    ("--trainer.logger.init_args.version=../x", 2),
    ("--data.init_args.batch_size=1e400", 2),
][:WHOLE_COMMANDS]


@pytest.mark.slow
@pytest.mark.parametrize(("flag", "code"), COMMANDS)
def test_fuzz_whole_commands(flag: str, code: int, workdir: Path, quiet, capsys):
    """The contract through ``main``: exit code, one line, nothing outside runs/ and data/, an earlier
    run byte-identical."""
    earlier = workdir / "runs" / "classify" / "version_0"
    earlier.mkdir(parents=True)
    (earlier / "metrics.csv").write_text("epoch,step,val/loss\n0,1,2.0\n")
    before = digests(workdir / "runs")
    with pytest.raises(SystemExit) if code else contextlib.nullcontext() as exit:
        main(["fit", "--config", CLASSIFY, *TINY_FIT, "--test_after_fit=false", flag])
    err = capsys.readouterr().err
    if code:
        assert exit.value.code == code
        check_refusal(err, flag.split("=")[0].removeprefix("--"))
        assert sorted(p.name for p in (workdir / "runs" / "classify").iterdir()) == ["version_0"]
    else:
        assert "Traceback" not in err
        saved = yaml.safe_load((workdir / "runs" / "classify" / "version_1" / "config.yaml").read_text())
        assert saved["model"]["init_args"]["optimizer"]["init_args"]["weight_decay"] == 0
    assert {p.name for p in workdir.iterdir()} <= {"runs", "data"}
    after = digests(workdir / "runs")
    assert {k: after.get(k) for k in before} == before
    shutil.rmtree(workdir / "runs")
