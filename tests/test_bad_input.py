"""Bad input to this project's own modules, row by row from ``bad_inputs.CASES``, run by the kit's
runner (``projkit.testing.bad_input``): each is refused (or, for a warning, said) with the field or
file and the fix, exits with its code without a traceback, runs no code from a checkpoint, and leaves
an earlier run's files as they were and no new run directory behind. The errors page
(kit/docs/errors.md) or the project's docs (docs/data.md, docs/models.md) quote every row's message.
The kit's own refusals: kit/tests/test_bad_input.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from projkit.testing import config
from projkit.testing.bad_input import Case, as_params, assert_said, make_baseline, run_case

from bad_inputs import CASES
from bad_setups import VALUES
from conftest import ROOT


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An earlier run, made once for the file: a tiny digits fit with its checkpoint."""
    return make_baseline(tmp_path_factory.mktemp("baseline"), config("digits.yaml"))


@pytest.mark.parametrize("case", as_params(CASES))
def test_bad_input(case: Case, baseline, workdir, monkeypatch, capsys):
    if case.cpu_only and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_said(case, run_case(case, baseline, workdir, monkeypatch, capsys, VALUES))


# Where a message is quoted with its fix: the errors page, or the page of the module that says it.
PAGES = ("kit/docs/errors.md", "docs/data.md", "docs/models.md")
FAQ = "\n".join((ROOT / page).read_text() for page in PAGES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_readme_faq_quotes_the_message(case: Case):
    assert case.words[0] in FAQ, f"none of {', '.join(PAGES)} quotes `{case.words[0]}`"
