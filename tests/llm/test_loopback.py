"""The loopback server's own promise that the providers' drop tests rest on: a dropped
connection (``Exchange.drop``, a reset) arrives after every byte written before it, however
busy the machine. CI once lost a stream's text deltas to the reset: the kernel still held
them unsent when the socket was closed with a zero linger."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import pytest

from .loopback import RESET_ON_CLOSE, Exchange, LoopbackServer, Recorded, delivered

PAYLOAD = bytes(range(256)) * (32 * 1024)  # 8 MiB: more than the socket buffers hold


def _drop_after_payload(_: Recorded, ex: Exchange) -> None:
    ex.send_bytes(200, PAYLOAD, "application/octet-stream", length=len(PAYLOAD) + 1)
    ex.drop()


def _read_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    got = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return bytes(got), "reset"
        if not chunk:
            return bytes(got), "eof"
        got += chunk


def test_a_drop_arrives_after_everything_written_before_it_as_a_reset() -> None:
    with LoopbackServer(_drop_after_payload) as server:
        url = urlsplit(server.url)
        with socket.create_connection((url.hostname, url.port)) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            got, how = _read_until_closed(sock)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert (len(body), how) == (len(PAYLOAD), "reset")
    assert body == PAYLOAD


def test_delivered_is_false_for_a_client_that_is_gone() -> None:
    """A client that reset the connection acknowledges nothing more: ``delivered`` says the
    bytes were not delivered (the kernel's queue, emptied by the reset, alone would say they
    were)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with server:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
            client.close()  # a reset
            with pytest.raises(OSError):  # the reset has arrived once a write fails
                for _ in range(100):
                    server.sendall(b"x" * 65536)
            assert delivered(server) is False
