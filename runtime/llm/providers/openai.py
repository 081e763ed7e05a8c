"""OpenAI Chat Completions over httpx; also any OpenAI-compatible server (llama.cpp, vLLM,
Ollama) on loopback, the named ones of ``presets`` (``preset="ollama"``), and Azure OpenAI
(``AzureOpenAIModel``).

Choices worth knowing (each keeps a request valid on OpenAI *and* on local servers):

- The system prompt is sent as a ``system`` message, not ``developer``: OpenAI maps it for
  reasoning models and the compatible servers only know ``system``.
- Tool results become ``tool`` messages (OpenAI requires them right after the assistant's
  ``tool_calls``), followed by one ``user`` message for any other blocks of the same port
  message. The wire has no error flag, so a failed call's content is prefixed ``"Error: "``.
- Images become ``image_url`` parts holding a ``data:`` URI; an unsupported media type is
  refused, never dropped.
- Opaque blocks of other providers are dropped (their bytes mean nothing here). An
  ``OpaqueBlock(provider="openai")`` must be one JSON content part and is spliced verbatim into
  its message's ``content`` array: the escape hatch for parts the port does not model.
- ``tool_choice`` goes out as ``"required"``, ``"none"`` or ``{"type": "function",
  "function": {"name": ...}}``; ``auto``, the API's default, is not sent, and nothing is
  sent without tools (the API refuses a choice then), so a server that knows no
  ``tool_choice`` still takes every request that does not ask for one.
- The output ceiling goes out as ``max_completion_tokens`` (OpenAI's reasoning models reject
  ``max_tokens``), except to a loopback server, which gets the ``max_tokens`` every compatible
  server understands.
- OpenAI caches request prefixes by itself, so a ``CacheHint`` only contributes
  ``prompt_cache_key``. The body is encoded deterministically with ``tools`` before
  ``messages`` and every per-call field after them, so one conversation's turns share a
  byte-identical prefix.
- ``usage.prompt_tokens`` already includes cached tokens, so it is ``input_tokens`` as is;
  ``cached_tokens`` is ``cache_read_tokens``; automatic caching reports no separate write.
- A tool call without an id (some compatible servers send none), with an id the reply has
  already used or with one a provider would refuse back (``replayable_call_id``) gets a
  fresh one (``CallIds``), so no two calls of a history share an id and every id replays.
- Argument text that streams in before its call's name (the call cannot be announced
  without one) counts toward the reply cap as it arrives (the decoder spends it from the
  attempt's ``ReplyBudget``). Arguments nested too deeply to parse are a malformed reply
  (terminal).

Servers differ in what of the wire they honour, and a ``Dialect`` says how, once per server
family, so the encoder has one place to ask: whether to ask for the usage chunk
(``stream_options``) and send ``prompt_cache_key`` (an OpenAI field: a compatible server may
refuse it, and Azure's 2024-10-21 specification has none), how much of ``tool_choice`` to
send (``presets`` module doc), whose opaque blocks are its own, and which 400 codes blame the
model's output rather than the request (transient). A preset model reports its preset's name as its
``provider`` (``"ollama"``), so its errors, logs and a rebuilt choice say which server it was.
"""

from __future__ import annotations

import base64
import inspect
import json
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from ..errors import ConfigurationError, Fault, LLMError, quota_exhausted
from ..events import (
    Stop,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
)
from ..history import CallIds
from ..limits import DEFAULT_ATTEMPT_TIMEOUT, ReplyLimits
from ..retry_policy import RetryPolicy
from ..safety import (
    check_api_key,
    display_url,
    is_loopback_url,
    redact_secrets,
    supported_image_media_type,
)
from ..types import (
    ImageBlock,
    Message,
    OpaqueBlock,
    Request,
    Response,
    Role,
    StopReason,
    TextBlock,
    Tool,
    ToolResult,
    ToolUse,
    Usage,
)
from ._http import (
    Deadline,
    HTTPModel,
    ReplyBudget,
    TooDeep,
    body_text,
    compact_json,
    cut_short,
    encode_text,
    is_json_object,
    loads,
    malformed,
)
from ._sse import iter_sse
from .presets import (
    AZURE_DEFAULT_API_VERSION,
    PRESETS,
    Preset,
    ToolChoiceSupport,
    azure_features,
    check_azure_api_version,
    check_azure_deployment,
    check_azure_endpoint,
    with_default_path,
)

__all__ = ["DEFAULT_BASE_URL", "OPENAI_DIALECT", "PROVIDER", "AzureOpenAIModel", "Dialect",
           "OpenAIModel", "TokenProvider"]

PROVIDER = "openai"
DEFAULT_BASE_URL = "https://api.openai.com/v1"

_FINISH = {
    "stop": StopReason.END_TURN,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.REFUSAL,
}
_TERMINAL_STREAM_ERRORS = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error"}
)
# What a well-formed JSON value of the wrong shape raises while we pick it apart.
_SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)
# Fixed block positions, so a stream assembles in the order ``generate`` decodes: the text,
# then a refusal, then the tool calls by their wire index.
_CONTENT, _REFUSAL, _FIRST_CALL = 0, 1, 2
MAX_STREAMED_CALLS = 4096
"""Tool calls one streamed reply may open (distinct wire ``index`` values). A delta that
only names an index costs no reply characters, so without a cap a server could make this
process hold state for millions of them; no model's reply holds that many calls."""


@dataclass(frozen=True)
class Dialect:
    """What one family of Chat Completions servers honours (module doc)."""

    stream_usage: bool = True  # ask for the usage chunk (stream_options.include_usage)
    cache_key: bool = True  # send CacheHint.key as prompt_cache_key
    tool_choice: ToolChoiceSupport = "full"
    opaque: frozenset[str] = frozenset({PROVIDER})  # providers whose opaque blocks it takes
    model_fault_codes: frozenset[str] = frozenset()  # 400 codes that blame the model's output


OPENAI_DIALECT = Dialect()
"""OpenAI's own API, and any server not named by a preset."""


def _known_preset(name: str | None) -> Preset | None:
    if name is None:
        return None
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}") from None


def _preset_dialect(preset: Preset) -> Dialect:
    # prompt_cache_key is OpenAI's field: none of the presets documents it, so none gets it
    return Dialect(cache_key=False, tool_choice=preset.tool_choice,
                   opaque=frozenset({PROVIDER, preset.name}),
                   model_fault_codes=preset.model_fault_codes)


class OpenAIModel(HTTPModel):
    """A ``Model`` over the Chat Completions API.

    The key is ``api_key``, the base URL ``base_url`` or OpenAI's: the adapter never reads
    the environment (``resolve_model`` reads ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` from it
    and from ``.env``). A key is required except for a loopback base URL (a local server
    usually needs none; if one is given it is sent there too, as loopback traffic never
    leaves the machine). A base URL that is not https, or http to loopback, is refused.

    ``preset`` names a known compatible server (``presets.PRESETS``: ``"ollama"``,
    ``"groq"``...): its default base URL (and its API path, added to a given ``base_url``
    without one: ``http://localhost:11434`` is Ollama's ``.../v1``), whether it needs a key,
    its ``Dialect``, and its name as ``provider``. A loopback server and every preset get
    the ceiling as ``max_tokens``; OpenAI gets ``max_completion_tokens``.

    Safe for concurrent use. Without ``http_client`` it owns one pooled client, created on
    first use and released by ``aclose()`` (or ``async with``); it belongs to the event loop
    that created it, and a call from another loop gets a fresh one (``providers/_http.py``).
    A given ``httpx.AsyncClient`` is used as is and left open. ``timeout`` is each attempt's
    wall-clock deadline in seconds (``providers/_http.py``; connecting: at most 10); the
    retry policy's ``max_elapsed`` is the call's; ``limits`` caps what a reply may hold.
    """

    PROVIDER = PROVIDER
    LABEL = "OpenAI"

    def __init__(
        self,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        preset: str | None = None,
        max_tokens: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
        limits: ReplyLimits | None = None,
    ) -> None:
        server = _known_preset(preset)
        if server is not None:  # its own name and label, in messages, logs and ``provider``
            self.PROVIDER, self.LABEL = server.name, server.label  # type: ignore[misc]
        key = api_key or ""
        if base_url and server is not None:  # its API's path, as resolve_model adds it
            base_url = with_default_path(base_url, server)
        base = (base_url or (server.base_url if server else DEFAULT_BASE_URL)).rstrip("/")
        local = is_loopback_url(base)
        if not key and not local and (server is None or server.key_required):
            var = server.api_key_var if server else "OPENAI_API_KEY"
            raise ConfigurationError(
                f"no {self.LABEL} API key for {display_url(base)}: pass api_key= (only a "
                f"loopback server may go without one; resolve_model reads {var} from the "
                "environment or .env, the adapter never does)"
            )
        super().__init__(model=model, base_url=base, endpoint="/chat/completions", key=key,
                         retry=retry, timeout=timeout, http_client=http_client, limits=limits)
        self._preset = server
        # loopback and compatible servers get the ceiling every server knows; OpenAI's
        # reasoning models reject it
        ceiling = "max_tokens" if local or server else "max_completion_tokens"
        self._wire(ceiling, _preset_dialect(server) if server else OPENAI_DIALECT, max_tokens,
                   {"authorization": f"Bearer {key}"} if key else {})

    def _wire(self, ceiling: str, dialect: Dialect, max_tokens: int | None,
              auth: dict[str, str]) -> None:
        """How this model writes its requests (``encode``) and the headers they carry."""
        self._ceiling = ceiling
        self._dialect = dialect
        self._max_tokens = max_tokens
        self._json_headers = {"content-type": "application/json", "accept": "application/json",
                              **auth}
        self._sse_headers = {**self._json_headers, "accept": "text/event-stream"}

    def __repr__(self) -> str:
        key = "set" if self._key else "none"
        preset = f", preset={self._preset.name!r}" if self._preset else ""
        return (f"OpenAIModel(model={self._model!r}, base_url={self._where!r}, "
                f"api_key={key}{preset})")

    def encode(self, request: Request, *, stream: bool) -> bytes:
        """The exact request body sent for ``request`` (deterministic)."""
        try:
            return encode_request(self._model, request, stream=stream, ceiling=self._ceiling,
                                  max_tokens=self._max_tokens, dialect=self._dialect)
        except LLMError as e:
            raise self._ours(e) from None

    def _ours(self, error: LLMError) -> LLMError:
        """``error`` (raised by this module's encoder or decoder, which name OpenAI) as this
        model's: a preset's or Azure's errors carry their own provider name."""
        error.provider = self.PROVIDER
        return error

    # -- one HTTP exchange -------------------------------------------------------------------

    # Errors are raised outside the ``except`` blocks that detect them, so the exception
    # that revealed the problem (a JSONDecodeError holds the whole body) is not their
    # ``__context__``; ``HTTPModel`` detaches whatever the retry layer adds on the way out.

    async def _generate_once(self, body: bytes, deadline: Deadline) -> Response:
        async with self._post(body, self._json_headers, deadline) as response:
            raw = await self._read(response)
        failure: LLMError | None = None
        try:
            return decode_completion(loads(raw))
        except LLMError as e:
            failure = self._ours(e)
        except _SHAPE_ERRORS:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            failure = self._malformed("the response body is not a chat completion")
        raise failure

    async def _stream_once(self, body: bytes, deadline: Deadline, budget: ReplyBudget,
                           ) -> AsyncIterator[StreamEvent]:
        limits = self._limits
        async with self._post(body, self._sse_headers, deadline, stream=True) as response:
            decoder = ChunkDecoder(budget)
            async for sse in iter_sse(response, self.PROVIDER, max_line=limits.sse_line_bytes,
                                      max_event=limits.sse_event_bytes):
                if sse.data.strip() == "[DONE]":
                    for event in decoder.done():
                        yield event
                    return
                events, failure = self._decode_chunk(decoder, sse.data)
                if failure is not None:
                    raise failure
                for event in events:
                    yield event
        raise cut_short(self.PROVIDER, "the stream ended before [DONE]")

    def _decode_chunk(
        self, decoder: ChunkDecoder, data: str
    ) -> tuple[list[StreamEvent], LLMError | None]:
        try:
            chunk = loads(data)
        except TooDeep:
            return [], self._malformed("a stream event nests too deeply to parse")
        except ValueError:
            return [], self._malformed("a stream event's data is not JSON")
        if not isinstance(chunk, dict):
            return [], self._malformed("a stream event is not a JSON object")
        if "error" in chunk:
            return [], self._stream_error(chunk["error"])
        try:
            return decoder.feed(chunk), None
        except LLMError as e:
            return [], self._ours(e)
        except _SHAPE_ERRORS:
            return [], self._malformed("a stream event is not a chat completion chunk")

    # -- errors ------------------------------------------------------------------------------

    def _error_fields(self, raw: bytes) -> tuple[str, tuple[str | None, ...]]:
        try:
            data = loads(raw)
        except ValueError:  # an HTML page, a body cut at ERROR_BODY_LIMIT, not UTF-8
            return body_text(raw), ()
        return _error_fields(data.get("error", data) if isinstance(data, dict) else data)

    def _status_error(self, response: httpx.Response, raw: bytes) -> LLMError:
        error = super()._status_error(response, raw)
        blamed = self._dialect.model_fault_codes
        if blamed and error.status == 400 and blamed & set(self._error_fields(raw)[1]):
            # the model wrote a malformed call: a new sample may well not
            return self._error(error.message, Fault.TRANSIENT, 400, error.retry_after)
        return error

    def _stream_error(self, error: Any) -> LLMError:
        message, codes = _error_fields(error)
        kind = error.get("type") if isinstance(error, dict) else None
        terminal = quota_exhausted(message, *codes) or kind in _TERMINAL_STREAM_ERRORS
        return self._error(
            message or "error event in the stream",
            Fault.TERMINAL if terminal else Fault.TRANSIENT,
        )


# -- encoding ---------------------------------------------------------------------------------


def encode_request(
    model: str,
    request: Request,
    *,
    stream: bool,
    ceiling: str = "max_completion_tokens",
    max_tokens: int | None = None,
    dialect: Dialect = OPENAI_DIALECT,
) -> bytes:
    """The request body as deterministic JSON bytes.

    ``tools`` and ``messages`` come first, so the bytes up to the end of any stable message
    are identical across turns; per-call fields follow. ``max_tokens`` is the default output
    ceiling, sent under the key ``ceiling`` unless the request sets its own. ``dialect``
    says what the server honours (module doc); a ``tool_choice`` it cannot take narrows the
    ``tools`` sent instead, so those bytes then differ from an unforced turn's.
    """
    splices: list[str] = []
    marker = f"\x00opaque-{uuid.uuid4().hex}-"
    body: dict[str, Any] = {"model": model}
    tools, choice = _tools_and_choice(request, dialect.tool_choice)
    if tools:
        body["tools"] = [_encode_tool(t.name, t.description, t.input_schema) for t in tools]
    messages = [{"role": "system", "content": request.system}] if request.system else []
    for message in request.messages:
        messages.extend(_encode_message(message, splices, marker, dialect.opaque))
    body["messages"] = messages
    if choice is not None:
        body["tool_choice"] = choice
    if (limit := request.max_tokens or max_tokens) is not None:
        body[ceiling] = limit
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    if request.sampling is not None:
        sampling = request.sampling.normalized()
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        body["temperature"] = sampling.temperature
        if sampling.top_p > 0:
            body["top_p"] = sampling.top_p
    if request.cache.key and dialect.cache_key:
        body["prompt_cache_key"] = request.cache.key
    if stream:
        body["stream"] = True
        if dialect.stream_usage:
            body["stream_options"] = {"include_usage": True}
    text = compact_json(body)
    for i, raw in enumerate(splices):
        text = text.replace(json.dumps(f"{marker}{i}", ensure_ascii=False), raw, 1)
    return encode_text(text)


def _tools_and_choice(request: Request, support: ToolChoiceSupport,
                      ) -> tuple[tuple[Tool, ...], str | dict[str, Any] | None]:
    """The tools to send and the wire's ``tool_choice`` (None: send none, for ``auto`` or no
    tools), as far as the server takes one (``presets`` module doc)."""
    tools, choice = request.tools, request.tool_choice
    if choice.mode == "auto" or not tools:
        return tools, None
    if choice.mode == "tool":
        if support == "full":
            return tools, {"type": "function", "function": {"name": choice.name}}
        named = tuple(t for t in tools if t.name == choice.name)  # that tool alone
        return named, ("required" if support == "modes" else None)
    if support == "ignored":  # "none": offer nothing; "required": cannot be asked for
        return (() if choice.mode == "none" else tools), None
    return tools, choice.mode  # "required" or "none": the same words on the wire


def _encode_tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = schema
    return {"type": "function", "function": function}


def _encode_message(message: Message, splices: list[str], marker: str,
                    opaque: frozenset[str] = OPENAI_DIALECT.opaque) -> list[dict[str, Any]]:
    """One port message as wire messages: tool results first, then the rest of the message.
    Opaque blocks of the providers in ``opaque`` are spliced in; others are dropped."""
    out: list[dict[str, Any]] = []
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    role = message.role.value
    for block in message.blocks:
        match block:
            case TextBlock(text=text):
                parts.append({"type": "text", "text": text})
            case ImageBlock(media_type=media_type, data=data):
                _check_image(message.role, media_type)
                uri = f"data:{media_type.strip().lower()};base64,{base64.b64encode(data).decode()}"
                parts.append({"type": "image_url", "image_url": {"url": uri}})
            case ToolUse(id=cid, name=name, input=args) if message.role is Role.ASSISTANT:
                arguments = compact_json(args)
                calls.append(
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                )
            case ToolResult(tool_use_id=cid, content=content, is_error=failed) if (
                message.role is Role.USER
            ):
                text = f"Error: {content}" if failed else content
                out.append({"role": "tool", "tool_call_id": cid, "content": text})
            case OpaqueBlock(provider=provider, raw=raw):
                if provider in opaque:
                    parts.append(f"{marker}{len(splices)}")
                    splices.append(_check_opaque(raw))
            case _:
                raise _refused(f"a {block.kind} block cannot go in a {role} message")
    if parts or calls or not out:
        wire: dict[str, Any] = {"role": role}
        if len(parts) == 1 and isinstance(parts[0], dict) and parts[0]["type"] == "text":
            wire["content"] = parts[0]["text"]
        elif parts:
            wire["content"] = parts
        else:
            wire["content"] = None if calls else ""
        if calls:
            wire["tool_calls"] = calls
        out.append(wire)
    return out


def _check_image(role: Role, media_type: str) -> None:
    if role is not Role.USER:
        raise _refused(f"images can only be sent in user messages, not {role.value} ones")
    if not supported_image_media_type(media_type):
        raise _refused(f"image type {media_type!r} is not supported (use png, jpeg, gif or webp)")


def _check_opaque(raw: str) -> str:
    if not is_json_object(raw):
        raise _refused("an openai opaque block must be one JSON object (a content part)")
    return raw


def _refused(message: str) -> LLMError:
    """A request we will not send: retrying cannot fix it."""
    return LLMError(message, fault=Fault.TERMINAL, provider=PROVIDER)


# -- decoding ---------------------------------------------------------------------------------


def decode_completion(data: dict[str, Any]) -> Response:
    """A non-streaming ``chat.completion`` body as a ``Response``."""
    choice = data["choices"][0]
    message = choice["message"]
    blocks: list[TextBlock | ToolUse] = []
    if content := _text(message.get("content")):
        blocks.append(TextBlock(text=content))
    if refusal := message.get("refusal"):
        blocks.append(TextBlock(text=refusal))
    calls = message.get("tool_calls") or []
    ids = CallIds()
    for call in calls:
        function = call["function"]
        arguments = _arguments(function["name"], function.get("arguments") or "")
        blocks.append(
            ToolUse(id=ids.take(call.get("id")), name=function["name"], input=arguments)
        )
    return Response(
        message=Message(role=Role.ASSISTANT, blocks=tuple(blocks)),
        stop_reason=_stop_reason(choice.get("finish_reason"), bool(calls), bool(refusal)),
        usage=_usage(data.get("usage")),
        model=data.get("model") or "",
    )


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    pending: list[str] = field(default_factory=list)
    held: int = 0  # characters of id and arguments held back before the name came
    spent: int = 0  # how many of them the budget has been charged
    started: bool = False
    ended: bool = False


class ChunkDecoder:
    """Turns ``chat.completion.chunk`` objects into stream events.

    Tool calls are tracked by their wire ``index`` (parallel calls may interleave); a call is
    announced once its name is known, with any argument text that arrived before it. That
    text and the call's id are spent from ``budget`` as they arrive and given back when they
    go out as events, which the attempt counts (none: uncounted, for a caller that decodes
    chunks it holds).
    """

    def __init__(self, budget: ReplyBudget | None = None) -> None:
        self._budget = budget
        self._calls: dict[int, _Call] = {}
        self._ids = CallIds()
        self._finish: str | None = None
        self._refused = False
        self._model = ""

    def feed(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        self._model = chunk.get("model") or self._model
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if content := _text(delta.get("content")):
                out.append(TextDelta(index=_CONTENT, text=content))
            if refusal := delta.get("refusal"):
                self._refused = True
                out.append(TextDelta(index=_REFUSAL, text=refusal))
            for call in delta.get("tool_calls") or []:
                out.extend(self._call(call))
            if finish := choice.get("finish_reason"):
                self._finish = finish
                out.extend(self._end_calls())
        if usage := chunk.get("usage"):
            out.append(UsageUpdate(usage=_usage(usage)))
        return out

    def done(self) -> list[StreamEvent]:
        """The closing events, at ``data: [DONE]``."""
        out = self._end_calls()
        stop = _stop_reason(self._finish, bool(self._calls), self._refused)
        out.append(Stop(stop_reason=stop, model=self._model))
        return out

    def _call(self, delta: dict[str, Any]) -> list[StreamEvent]:
        i = delta["index"]
        if type(i) is not int or i < 0:  # a negative one would land on the text's index
            raise ValueError("a tool call's index is not a count")
        call = self._calls.get(i)
        if call is None:
            if len(self._calls) >= MAX_STREAMED_CALLS:
                raise _malformed(f"the stream opens more than {MAX_STREAMED_CALLS:,} tool calls "
                                 "(MAX_STREAMED_CALLS): no model's reply holds that many")
            call = self._calls[i] = _Call()
        function = delta.get("function") or {}
        arguments = function.get("arguments") or ""
        if call.started:
            return [ToolCallDelta(index=_FIRST_CALL + i, arguments=arguments)] if arguments else []
        if not call.id and (cid := delta.get("id")):
            if type(cid) is not str:
                raise TypeError("a tool call id is not text")
            call.id = cid
            call.held += len(cid)
        call.name = call.name or function.get("name") or ""
        if arguments:
            if type(arguments) is not str:
                raise TypeError("tool call arguments are not text")
            call.pending.append(arguments)
            call.held += len(arguments)
        if not call.name:
            if self._budget is not None:  # held back until the name comes: counted now
                self._budget.spend(call.held - call.spent)
                call.spent = call.held
            return []
        call.started = True
        if self._budget is not None:
            self._budget.refund(call.spent)  # the attempt counts the events they become
        out: list[StreamEvent] = [
            ToolCallStart(index=_FIRST_CALL + i, id=self._ids.take(call.id), name=call.name)
        ]
        if text := "".join(call.pending):
            out.append(ToolCallDelta(index=_FIRST_CALL + i, arguments=text))
        call.pending.clear()
        return out

    def _end_calls(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for i in sorted(self._calls):
            call = self._calls[i]
            if not call.started:
                raise _malformed(f"tool call {i} never got a name")
            if not call.ended:
                call.ended = True
                out.append(ToolCallEnd(index=_FIRST_CALL + i))
        return out


def _text(content: Any) -> str:
    """Message content as text; a few compatible servers send a list of text parts."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _arguments(name: str, text: str) -> dict[str, Any]:
    """A tool call's arguments. Text that is no JSON object is the model's output, not a
    wire-format fault: transient, as a new sample usually parses (and as ``assemble`` judges
    the same arguments in a stream)."""
    value: Any = None
    deep = False
    try:
        value = loads(text.strip() or "{}")
    except TooDeep:
        deep = True
    except ValueError:
        pass
    if deep:
        raise _malformed(f"tool call {name[:200]!r} arguments nest too deeply to parse")
    if not isinstance(value, dict):
        raise cut_short(PROVIDER, f"malformed tool call: {name[:200]!r} arguments are not a "
                        "JSON object")
    return value


def _stop_reason(finish: str | None, has_calls: bool, refused: bool) -> StopReason:
    if refused:
        return StopReason.REFUSAL
    reason = _FINISH.get(finish or "", StopReason.END_TURN)
    # Some compatible servers finish a tool-calling turn with "stop".
    if reason is StopReason.END_TURN and has_calls:
        return StopReason.TOOL_USE
    return reason


def _usage(usage: dict[str, Any] | None) -> Usage:
    if not usage:
        return Usage()
    details = usage.get("prompt_tokens_details") or {}
    output = usage.get("completion_tokens") or 0
    thinking = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    if type(thinking) is int and type(output) is int:  # inside completion_tokens (o-series,
        thinking = min(thinking, output)  # gpt-5): a server's odd count never exceeds it
    return Usage(
        input_tokens=usage.get("prompt_tokens") or 0,
        output_tokens=output,
        cache_read_tokens=details.get("cached_tokens") or 0,
        reasoning_tokens=thinking,
    )


def _malformed(what: str) -> LLMError:
    return malformed(PROVIDER, what)


# -- errors --------------------------------------------------------------------------


def _error_fields(error: Any) -> tuple[str, tuple[str | None, ...]]:
    """(message, code and type) of an OpenAI error object (or a bare error string)."""
    if isinstance(error, str):
        return error, ()
    if not isinstance(error, dict):
        return "", ()
    codes = tuple(c if isinstance(c, str) else None for c in (error.get("code"), error.get("type")))
    return str(error.get("message") or ""), codes


# -- Azure OpenAI --------------------------------------------------------------------------

TokenProvider = Callable[[], str | Awaitable[str]]
"""A callable returning a Microsoft Entra ID token: sync (run in a worker thread, since a
credential may fetch one over the network) or async (awaited), called before every attempt."""

_AZURE = "azure"
_SEEN_TOKENS = 4  # the provider's latest tokens, kept to be redacted from errors


class AzureOpenAIModel(OpenAIModel):
    """Chat Completions on an Azure OpenAI deployment.

    ``model`` is the deployment's name and ``base_url`` the resource endpoint
    (``https://<resource>.openai.azure.com``); requests go to
    ``{endpoint}/openai/deployments/{deployment}/chat/completions?api-version=...``, with
    ``api_version`` defaulting to the latest GA one (``presets.AZURE_DEFAULT_API_VERSION``).
    The credential is an ``api_key`` (sent as the ``api-key`` header) or a Microsoft Entra ID
    ``token``: a string, or a ``TokenProvider`` called before every attempt (tokens expire
    within hours; a provider from ``azure.identity.get_bearer_token_provider`` caches and
    renews them), sent as ``Authorization: Bearer``. Exactly one of the two is required. A
    token the provider returns is kept out of errors and reprs like a key.

    The wire is the OpenAI adapter's, minus ``prompt_cache_key`` (not in the dated API
    versions); ``stream_options`` and ``max_completion_tokens`` go only to api-versions from
    2024-09-01 on (older ones refuse both: ``max_tokens`` goes to those, and streams carry no
    usage there). Like every adapter it never reads the environment: ``resolve_model("azure:
    <deployment>")`` reads ``AZURE_OPENAI_API_KEY``, ``AZURE_OPENAI_ENDPOINT`` and
    ``OPENAI_API_VERSION``.
    """

    PROVIDER = _AZURE
    LABEL = "Azure OpenAI"

    def __init__(
        self,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        api_version: str = AZURE_DEFAULT_API_VERSION,
        token: str | TokenProvider | None = None,
        max_tokens: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
        limits: ReplyLimits | None = None,
    ) -> None:
        check_azure_deployment(model)
        check_azure_api_version(api_version)
        if not base_url:
            raise ConfigurationError(
                "no Azure OpenAI endpoint: pass base_url='https://<resource>.openai.azure.com' "
                "(resolve_model reads AZURE_OPENAI_ENDPOINT from the environment or .env, the "
                "adapter never does)")
        check_azure_endpoint(base_url)
        if bool(api_key) == (token is not None and token != ""):
            raise ConfigurationError(
                "Azure OpenAI takes one credential: pass api_key= (sent as the api-key header) "
                "or token= (a Microsoft Entra ID token, or a callable returning one), not "
                + ("both" if api_key else "neither"))
        provider = token if callable(token) else None
        if token is not None and provider is None and not isinstance(token, str):
            raise ConfigurationError(
                "the Azure OpenAI token= must be a string or a callable returning one, not "
                f"{type(token).__name__}")
        static = api_key or (token if isinstance(token, str) else "")
        HTTPModel.__init__(
            self, model=model, base_url=base_url.rstrip("/"),
            endpoint=f"/openai/deployments/{model}/chat/completions?api-version={api_version}",
            key=static, retry=retry, timeout=timeout, http_client=http_client, limits=limits)
        self._preset = None
        self._api_version = api_version
        self._token_provider = provider
        self._tokens: deque[str] = deque(maxlen=_SEEN_TOKENS)
        self._auth = "api-key" if api_key else "token provider" if provider else "token"
        current = azure_features(api_version)
        dialect = Dialect(stream_usage=current, cache_key=False,
                          opaque=frozenset({PROVIDER, _AZURE}))
        auth = ({"api-key": api_key} if api_key else
                {"authorization": f"Bearer {token}"} if isinstance(token, str) else {})
        self._wire("max_completion_tokens" if current else "max_tokens", dialect, max_tokens,
                   auth)

    def __repr__(self) -> str:
        return (f"AzureOpenAIModel(deployment={self._model!r}, endpoint={self._where!r}, "
                f"api_version={self._api_version!r}, auth={self._auth})")

    @asynccontextmanager
    async def _post(self, body: bytes, headers: Any, deadline: Deadline, *,
                    stream: bool = False) -> AsyncIterator[httpx.Response]:
        if self._token_provider is not None:  # a fresh token for every attempt
            headers = {**headers, "authorization": f"Bearer {await self._fresh_token(deadline)}"}
        async with super()._post(body, headers, deadline, stream=stream) as response:
            yield response

    async def _fresh_token(self, deadline: Deadline) -> str:
        """The provider's token, within the attempt's deadline. A provider that fails or
        returns something unusable ends the call (terminal): waiting rarely mends a
        credential, and the error says which."""
        provider = self._token_provider
        assert provider is not None
        failure: LLMError | None = None
        token: object = None
        try:
            with deadline.waiting():
                if inspect.iscoroutinefunction(provider) or inspect.iscoroutinefunction(
                        type(provider).__call__):  # an object with an async __call__
                    token = await provider()  # type: ignore[misc]
                else:
                    token = await anyio.to_thread.run_sync(provider, abandon_on_cancel=True)
                    if inspect.isawaitable(token):
                        token = await token
        except TimeoutError:
            failure = self._timed_out(deadline)
        except Exception as e:  # the credential's own error, in words without secrets
            failure = self._error(
                f"the Entra ID token provider failed ({type(e).__name__}: "
                f"{redact_secrets(str(e))[:300]})", Fault.TERMINAL)
        if failure is not None:
            raise failure
        if not isinstance(token, str) or not token:
            raise self._error(f"the Entra ID token provider returned {type(token).__name__}, "
                              "not a token string", Fault.TERMINAL)
        try:
            check_api_key(token, "Azure OpenAI token")
        except ConfigurationError as e:
            failure = self._error(f"the Entra ID token provider returned an unusable token: "
                                  f"{e}", Fault.TERMINAL)
        if failure is not None:
            raise failure
        if token not in self._tokens:
            self._tokens.append(token)
        return token

    def _secrets(self) -> tuple[str, ...]:
        # a server may echo the bearer token too
        return (*super()._secrets(), *getattr(self, "_tokens", ()))
