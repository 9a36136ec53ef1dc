"""`python -m tinyproj serve`: real servers on 127.0.0.1, asked over real HTTP. Their answers equal
``predict``'s for the same files and prompts; every kind of bad request gets a 4xx and its one line,
and a good request still gets its answer after each (a seeded fuzzer of request kinds, numbers at
their extremes and a decode fuzzer's files among them, never a 5xx); a request the model fails on
fails alone, its batch-mates answered; a request
that arrives while the model loads waits, SIGTERM drains what is in flight and exits 0, and a
request after it on a kept-alive connection gets 503 with Connection: close; requests that wait
for the model share a call, a lone one is a call of its own; a client that sends slowly or endlessly
is refused alone; ``--workers`` processes answer alike, one killed by kill -9 is started again, and
they end with a parent killed by kill -9, the port free; a real export's model.json, mutated, serves
or is refused at start in one line (test_serve_start.py: the other refusals at start)."""

from __future__ import annotations

import csv
import http.client
import json
import os
import random
import re
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

import bad_exports
import bad_requests
from bad_requests import IMAGE_KINDS, LIMITS, TEXT_KINDS, assert_refused, files_of_every_shape
from conftest import main
from held_connections import READ_TIMEOUT, killed_in_a_request, misbehaving, replaced
from projkit.callbacks import PredictionFileWriter
from projkit.preprocessing import Preprocessing
from projkit.testing import TINY_FIT, ServedExport, config
from served_models import (
    GREEDY,
    SlowModel,
    accepted_connections,
    asking,
    drain,
    poisoned_export,
    server_processes,
)

CLASSIFY = ("--config", config("classify.yaml"))
LM = ("--config", config("lm.yaml"))
QUIET = ("--trainer.enable_progress_bar=false",)
ROUNDS = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "40"))


def fitted(folder: Path, *args: str) -> Path:
    """``last.ckpt`` of a tiny fit run in ``folder``."""
    os.chdir(folder)
    fit = main(["fit", *args, *TINY_FIT, "--test_after_fit=false"])
    return (Path(fit.trainer.checkpoint_callbacks[-1].dirpath) / "last.ckpt").resolve()


def written(cli) -> Path:
    (writer,) = [c for c in cli.trainer.callbacks if isinstance(c, PredictionFileWriter)]
    return writer.path


@pytest.fixture(scope="module")
def image_case(tmp_path_factory: pytest.TempPathFactory):
    """A classifier's checkpoint, files to classify, ``predict``'s rows for them by file, and a server
    started as ``serve --config ... --ckpt_path ...``: it exports the checkpoint first."""
    folder = tmp_path_factory.mktemp("serve_classify")
    here = Path.cwd()
    try:
        ckpt = fitted(folder, *CLASSIFY)
        files = files_of_every_shape(folder / "new")
        predicted = main(
            ["predict", *CLASSIFY, f"--ckpt_path={ckpt}", "--data.init_args.predict_path=new", *QUIET]
        )
        with open(written(predicted), newline="") as f:
            rows = {row["file"]: row for row in csv.DictReader(f)}
    finally:
        os.chdir(here)
    flags = (*LIMITS, f"--read_timeout={READ_TIMEOUT}")
    server = ServedExport(*CLASSIFY, f"--ckpt_path={ckpt}", *flags, cwd=str(folder)).start()
    yield files, rows, server
    assert server.stop() == 0, server.output


@pytest.fixture(scope="module")
def image_export(image_case) -> Path:
    """The folder that image_case's server exported before serving it."""
    ckpt = next(arg for arg in image_case[2].command if arg.startswith("--ckpt_path="))
    return Path(ckpt.partition("=")[2]).parent.parent / "export" / "last"


@pytest.mark.parametrize(
    "case",
    [
        "tiny",
        pytest.param("image_export", marks=pytest.mark.slow),
        pytest.param("text_case", marks=pytest.mark.slow),
    ],
)
def test_fuzz_model_json_either_serves_or_is_refused_in_one_line(case, request, tmp_path):
    """An export's model.json, mutated (bad_exports.mutated): each start serves its request or is
    refused in one line; never a traceback, a 5xx or a hang. ``tiny``: bad_exports' own 8x8
    classifier, built in milliseconds, for the fast runs; then a real export of each task."""
    if case == "tiny":
        export = bad_exports.write_export(tmp_path / "tiny")
    else:
        export = request.getfixturevalue(case)
        export = export[0] if case == "text_case" else export
    seen = bad_exports.fuzz_starts(export, tmp_path, ROUNDS)
    assert seen["refused"] >= ROUNDS // 4 and seen["served"] >= 1, seen


@pytest.mark.slow
def test_health_answers_503_while_serve_exports_the_checkpoint(image_case):
    """``serve --config ... --ckpt_path ...`` takes its port before it exports: /health is 503 until
    the model is loaded, not a refused connection."""
    _, _, server = image_case
    assert 503 in server.health_seen and server.health_seen[-1] == 200


@pytest.mark.slow
def test_a_client_that_sends_slowly_or_endlessly_is_refused_alone(image_case):
    """Four clients at once: an endless header is refused (431) at once, a head or a body cut short
    (408) and a connection that sends nothing (closed) after --read_timeout, while good requests
    are answered. A large header sent whole is told so too."""
    files, rows, server = image_case
    threads, said = misbehaving(server.port)
    answered = []
    while any(thread.is_alive() for thread in threads):
        answered.append(ask_image(server, files[2])["class"])
    assert answered.count(rows[files[2].name]["class"]) == len(answered) > 10 and len(said) == 4, said
    (status, answer), after = said.pop("endless header")
    assert_refused(status, answer, 431, "endless header")
    assert after < READ_TIMEOUT / 2 and "over 65536 bytes" in answer["detail"]
    for name, ((status, answer), after) in said.items():
        assert READ_TIMEOUT - 0.1 < after < READ_TIMEOUT + 3, (name, after)
        if name != "nothing":
            assert_refused(status, answer, 408, name)
            assert f"--read_timeout {READ_TIMEOUT:g} s" in answer["detail"], answer
    assert said["nothing"][0] == (None, None), "closed with no answer"
    status, answer = server.request("GET", "/health", headers={"X-Large": "a" * 100_000})
    assert_refused(status, answer, 431, "a header too large, sent whole")


@pytest.fixture(scope="module")
def text_case(tmp_path_factory: pytest.TempPathFactory):
    """A language model's export, ``predict``'s greedy text for GREEDY's prompt, and a server."""
    folder = tmp_path_factory.mktemp("serve_lm")
    here = Path.cwd()
    try:
        ckpt = fitted(folder, *LM)
        main(["export", *LM, f"--ckpt_path={ckpt}", "--formats=onnx"])
        export = ckpt.parent.parent / "export" / "last"
        predicted = main(["predict", *LM, f"--ckpt_path={ckpt}", *QUIET])
        (row,) = [json.loads(line) for line in written(predicted).read_text().splitlines()]
    finally:
        os.chdir(here)
    assert (
        row["prompt"] == GREEDY["prompt"]
        and len(row["text"]) == len(row["prompt"]) + GREEDY["max_new_tokens"]
    )
    server = ServedExport(str(export), *LIMITS, "--max_batch_size=4").start()
    yield export, row["text"], server
    assert server.stop() == 0, server.output


def ask_image(server: ServedExport, file: Path) -> dict:
    status, answer = server.post(file.read_bytes(), "image/png", "?top_k=3")
    assert status == 200, answer
    return answer


@pytest.mark.slow
def test_served_classes_equal_predict_on_every_file(image_case):
    files, rows, server = image_case
    assert sorted(rows) == [file.name for file in files]
    for file in files:
        answer = ask_image(server, file)
        assert answer["class"] == rows[file.name]["class"], file.name
        assert answer["probability"] == pytest.approx(float(rows[file.name]["probability"]), abs=1e-4)
        assert answer["top_k"][0]["class"] == answer["class"] and len(answer["top_k"]) == 3
    status, info = server.request("GET", "/info")
    assert status == 200 and info["model"]["classes"] == ["c0", "c1", "c2", "c3"]
    assert Preprocessing.from_description(info["model"]["preprocessing"]).crop == (4, 4)


@pytest.mark.slow
def test_served_text_at_temperature_0_equals_predict(text_case):
    _, text, server = text_case
    status, answer = server.post(json.dumps(GREEDY).encode(), "application/json")
    assert status == 200 and answer["text"] == text and answer["completion"] == text[len("ROMEO:") :]
    seeded = {**GREEDY, "temperature": 0.9, "top_k": 5, "seed": 7}
    first, second = (server.post(json.dumps(seeded).encode(), "application/json") for _ in range(2))
    assert first == second and first[0] == 200, "a seed repeats a sampled text"


@pytest.mark.slow
def test_fuzz_bad_requests_get_a_4xx_line_and_the_server_keeps_answering(image_case, text_case):
    """Every kind of bad request once, then ROUNDS drawn at random: numbers at their extremes, files
    of a decode fuzzer, ... each answered in time by what its kind expects, never a 5xx, and a good
    request after each still gets predict's answer."""
    files, rows, image_server = image_case
    good_file = files[2]
    good_image = good_file.read_bytes()
    _, text, text_server = text_case
    good_text = json.dumps(GREEDY).encode()
    rng = random.Random(0)
    kinds = [(name, IMAGE_KINDS[name], image_server, good_image) for name in IMAGE_KINDS]
    kinds += [(name, TEXT_KINDS[name], text_server, good_text) for name in TEXT_KINDS]
    tried = set()
    for round_ in range(max(ROUNDS, len(kinds))):
        name, kind, server, good = kinds[round_] if round_ < len(kinds) else rng.choice(kinds)
        (body, content_type, query), expected = kind(rng, good)
        status, answer = server.request(
            "POST", f"/predict{query}", body, {"Content-Type": content_type}, timeout=20
        )
        assert_refused(status, answer, expected, f"{name}: {body[:60]!r} {query[:60]}")
        tried.add((server is image_server, name))
        if server is image_server:
            assert ask_image(server, good_file)["class"] == rows[good_file.name]["class"], name
        else:
            status, answer = server.post(good_text, "application/json")
            assert status == 200 and answer["text"] == text, name
    assert len(tried) == len(IMAGE_KINDS) + len(TEXT_KINDS)
    status, answer = image_server.request("GET", "/predict")
    assert status == 405
    said = image_server.post(bad_requests.bomb(), "image/png")[1]["detail"]
    assert re.search(r"2000x2000, 4000000 pixels, over this server's --max_pixels 1000000", said)
    said = text_server.post(bad_requests.generation(prompt="ROMEO€"), "application/json")[1]["detail"]
    assert "characters '€' are not in the model's vocabulary" in said


@pytest.mark.slow
def test_a_request_while_the_model_loads_waits_and_sigterm_drains_it(text_case, tmp_path):
    """The model arrives through a pipe, as slowly as the test lets it: the server listens, /health
    says 503, requests wait; SIGTERM then stops the server only after they are answered, exit 0."""
    export, text, _ = text_case
    slow = SlowModel(export, tmp_path)
    server = ServedExport(str(slow.folder)).start(healthy=False)
    answers: list = []
    threads: list[threading.Thread] = []
    try:
        assert slow.listening(server) == 503
        threads = asking(server, 3, answers)
        while accepted_connections(server) < 3:
            assert server.process.poll() is None and not answers
            time.sleep(0.05)
        assert not answers, "nothing is answered before the model is in"
        server.process.send_signal(15)
    finally:
        code = drain(slow, server, threads)
    assert code == 0, server.output
    assert [(status, said.get("text")) for status, said in answers] == [(200, text)] * 3
    assert "Server stopped." in server.output


@pytest.mark.slow
def test_after_sigterm_a_kept_alive_connection_gets_503_and_close_and_waiting_requests_batch(
    text_case, tmp_path
):
    """Three requests queue while the model loads, on a server that batches up to 4: the model
    answers them in one call once it is in, as the server's log says. A client
    whose kept-alive connection asks again after SIGTERM is told 503 with Connection: close."""
    export, text, _ = text_case
    slow = SlowModel(export, tmp_path)
    server = ServedExport(str(slow.folder), "--max_batch_size=4").start(healthy=False)
    kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    answers: list = []
    threads: list[threading.Thread] = []
    try:
        assert slow.listening(server) == 503
        threads = asking(server, 3, answers)
        while server.request("GET", "/info")[1]["server"]["queued"] < 3:
            assert server.process.poll() is None and not answers
            time.sleep(0.05)
        kept.request("GET", "/info")
        response = kept.getresponse()
        assert response.status == 200 and response.read() and kept.sock is not None
        server.process.send_signal(15)
        time.sleep(0.5)  # the signal handled, the server still draining the three
        kept.request("POST", "/predict", json.dumps(GREEDY), {"Content-Type": "application/json"})
        response = kept.getresponse()
        said = json.loads(response.read())
        assert response.status == 503 and response.getheader("Connection") == "close", said
        assert "the server is stopping" in said["detail"] and kept.sock is None
    finally:
        code = drain(slow, server, threads)
    assert code == 0, server.output
    assert [(status, said.get("text")) for status, said in answers] == [(200, text)] * 3
    assert re.search(r"answered 3 requests in 1 model calls \(largest batch 3\)", server.output)


@pytest.mark.slow
def test_a_request_the_model_fails_on_fails_alone_and_its_batch_mates_are_answered(text_case, tmp_path):
    """A request the model raises on, queued with three good ones while the model loads: the four
    share one batch, the model raises on it, and the server runs them again a request at a time:
    the poisoned one gets a 500 and its line, the others their continuations; the server's log has
    the traceback."""
    export, _, _ = text_case
    folder, poison = poisoned_export(export, tmp_path / "poisoned")
    vocab = json.loads((folder / "model.json").read_text())["vocab"]
    prompts = ["ROMEO:", "JULIET", "ROMEO" + poison, "RO"]
    assert all(c in vocab for prompt in prompts for c in prompt) and poison not in "ROMEO:JULIET"
    slow = SlowModel(folder, tmp_path)
    server = ServedExport(str(slow.folder), "--max_batch_size=8").start(healthy=False)
    answers: dict[str, tuple[int, dict]] = {}

    def ask(prompt: str) -> None:
        body = json.dumps({**GREEDY, "prompt": prompt}).encode()
        answers[prompt] = server.post(body, "application/json")

    threads = [threading.Thread(target=ask, args=(prompt,), daemon=True) for prompt in prompts]
    try:
        assert slow.listening(server) == 503
        for thread in threads:
            thread.start()
        while server.request("GET", "/info")[1]["server"]["queued"] < len(prompts):
            assert server.process.poll() is None and not answers
            time.sleep(0.05)
    finally:
        code = drain(slow, server, threads)
    assert code == 0, server.output
    status, said = answers.pop("ROMEO" + poison)
    assert status == 500 and said["detail"].startswith("the model failed on this request"), said
    assert "\n" not in said["detail"]
    assert "The model failed on a request to /predict\nTraceback" in server.output  # for its owner
    for prompt, (status, said) in answers.items():
        count = [
            (vocab.index(prompt[-1]) + 1 + i) % (len(vocab) - 1) for i in range(GREEDY["max_new_tokens"])
        ]
        assert (status, said.get("text")) == (200, prompt + "".join(vocab[i] for i in count)), said
    assert re.search(r"answered 4 requests in 5 model calls \(largest batch 4\)", server.output)


@pytest.mark.slow
def test_a_request_that_waits_past_the_timeout_gets_504(text_case, tmp_path):
    export, _, _ = text_case
    slow = SlowModel(export, tmp_path)
    server = ServedExport(str(slow.folder), "--timeout=0.5").start(healthy=False)
    try:
        assert slow.listening(server) == 503
        status, answer = server.post(json.dumps(GREEDY).encode(), "application/json")
        assert status == 504 and "did not answer within --timeout 0.5 s" in answer["detail"], answer
    finally:
        slow.release.set()
        code = server.stop()
    assert code == 0, server.output


@pytest.mark.slow
def test_a_lone_request_is_a_batch_of_one(image_case):
    files, _, server = image_case
    before = server.request("GET", "/info")[1]["server"]
    for file in files[:5]:
        ask_image(server, file)
    after = server.request("GET", "/info")[1]["server"]
    assert after["max_batch_size"] == 8
    assert (after["requests"] - before["requests"], after["batches"] - before["batches"]) == (5, 5)


@pytest.mark.slow
def test_workers_answer_drain_restart_a_killed_one_and_end_with_a_killed_parent(text_case):
    """``--workers 2``: two processes on one socket, each answering as predict. One killed by kill -9
    in a request closes that connection (no client left waiting) and is started again, the port
    answering throughout; SIGTERM drains both, exit 0. A second such server's parent killed by
    kill -9 leaves no worker and no port."""
    export, text, _ = text_case
    body = json.dumps(GREEDY).encode()
    with ServedExport(str(export), "--workers=2") as server:
        assert len(server_processes(server)) == 3
        killed, raised, after = killed_in_a_request(server.port)
        assert isinstance(raised, ConnectionError) and after < 5, (raised, after)
        for _ in range(4):
            status, answer = server.post(body, "application/json")
            assert status == 200 and answer["text"] == text
        assert killed not in replaced(server.process.pid, killed, workers=2)
    assert server.process.returncode == 0 and "Server stopped." in server.output, server.output
    assert f"Worker {killed} was killed by SIGKILL: starting another on the same port." in server.output
    server = ServedExport(str(export), "--workers=2").start()
    try:
        workers = server_processes(server)[1:]
        assert len(workers) == 2
        server.process.kill()
        _, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, alive
    finally:
        server.stop()
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a new server binds it
        probe.bind(("127.0.0.1", server.port))  # no process listens on it any more
