"""Clients that hold a server's connection rather than ask (test_serve.py): one streams an endless
header, one stops within its headers, one within its body, one connects and sends nothing; and a
request cut short by its worker's ``kill -9``. Each over a real socket to a real server."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import threading
import time

import psutil

# A server given this --read_timeout (test_serve.py's image server).
READ_TIMEOUT = 2.0
ENDLESS_BYTES = 8 * 2**20
BODY_CUT = b"POST /predict HTTP/1.1\r\nContent-Type: image/png\r\nContent-Length: 900\r\n\r\nab"
# Each client's first bytes, after which it sends nothing more (the endless header goes on).
CLIENTS = {
    "endless header": b"GET /health HTTP/1.1\r\nX-Endless: ",
    "slow head": b"POST /predict HTTP/1.1\r\nHost: a\r\n",
    "slow body": BODY_CUT,
    "nothing": b"",
}

Answer = tuple[int | None, object]


def answer_to(sock: socket.socket) -> Answer:
    """What the server sent on ``sock`` until it closed it: the status and JSON, or None twice."""
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return (int(head.split()[1]), json.loads(body)) if data else (None, None)


def held(port: int, name: str) -> Answer:
    """Client ``name`` of ``CLIENTS`` on ``port``: what the server answered it. The endless header
    stops once the server answers, or after ``ENDLESS_BYTES`` (then ``(None, 'still sending')``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT + 10)
    sock.sendall(CLIENTS[name])
    size = 0
    while name == "endless header" and not select.select([sock], [], [], 0)[0]:
        if size >= ENDLESS_BYTES:
            sock.close()
            return None, "still sending"
        sock.sendall(b"a" * 65536)
        size += 65536
    return answer_to(sock)


def misbehaving(port: int) -> tuple[list[threading.Thread], dict[str, tuple[Answer, float]]]:
    """The four ``CLIENTS`` at once, each in a thread, started: the threads, and the dict each fills
    with its answer and the seconds it took."""
    began, said = time.monotonic(), {}

    def client(name: str) -> None:
        said[name] = (held(port, name), time.monotonic() - began)

    threads = [threading.Thread(target=client, args=(name,), daemon=True) for name in CLIENTS]
    for thread in threads:
        thread.start()
    return threads, said


def killed_in_a_request(port: int) -> tuple[int, BaseException, float]:
    """``kill -9`` of the worker that holds a request half sent (its head and part of its body),
    found through ``/info`` on the same kept-alive connection once its model is loaded: the worker's
    pid, what the client's wait for the answer raised, and after how many seconds."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        connection.request("GET", "/info")
        served = json.loads(connection.getresponse().read())["server"]
        if served["loaded"]:
            break
        time.sleep(0.1)
    connection.putrequest("POST", "/predict")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", "100")
    connection.endheaders(b'{"prompt": ')
    os.kill(served["pid"], signal.SIGKILL)
    began = time.monotonic()
    try:
        connection.getresponse()
    except (OSError, http.client.HTTPException) as raised:  # the test says which it must be
        return served["pid"], raised, time.monotonic() - began
    finally:
        connection.close()
    raise AssertionError("a request on a killed worker was answered")


def replaced(parent: int, killed: int, workers: int) -> list[int]:
    """The pids of ``parent``'s ``workers`` once the ``killed`` one has been reaped and another
    started in its place (waited for, at most a minute)."""
    deadline = time.monotonic() + 60
    while True:
        pids = [child.pid for child in psutil.Process(parent).children()]
        if killed not in pids and len(pids) == workers:
            return pids
        assert time.monotonic() < deadline, f"worker {killed} was not replaced: {pids}"
        time.sleep(0.1)
