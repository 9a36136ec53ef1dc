"""A bug in code keeps its traceback; only a refused argument becomes a one-line config error.

The user's own network, from a module beside the config, as a user writes one: a misspelt name in
its ``__init__`` is a bug to see where it is, a ``raise ValueError`` of its own argument check is a
refusal to read in one line. On the tiny project's classify experiment. (The CLI's own refusals:
test_bad_input.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import main
from projkit.testing import TINY_FIT, config

NET = """
from torch import nn


class MyNet(nn.Module):
    def __init__(self, num_classes: int, input_shape: tuple = (1, 4, 4), width: int = 16) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"net.width must be positive, got {width}")
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, {classes}))

    def forward(self, x):
        return self.body(x)
"""


@pytest.fixture
def user_net(workdir: Path, monkeypatch: pytest.MonkeyPatch):
    """Writes ``my_net.py`` (its output layer's size as ``classes``) where the command can import it."""
    monkeypatch.syspath_prepend(str(workdir))
    monkeypatch.delenv("PROJ_DEBUG")
    sys.modules.pop("my_net", None)  # this test's file, never the module another test imported

    def write(classes: str) -> list[str]:
        (workdir / "my_net.py").write_text(NET.replace("{classes}", classes))
        return ["fit", "--config", config("classify.yaml"), *TINY_FIT, "--model.init_args.net=my_net.MyNet"]

    yield write
    sys.modules.pop("my_net", None)


@pytest.mark.slow
def test_a_bug_in_a_users_network_shows_its_traceback(user_net, workdir, capsys):
    command = user_net("num_clases")
    with pytest.raises(NameError, match="num_clases") as raised:
        main(command)
    assert raised.traceback[-1].path == workdir / "my_net.py", "raised as it was, from the user's line"
    assert "error:" not in capsys.readouterr().err
    assert not list(workdir.glob("runs/*/*")), "no run directory left behind"


@pytest.mark.slow
def test_a_users_argument_check_is_one_line(user_net, workdir, capsys):
    command = user_net("num_classes")
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--model.init_args.net.init_args.width=0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: model.init_args.net (my_net.MyNet): net.width must be positive, got 0" in err
    assert "Traceback" not in err
