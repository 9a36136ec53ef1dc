"""What one client may hold of the server: a request's head (its request line and headers) of at
most ``MAX_HEAD_BYTES``, sent within ``--read_timeout`` seconds of the connection or of its first
byte, and then its body within as long again.

uvicorn bounds neither with httptools (``h11_max_incomplete_event_size`` is h11's, and its
keep-alive timeout runs only between requests), and httptools gathers a header by appending to it,
which costs the square of its length: one client streaming an endless header held the event loop,
and every other request with it, for as long as it sent. ``BoundedHttpTools`` is uvicorn's
httptools protocol with both bounds; the connection that passes one is answered (431 or 408, a
one-line ``detail``) and closed, the others go on as before.
"""

from __future__ import annotations

import asyncio
import http
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Node allows 16 KiB, nginx 32 KiB: no client sends more, and the server reads two headers.
MAX_HEAD_BYTES = 64 * 1024
# After a refusal, how long what the client still sends is read and dropped before the connection
# closes: closed with bytes unread, the kernel resets it and the client may lose the answer.
LINGER_S = 1.0


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol within ``read_timeout`` (a subclass per server: ``bounded``)."""

    read_timeout = 30.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self.in_head, self.head_bytes, self.refused = True, 0, False
        self.deadline: asyncio.TimerHandle | None = None
        self.restart_deadline()  # a connection that sends nothing is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # read and dropped until the connection closes
        if self.in_head and self.deadline is None:  # a kept-alive connection's next request
            self.restart_deadline()
        while self.in_head and data:  # the head is fed in pieces that stop at the limit
            room = MAX_HEAD_BYTES - self.head_bytes
            piece, data = data[:room], data[room:]
            self.head_bytes += len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return
            if self.in_head and self.head_bytes >= MAX_HEAD_BYTES:
                return self.refuse(
                    431,
                    f"the request line and headers are over {MAX_HEAD_BYTES} bytes, this server's limit: "
                    "send a shorter URL and fewer or shorter headers.",
                )
        if data:
            super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.deadline is None:
            self.restart_deadline()

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.restart_deadline()  # the body's turn
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.cancel_deadline()
        self.in_head, self.head_bytes = True, 0
        super().on_message_complete()

    def restart_deadline(self) -> None:
        self.cancel_deadline()
        self.deadline = self.loop.call_later(self.read_timeout, self.too_slow)

    def cancel_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def too_slow(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.in_head and self.head_bytes == 0:  # nothing asked: closed like an idle connection
            self.transport.close()
            return
        part = "request line and headers" if self.in_head else "request body"
        self.refuse(
            408,
            f"the {part} took over --read_timeout {self.read_timeout:g} s to arrive: "
            "send each request whole, at once.",
        )

    def refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with ``message`` when this connection owes no other answer, read and
        drop what follows for ``LINGER_S``, then close; the request's handler, if it runs, sees
        the client gone. A connection in the middle of another answer is closed at once."""
        self.refused = True
        self.cancel_deadline()
        client = "{}:{}".format(*self.client) if self.client else "a client"
        self.logger.warning("Refused %s: %d %s", client, status, message)
        cycle = self.cycle
        if self.pipeline:  # an earlier request is still being answered on this connection
            answerable = False
        elif cycle is None:
            answerable = True
        elif self.in_head:  # the cycle is the previous request's
            answerable = cycle.response_complete
        else:
            answerable = not cycle.response_started
        if not answerable:
            self.transport.close()
            return
        body = json.dumps({"detail": message}).encode()
        head = (
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.deadline = self.loop.call_later(LINGER_S, self.transport.close)


def bounded(read_timeout: float) -> type[BoundedHttpTools]:
    """The protocol class uvicorn builds each connection with, for this ``read_timeout``."""
    return type("BoundedHttpTools", (BoundedHttpTools,), {"read_timeout": read_timeout})
