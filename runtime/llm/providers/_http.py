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
from httpx's (which may carry request data). Anything a server echoes back has the key
replaced by ``[redacted]`` first and is cut to ``MAX_MESSAGE_CHARS`` after (``redact``: in
that order, so a cut can never leave a fragment of the key). At most ``ERROR_BODY_LIMIT``
bytes of an error body are read. An ``LLMError`` leaving an adapter has no ``__cause__`` and
no ``__context__``: the exceptions underneath hold the request (with its key) or the raw
body, so the type of the underlying error is named in the message instead.

Time. ``timeout`` bounds one whole attempt: the seconds it may spend waiting on the network,
connecting, sending and reading every byte of the reply, summed (``Budget``, measured with
the retry policy's clock). A stream that trickles a byte at a time forever runs out of it
like one that hangs. The time a stream's consumer spends between events does not count.

Protocol errors. A 2xx reply whose body is not JSON, or JSON of the wrong shape, comes from
a broken server (or something posing as one): retrying it only costs the backoff, so
``malformed`` is terminal. A reply cut short (a connection dropped mid-body, a stream that
ends before its last event) is transient, as the next attempt may well get all of it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import aclosing, asynccontextmanager, contextmanager
from typing import Any, ClassVar, Self

import anyio
import httpx

from ..errors import ConfigurationError, Fault, LLMError, cap_message, quota_exhausted, retry_class
from ..events import StreamEvent
from ..retry_policy import (
    RetryPolicy,
    parse_retry_after,
    parse_retry_after_ms,
    retry_call,
    retry_stream,
)
from ..safety import check_api_key, check_base_url, display_url
from ..types import Request, Response

ERROR_BODY_LIMIT = 64 * 1024
"""The most bytes of an error body (a non-2xx reply) an adapter reads; the rest is never
received. Far more than any JSON error a provider sends, far less than a runaway page."""


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
    """A 2xx reply that breaks the wire format (not JSON, the wrong shape): terminal, as a
    server that sends one will send it again (module doc)."""
    return LLMError(f"malformed response: {what}", fault=Fault.TERMINAL, provider=provider)


def cut_short(provider: str, what: str) -> LLMError:
    """A reply that ended before it was whole: transient, like the dropped connection it
    almost always is."""
    return LLMError(what, fault=Fault.TRANSIENT, provider=provider)


def redact(text: str, secret: str) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``[redacted]``, *then* cut to
    ``MAX_MESSAGE_CHARS``: in that order, so no cut can leave part of the secret behind."""
    if secret:
        text = text.replace(secret, "[redacted]")
    return cap_message(text)


def body_text(raw: bytes) -> str:
    """An error body that is not JSON as one line of text (an HTML error page, say)."""
    return " ".join(raw.decode("utf-8", "replace").split())


def retry_after(headers: httpx.Headers) -> float | None:
    """The server's wait hint: ``retry-after-ms`` (OpenAI's, more precise) if usable, else
    ``retry-after``; anything unusable is ignored (``parse_retry_after``)."""
    ms = parse_retry_after_ms(headers.get("retry-after-ms"))
    return ms if ms is not None else parse_retry_after(headers.get("retry-after"))


def detached(error: LLMError) -> LLMError:
    """``error`` without the exceptions it was raised during or from (module doc)."""
    error.__cause__ = None
    error.__context__ = None
    error.__suppress_context__ = False
    return error


class Budget:
    """The seconds one attempt may still spend waiting on the network (module doc)."""

    __slots__ = ("_clock", "left", "seconds")

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.seconds = seconds
        self.left = seconds
        self._clock = clock

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Bound the wait inside by what is left; raises ``TimeoutError`` when it runs out."""
        if self.left <= 0:
            raise TimeoutError
        started = self._clock()
        try:
            with anyio.fail_after(self.left):
                yield
        finally:
            self.left -= max(self._clock() - started, 0.0)


class _BudgetedStream(httpx.AsyncByteStream):
    """A response's raw byte stream, each read bounded by the attempt's ``Budget``. Every way
    httpx reads a body (``aread``, ``aiter_bytes``, ``aiter_lines``) goes through it."""

    def __init__(self, inner: httpx.AsyncByteStream, budget: Budget) -> None:
        self._inner = inner
        self._budget = budget

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._inner)
        while True:
            with self._budget.waiting():  # never open across the yield below
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class HTTPModel(ABC):
    """The shared half of an adapter: identity, ``generate`` / ``stream`` with the retry
    layer around one attempt, the POST of that attempt, ``aclose`` / ``async with``.

    A subclass sets ``PROVIDER`` (and ``LABEL``, its name in messages), calls ``__init__``
    with its endpoint, and implements ``encode``, ``_generate_once``, ``_stream_once`` and
    ``_error_fields``.

    The constructor takes explicit values only and never reads the environment
    (``resolve_model`` does that). It checks them: a base URL httpx cannot use or a key must
    not go to, a key that cannot go in a header, a timeout that is not a positive number
    are ``ConfigurationError`` here, never an odd failure at the first call.
    """

    PROVIDER: ClassVar[str]
    LABEL: ClassVar[str]

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
        check_base_url(base_url, self.LABEL)
        if key:
            check_api_key(key, self.LABEL)
        if not (isinstance(timeout, int | float) and 0 < timeout < float("inf")):
            raise ConfigurationError(
                f"the {self.LABEL} timeout must be a positive number of seconds, not {timeout!r}"
            )
        url = base_url + endpoint
        try:
            httpx.URL(url)
        except httpx.InvalidURL:
            raise ConfigurationError(
                f"unusable {self.LABEL} base URL {display_url(base_url)!r}: httpx cannot parse it"
            ) from None
        self._model = model
        self._base_url = base_url
        self._url = url
        self._where = display_url(base_url)
        self._key = key
        self._retry = retry or RetryPolicy()
        self._seconds = float(timeout)
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
        try:
            return await retry_call(lambda: self._generate_once(body), self._retry)
        except LLMError as e:
            detached(e)
            raise

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        body = self.encode(request, stream=True)
        async with aclosing(retry_stream(lambda: self._stream_once(body), self._retry)) as events:
            try:
                async for event in events:
                    yield event
            except LLMError as e:
                detached(e)
                raise

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
    def _error_fields(self, raw: bytes) -> tuple[str, tuple[str | None, ...]]:
        """The server's message in an error body (at most ``ERROR_BODY_LIMIT`` bytes of it)
        and the codes / types that may signal an exhausted quota."""

    # -- one HTTP attempt ------------------------------------------------------------------

    @asynccontextmanager
    async def _post(
        self, body: bytes, headers: Mapping[str, str]
    ) -> AsyncIterator[httpx.Response]:
        """POST ``body``; yields a 2xx response, raises ``LLMError`` for anything else.
        The response is closed on any exit, so a cancelled caller never leaves a request
        running; a transport failure or the end of the time budget while the caller reads
        the body (a dropped stream) comes back through here as a transient fault too."""
        client = self._http.get()
        budget = Budget(self._seconds, self._retry.clock)
        request = client.build_request(
            "POST", self._url, content=body, headers=headers, timeout=self._timeout
        )
        failure: LLMError | None = None
        try:
            with budget.waiting():
                response = await client.send(request, stream=True)
        except httpx.HTTPError as e:
            failure = self._transport_error(e)
        except TimeoutError:
            failure = self._timed_out()
        if failure is not None:
            raise failure
        response.stream = _BudgetedStream(response.stream, budget)  # type: ignore[arg-type]
        try:
            try:
                if response.is_success:
                    yield response
                else:
                    failure = self._status_error(response, await _read_at_most(response))
            except httpx.HTTPError as e:
                failure = self._transport_error(e)
            except TimeoutError:
                failure = self._timed_out()
            if failure is not None:
                raise failure
        finally:
            await response.aclose()

    # -- errors ----------------------------------------------------------------------------

    def _error(
        self,
        message: str,
        fault: Fault,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> LLMError:
        """An ``LLMError`` from this provider, its message ``redact``ed."""
        return LLMError(
            redact(message, self._key),
            fault=fault,
            provider=self.PROVIDER,
            status=status,
            retry_after=retry_after,
        )

    def _status_error(self, response: httpx.Response, raw: bytes) -> LLMError:
        """The classified error for a non-2xx reply, from the start of its body. A 404 or
        405 names the URL asked for (mostly a base URL missing or repeating ``/v1``)."""
        status = response.status_code
        message, codes = self._error_fields(raw)
        fault = retry_class(status, quota_exhausted(message, *codes))
        message = message or f"HTTP {status} {response.reason_phrase}".strip()
        if status in (404, 405):
            message = f"{message} (POST {display_url(self._url)}: is the base URL right?)"
        return self._error(message, fault, status, retry_after(response.headers))

    def _timed_out(self) -> LLMError:
        return self._error(
            f"timed out talking to {self._where}: the attempt took more than "
            f"{self._seconds:g} s (connecting and reading the whole reply)",
            Fault.TRANSIENT,
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


async def _read_at_most(response: httpx.Response, limit: int = ERROR_BODY_LIMIT) -> bytes:
    """The first ``limit`` bytes of ``response``'s body; the rest is never read (closing the
    response then drops the connection)."""
    chunks: list[bytes] = []
    size = 0
    async with aclosing(response.aiter_bytes()) as body:
        async for chunk in body:
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit:
                break
    return b"".join(chunks)[:limit]
