"""The HTTP server, in the process that holds the model: Starlette on uvicorn (uvloop, httptools),
with ``POST /predict``, ``GET /health`` and ``GET /info``.

A request is read and checked on the event loop (``requests``), so a bad one is answered alone and
never reaches a batch, then handed to the model's thread (``batching``) and its answer awaited: no
other process, no pickling, between the socket and onnxruntime. SIGTERM or Ctrl-C starts a drain:
every request already taken in is answered, any request after it gets 503 with ``Connection:
close`` (a client on a kept-alive connection is told, not reset), and once nothing is in flight
uvicorn closes the socket and the connections and ``serve`` returns. A client holds a connection
for ``--read_timeout`` at most while it sends a request, whose head has a size limit too
(``connections``): one that sends slowly or endlessly is refused alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from projkit.preprocessing import Preprocessing
from projkit.serve.batching import ModelThread
from projkit.serve.connections import bounded
from projkit.serve.model import IMAGE_TASK
from projkit.serve.requests import BadRequest, Limits, generation_request, image_request

PREDICT_PATH = "/predict"
# A body up to this size is prepared on the event loop: a thread's hand-over would cost more than
# decoding a small image; a larger one is prepared in a thread, so the loop goes on meanwhile.
INLINE_BODY_BYTES = 64 * 1024
NOT_POST = "send POST to /predict: an image file or a JSON prompt."
STOPPING = "the server is stopping (SIGTERM): send the request again, to a server that runs."
Send = Callable[[dict], Awaitable[None]]
Receive = Callable[[], Awaitable[dict]]
LOG = logging.getLogger("uvicorn.error")  # uvicorn's own log, at the --log_level given


def json_body(content: Any) -> bytes:
    """An answer's JSON as Starlette's ``JSONResponse`` renders it (UTF-8, compact, no NaN)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


async def send_json(send: Send, status: int, content: Any, headers: dict[str, str] | None = None) -> None:
    """Answer ``status`` with ``content`` as JSON, straight through ASGI."""
    body = json_body(content)
    head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    head += [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def refuse(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    """A refused request's answer: its status and ``{"detail": <one line>}``."""
    await send_json(send, status, {"detail": message}, headers)


def header(scope: dict, name: bytes) -> str | None:
    """The request's first ``name`` header (lower case, as the server gives them), or None."""
    return next((value.decode("latin-1") for key, value in scope["headers"] if key == name), None)


async def read_body(scope: dict, receive: Receive, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is known to pass ``limit`` bytes, or (400)
    when the client goes before it ends."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"the body is {declared} bytes, over this server's --max_body_bytes {limit}.")
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest(400, "the client closed the connection before the body ended.")
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"the body is over this server's --max_body_bytes {limit}.")
        chunks.append(chunk)
    return b"".join(chunks)


class Endpoints:
    """The three routes over one export's model thread; ``settings`` is what ``/info`` says of the
    server besides the model's counts. ``/predict`` is answered in plain ASGI (it is the one route
    whose cost per request counts), the other two through Starlette."""

    def __init__(
        self, spec: dict[str, Any], limits: Limits, model: ModelThread, timeout: float, settings: dict
    ) -> None:
        self.spec, self.limits, self.model, self.timeout = spec, limits, model, timeout
        self.settings = settings
        self.image = spec["task"] == IMAGE_TASK
        self.preprocessing = Preprocessing.from_description(spec["preprocessing"]) if self.image else None
        self.classes = len(spec.get("classes", ()))

    def routes(self) -> list[Route]:
        return [Route("/health", self.health, methods=["GET"]), Route("/info", self.info, methods=["GET"])]

    def prepare(self, body: bytes, content_type: str, query: list[tuple[str, str]]) -> dict[str, Any]:
        if self.image:
            return image_request(body, content_type, query, self.preprocessing, self.classes, self.limits)
        return generation_request(body, content_type, self.spec["vocab"], self.limits, query)

    async def predict(self, scope: dict, receive: Receive, send: Send, alone: Callable[[], bool]) -> None:
        """``POST /predict``. An image request that is the only one in the server once the loop has
        let the others read with it count themselves (``alone``) is answered here, on the loop,
        rather than through the model's thread: one call, no hand-over. A generation takes a call
        per token, and never holds the loop."""
        try:
            body = await read_body(scope, receive, self.limits.max_body_bytes)
            query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            asked = (body, header(scope, b"content-type") or "", query)
            if len(body) <= INLINE_BODY_BYTES:
                prepared = self.prepare(*asked)
            else:
                prepared = await run_in_threadpool(self.prepare, *asked)
        except BadRequest as refused:
            return await refuse(send, refused.status, refused.message)
        inline = False
        if self.image:
            await asyncio.sleep(0)  # the requests read in the same turn of the loop count themselves in
            inline = alone()
        try:
            answer = await self.model.answer(prepared, self.timeout, inline=inline)
        except asyncio.TimeoutError:
            return await refuse(send, 504, f"the model did not answer within --timeout {self.timeout:g} s.")
        except Exception as error:
            LOG.exception("The model failed on a request to %s", PREDICT_PATH)  # the traceback, for the owner
            message = " ".join(f"the model failed on this request: {error}".split())[:300]
            return await refuse(send, 500, message)
        await send_json(send, 200, answer)

    async def health(self, request: Request) -> Response:
        return PlainTextResponse("ok") if self.model.ready else PlainTextResponse("not ready", 503)

    async def info(self, request: Request) -> Response:
        served = {**self.settings, "pid": os.getpid(), "loaded": self.model.ready, **self.model.counts}
        served["queued"] = self.model.queue.qsize()
        return Response(json_body({"model": self.spec, "server": served}), media_type="application/json")


class Gate:
    """The server's ASGI app: counts the requests in flight and, once a drain has begun, refuses new
    ones with 503 and ``Connection: close``; ``on_drained`` is called when the last one in flight is
    answered. ``POST /predict`` goes to the endpoints directly, any other request to Starlette."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self.others = Starlette(routes=endpoints.routes())
        self.on_drained: Callable[[], None] = lambda: None
        self.in_flight = 0
        self.stopping = False

    def alone(self) -> bool:
        return self.in_flight == 1

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.others(scope, receive, send)
        if self.stopping:
            return await refuse(send, 503, STOPPING, {"Connection": "close"})
        self.in_flight += 1
        try:
            if scope["path"] != PREDICT_PATH:
                await self.others(scope, receive, send)
            elif scope["method"] == "POST":
                await self.endpoints.predict(scope, receive, send, self.alone)
            else:
                await refuse(send, 405, NOT_POST, {"Allow": "POST"})
        finally:
            self.in_flight -= 1
            if self.stopping and self.in_flight == 0:
                self.on_drained()

    def stop(self) -> None:
        """Begin the drain (from a signal handler, on the loop's thread)."""
        self.stopping = True
        if self.in_flight == 0:
            self.on_drained()


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose SIGTERM and SIGINT drain through the ``Gate`` before it exits, and
    are not raised again once it has (uvicorn re-raises what it caught, which would end the process
    with the signal instead of exit 0). ``force``: a second signal stops at once (Ctrl-C twice); a
    worker process ignores it, its parent decides."""

    def __init__(self, config: uvicorn.Config, gate: Gate, force: bool = True) -> None:
        super().__init__(config)
        self.gate, self.force = gate, force
        gate.on_drained = self.drained

    def drained(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.gate.stopping:
            self.gate.stop()
        elif self.force:
            self.should_exit = self.force_exit = True


def run(
    endpoints: Endpoints,
    sock: socket.socket,
    log_level: str,
    read_timeout: float,
    force_on_second_signal: bool = True,
) -> None:
    """Serve on the bound, listening ``sock`` until a signal's drain is done (the model thread
    runs from before the first request to after the last); a client has ``read_timeout`` seconds
    to send a request's head, and as long again for its body."""
    gate = Gate(endpoints)
    config = uvicorn.Config(
        gate,
        loop="uvloop" if os.name != "nt" else "asyncio",
        http=bounded(read_timeout),
        ws="none",  # no WebSocket route: an Upgrade header is a plain HTTP request's
        lifespan="off",
        log_level=log_level,
        access_log=log_level in ("debug", "info"),
        # Requests are drained before uvicorn's shutdown begins; this bounds a connection that
        # still sends its headers then.
        timeout_graceful_shutdown=5,
        # No X-Forwarded-For rewriting per request (the kit reads no client address; the access log
        # names the proxy): with the timer below, 5-15 % less server CPU per request.
        proxy_headers=False,
    )
    server = DrainingServer(config, gate, force_on_second_signal)
    for signum in (signal.SIGTERM, signal.SIGINT):  # until uvicorn sets the same, as it starts
        signal.signal(signum, server.handle_exit)
    endpoints.model.start()
    try:
        server.run(sockets=[sock])
    finally:
        endpoints.model.stop(wait=not server.force_exit)  # a second Ctrl-C cuts a long answer short
