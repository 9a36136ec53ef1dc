"""The HTTP server on LitServe: its workers, dynamic batching, ``/health`` and ``/info``, with the
kit's own ``/predict`` endpoint (``ExportSpec``, a LitServe spec) and model (``ExportedModel``, a
LitServe API).

LitServe runs the model in ``workers`` inference processes per device, fed from one queue, and
batches requests that arrive within ``batch_timeout`` of each other up to ``max_batch_size``. The
endpoint reads and checks each request in the HTTP process before it is queued (``requests``), so
a bad request is answered alone and a batch holds only good ones. A worker loads its model in the
background: the server listens at once, ``/health`` answers 503 until a model is loaded, and a
request that arrives meanwhile waits for it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import litserve as ls
from fastapi import Request
from fastapi.responses import JSONResponse
from litserve.specs.base import LitSpec
from litserve.utils import LitAPIStatus, ResponseBufferItem
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from projkit.internals.litserve import DrainingServer
from projkit.preprocessing import Preprocessing
from projkit.serve.model import IMAGE_TASK, answerer, load_session
from projkit.serve.requests import BadRequest, Limits, generation_request, image_request

PREDICT_PATH = "/predict"


def refusal(status: int, message: str) -> JSONResponse:
    """A refused request's answer: its status and ``{"detail": <one line>}``, as FastAPI words its own."""
    return JSONResponse({"detail": message}, status_code=status)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is known to pass ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"the body is {declared} bytes, over this server's --max_body_bytes {limit}.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"the body is over this server's --max_body_bytes {limit}.")
        chunks.append(chunk)
    return b"".join(chunks)


class ExportSpec(LitSpec):
    """``POST /predict`` for an export: the body checked and prepared here, in the HTTP process, then
    queued for the inference workers (the way LitServe's own specs queue theirs) and answered as JSON."""

    def __init__(self, spec: dict[str, Any], limits: Limits) -> None:
        super().__init__()
        self.api_path = PREDICT_PATH
        self.limits = limits
        self.image = spec["task"] == IMAGE_TASK
        self.preprocessing = Preprocessing.from_description(spec["preprocessing"]) if self.image else None
        self.classes = len(spec.get("classes", ()))
        self.vocab = spec.get("vocab", "")

    def pre_setup(self, lit_api: ls.LitAPI) -> None:
        self.add_endpoint(self.api_path, self.predict, ["POST"])

    def decode_request(self, request: Any, context_kwargs: dict | None = None) -> Any:
        return request

    def encode_response(self, output: Any, context_kwargs: dict | None = None) -> Any:
        return output

    def prepare(self, body: bytes, content_type: str, query: dict[str, str]) -> dict[str, Any]:
        if self.image:
            return image_request(body, content_type, query, self.preprocessing, self.classes, self.limits)
        return generation_request(body, content_type, self.vocab, self.limits)

    async def predict(self, request: Request) -> JSONResponse:
        try:
            body = await read_body(request, self.limits.max_body_bytes)
            content_type = request.headers.get("content-type", "")
            query = dict(request.query_params)
            prepared = await run_in_threadpool(self.prepare, body, content_type, query)
        except BadRequest as refused:
            return refusal(refused.status, refused.message)
        except ClientDisconnect:
            return refusal(400, "the client closed the connection before the body ended.")
        uid = str(uuid.uuid4())
        event = asyncio.Event()
        self.response_buffer[uid] = ResponseBufferItem(event=event)
        try:
            self.request_queue.put((self.response_queue_id, uid, time.monotonic(), prepared))
            await event.wait()
            response, status = self.response_buffer[uid].response
        finally:
            self.response_buffer.pop(uid, None)
        if status == LitAPIStatus.ERROR:
            code = getattr(response, "status_code", 500)
            detail = (
                getattr(response, "detail", None) or "the model failed on this request; see the server's log."
            )
            return refusal(code, str(detail))
        return JSONResponse(response)


class ExportedModel(ls.LitAPI):
    """The export's model in a LitServe inference worker: loaded in the background when the worker
    starts (``loaded`` counts the workers whose model is in, for ``/health`` in the HTTP processes),
    answering a batch of prepared requests at once."""

    def __init__(
        self,
        folder: Path,
        spec: dict[str, Any],
        limits: Limits,
        max_batch_size: int,
        batch_timeout: float,
        threads: int,
    ) -> None:
        super().__init__(
            max_batch_size=max_batch_size, batch_timeout=batch_timeout, spec=ExportSpec(spec, limits)
        )
        self.folder = Path(folder)
        self.model_spec = spec
        self.threads = threads
        # Spawned workers receive it as they start; the forked HTTP processes share it.
        self.loaded = multiprocessing.get_context("spawn").Value("i", 0)

    def setup(self, device: str) -> None:
        # A SIGTERM or Ctrl-C to the whole process group (systemd, a terminal, a batch system) is the
        # server's to handle: the worker answers until the server stops it, after the HTTP side drained.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        threading.Thread(target=self.load, args=(device,), name="model-load", daemon=True).start()

    def load(self, device: str) -> None:
        try:
            self.model = answerer(load_session(self.folder, device, self.threads), self.model_spec)
            with self.loaded.get_lock():
                self.loaded.value += 1
        except BaseException as error:  # said to every request rather than lost with the thread
            self._failure = error
        finally:
            self._ready.set()

    def health(self) -> bool:
        return self.loaded.value > 0

    def decode_request(self, request: Any, **kwargs: Any) -> Any:
        return request

    def predict(self, x: Any, **kwargs: Any) -> Any:
        self._ready.wait()
        if self._failure is not None:
            raise RuntimeError(f"the model did not load: {self._failure}")
        if self.max_batch_size == 1:  # LitServe hands a single request unbatched
            return self.model.answers([x])[0]
        return self.model.answers(list(x))

    def encode_response(self, output: Any, **kwargs: Any) -> Any:
        return output


# The server the kit runs: LitServe's, with a shutdown that drains (``projkit.internals.litserve``).
Server = DrainingServer
