"""What the kit takes from LitServe's internals: a shutdown that drains, and the event that starts it.

Checked with litserve 0.2.19; ``kit/tests/test_internals.py`` tests both. LitServe's graceful
shutdown terminates its inference workers at once, cutting off the requests they hold; the kit's
``Server`` drains them first, by the stop value their loop ends on.
"""

from __future__ import annotations

import threading
from typing import Any

import litserve as ls

from projkit.internals import LibraryChanged, existing

LITSERVE = "litserve"
DRAIN = "drain the workers at shutdown"

try:
    from litserve.loops.base import _SENTINEL_VALUE as STOP_VALUE
except ImportError:
    raise LibraryChanged(LITSERVE, "litserve.loops.base._SENTINEL_VALUE", DRAIN) from None

if not callable(getattr(ls.LitServer, "_perform_graceful_shutdown", None)):
    raise LibraryChanged(LITSERVE, "LitServer._perform_graceful_shutdown", DRAIN)


class DrainingServer(ls.LitServer):
    """LitServe's server, whose shutdown drains before it stops: the HTTP processes first (each
    answers what it has in flight, as uvicorn does on SIGTERM), then each inference worker by the
    stop value its loop ends on, so no request is cut off by a terminated worker."""

    def _perform_graceful_shutdown(
        self, manager: Any, uvicorn_workers: dict, shutdown_reason: str = "normal"
    ) -> None:
        for worker in uvicorn_workers.values():
            if worker.is_alive():
                worker.terminate()
        for worker in uvicorn_workers.values():
            worker.join(self.uvicorn_graceful_timeout)
        workers = getattr(self, "inference_workers", [])
        for queue in self.litapi_request_queues.values():
            for _ in workers:
                queue.put(STOP_VALUE)
        for worker in workers:
            worker.join(5)
        alive = {key: worker for key, worker in uvicorn_workers.items() if worker.is_alive()}
        super()._perform_graceful_shutdown(manager, alive, shutdown_reason)


def shutdown_event(server: ls.LitServer) -> threading.Event | None:
    """The event whose setting shuts ``server`` down, or None before ``run`` made it (the attribute
    exists from the server's construction: a name that is gone raises)."""
    return existing(server, "_shutdown_event", LITSERVE, "stop the server on SIGTERM")
