"""`python -m tinyproj serve` refused at start: a missing or damaged export, or a setting no server
runs with, in one line and exit 2; a deprecated flag still taken, with a warning; a server that other
machines can reach warned, in one line, that it has no authentication."""

from __future__ import annotations

import argparse
import json
import re
import socket

import pytest

from conftest import main
from projkit import serve
from projkit.preprocessing import Preprocessing
from projkit.serve.workers import exposure


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda f: f / "nowhere", r"no such export folder"),
        (lambda f: f, r"no model\.json in it"),
        (
            lambda f: (f / "model.json").write_text("{") and (f / "model.onnx").write_bytes(b"x") and f,
            "is no valid JSON",
        ),
        (
            lambda f: (
                (f / "model.json").write_text('{"task": "segmentation"}')
                and (f / "model.onnx").write_bytes(b"x")
                and f
            ),
            "task 'segmentation' is none this server answers",
        ),
        (
            lambda f: (
                (f / "model.json").write_text(
                    json.dumps(
                        {
                            "task": "image classification",
                            "input": {"name": "pixels"},
                            "classes": ["a", "b"],
                            "preprocessing": Preprocessing.stretch((1, 4, 4)).describe(),
                        }
                    )
                )
                and (f / "model.onnx").write_bytes(b"\x08\x07garbage")
                and f
            ),
            r"model\.onnx: onnxruntime cannot load it .*; export the checkpoint again\.",
        ),
    ],
    ids=["missing", "empty", "json-corrupt", "unknown-task", "onnx-corrupt"],
)
def test_a_missing_or_damaged_export_is_refused_at_start_in_one_line(make, said, tmp_path, capsys):
    folder = make(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        serve.main([str(folder)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"error: .*{said}.*\n", err), err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--host=10.1.2.3", "--port=8000"), "--host 10.1.2.3 --port 8000: cannot listen there"),
        (("--port=80",), "--port 80: give a port from 1024 to 65535"),
        (("--max_batch_size=0",), "--max_batch_size 0: give a whole number of at least 1"),
        (("--workers=0",), "--workers 0: give a whole number of at least 1"),
        (("--timeout=0",), "--timeout 0.0: give a number of seconds above 0"),
        (("--read_timeout=-1",), "--read_timeout -1.0: give a number of seconds above 0"),
        (("--colour=blue",), "unknown option(s) --colour=blue"),
    ],
)
def test_a_setting_no_server_runs_with_is_refused_in_one_line(flags, said, tmp_path, capsys):
    (tmp_path / "model.json").write_text(
        json.dumps({"task": "next-token prediction", "input": {}, "vocab": "ab"})
    )
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(SystemExit) as exit_info:
        serve.main([str(tmp_path), *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and err.count("\n") == 1, err


def test_help_lists_serve(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    said = capsys.readouterr().out
    assert re.search(r"^\s+serve\s+Serve an export over HTTP: answers as predict does\.", said, re.M)


def test_batch_timeout_is_taken_with_a_deprecation_warning(capsys):
    args = serve.add_arguments(argparse.ArgumentParser()).parse_args(["x", "--batch_timeout=0.01"])
    assert serve.device_settings(args) == ("cpu", {"max_batch_size": 8, "workers": 1, "gpus": 0})
    err = capsys.readouterr().err
    assert err.startswith("warning: --batch_timeout is deprecated and has no effect") and err.count("\n") == 1


def test_a_server_other_machines_reach_is_warned_it_has_no_authentication():
    """Sockets as ``serve`` binds them (bound, not listening here): beyond the loopback, the line
    ``serve`` prints to stderr before it serves; on the loopback, none."""
    with socket.socket() as everywhere, socket.socket() as loopback:
        everywhere.bind(("0.0.0.0", 0))
        loopback.bind(("127.0.0.1", 0))
        said, unsaid = exposure(everywhere), exposure(loopback)
    assert unsaid is None
    assert said.startswith("warning: the server listens on 0.0.0.0 port ") and "\n" not in said
    assert "no authentication" in said and "--host 127.0.0.1" in said and "reverse proxy" in said
