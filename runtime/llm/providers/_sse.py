"""A minimal Server-Sent Events reader over an httpx streaming response."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str


async def iter_sse(response: httpx.Response) -> AsyncIterator[SSEEvent]:
    """Yield one ``SSEEvent`` per blank-line-terminated event (comments skipped).

    Follows the WHATWG rules that matter for model APIs: ``data:`` lines join with newlines,
    one optional space after the colon is dropped, ``event`` defaults to ``"message"``.
    A stream that ends mid-event yields nothing for the partial event.
    """
    event = ""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield SSEEvent(event or "message", "\n".join(data))
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
