"""Exports the serving tests make from a real one: ``SlowModel``, whose model.onnx arrives through a
pipe only when the test lets it (requests wait for it meanwhile, and batch), and ``poisoned_export``,
whose model fails on one character (a request the model raises on, for the batch that holds it)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import psutil
from onnx import TensorProto, helper, numpy_helper

from projkit.testing import ServedExport

# A prompt the language model continues the same way every time.
GREEDY = {"prompt": "ROMEO:", "max_new_tokens": 8, "temperature": 0}


class SlowModel:
    """A copy of ``export`` whose model.onnx is a pipe: the check at start reads it at once, the
    server's model thread only once ``release`` is set, so requests wait for the model meanwhile."""

    def __init__(self, export: Path, folder: Path) -> None:
        self.folder = folder / "slow"
        shutil.copytree(export, self.folder)
        self.model = (self.folder / "model.onnx").read_bytes()
        (self.folder / "model.onnx").unlink()
        os.mkfifo(self.folder / "model.onnx")
        self.release = threading.Event()
        threading.Thread(target=self.feed, daemon=True).start()

    def feed(self) -> None:
        for turn in range(2):
            if turn:
                self.release.wait()
            with open(self.folder / "model.onnx", "wb") as pipe:
                pipe.write(self.model)

    def listening(self, server: ServedExport) -> int:
        """The status of the first ``/health`` the server answers (bounded by the request's own
        timeout when it never listens)."""
        while True:
            try:
                return server.request("GET", "/health", timeout=5)[0]
            except OSError:
                assert server.process.poll() is None, "the server stopped while its model loaded"
                time.sleep(0.05)


def poisoned_export(export: Path, folder: Path) -> tuple[Path, str]:
    """A copy of the language model's ``export`` whose model.onnx fails on its vocabulary's last
    character, and that character. The model is one Gather from a table of logits that lacks that
    character's row (onnxruntime refuses the index), whose row for each other token id ``i`` is
    highest at ``(i + 1) % (V - 1)``: greedy text counts on through the vocabulary."""
    spec = json.loads((export / "model.json").read_text())
    size = len(spec["vocab"])
    table = np.zeros((size - 1, size), np.float32)
    table[np.arange(size - 1), (np.arange(size - 1) + 1) % (size - 1)] = 10.0
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", spec["input"]["name"]], ["logits"], axis=0)],
        "poisoned",
        [helper.make_tensor_value_info(spec["input"]["name"], TensorProto.INT64, ["N", "T"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "T", size])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    shutil.copytree(export, folder)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    return folder, spec["vocab"][-1]


def server_processes(server: ServedExport) -> list[psutil.Process]:
    parent = psutil.Process(server.process.pid)
    return [parent, *parent.children(recursive=True)]


def accepted_connections(server: ServedExport) -> int:
    """Connections the server's processes hold to its port: requests taken in, not merely queued
    by the kernel."""
    return sum(
        1
        for process in server_processes(server)
        for connection in process.net_connections("tcp")
        if connection.status == psutil.CONN_ESTABLISHED and connection.laddr.port == server.port
    )


def asking(server: ServedExport, count: int, answers: list) -> list[threading.Thread]:
    """``count`` threads, started, each posting GREEDY's prompt once into ``answers``."""
    body = json.dumps(GREEDY).encode()
    threads = [
        threading.Thread(target=lambda: answers.append(server.post(body, "application/json")), daemon=True)
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def drain(slow: SlowModel, server: ServedExport, threads: list[threading.Thread]) -> int:
    """Let the model in, wait for the requests' answers, stop the server: its exit code."""
    slow.release.set()
    for thread in threads:
        thread.join(60)
    return server.stop()
