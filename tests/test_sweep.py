"""The template's shipped sweep configs under `python -m proj sweep`: a W&B spec among them is pointed
to W&B. The sweep machinery itself (studies, workers, pruning, resuming, refusals) is tested on the
kit's tiny project, in kit/tests/test_sweep.py."""

from __future__ import annotations

import pytest

from conftest import ROOT


def test_a_wandb_spec_is_pointed_to_wandb(capsys):
    from projkit.sweep import main as sweep

    with pytest.raises(SystemExit) as exit_info:
        sweep(["--config", str(ROOT / "configs/sweeps/digits.yaml")])
    assert exit_info.value.code == 2
    assert "W&B sweep spec; run it with `wandb sweep" in capsys.readouterr().err
