"""OpenAI Chat Completions over httpx; also any OpenAI-compatible server (llama.cpp, vLLM,
Ollama) on loopback.

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
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

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
from ..safety import display_url, is_loopback_url, supported_image_media_type
from ..types import (
    ImageBlock,
    Message,
    OpaqueBlock,
    Request,
    Response,
    Role,
    StopReason,
    TextBlock,
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

__all__ = ["DEFAULT_BASE_URL", "PROVIDER", "OpenAIModel"]

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


class OpenAIModel(HTTPModel):
    """A ``Model`` over the Chat Completions API.

    The key is ``api_key``, the base URL ``base_url`` or OpenAI's: the adapter never reads
    the environment (``resolve_model`` reads ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` from it
    and from ``.env``). A key is required except for a loopback base URL (a local server
    usually needs none; if one is given it is sent there too, as loopback traffic never
    leaves the machine). A base URL that is not https, or http to loopback, is refused.

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
        max_tokens: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
        limits: ReplyLimits | None = None,
    ) -> None:
        key = api_key or ""
        base = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._local = is_loopback_url(base)
        if not key and not self._local:
            raise ConfigurationError(
                f"no OpenAI API key for {display_url(base)}: pass api_key= (only a loopback "
                "server may go without one; resolve_model reads OPENAI_API_KEY from the "
                "environment or .env, the adapter never does)"
            )
        super().__init__(model=model, base_url=base, endpoint="/chat/completions", key=key,
                         retry=retry, timeout=timeout, http_client=http_client, limits=limits)
        self._max_tokens = max_tokens
        auth = {"authorization": f"Bearer {key}"} if key else {}
        self._json_headers = {"content-type": "application/json", "accept": "application/json",
                              **auth}
        self._sse_headers = {**self._json_headers, "accept": "text/event-stream"}

    def __repr__(self) -> str:
        key = "set" if self._key else "none"
        return f"OpenAIModel(model={self._model!r}, base_url={self._where!r}, api_key={key})"

    def encode(self, request: Request, *, stream: bool) -> bytes:
        """The exact request body sent for ``request`` (deterministic)."""
        ceiling = "max_tokens" if self._local else "max_completion_tokens"
        return encode_request(
            self._model, request, stream=stream, ceiling=ceiling, max_tokens=self._max_tokens
        )

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
            failure = e
        except _SHAPE_ERRORS:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            failure = _malformed("the response body is not a chat completion")
        raise failure

    async def _stream_once(self, body: bytes, deadline: Deadline, budget: ReplyBudget,
                           ) -> AsyncIterator[StreamEvent]:
        limits = self._limits
        async with self._post(body, self._sse_headers, deadline, stream=True) as response:
            decoder = ChunkDecoder(budget)
            async for sse in iter_sse(response, PROVIDER, max_line=limits.sse_line_bytes,
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
        raise cut_short(PROVIDER, "the stream ended before [DONE]")

    def _decode_chunk(
        self, decoder: ChunkDecoder, data: str
    ) -> tuple[list[StreamEvent], LLMError | None]:
        try:
            chunk = loads(data)
        except TooDeep:
            return [], _malformed("a stream event nests too deeply to parse")
        except ValueError:
            return [], _malformed("a stream event's data is not JSON")
        if not isinstance(chunk, dict):
            return [], _malformed("a stream event is not a JSON object")
        if "error" in chunk:
            return [], self._stream_error(chunk["error"])
        try:
            return decoder.feed(chunk), None
        except LLMError as e:
            return [], e
        except _SHAPE_ERRORS:
            return [], _malformed("a stream event is not a chat completion chunk")

    # -- errors ------------------------------------------------------------------------------

    def _error_fields(self, raw: bytes) -> tuple[str, tuple[str | None, ...]]:
        try:
            data = loads(raw)
        except ValueError:  # an HTML page, a body cut at ERROR_BODY_LIMIT, not UTF-8
            return body_text(raw), ()
        return _error_fields(data.get("error", data) if isinstance(data, dict) else data)

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
) -> bytes:
    """The request body as deterministic JSON bytes.

    ``tools`` and ``messages`` come first, so the bytes up to the end of any stable message
    are identical across turns; per-call fields follow. ``max_tokens`` is the default output
    ceiling, sent under the key ``ceiling`` unless the request sets its own.
    """
    splices: list[str] = []
    marker = f"\x00opaque-{uuid.uuid4().hex}-"
    body: dict[str, Any] = {"model": model}
    if request.tools:
        body["tools"] = [_encode_tool(t.name, t.description, t.input_schema) for t in request.tools]
    messages = [{"role": "system", "content": request.system}] if request.system else []
    for message in request.messages:
        messages.extend(_encode_message(message, splices, marker))
    body["messages"] = messages
    if (choice := _encode_tool_choice(request)) is not None:
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
    if request.cache.key:
        body["prompt_cache_key"] = request.cache.key
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    text = compact_json(body)
    for i, raw in enumerate(splices):
        text = text.replace(json.dumps(f"{marker}{i}", ensure_ascii=False), raw, 1)
    return encode_text(text)


def _encode_tool_choice(request: Request) -> str | dict[str, Any] | None:
    """The wire's ``tool_choice``, or None to send none (``auto``, or no tools)."""
    choice = request.tool_choice
    if choice.mode == "auto" or not request.tools:
        return None
    if choice.mode == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode  # "required" or "none": the same words on the wire


def _encode_tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = schema
    return {"type": "function", "function": function}


def _encode_message(message: Message, splices: list[str], marker: str) -> list[dict[str, Any]]:
    """One port message as wire messages: tool results first, then the rest of the message."""
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
                if provider == PROVIDER:
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
        call = self._calls.setdefault(i, _Call())
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
    return Usage(
        input_tokens=usage.get("prompt_tokens") or 0,
        output_tokens=usage.get("completion_tokens") or 0,
        cache_read_tokens=details.get("cached_tokens") or 0,
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
