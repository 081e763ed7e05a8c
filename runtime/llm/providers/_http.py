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
that order, so a cut can never leave a fragment of the key). A server may also echo the key
where a decoder quotes the reply (a tool named with it), and a decoder cuts what it quotes:
so every ``LLMError`` leaving an attempt, whatever raised it, has the model's secrets (its
key; Azure's tokens) and every piece of them ``SECRET_PIECE`` characters or longer redacted
once more (``HTTPModel._redacted``), before the retry layer logs it. At most
``ERROR_BODY_LIMIT`` bytes of an error body are read. An ``LLMError`` leaving an adapter has
no ``__cause__`` and no ``__context__``: the exceptions underneath hold the request (with its
key) or the raw body, so the type of the underlying error is named in the message instead.

Time. Every call has two wall-clock deadlines, both anyio cancel scopes (``limits``):
``timeout`` bounds one attempt, from connecting to the reply's last byte, and the retry
policy's ``max_elapsed`` bounds the call, all attempts and the waits between them (the retry
layer's ``CallDeadline``). The attempt's deadline is a point in time fixed when it starts
(``Deadline``; for a stream, the call's if that comes first); every wait on the network
(connecting, sending, each read of the body) runs in a cancel scope that ends at that point,
and a stream's every event is checked against it, so a server that trickles a byte at a
time, one that floods valid events forever and one that hangs all end at the same moment.
No scope is ever open across a ``yield`` to the consumer, whose time between events counts
(the clock does not stop for it). A ``generate`` attempt runs whole inside the retry
layer's scope for the call; a stream's waits carry the call's deadline themselves, which
spares the retry layer a cancel scope per event.

Size. Everything that grows with a reply is capped (``ReplyLimits``): a stream's lines and
events (``_sse``), a ``generate`` body (``body_bytes``), and the characters one reply holds
(``reply_chars``, for both ``generate`` and ``stream``): its text, its tool calls'
arguments, names and ids, and its thinking. A stream's characters are spent from one
``ReplyBudget`` as they arrive: ``_stream_attempt`` spends what each event it hands on
carries, and a decoder spends what it holds back before it becomes an event (OpenAI's
argument text that arrives before its call's name, Anthropic's thinking and signatures,
which go out whole at the block's end), so nothing a server streams is held uncounted. A
tool name longer than ``MAX_TOOL_NAME_CHARS`` fails the reply as it arrives, and a call id
no provider would take back is replaced (``CallIds``) before it is counted or kept.

Text. What a provider sends is decoded with ``loads``, which replaces the lone surrogates a
``\\ud800`` escape produces (``runtime._text``): such text would be refused by the
vocabulary and could not be sent back. It refuses ``NaN`` and ``Infinity``, which Python's
reader takes but JSON has not: kept in an opaque block or a tool call's input, one would go
back out as a request that is not JSON. A request always encodes (``encode_text``): a
surrogate that reached a history anyway (an old stored one) is replaced as it is sent.

Protocol errors. A 2xx reply whose body is not JSON, or JSON of the wrong shape, a stream
answered with something other than an event stream (a proxy's HTML page), or a reply past a
cap comes from a broken server (or something posing as one): retrying it only costs the
backoff, so ``malformed`` is terminal. A reply cut short (a connection dropped mid-body, a
stream that ends before its last event) is transient, as the next attempt may well get all
of it.
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

from ..._text import scrub, scrub_text
from .._json import decode as decode_json
from ..errors import ConfigurationError, Fault, LLMError, cap_message, quota_exhausted, retry_class
from ..events import (
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    tool_name_too_long,
)
from ..limits import MAX_TOOL_NAME_CHARS, ReplyLimits
from ..retry_policy import (
    CallDeadline,
    RetryPolicy,
    parse_retry_after,
    parse_retry_after_ms,
    retry_call,
    retry_stream,
)
from ..safety import check_api_key, check_base_url, display_url
from ..types import OpaqueBlock, Request, Response, TextBlock, ToolUse

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


def encode_text(text: str) -> bytes:
    """A request body's bytes. Never raises: text the vocabulary would refuse (a lone
    surrogate in a history stored before it did, or built with ``model_construct``) is
    replaced by U+FFFD here, so no history can make every later request fail."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return scrub_text(text).encode()


class TooDeep(ValueError):
    """JSON nested too deeply to decode (``RecursionError`` underneath): what ``loads``
    raises for it, a ``ValueError`` like any JSON that cannot be read."""


def loads(raw: str | bytes) -> Any:
    """JSON a provider sent, decoded, with every lone surrogate its escapes produce
    (``"\\ud800"``) replaced by U+FFFD. Bytes must be UTF-8 (``json.loads`` alone would
    let surrogates through as CESU bytes), and decoded text cannot hold a surrogate, so only
    a body with a ``\\ud`` escape is walked: the common case costs two substring searches.
    Raises ``ValueError`` (``UnicodeDecodeError`` included) for what is not JSON, ``NaN``,
    ``Infinity`` and numbers past a float's range included (``runtime.llm._json``),
    ``TooDeep`` (one) for JSON nested past the recursion limit."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    try:
        value = decode_json(text)
        if "\\ud" in text or "\\uD" in text:
            value = scrub(value)
    except RecursionError:
        raise TooDeep("JSON nested too deeply to decode") from None
    return value


def is_json_object(raw: str) -> bool:
    """Whether ``raw`` is the JSON text of one object (what an opaque block must be): not
    ``NaN`` or ``Infinity`` anywhere in it, as ``loads`` refuses them."""
    try:
        return isinstance(decode_json(raw), dict)
    except (ValueError, RecursionError):
        return False


def malformed(provider: str, what: str) -> LLMError:
    """A 2xx reply that breaks the wire format (not JSON, the wrong shape): terminal, as a
    server that sends one will send it again (module doc)."""
    return LLMError(f"malformed response: {what}", fault=Fault.TERMINAL, provider=provider)


def cut_short(provider: str, what: str) -> LLMError:
    """A reply that ended before it was whole: transient, like the dropped connection it
    almost always is."""
    return LLMError(what, fault=Fault.TRANSIENT, provider=provider)


SECRET_PIECE = 8
"""The shortest piece of a secret ``redact`` finds on its own: a decoder quoting a server's
text cuts it (a tool name to 200 characters), and a message already cut to
``MAX_MESSAGE_CHARS`` may end in the start of a key. Eight characters of a random key say
nothing useful; a common prefix (``sk-proj-``) is redacted too, which costs nothing."""


def redact(text: str, *secrets: str) -> str:
    """``text`` with every occurrence of each secret, and every run of its pieces of
    ``SECRET_PIECE`` characters or more, replaced by ``[redacted]``, *then* cut to
    ``MAX_MESSAGE_CHARS``: in that order, so no cut can leave part of a secret behind."""
    for secret in secrets:
        if secret:
            text = _without_pieces(text.replace(secret, "[redacted]"), secret)
    return cap_message(text)


def _without_pieces(text: str, secret: str) -> str:
    """``text`` with every run of characters covered by ``SECRET_PIECE``-long pieces of
    ``secret`` replaced by one ``[redacted]``. A secret that short is only ever whole."""
    size = SECRET_PIECE
    if len(secret) <= size or len(text) < size:
        return text
    pieces = {secret[i:i + size] for i in range(len(secret) - size + 1)}
    covered_to = -1  # the end of the run being covered, exclusive
    runs: list[tuple[int, int]] = []
    for i in range(len(text) - size + 1):
        if text[i:i + size] in pieces:
            if runs and i <= covered_to:
                runs[-1] = (runs[-1][0], i + size)
            else:
                runs.append((i, i + size))
            covered_to = i + size
    if not runs:
        return text
    out: list[str] = []
    last = 0
    for start, end in runs:
        out += (text[last:start], "[redacted]")
        last = end
    out.append(text[last:])
    return "".join(out)


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


class ReplyBudget:
    """The characters a reply may still hold (``reply_chars``), spent as they arrive by the
    attempt and by its decoder (module doc); ``spend`` past the budget raises ``fail()``."""

    __slots__ = ("fail", "left")

    def __init__(self, chars: int, fail: Callable[[], LLMError]) -> None:
        self.left = chars
        self.fail = fail

    def spend(self, chars: int) -> None:
        self.left -= chars
        if self.left < 0:
            raise self.fail()

    def refund(self, chars: int) -> None:
        """Give back what a decoder spent on text it now hands on as an event (which the
        attempt spends again)."""
        self.left += chars


class Deadline:
    """The point in time (anyio's clock) one attempt must end by (module doc): ``seconds``
    from now, or the call's deadline if that comes first (then ``call`` is what ran out)."""

    __slots__ = ("at", "call", "seconds")

    def __init__(self, seconds: float, call: CallDeadline | None = None) -> None:
        self.seconds = seconds
        self.at = anyio.current_time() + seconds
        self.call = None
        if call is not None and call.at <= self.at:
            self.at, self.call = call.at, call

    def passed(self) -> bool:
        return anyio.current_time() >= self.at

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Bound the wait inside by the deadline; raises ``TimeoutError`` once it is past."""
        left = self.at - anyio.current_time()
        if left <= 0:
            raise TimeoutError
        with anyio.fail_after(left):
            yield


class _DeadlineStream(httpx.AsyncByteStream):
    """A response's raw byte stream, each read bounded by the attempt's ``Deadline``. Every
    way httpx reads a body (``aread``, ``aiter_bytes``, ``aiter_lines``) goes through it."""

    def __init__(self, inner: httpx.AsyncByteStream, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._inner)
        while True:
            with self._deadline.waiting():  # never open across the yield below
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
        limits: ReplyLimits | None = None,
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
        self._limits = limits or ReplyLimits()
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
            return await retry_call(lambda: self._generate_attempt(body), self._retry,
                                    provider=self.PROVIDER)
        except LLMError as e:
            detached(e)
            raise

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        body = self.encode(request, stream=True)
        call = CallDeadline(self._retry, self.PROVIDER)  # every network wait is held to it
        events = retry_stream(lambda: self._stream_attempt(body, call), self._retry,
                              provider=self.PROVIDER, deadline=call)
        async with aclosing(events):
            try:
                async for event in events:
                    yield event
            except LLMError as e:
                detached(e)
                raise

    async def _generate_attempt(self, body: bytes) -> Response:
        """One ``generate`` attempt under its deadline, its reply held to ``reply_chars``
        (thinking counted as its blocks' JSON) and its tool names to
        ``MAX_TOOL_NAME_CHARS``; an ``LLMError`` ends it ``_redacted``."""
        try:
            response = await self._generate_once(body, Deadline(self._seconds))
            size = 0
            for block in response.message.blocks:
                if isinstance(block, TextBlock):
                    size += len(block.text)
                elif isinstance(block, ToolUse):
                    if len(block.name) > MAX_TOOL_NAME_CHARS:
                        raise self._name_too_long(block.name)
                    size += len(compact_json(block.input)) + len(block.name) + len(block.id)
                elif isinstance(block, OpaqueBlock):
                    size += len(block.raw)
            if size > self._limits.reply_chars:
                raise self._too_large()
        except LLMError as e:
            self._redacted(e)
            raise
        return response

    async def _stream_attempt(self, body: bytes, call: CallDeadline) -> AsyncIterator[StreamEvent]:
        """One streaming attempt under its deadline (or the call's, if sooner), checked at
        every network wait and before every event (one read may hold hundreds: a slow
        consumer must not outlive the deadline by their sum), its reply held to
        ``reply_chars``; an ``LLMError`` ends it ``_redacted``."""
        deadline = Deadline(self._seconds, call)
        budget = ReplyBudget(self._limits.reply_chars, self._too_large)
        try:
            async with aclosing(self._stream_once(body, deadline, budget)) as events:
                async for event in events:
                    if deadline.passed():
                        raise self._timed_out(deadline)
                    kind = type(event)
                    if kind is TextDelta:
                        budget.spend(len(event.text))
                    elif kind is ToolCallDelta:
                        budget.spend(len(event.arguments))
                    elif kind is ToolCallStart:
                        if len(event.name) > MAX_TOOL_NAME_CHARS:
                            raise self._name_too_long(event.name)
                        budget.spend(len(event.name) + len(event.id))
                    yield event
        except LLMError as e:
            self._redacted(e)
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
    async def _generate_once(self, body: bytes, deadline: Deadline) -> Response:
        """One non-streaming attempt (``_post`` it under ``deadline``, ``_read`` the body,
        decode the reply)."""

    @abstractmethod
    def _stream_once(self, body: bytes, deadline: Deadline, budget: ReplyBudget,
                     ) -> AsyncIterator[StreamEvent]:
        """One streaming attempt (``_post`` it under ``deadline``, decode the events; the
        decoder spends from ``budget`` what it holds back before it becomes an event)."""

    @abstractmethod
    def _error_fields(self, raw: bytes) -> tuple[str, tuple[str | None, ...]]:
        """The server's message in an error body (at most ``ERROR_BODY_LIMIT`` bytes of it)
        and the codes / types that may signal an exhausted quota."""

    # -- one HTTP attempt ------------------------------------------------------------------

    @asynccontextmanager
    async def _post(
        self, body: bytes, headers: Mapping[str, str], deadline: Deadline, *,
        stream: bool = False,
    ) -> AsyncIterator[httpx.Response]:
        """POST ``body``, every network wait bounded by ``deadline``; yields a 2xx response,
        raises ``LLMError`` for anything else (``stream``: a 2xx that is not an event stream
        is malformed). The response is closed on any exit, so a cancelled caller never
        leaves a request running; a transport failure or the deadline while the caller reads
        the body (a dropped or an endless stream) comes back through here as a transient
        fault too."""
        client = self._http.get()
        request = client.build_request(
            "POST", self._url, content=body, headers=headers, timeout=self._timeout
        )
        failure: LLMError | None = None
        try:
            with deadline.waiting():
                response = await client.send(request, stream=True)
        except httpx.HTTPError as e:
            failure = self._transport_error(e)
        except TimeoutError:
            failure = self._timed_out(deadline)
        if failure is not None:
            raise failure
        response.stream = _DeadlineStream(response.stream, deadline)  # type: ignore[arg-type]
        try:
            try:
                if not response.is_success:
                    failure = self._status_error(response, await _read_at_most(response))
                elif stream and not _is_event_stream(response):
                    failure = self._malformed(
                        f"a stream was asked for, the server answered "
                        f"{response.headers.get('content-type', '')[:100]!r} instead")
                else:
                    yield response
            except httpx.HTTPError as e:
                failure = self._transport_error(e)
            except TimeoutError:
                failure = self._timed_out(deadline)
            if failure is not None:
                raise failure
        finally:
            await response.aclose()

    async def _read(self, response: httpx.Response) -> bytes:
        """A ``generate`` reply's whole body, at most ``body_bytes`` of it: a larger one is
        malformed (nothing larger is ever held)."""
        limit = self._limits.body_bytes
        body = await _read_at_most(response, limit + 1)
        if len(body) > limit:
            raise self._malformed(f"the reply body is larger than {limit:,} bytes (the body "
                                  "cap, ReplyLimits.body_bytes)")
        return body

    # -- errors ----------------------------------------------------------------------------

    def _secrets(self) -> tuple[str, ...]:
        """What no message may show: the key (Azure adds the tokens it was given)."""
        return (self._key,)

    def _redacted(self, error: LLMError) -> LLMError:
        """``error`` with this model's secrets redacted from its message, in place: the one
        pass every error leaving an attempt gets, whoever raised it (a decoder quoting the
        server's tool name, the retry layer's deadline) and whatever it quotes."""
        message = redact(error.message, *self._secrets())
        if message != error.message:
            error.message = message
            error.args = (message,)
        return error

    def _error(
        self,
        message: str,
        fault: Fault,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> LLMError:
        """An ``LLMError`` from this provider, its message ``redact``ed."""
        return LLMError(
            redact(message, *self._secrets()),
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

    def _timed_out(self, deadline: Deadline) -> LLMError:
        if deadline.call is not None:  # the call's deadline came first
            return deadline.call.expired()
        return self._error(
            f"timed out talking to {self._where}: the attempt passed its deadline of "
            f"{self._seconds:g} s (wall-clock, connecting to the reply's last byte); raise it "
            f"with {type(self).__name__}(..., timeout=seconds)",
            Fault.TRANSIENT,
        )

    def _too_large(self) -> LLMError:
        """A reply past ``reply_chars``: terminal (docs/llm-port.md, "Deadlines and caps")."""
        limit = self._limits.reply_chars
        return self._error(
            f"the reply is longer than {limit:,} characters of text, tool calls and thinking "
            f"(the reply cap): a runaway generation or a broken server; raise it with "
            f"{type(self).__name__}(..., limits=ReplyLimits(reply_chars=...))",
            Fault.TERMINAL,
        )

    def _name_too_long(self, name: str) -> LLMError:
        """A tool name past ``MAX_TOOL_NAME_CHARS``: terminal, like the reply cap."""
        return self._error(tool_name_too_long(name, self.PROVIDER).message, Fault.TERMINAL)

    def _transport_error(self, e: httpx.HTTPError) -> LLMError:
        if isinstance(e, httpx.ConnectError):
            what = f"could not connect to {self._where}"
        elif isinstance(e, httpx.TimeoutException):
            what = f"timed out talking to {self._where} ({type(e).__name__})"
        else:
            what = f"the connection to {self._where} failed ({type(e).__name__})"
        return self._error(what, Fault.TRANSIENT)

    def _malformed(self, what: str) -> LLMError:
        return self._error(malformed(self.PROVIDER, what).message, Fault.TERMINAL)


def _is_event_stream(response: httpx.Response) -> bool:
    """Whether a 2xx reply to a stream request says it is one (no content type: let the
    parser judge)."""
    kind = response.headers.get("content-type")
    return kind is None or kind.split(";", 1)[0].strip().lower() == "text/event-stream"


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
