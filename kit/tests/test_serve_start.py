"""`python -m tinyproj serve` refused at start: a missing or damaged export, or a setting no server
runs with, in one line and exit 2; a deprecated flag still taken, with a warning; a server that other
machines can reach warned, in one line, that it has no authentication."""

from __future__ import annotations

import argparse
import json
import math
import re
import socket
import subprocess
import sys

import pytest

from bad_exports import CLASSES, SHAPE, classifier_json, classifier_onnx, write_export
from conftest import main
from projkit import serve
from projkit.context import current
from projkit.preprocessing import Preprocessing
from projkit.serve.model import ServeError, load_session, read_export
from projkit.serve.workers import exposure
from projkit.testing.served import free_port


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
            "task 'segmentation': give 'image classification' or 'next-token prediction'",
        ),
        (
            lambda f: (
                (f / "model.json").write_text(
                    json.dumps(
                        {
                            "task": "image classification",
                            "input": {"name": "pixels", "shape": ["N", 1, 4, 4]},
                            "classes": ["a", "b"],
                            "preprocessing": Preprocessing.stretch((1, 4, 4)).describe(),
                        }
                    )
                )
                and (f / "model.onnx").write_bytes(b"\x08\x07garbage")
                and f
            ),
            r"model\.onnx is no ONNX model \(DecodeError: .*\); export the checkpoint again",
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
        (("--timeout=0",), "--timeout 0.0: give a finite number of seconds above 0"),
        (("--timeout=inf",), "--timeout inf: give a finite number of seconds above 0"),
        (("--read_timeout=-1",), "--read_timeout -1.0: give a finite number of seconds above 0"),
        (("--colour=blue",), "unknown option(s) --colour=blue"),
        (
            ("--port=http",),
            "argument --port: invalid int value: 'http'; `python -m tinyproj serve --help` lists",
        ),
    ],
)
def test_a_setting_no_server_runs_with_is_refused_in_one_line(flags, said, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve.main([str(write_export(tmp_path)), *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and err.count("\n") == 1, err


def test_help_lists_serve(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    said = capsys.readouterr().out
    assert re.search(r"^\s+serve\s+Serve an export over HTTP: answers as predict does\.", said, re.M)


@pytest.mark.parametrize("value", ["0.01", "inf", "nan", "-1"])
def test_batch_timeout_is_taken_with_a_deprecation_warning(value, capsys):
    args = serve.add_arguments(argparse.ArgumentParser()).parse_args(["x", f"--batch_timeout={value}"])
    assert serve.device_settings(args) == ("cpu", {"max_batch_size": 8, "workers": 1, "gpus": 0})
    err = capsys.readouterr().err
    assert err.startswith("warning: --batch_timeout is deprecated and has no effect") and err.count("\n") == 1


def changed(change) -> dict:
    spec = classifier_json()
    change(spec)
    return spec


# What issue 46 saw start a server that then failed every request (or end in a traceback): each
# model.json beside the 8x8, 10-class classifier's model.onnx, and the line that now refuses it.
STEERING = {
    "resize-1e9": (
        changed(lambda s: s["preprocessing"]["resize"].update(size=[10**9, 10**9])),
        r"model\.json: preprocessing\.resize\.size \[1000000000, 1000000000\]: give \[width, height\], "
        r"whole numbers from 1 to 8192",
    ),
    "resize-9x9": (
        changed(lambda s: s["preprocessing"]["resize"].update(size=[9, 9])),
        r"model\.json: preprocessing gives 9x9 \(width x height\) L images, 1 channel\(s\), but input\.shape "
        r"\['N', 1, 8, 8\] takes 8x8",
    ),
    "shape-9x9": (
        classifier_json((1, 9, 9)),
        r"model\.onnx: its input 'pixels' is float32 \[N, 1, 8, 8\], but model\.json says float32 "
        r"\[N, 1, 9, 9\]",
    ),
    "3-classes": (
        changed(lambda s: s.update(classes=["a", "b", "c"])),
        r"model\.onnx: its output 'logits' is float32 \[N, 10\], but model\.json has 3 classes",
    ),
    "no-input-name": (
        changed(lambda s: s["input"].pop("name")),
        r"model\.json: input\.name is missing: give the ONNX model's input name",
    ),
    "resize-list": (
        changed(lambda s: s["preprocessing"].update(resize=[8, 8])),
        r"model\.json: preprocessing\.resize \[8, 8\]: give an object",
    ),
    "nesting-100000": (
        '{"task": "image classification", "input": ' + "[" * 100_000 + "]" * 100_000 + "}",
        r"model\.json nests deeper than JSON can be read",
    ),
}


@pytest.mark.parametrize(("spec", "said"), STEERING.values(), ids=STEERING)
def test_a_model_json_that_would_fail_every_request_is_refused_by_the_start_check(spec, said, tmp_path):
    folder = write_export(tmp_path / "export", spec)
    with pytest.raises(ServeError, match=rf"^{re.escape(str(folder))}/{said}.*export the checkpoint again"):
        read_export(folder)
        load_session(folder)


# A model.onnx whose weight lives in a file it names: loaded from memory, onnxruntime looked the name
# up from the server's working directory, and ?top_k showed the file's bytes as probabilities.
@pytest.mark.parametrize(
    ("location", "constant"),
    [("Makefile", False), ("Makefile", True), ("weights.bin", False)],
    ids=["makefile", "makefile-in-a-constant", "beside-model-onnx"],
)
def test_a_model_onnx_that_names_any_other_file_is_refused(location, constant, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    secret = bytes(range(256)) * (math.prod(SHAPE) * CLASSES * 4 // 256 + 1)
    (tmp_path / "Makefile").write_bytes(secret)
    folder = write_export(tmp_path / "export", model=classifier_onnx(location=location, constant=constant))
    (folder / "weights.bin").write_bytes(secret)
    with pytest.raises(
        ServeError,
        match=rf"model\.onnx: its tensor 'weight' keeps its data in another file \('{location}'\), which "
        "serve never reads: the kit's export keeps every weight inside model.onnx",
    ):
        load_session(folder)


def test_python_m_serve_refuses_a_model_naming_a_file_of_its_machine_in_one_line(tmp_path):
    """The issue's start as a user types it, in a folder that holds a Makefile: ``serve`` of a
    model.onnx whose weight is that Makefile exits 2 with one line, before it listens (it served the
    Makefile's bytes before)."""
    (tmp_path / "Makefile").write_bytes(bytes(range(256)) * 11)
    folder = write_export(tmp_path / "export", model=classifier_onnx(location="Makefile"))
    command = [sys.executable, "-m", current().package, "serve", str(folder), f"--port={free_port()}"]
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    first = process.stdout.readline()  # its error, or "Serving ..." once it serves (then it is killed)
    if first.startswith("Serving"):
        process.kill()
    rest = process.communicate(timeout=60)[0]
    assert process.returncode == 2 and not rest, first + rest
    assert first.startswith(f"error: {folder}/model.onnx: its tensor 'weight' keeps its data in another file")


@pytest.mark.parametrize("case", ["resize-list", "nesting-100000"])
def test_what_was_a_traceback_at_start_is_one_line_and_exit_2(case, tmp_path, capsys):
    spec, said = STEERING[case]
    folder = write_export(tmp_path / "export", spec)
    with pytest.raises(SystemExit) as exit_info:
        serve.main([str(folder)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert re.fullmatch(rf"error: {re.escape(str(folder))}/{said}.*\n", err), err


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
