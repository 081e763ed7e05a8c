"""The web tests' harness: the app served for real by uvicorn on a free loopback port, in the
test's own event loop, and a client that reads the event stream as a tab does (a snapshot,
then patches applied with ``wire.apply``)."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import uvicorn

from runtime.web.wire import apply


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL. The socket listens before
    uvicorn starts, so a request made at once waits in the backlog instead of failing."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server._serve, [sock])  # _serve: no signal handlers in tests
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


class Browser:
    """One cookie jar: a user. ``open()`` gets the page (minting the cookie) and returns the
    session id the server sent it to."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.AsyncClient(base_url=base, timeout=10)

    async def __aenter__(self) -> Browser:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def open(self) -> str:
        """``/`` as a browser follows it: a first visit gets the cookie and comes back, then
        lands on the newest session."""
        for _ in range(2):
            r = await self.http.get("/")
            assert r.status_code == 303, r.text
            if r.headers["location"].startswith("/c/"):
                return r.headers["location"].removeprefix("/c/")
        raise AssertionError("GET / never reached a session")

    async def post(self, path: str, body: Any, **headers: str) -> httpx.Response:
        headers = {"origin": self.base, "content-type": "application/json", **headers}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.http.post(path, content=content, headers=headers)

    async def send(self, sid: str, stream: str, event: Any, **headers: str) -> httpx.Response:
        return await self.post(f"/api/sessions/{sid}/streams/{stream}", event, **headers)

    @asynccontextmanager
    async def tab(self, sid: str) -> AsyncIterator[Tab]:
        async with self.http.stream("GET", f"/api/sessions/{sid}/events") as response:
            assert response.status_code == 200, (await response.aread()).decode()
            tab = Tab(response)
            await tab.next()  # the snapshot
            yield tab


class Tab:
    """An open event stream: ``doc`` is the snapshot's cells with every patch applied."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()
        self.snapshot: dict[str, Any] = {}
        self.doc: dict[str, Any] = {}
        self.patches: list[list[dict[str, Any]]] = []
        self.raw: list[str] = []  # every data line, as sent

    async def next(self) -> str:
        """Read one event, apply it; returns its name."""
        event = data = None
        async for line in self.lines:
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and event is not None:
                break
        if event is None or data is None:
            raise EOFError("the event stream ended")
        self.raw.append(data)
        if event == "snapshot":
            self.snapshot = json.loads(data)
            self.doc = self.snapshot["cells"]
        else:
            ops = json.loads(data)
            self.patches.append(ops)
            apply(self.doc, ops)
        return event

    async def until(self, predicate: Any, timeout: float = 10) -> dict[str, Any]:
        """Read events until ``predicate(doc)`` holds."""
        with anyio.fail_after(timeout):
            while not predicate(self.doc):
                await self.next()
        return self.doc


def texts(messages: list[dict[str, Any]], role: str) -> list[str]:
    return ["".join(b.get("text", "") for b in m["blocks"] if b.get("kind") == "text")
            for m in messages if m["role"] == role]
