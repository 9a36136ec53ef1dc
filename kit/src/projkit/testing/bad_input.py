"""The runner of a table of bad input, for a project's tests of what its own modules refuse and for
the kit's of what it refuses whatever the project. A table is a list of ``Case`` rows, each one
command line (after ``python -m <package>``) with what it needs written first, the words its message
must hold (the first is its key, which the docs quote with the fix) and the exit code.

A test file runs every row against an earlier run, made once (``baseline``), and checks what a user
would rely on: refused (or, for a warning, said) with the words, the exit code and no traceback, no
code run from a checkpoint, the earlier run's files as they were and no new run directory left::

    @pytest.fixture(scope="module")
    def baseline(tmp_path_factory):
        return make_baseline(tmp_path_factory.mktemp("baseline"), config("my_experiment.yaml"))

    @pytest.mark.parametrize("case", as_params(CASES))
    def test_bad_input(case, baseline, workdir, monkeypatch, capsys):
        output = run_case(case, baseline, workdir, monkeypatch, capsys, values={"corpus": ...})
        assert_said(case, output)
"""

from __future__ import annotations

import hashlib
import shutil
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from projkit.context import current
from projkit.testing.runs import TINY_FIT

# A few optimizer steps and test batches: a row that trains (today or by mistake) ends in seconds.
QUICK = TINY_FIT
MARKER = "payload_ran"  # the file a crafted checkpoint's code would write into the working folder

Setup = Callable[[Path, Path], None]  # (working folder, the baseline run's last checkpoint)


@dataclass(frozen=True)
class Case:
    """One row: ``args`` may hold ``{name}`` placeholders, filled from the test's ``values`` and
    ``{ckpt}`` (the baseline run's last checkpoint, copied into the working folder) and ``{dir}``
    (the working folder), so a row names files the test makes where it runs."""

    kind: str
    name: str
    args: tuple[str, ...]
    words: tuple[str, ...]
    code: int = 2
    setup: Setup | None = None
    env: dict[str, str] = field(default_factory=dict)
    slow: bool = False
    cpu_only: bool = False  # a row about a machine without a GPU
    new_run: bool = False  # the command starts a run before it is refused (its checkpoints stay)

    @property
    def id(self) -> str:
        """``kind: name``, the row's test id."""
        return f"{self.kind}: {self.name}"

    def command(self, ckpt: Path, workdir: Path, values: Mapping[str, str] | None = None) -> list[str]:
        """The row's arguments with its placeholders filled."""
        filled = {**(values or {}), "ckpt": str(ckpt), "dir": str(workdir)}
        return [arg.format(**filled) for arg in self.args]


def write(name: str, content: str | bytes) -> Setup:
    """A setup that writes ``content`` to the file ``name`` of the working folder."""

    def setup(workdir: Path, ckpt: Path) -> None:
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    return setup


def make_folder(name: str) -> Setup:
    """A setup that makes the folder ``name`` in the working folder."""
    return lambda workdir, ckpt: (workdir / name).mkdir(parents=True, exist_ok=True)


class Payload:
    """Code hidden in a checkpoint: unpickling it writes the marker file, as any code could."""

    def __reduce__(self) -> tuple:
        return (Path.write_text, (Path(MARKER), "ran"))


def digests(runs: Path) -> dict[str, str]:
    """Each file under ``runs`` by its SHA-256: what a refused command must leave as it was."""
    return {
        str(p.relative_to(runs)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(runs.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def run_dirs(runs: Path) -> set[str]:
    """The run directories under ``runs`` (``<name>/<version>``)."""
    return {str(p.relative_to(runs)) for p in runs.glob("*/*") if p.is_dir()}


def make_baseline(root: Path, experiment: str, *args: str) -> Path:
    """An earlier run for the rows to leave alone: a tiny fit of ``experiment`` (a config's path) in
    ``root``, with its checkpoint; its runs/ folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        current().main(["fit", "--config", experiment, *QUICK, "--test_after_fit=false", *args])
    return root / "runs"


def run_case(
    case: Case,
    baseline: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    values: Mapping[str, str] | None = None,
) -> str:
    """``case`` in this process as a user meets it (no ``PROJ_DEBUG``), after the baseline's runs are
    copied in; what it printed and warned. A ``sweep`` row goes to the sweep's command, as
    ``python -m <package>`` dispatches it."""
    from projkit.sweep import main as sweep

    runs = workdir / "runs"
    shutil.copytree(baseline, runs)
    (name,) = {Path(run).parts[0] for run in run_dirs(baseline)}
    ckpt = runs / name / "version_0" / "checkpoints" / "last.ckpt"
    if case.setup:
        case.setup(workdir, ckpt)
    before, dirs = digests(runs), run_dirs(runs)
    monkeypatch.delenv("PROJ_DEBUG", raising=False)
    for variable, value in case.env.items():
        monkeypatch.setenv(variable, value)
    args = case.command(ckpt, workdir, values)
    command = sweep if args[0] == "sweep" else current().main
    args = args[1:] if command is sweep else args
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if case.code == 0:
            command(args)
        else:
            with pytest.raises(SystemExit) as exit_info:
                command(args)
            assert exit_info.value.code == case.code
    captured = capsys.readouterr()
    output = captured.out + captured.err + "\n".join(str(w.message) for w in caught)
    assert_left_alone(case, workdir, runs, before, dirs, name)
    return output


def assert_left_alone(
    case: Case, workdir: Path, runs: Path, before: dict[str, str], dirs: set[str], baseline: str
) -> None:
    """No checkpoint's code ran, the earlier runs' files are as they were and a refused command left
    no run directory (a row that resumes a run of its own setup may write there)."""
    assert not (workdir / MARKER).exists(), "a checkpoint's code ran"
    after = digests(runs)
    kept = [name for name in before if not case.new_run or name.startswith(f"{baseline}/")]
    changed = [name for name in kept if after.get(name) != before[name]]
    assert not changed, f"files of earlier runs changed or went: {changed}"
    if case.code and not case.new_run:
        assert run_dirs(runs) == dirs, "a refused command left a run directory"


def assert_said(case: Case, output: str) -> None:
    """The row's words are in what the command printed, and no traceback or parser internals are."""
    missing = [word for word in case.words if word not in output]
    assert not missing, f"{missing} not in:\n{output[-3000:]}"
    assert "Traceback" not in output
    assert "Given value: Namespace" not in output


def as_params(cases: Iterable[Case]) -> list:
    """The rows as pytest parameters: the first row of each kind in the edit loop (``make test-fast``,
    ``-m "not slow"``), every row in ``make test``."""
    cases = list(cases)
    first_of_kind = {case.kind: case for case in reversed(cases) if not case.slow}
    marks = {id(case): [] for case in first_of_kind.values()}
    return [pytest.param(case, id=case.id, marks=marks.get(id(case), [pytest.mark.slow])) for case in cases]
