"""A real HTTP server on 127.0.0.1 for the provider adapters' tests.

It runs the stdlib ``ThreadingHTTPServer`` in a background thread (one thread per
connection), records every request, and hands each one to a provider-specific ``respond``
callback that writes the reply through an ``Exchange``: a JSON body, an SSE stream, a dropped
connection or a hang until the client goes away.
"""

from __future__ import annotations

import fcntl
import json
import socket
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.raw)


@dataclass
class Exchange:
    """The reply side of one request."""

    handler: BaseHTTPRequestHandler
    closed_by_client: threading.Event = field(default_factory=threading.Event)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(body).encode(), headers=headers)

    def send_bytes(
        self,
        status: int,
        data: bytes,
        content_type: str = "application/json",
        *,
        length: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """A reply with this body. ``length`` overrides the ``content-length`` header: a
        larger one than ``len(data)`` announces more than is sent (a body cut short)."""
        h = self.handler
        h.send_response(status)
        h.send_header("content-type", content_type)
        h.send_header("content-length", str(len(data) if length is None else length))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def start_stream(self, headers: dict[str, str] | None = None) -> None:
        h = self.handler
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("cache-control", "no-cache")
        h.send_header("connection", "close")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.close_connection = True

    def send_event(self, data: str, event: str | None = None) -> None:
        """One SSE event; ``data`` is written as is (callers pass JSON text or garbage)."""
        chunk = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
        self.handler.wfile.write(chunk.encode())
        self.handler.wfile.flush()

    def drop(self) -> None:
        """Close the TCP connection abruptly (RST), mid-response, after the client's kernel
        has every byte written before it (``delivered``): the reset discards what is still
        unsent (held back by Nagle's rule or autocorking on a busy machine) and may overtake
        segments in flight, so without the wait "the events before the drop" arrive only
        sometimes."""
        sock = self.handler.connection
        delivered(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        sock.close()
        self.handler.close_connection = True

    def hang_until_client_leaves(self, limit: float = 10.0) -> bool:
        """Block until the client closes the connection (True) or ``limit`` passes (False)."""
        sock = self.handler.connection
        sock.settimeout(limit)
        try:
            while True:
                if not sock.recv(1024):
                    self.closed_by_client.set()
                    return True
        except TimeoutError:
            return False
        except OSError:  # reset by the client: it is gone
            self.closed_by_client.set()
            return True


# SO_LINGER on with a zero timeout: close() sends a reset (RST) instead of a FIN
RESET_ON_CLOSE = struct.pack("ii", 1, 0)


def delivered(sock: socket.socket, limit: float = 10.0) -> bool:
    """Wait until ``sock``'s send queue is empty: every byte written was acknowledged by the
    peer's kernel (Linux ``SIOCOUTQ``). The kernel offers no event for it, so this polls,
    a millisecond apart, for at most ``limit`` seconds. False if bytes are still queued, or
    the peer is gone (reset: nothing will be acknowledged any more)."""
    deadline = time.monotonic() + limit
    queued = bytearray(4)
    while True:
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
            fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, queued)
        except OSError:
            return False
        if state not in _OPEN:
            return False
        if not int.from_bytes(queued, "little"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)


_OPEN = (1, 8)  # TCP_ESTABLISHED, TCP_CLOSE_WAIT (the client closed its side: it still acks)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets a kept-alive connection while the server waits for its next
        request is a client going away, not an error of the server's: stay quiet on it."""
        if not isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            super().handle_error(request, client_address)


Respond = Callable[[Recorded, Exchange], None]


class LoopbackServer:
    """``with LoopbackServer(respond) as srv:`` serves on ``srv.url`` until the block ends."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[Recorded] = []
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                rec = Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()},
                               self.rfile.read(n))
                ex = Exchange(self)
                with server._lock:
                    server.requests.append(rec)
                    server.exchanges.append(ex)
                try:
                    server.respond(rec, ex)
                except (BrokenPipeError, ConnectionResetError):
                    ex.closed_by_client.set()

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll interval: ``shutdown()`` waits up to one interval (0.5 s by default).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class FakeServer:
    """What every provider fake shares: a ``LoopbackServer`` answering with the fake's
    ``_respond``, serving ``url`` while the ``with`` block lasts, and what it recorded."""

    def __init__(self) -> None:
        self._server = LoopbackServer(self._respond)

    def _respond(self, rec: Recorded, ex: Exchange) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def requests(self) -> list[Recorded]:
        return self._server.requests

    @property
    def exchanges(self) -> list[Exchange]:
        return self._server.exchanges

    def __enter__(self) -> Self:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)
