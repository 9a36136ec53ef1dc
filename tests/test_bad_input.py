"""Bad input to this project's own modules, row by row from ``bad_inputs.CASES``: each is refused
(or, for a warning, said) with the field or file and the fix, exits with its code without a
traceback, runs no code from a checkpoint, and leaves an earlier run's files as they were and no new
run directory behind. The errors page (kit/docs/errors.md) or the project's docs (docs/data.md,
docs/models.md) quote every row's message. The kit's own refusals: kit/tests/test_bad_input.py."""

from __future__ import annotations

import hashlib
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from bad_inputs import CASES, MARKER, QUICK, Case
from conftest import ROOT, config
from proj import main


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An earlier run, made once for the file: a tiny digits fit with its checkpoint."""
    root = tmp_path_factory.mktemp("baseline")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        main(["fit", "--config", config("digits.yaml"), *QUICK, "--test_after_fit=false"])
    return root / "runs"


def digests(runs: Path) -> dict[str, str]:
    return {
        str(p.relative_to(runs)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(runs.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def run_dirs(runs: Path) -> set[str]:
    return {str(p.relative_to(runs)) for p in runs.glob("*/*") if p.is_dir()}


def run_case(case: Case, baseline: Path, workdir: Path, monkeypatch, capsys) -> str:
    """``case`` in this process, after the baseline's runs are copied in; its output."""
    runs = workdir / "runs"
    shutil.copytree(baseline, runs)
    ckpt = runs / "digits" / "version_0" / "checkpoints" / "last.ckpt"
    if case.setup:
        case.setup(workdir, ckpt)
    before, dirs = digests(runs), run_dirs(runs)
    monkeypatch.delenv("PROJ_DEBUG")
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if case.code == 0:
            main(case.command(ckpt, workdir))
        else:
            with pytest.raises(SystemExit) as exit_info:
                main(case.command(ckpt, workdir))
            assert exit_info.value.code == case.code
    captured = capsys.readouterr()
    output = captured.out + captured.err + "\n".join(str(w.message) for w in caught)
    assert not (workdir / MARKER).exists(), "a checkpoint's code ran"
    after = digests(runs)
    # A row that resumes a run of its own setup may write there; the baseline stays as it was.
    kept = [name for name in before if not case.new_run or name.startswith("digits/")]
    changed = [name for name in kept if after.get(name) != before[name]]
    assert not changed, f"files of earlier runs changed or went: {changed}"
    if case.code and not case.new_run:
        assert run_dirs(runs) == dirs, "a refused command left a run directory"
    return output


# `make test-fast` runs the first row of each kind; `make test` all of them.
FIRST_OF_KIND = {case.kind: case for case in reversed(CASES) if not case.slow}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case,
            id=f"{case.kind}: {case.name}",
            marks=[] if FIRST_OF_KIND.get(case.kind) is case else [pytest.mark.slow],
        )
        for case in CASES
    ],
)
def test_bad_input(case: Case, baseline, workdir, monkeypatch, capsys):
    if case.cpu_only and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    output = run_case(case, baseline, workdir, monkeypatch, capsys)
    missing = [word for word in case.words if word not in output]
    assert not missing, f"{missing} not in:\n{output[-3000:]}"
    assert "Traceback" not in output
    assert "Given value: Namespace" not in output


# Where a message is quoted with its fix: the errors page, or the page of the module that says it.
PAGES = ("kit/docs/errors.md", "docs/data.md", "docs/models.md")
FAQ = "\n".join((ROOT / page).read_text() for page in PAGES)


@pytest.mark.parametrize("case", CASES, ids=[f"{case.kind}: {case.name}" for case in CASES])
def test_readme_faq_quotes_the_message(case: Case):
    assert case.words[0] in FAQ, f"none of {', '.join(PAGES)} quotes `{case.words[0]}`"
