"""The floor of ``bench/web.py``: a bare Starlette app with one sse-starlette stream per client.

    python -m uvicorn _web_floor:app --app-dir bench --port 8001

What a server pushing Server-Sent Events cannot do with less: no identity, no runtime, no JSON
work per event. ``GET /events/{group}`` is an ``EventSourceResponse`` over a per-connection
``asyncio.Queue``; its first event is ``event: snapshot`` (as ours, so a client knows the stream
is open the same way). ``POST /broadcast/{group}`` takes the body as the ``data`` of one
``event: patch``, frames it once (``event: patch\ndata: ...\n\n``, as ours frames its patches)
and puts the same bytes on the queue of every connection of the group, then answers ``202``.
The benchmark posts the very patch text our server sent for the same event (nonce swapped), so
both push the same bytes. Pings every 15 s, as ours by default.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["app"]

_groups: dict[str, set[asyncio.Queue[bytes]]] = {}
PING = 15
SNAPSHOT = b"event: snapshot\ndata: {}\n\n"


async def events(request: Request) -> Response:
    group = request.path_params["group"]
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=256)

    async def stream() -> AsyncIterator[bytes]:
        members = _groups.setdefault(group, set())
        members.add(queue)
        try:
            yield SNAPSHOT
            while True:
                yield await queue.get()
        finally:
            members.discard(queue)

    return EventSourceResponse(stream(), ping=PING)


async def broadcast(request: Request) -> Response:
    event = b"event: patch\ndata: " + await request.body() + b"\n\n"
    members = _groups.get(request.path_params["group"], ())
    for queue in members:
        with contextlib.suppress(asyncio.QueueFull):  # a client that cannot keep up misses it
            queue.put_nowait(event)
    return JSONResponse({"ok": True, "clients": len(members)}, status_code=202)


async def stats(request: Request) -> Response:
    return JSONResponse({g: len(m) for g, m in _groups.items()})


app = Starlette(routes=[
    Route("/events/{group}", events),
    Route("/broadcast/{group}", broadcast, methods=["POST"]),
    Route("/stats", stats),
])
