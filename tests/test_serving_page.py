"""kit/docs/serving.md works as written: from where the page starts (the digits and the character
GPT trained), its commands run in a shell as a reader types them, ``<package>`` read as ``proj``,
and its requests, curl and Python, each asked of every server of its kind, answer as the page
shows. One change: the page's port, 8000, is a free one here (tests run side by side), given to
``serve`` as ``--port`` and to the requests in their URLs. A download would fail (``https_proxy``
points nowhere): exporting the GPT reads no text, and the corpus is not where its config says.

tests/test_docs.py checks that every command of the pages parses; this runs the serving page's."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from projkit.testing import TINY_FIT, ServedExport, write_png

from conftest import ROOT, small_gpt
from proj import main
from proj.data.image import load_digits
from test_docs import bash_lines, code_blocks

PAGE = ROOT / "kit" / "docs" / "serving.md"
PAGE_ADDRESS = "127.0.0.1:8000"
# The experiments the page serves, trained here first, by the kind of request their servers take.
TRAINED = {"digits": "image", "shakespeare_char_cpu": "text"}
Request = tuple[str, str, set[str]]


def kind_of(code: str) -> str:
    """A request's kind: a prompt is for the language model, anything else is an image."""
    return "text" if '"prompt"' in code else "image"


def experiment_of(command: str) -> str:
    """The trained experiment a command names, by its run folder or its config."""
    named = [name for name in TRAINED if f"runs/{name}/" in command or f"configs/{name}.yaml" in command]
    assert len(named) == 1, f"serving.md: `{command}` names none of {sorted(TRAINED)}, which this test trains"
    return named[0]


def read_page() -> tuple[list[str], list[Request]]:
    """The page's ``python -m <package>`` lines (as ``proj``), in order, and its requests as
    (kind, code, keys): each curl line with the keys of the answer the page shows under it, each
    Python block with none."""
    commands, requests = [], []
    for block in code_blocks(PAGE, "bash"):
        lines = bash_lines(block)
        for line, after in zip(lines, [*lines[1:], ""], strict=True):
            if line.startswith("python -m <package> "):
                commands.append(line.replace("<package>", "proj", 1))
            elif line.startswith("curl "):
                shown = re.findall(r'"(\w+)":', after) if after.startswith("# {") else []
                requests.append((kind_of(line), line, set(shown)))
    requests += [(kind_of(block), block, set()) for block in code_blocks(PAGE, "python")]
    return commands, requests


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command[-1]}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def ask(request: Request, port: int, cwd: Path) -> None:
    """The request as the page writes it, at ``port``; its answer as the page shows it."""
    kind, code, keys = request
    here = code.replace(PAGE_ADDRESS, f"127.0.0.1:{port}")
    assert here != code, f"serving.md: the request asks no {PAGE_ADDRESS}:\n{code}"
    if code.startswith("curl "):
        answer = json.loads(run(["bash", "-c", here], cwd).stdout)
        assert set(answer) == keys, f"serving.md shows {sorted(keys)}, the server answered {answer}"
        return
    said = run([sys.executable, "-c", here], cwd).stdout
    if kind == "image":  # `7 0.9981`
        name, probability = said.split()
        assert name in [str(digit) for digit in range(10)] and 0 <= float(probability) <= 1, said
    else:  # the prompt and the 50 characters after it
        assert said.startswith("ROMEO:") and len(said) == len("ROMEO:") + 50 + 1, said


@pytest.fixture
def trained(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the page starts: the digits and the GPT trained (a few batches each) in the folder the
    commands run in, with the configs, a digit's image file (digit.png), the environment's
    ``python`` first on the PATH, and the network for downloads pointing nowhere."""
    shutil.copytree(ROOT / "configs", workdir / "configs")
    quick = (*TINY_FIT, "--test_after_fit=false")
    main(["fit", "--config", "configs/digits.yaml", *quick])
    text = ("--config", "configs/shakespeare_char_cpu.yaml", *small_gpt(), *quick)
    main(["fit", *text, "--model.init_args.num_samples=0"])
    images, _ = load_digits()
    write_png(workdir / "digit.png", (images[0] * 255 / 16).round())
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for name in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    return workdir


def test_the_page_has_a_curl_and_a_python_request_for_each_kind_of_server():
    commands, requests = read_page()
    kinds = {(kind, code.startswith("curl ")) for kind, code, _ in requests}
    assert kinds == {(kind, curl) for kind in ("image", "text") for curl in (True, False)}, requests
    assert {TRAINED[experiment_of(c)] for c in commands if " serve " in c} == {"image", "text"}


@pytest.mark.slow
def test_the_serving_page_runs_as_written(trained: Path):
    commands, requests = read_page()
    for command in commands:
        if " serve " not in command:
            printed = run(["bash", "-c", command], trained).stdout
            if written := re.search(r"# writes (\S+)/$", command):  # what the comment says it writes
                assert f"Exported {written[1]}/model.json" in printed, printed
            continue
        kind = TRAINED[experiment_of(command)]
        server = ServedExport(*shlex.split(command, comments=True)[4:], cwd=str(trained)).start()
        try:
            for request in requests:
                if request[0] == kind:
                    ask(request, server.port, trained)
        finally:
            code = server.stop()
        assert code == 0, server.output[-3000:]
