"""The HTTP client an adapter sends through, shared by the provider adapters.

A client the caller passes in is used as is and never closed: its owner decides. Without one,
the adapter owns a single pooled ``httpx.AsyncClient``, created on first use (so building a
model costs nothing and needs no event loop) and released by ``aclose()`` or ``async with``.

The event-loop rule: httpx ties a pool's connections to the event loop that opened them, so
the owned client belongs to the loop of the call that created it. Any number of concurrent
tasks of that loop share it. A call from another event loop (a second ``anyio.run`` in a
script) transparently gets a fresh client for its own loop; the old one cannot be closed from
there and is dropped. So: close a model in the loop that used it, and give each of several
loops running at once (one per thread) a model of its own, or they keep replacing each
other's pool.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from typing import Self

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for the process: building one (loading the CA bundle) costs more
    than a whole request on loopback, and a context is safe to share."""
    return httpx.create_ssl_context()


def _event_loop() -> object:
    """The identity of the running event loop: asyncio's loop, or trio's token."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        import trio  # the only other loop anyio (hence httpx) runs on

        return trio.lowlevel.current_trio_token()


class ClientSlot:
    """The caller's client, or the one pooled client an adapter owns (see module doc)."""

    __slots__ = ("_given", "_loop", "_make", "_owned")

    def __init__(
        self, given: httpx.AsyncClient | None, make: Callable[[], httpx.AsyncClient]
    ) -> None:
        self._given = given
        self._make = make
        self._owned: httpx.AsyncClient | None = None
        self._loop: object = None

    @property
    def owned(self) -> httpx.AsyncClient | None:
        """The client this slot created and will close, if it holds one now."""
        return self._owned

    def get(self) -> httpx.AsyncClient:
        """The client for a call made now, from the running event loop."""
        if self._given is not None:
            return self._given
        loop = _event_loop()
        if self._owned is None or self._loop is not loop:
            # Synchronous from the check to the assignment: concurrent first calls of one
            # loop cannot race into two clients.
            self._owned, self._loop = self._make(), loop
        return self._owned

    async def aclose(self) -> None:
        """Close the owned client, if any; the next call opens a new one."""
        client, loop = self._owned, self._loop
        self._owned, self._loop = None, None
        if client is not None and loop is _event_loop():
            await client.aclose()


class PooledClient:
    """``aclose()`` and ``async with`` for an adapter that keeps its client in ``_http``."""

    _http: ClientSlot

    async def aclose(self) -> None:
        """Close the HTTP client if this model created it (a given one is left open)."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
