"""The sweep config fuzzer: a working sweep config of the classify experiment with one field's key or
value replaced, or a line of its text spoilt (a tab, a tag, a byte that is not UTF-8, a key given
twice, nested aliases). Each is either read into a ``Sweep`` whose fields have the types the sweep
uses, or refused as a ``SweepConfigError`` of one line naming the file; never another error, and
never a hang (the aliases are bounded).

``load_sweep`` only: no trial runs. Seeded (``derandomize``); ``PROJ_FUZZ_EXAMPLES`` sets the number
of cases (``make fuzz`` runs many more).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from conftest import seeded
from projkit.sweep.config import Sweep, SweepConfigError, load_sweep
from projkit.testing import config

EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "500")) // 10  # each reads and checks a sweep config
SPEC = {
    "configs": [config("classify.yaml")],
    "metric": "val/loss",
    "direction": "minimize",
    "n_trials": 2,
    "sampler": {"class_path": "TPESampler", "init_args": {"seed": 1}},
    "pruner": {"class_path": "NopPruner"},
    "space": {"model.init_args.optimizer.init_args.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2}},
}
KEYS = [*SPEC, "flags", "method", "space.lr", "configz", "", "é", "\u200b", "n_trials\t"]
ODD_VALUES = [
    None, True, 0, -1, 2**70, 1e400, math.nan, "", "nan", "1e-4", ".inf", [], {}, [1, "a"],
    {"type": "float", "low": math.nan, "high": 1}, {"type": "int", "low": 5, "high": 1},
    {"type": "categorical", "choices": [math.inf]}, {"class_path": "os.system"},
    {"class_path": "CmaEsSampler"}, {"class_path": "TPESampler", "init_args": {"seed": -5}},
    ["--trainer.max_epochs=1"], ["not a flag"], "maximize", "val/acc", "/dev/zero", "\u202e",
]  # fmt: skip
VALUES = st.one_of(st.sampled_from(ODD_VALUES), st.text(max_size=8), st.integers(), st.floats())
SPOILS = [
    lambda text: text.replace("\n  ", "\n\t", 1),
    lambda text: text + "sampler: !!python/object/apply:os.system [true]\n",
    lambda text: text.encode() + b"# \xe9\n",
    lambda text: text + "metric: val/acc\n",
    lambda text: (
        text
        + "a0: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"a{i}: &a{i} [{', '.join(['*a' if i == 1 else f'*a{i - 1}'] * 10)}]\n" for i in range(1, 7)
        )
    ),
    lambda text: text[: len(text) // 2],
    lambda text: "[" + text,
    lambda text: "",
]


def check(path: Path) -> None:
    """Read or refused in one line naming the file, as the sweep command says it."""
    try:
        sweep = load_sweep(path)
    except SweepConfigError as error:
        said = str(error)
        assert "\n" not in said and said.startswith(str(path)), said
        return
    assert isinstance(sweep, Sweep) and sweep.n_trials >= 1 and sweep.direction in ("minimize", "maximize")
    assert sweep.metric and sweep.space and all(isinstance(c, str) for c in sweep.configs)


@pytest.mark.slow
@seeded(EXAMPLES)
@given(key=st.sampled_from(KEYS), value=VALUES, spoil=st.sampled_from([None, *SPOILS]))
def test_fuzz_sweep_configs(key, value, spoil, tmp_path_factory):
    spec = {**SPEC, key: value}  # a field's value replaced, or a key added
    text = yaml.safe_dump(spec, allow_unicode=True)
    path = tmp_path_factory.mktemp("sweep") / "fuzzed.yaml"
    written = spoil(text) if spoil else text
    path.write_bytes(written if isinstance(written, bytes) else written.encode("utf-8", "surrogateescape"))
    check(path)


def test_the_spoilt_lines_are_refused(tmp_path: Path):
    """Each spoilt text, in `make test-fast`: refused in one line."""
    text = yaml.safe_dump(SPEC)
    for index, spoil in enumerate(SPOILS):
        path = tmp_path / f"spoilt{index}.yaml"
        written = spoil(text)
        path.write_bytes(written if isinstance(written, bytes) else written.encode())
        with pytest.raises(SweepConfigError) as refused:
            load_sweep(path)
        assert "\n" not in str(refused.value) and str(refused.value).startswith(str(path))
