"""The model's own thread, which batches only what is already waiting.

One thread loads the export and then answers from a queue: each time it is free it takes every
request queued meanwhile, up to ``max_batch_size``, and runs them as one call. A lone request is a
batch of one at once (no timeout waits for company); under load the requests that piled up during
the previous call share the next one, which is where batching pays. A batch the model raises on
is run again a request at a time, so that a request it fails on fails alone (500) and the others
are answered. onnxruntime runs outside the GIL, so the event loop keeps reading and preparing
requests while the model computes.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

# A request's place in the queue: what the model answers, the future its answer settles, its loop.
Entry = tuple[Any, asyncio.Future, asyncio.AbstractEventLoop]
# What the model made of one request: its answer, or the exception it raised on it.
Outcome = tuple[Any, Exception | None]


class ModelThread:
    """The model, loaded and run in a thread of its own; ``answer`` queues a prepared request and
    awaits its answer. ``counts`` says how many requests and model calls (batches) there have been,
    for ``/info``: under load the calls are fewer than the requests (a batch the model failed on is
    run again a request at a time, each a call)."""

    def __init__(self, load: Callable[[], Any], max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.queue: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self.loaded = threading.Event()
        self.model: Any = None
        self.calling = threading.Lock()  # held during each call of the model, by whichever thread
        self.failure: str | None = None
        self.counts = {"requests": 0, "batches": 0, "largest_batch": 0}
        self.thread = threading.Thread(target=self.run, args=(load,), name="model", daemon=True)

    def start(self) -> ModelThread:
        self.thread.start()
        return self

    @property
    def ready(self) -> bool:
        """Whether the model is loaded and answers (``/health``)."""
        return self.loaded.is_set() and self.failure is None

    async def answer(self, request: Any, timeout: float, inline: bool = False) -> Any:
        """The model's answer to ``request``; TimeoutError after ``timeout`` seconds (its entry is
        then skipped, or its answer dropped), the model's exception if it raised on this request.
        ``inline``: when the model is loaded and not in a call, it is called here, in the caller's
        thread, without the two hand-overs of a thread (what a lone request on a small model
        mostly waits for); when it is busy, the request is queued as any other."""
        if inline and self.ready and self.calling.acquire(blocking=False):
            try:
                ((answer, error),) = self.counted_outcomes(self.model, [request])
            finally:
                self.calling.release()
            if error is not None:
                raise error
            return answer
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((request, future, loop))
        timer = loop.call_later(timeout, expire, future)  # lighter than asyncio.wait_for's task
        try:
            return await future
        finally:
            timer.cancel()

    def stop(self, wait: bool = True) -> None:
        """End the thread once it has answered what is queued (``wait``: return after); one still
        loading the model (so nothing was queued) is left to end with the process."""
        self.queue.put(None)
        if wait and self.loaded.is_set():
            self.thread.join()

    def run(self, load: Callable[[], Any]) -> None:
        try:
            model = load()
        except BaseException as error:  # said to every request rather than lost with the thread
            model, self.failure = None, f"the model did not load: {error}"
        self.model = model
        self.loaded.set()
        while (batch := self.next_batch()) is not None:
            self.answer_batch(model, batch)

    def next_batch(self) -> list[Entry] | None:
        """The next request, waited for, and every one queued behind it (up to the maximum); None
        once ``stop`` was called and nothing is left before it."""
        first = self.queue.get()
        if first is None:
            return None
        batch = [first]
        while len(batch) < self.max_batch_size:
            try:
                entry = self.queue.get_nowait()
            except queue.Empty:
                break
            if entry is None:  # stop after this batch
                self.queue.put(None)
                break
            batch.append(entry)
        return batch

    def answer_batch(self, model: Any, batch: list[Entry]) -> None:
        batch = [entry for entry in batch if not entry[1].done()]  # a timed-out request is not run
        if not batch:
            return
        with self.calling:
            outcomes = self.counted_outcomes(model, [request for request, _, _ in batch])
        loop = batch[0][2]
        loop.call_soon_threadsafe(settle, [future for _, future, _ in batch], outcomes)

    def counted_outcomes(self, model: Any, requests: list[Any]) -> list[Outcome]:
        """``outcomes``, counted for ``/info`` (with ``calling`` held)."""
        self.counts["requests"] += len(requests)
        self.counts["largest_batch"] = max(self.counts["largest_batch"], len(requests))
        return self.outcomes(model, requests)

    def outcomes(self, model: Any, requests: list[Any]) -> list[Outcome]:
        """Each request's answer, or the exception the model raised on it: the requests in one call,
        and when that call raises, each in a call of its own, so that a request the model fails on
        fails alone and its batch-mates are answered (at the cost of a call each, only then)."""
        self.counts["batches"] += 1
        try:
            if model is None:
                raise RuntimeError(self.failure)
            return [(answer, None) for answer in model.answers(requests)]
        except Exception as error:  # told to the request(s) it failed, the thread goes on
            if model is None or len(requests) == 1:
                return [(None, error)] * len(requests)
        return [self.outcomes(model, [request])[0] for request in requests]


def expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())


def settle(futures: list[asyncio.Future], outcomes: list[Outcome]) -> None:
    """In the event loop: each future gets its answer or its error; one that timed out meanwhile is
    left as it is."""
    for future, (answer, error) in zip(futures, outcomes, strict=True):
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(answer)
