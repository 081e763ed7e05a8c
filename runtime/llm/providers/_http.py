"""What the HTTP adapters share: the client they send through, the retry loop around one
POST, and the errors that POST can end in. A provider module adds its wire format: how a
``Request`` is encoded, how a reply and a stream are decoded, how an error body is read.

Clients. A client the caller passes in is used as is and never closed: its owner decides.
Without one, the adapter owns a single pooled ``httpx.AsyncClient``, created on first use (so
building a model costs nothing and needs no event loop) and released by ``aclose()`` or
``async with``.

The event-loop rule: httpx ties a pool's connections to the event loop that opened them, so
the owned client belongs to the loop of the call that created it. Any number of concurrent
tasks of that loop share it. A call from another event loop (a second ``anyio.run`` in a
script) transparently gets a fresh client for its own loop; the old one cannot be closed from
there and is dropped. So: close a model in the loop that used it, and give each of several
loops running at once (one per thread) a model of its own, or they keep replacing each
other's pool.

Secrets. Error messages are built here and in the provider modules in our own words, never
from httpx's (which may carry request data), and anything a server echoes back has the key
replaced by ``[redacted]`` before it reaches an ``LLMError``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, ClassVar, Self

import httpx

from ..errors import Fault, LLMError
from ..events import StreamEvent
from ..retry import RetryPolicy, retry_call, retry_stream
from ..safety import display_url
from ..types import Request, Response


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


def compact_json(value: Any) -> str:
    """Compact, order-preserving JSON: the one encoding used for every byte we send."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def is_json_object(raw: str) -> bool:
    """Whether ``raw`` is the JSON text of one object (what an opaque block must be)."""
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


def malformed(provider: str, what: str) -> LLMError:
    """A reply we cannot read: transient, as a retry may well get a whole one."""
    return LLMError(f"malformed response: {what}", fault=Fault.TRANSIENT, provider=provider)


class HTTPModel(ABC):
    """The shared half of an adapter: identity, ``generate`` / ``stream`` with the retry
    layer around one attempt, the POST of that attempt, ``aclose`` / ``async with``.

    A subclass sets ``PROVIDER``, calls ``__init__`` with its endpoint, and implements
    ``encode``, ``_generate_once``, ``_stream_once`` and ``_status_error``.
    """

    PROVIDER: ClassVar[str]

    def __init__(
        self,
        *,
        model: str,
        base_url: str,
        endpoint: str,
        key: str,
        retry: RetryPolicy | None,
        timeout: float,
        http_client: httpx.AsyncClient | None,
    ) -> None:
        self._model = model
        self._base_url = base_url
        self._url = base_url + endpoint
        self._where = display_url(base_url)
        self._key = key
        self._retry = retry or RetryPolicy()
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self._http = ClientSlot(http_client, lambda: httpx.AsyncClient(verify=tls_context()))

    @property
    def name(self) -> str:
        """The model id sent to the provider."""
        return self._model

    @property
    def provider(self) -> str:
        return self.PROVIDER

    # -- the port ------------------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        body = self.encode(request, stream=False)
        return await retry_call(lambda: self._generate_once(body), self._retry)

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        body = self.encode(request, stream=True)
        async with aclosing(retry_stream(lambda: self._stream_once(body), self._retry)) as events:
            async for event in events:
                yield event

    async def aclose(self) -> None:
        """Close the HTTP client if this model created it (a given one is left open)."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- what a provider supplies ----------------------------------------------------------

    @abstractmethod
    def encode(self, request: Request, *, stream: bool) -> bytes:
        """The exact request body sent for ``request`` (deterministic)."""

    @abstractmethod
    async def _generate_once(self, body: bytes) -> Response:
        """One non-streaming attempt (``_post`` it, decode the reply)."""

    @abstractmethod
    def _stream_once(self, body: bytes) -> AsyncIterator[StreamEvent]:
        """One streaming attempt (``_post`` it, decode the events)."""

    @abstractmethod
    def _status_error(self, response: httpx.Response) -> LLMError:
        """The classified error for a non-2xx reply (its body already read)."""

    # -- one HTTP attempt ------------------------------------------------------------------

    @asynccontextmanager
    async def _post(
        self, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[httpx.Response]:
        """POST ``body``; yields a 2xx response, raises ``LLMError`` for anything else.
        ``async with client.stream`` closes the connection on any exit, so a cancelled
        caller never leaves a request running; a transport failure while the caller reads
        the body (a dropped stream) comes back through here as a transient fault too."""
        client = self._http.get()
        try:
            async with client.stream(
                "POST", self._url, content=body, headers=headers, timeout=self._timeout
            ) as response:
                if not response.is_success:
                    await response.aread()
                    raise self._status_error(response)
                yield response
        except httpx.HTTPError as e:
            raise self._transport_error(e) from None

    # -- errors ----------------------------------------------------------------------------

    def _error(
        self,
        message: str,
        fault: Fault,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> LLMError:
        """An ``LLMError`` from this provider, the key scrubbed from its message."""
        if self._key:
            message = message.replace(self._key, "[redacted]")
        return LLMError(
            message, fault=fault, provider=self.PROVIDER, status=status, retry_after=retry_after
        )

    def _transport_error(self, e: httpx.HTTPError) -> LLMError:
        if isinstance(e, httpx.ConnectError):
            what = f"could not connect to {self._where}"
        elif isinstance(e, httpx.TimeoutException):
            what = f"timed out talking to {self._where} ({type(e).__name__})"
        else:
            what = f"the connection to {self._where} failed ({type(e).__name__})"
        return self._error(what, Fault.TRANSIENT)

    def _malformed(self, what: str) -> LLMError:
        return malformed(self.PROVIDER, what)
