"""The Anthropic Messages API behind the port, over httpx (no vendor SDK at run time).

Wire mapping, in brief:

- The request body is built as text with a fixed key order and compact separators, so the
  same conversation always encodes to the same bytes and a prompt cache sees a byte-identical
  prefix across turns. Order: ``model``, ``tools``, ``system``, ``messages``, then the knobs
  that may vary per call (``tool_choice``, ``max_tokens``, ``thinking``, ``output_config``,
  ``stream``).
  Message content is always a list of blocks, never the string shorthand, so a message does
  not change shape when a cache marker lands on it.
- ``thinking`` / ``redacted_thinking`` (and any other block type we do not model) come back
  as ``OpaqueBlock(provider="anthropic", raw=<the block as compact JSON>)`` and are spliced
  back into the request text byte for byte. Opaque blocks of other providers are dropped.
- ``CacheHint.prefix`` puts ``cache_control`` on the last system block and the last tool;
  ``stable_messages=n`` puts one on the last markable block at or before message ``n-1``
  (thinking blocks cannot carry a marker and are replayed untouched).
- ``Usage`` is normalised: ``input_tokens`` = Anthropic ``input_tokens`` +
  ``cache_read_input_tokens``; ``cache_write_tokens`` = ``cache_creation_input_tokens``.
- ``reasoning_effort`` turns thinking on in whichever of the API's two forms the model takes
  (``thinking_style(model)``). ``"adaptive"``, the current form, sends ``thinking:
  {"type": "adaptive"}`` and ``output_config: {"effort": "low" | "medium" | "high"}``: the
  model decides how much to think. ``"budget"``, for the models from before adaptive thinking
  (Claude 3.7 and the 4.0 to 4.5 families), sends ``thinking: {"type": "enabled",
  "budget_tokens": 1024 | 4096 | 16384}``. Thinking tokens count toward ``max_tokens`` in
  both forms, so that amount is added to ``max_tokens`` as headroom and the request's own
  ``max_tokens`` keeps bounding the visible answer. The constructor's ``thinking=`` overrides
  the style for a model id the rule does not know (a gateway's alias, say).
- ``tool_choice`` goes out as the API documents it: ``{"type": "any"}`` for ``required``,
  ``{"type": "tool", "name": ...}`` for a named tool, ``{"type": "none"}`` for ``none``;
  ``auto``, the API's default, is not sent, nor anything without tools (the API takes a
  choice only with tools). A choice that forces a call cannot go with thinking (the API
  answers 400, "Thinking may not be enabled when tool_choice forces tool use"), so such a
  request with a ``reasoning_effort`` is refused before sending (terminal), never sent
  with its thinking silently dropped. Changing the choice between calls (the step engine
  does, after a forced step) costs the cached messages, not the cached tools and
  system prompt: the API keys its message cache on the choice.
- ``Sampling`` is not sent. The Messages API as the official SDK (2.x) types it has no
  sampling parameters any more; current models reject ``temperature`` / ``top_p`` with a
  400, the 4.5 generation rejects the two together, and a hosted model cannot pin its
  decoding anyway, which is what ``Sampling`` is for (reproducible runs on weights you hold:
  the OpenAI adapter sends it, and so do local OpenAI-compatible servers behind it). So every
  body this adapter builds is one the SDK's own ``MessageCreateParams`` accept, and the
  tests' fake validates it against exactly those, with no hand-written exception.
- A ``tool_use`` block without an id, with one the reply has already used, or with one the
  API would refuse back (it takes ``^[a-zA-Z0-9_-]+$``: ``replayable_call_id``) gets a fresh
  one (``CallIds``): the API always sends good unique ids, a gateway posing as it may not.
- Thinking and signature text counts toward the reply cap as it streams in (the decoder
  spends it from the attempt's ``ReplyBudget``), though it goes out only whole, at the
  block's end; a whole block (``redacted_thinking``'s data) counts as it starts.
- Tool call arguments nested too deeply to parse are a malformed reply (terminal).
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import httpx

from ..errors import ConfigurationError, Fault, LLMError, quota_exhausted, retry_class
from ..events import (
    OpaqueDone,
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
from ..safety import supported_image_media_type
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
    compact_json,
    cut_short,
    encode_text,
    is_json_object,
    loads,
)
from ._sse import SSEEvent, iter_sse

__all__ = ["DEFAULT_BASE_URL", "THINKING_BUDGETS", "AnthropicModel", "thinking_style"]

PROVIDER = "anthropic"
DEFAULT_BASE_URL = "https://api.anthropic.com"
THINKING_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}
"""Thinking tokens per ``reasoning_effort``: the budget of ``"budget"`` thinking, and the
headroom added to ``max_tokens`` in either style."""

ThinkingStyle = Literal["adaptive", "budget"]
# The models that predate adaptive thinking and take only a token budget: Claude 3.x, and
# the opus / sonnet / haiku 4.0 to 4.5 families (dated snapshots and "claude-sonnet-4" too).
_BUDGET_ONLY = re.compile(r"^claude-(3|(opus|sonnet|haiku)-4(-[0-5](\b|-)|-\d{8}|@|$))")

_GATHERED = frozenset({"thinking", "signature"})
"""The fields of an opaque block its deltas add to: gathered as lists, joined at its end."""
_CACHE_MARKER = '"cache_control":{"type":"ephemeral"}'
_STOP_REASONS = {
    "end_turn": StopReason.END_TURN,
    "stop_sequence": StopReason.END_TURN,
    "pause_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.MAX_TOKENS,
    "refusal": StopReason.REFUSAL,
    "model_context_window_exceeded": StopReason.CONTEXT_EXCEEDED,
}
# The HTTP status each in-stream ``error`` event type stands for, to classify it like one.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class AnthropicModel(HTTPModel):
    """A ``Model`` backed by Anthropic's Messages API.

    Safe for concurrent use. Without ``http_client`` it owns one pooled client, created on
    first use and released by ``aclose()`` (or ``async with``); it belongs to the event loop
    that created it, and a call from another loop gets a fresh one (``providers/_http.py``).
    A given ``httpx.AsyncClient`` is used as is and left open. ``timeout`` is each attempt's
    wall-clock deadline in seconds (``providers/_http.py``; connecting: at most 10); the
    retry policy's ``max_elapsed`` is the call's; ``limits`` caps what a reply may hold.

    ``api_key`` is required and ``base_url`` defaults to Anthropic's: the adapter never
    reads the environment (``resolve_model`` reads ``ANTHROPIC_API_KEY`` and
    ``ANTHROPIC_BASE_URL`` from it and from ``.env``).
    """

    PROVIDER = PROVIDER
    LABEL = "Anthropic"

    def __init__(
        self,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        max_tokens: int = 4096,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
        anthropic_version: str = "2023-06-01",
        thinking: ThinkingStyle | None = None,
        limits: ReplyLimits | None = None,
    ) -> None:
        key = api_key
        if not key:
            raise ConfigurationError(
                "no Anthropic API key: pass api_key= (resolve_model reads ANTHROPIC_API_KEY "
                "from the environment or .env; the adapter never does)"
            )
        url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        super().__init__(model=model, base_url=url, endpoint="/v1/messages", key=key,
                         retry=retry, timeout=timeout, http_client=http_client, limits=limits)
        self._thinking: ThinkingStyle = thinking or thinking_style(model)
        self._headers = {
            "x-api-key": key,
            "anthropic-version": anthropic_version,
            "content-type": "application/json",
        }
        self._max_tokens = max_tokens

    @property
    def base_url(self) -> str:
        return self._base_url

    def __repr__(self) -> str:
        return f"AnthropicModel(model={self._model!r}, base_url={self._where!r})"

    def encode(self, request: Request, *, stream: bool) -> bytes:
        """The exact request body sent for ``request`` (deterministic)."""
        return encode_request(
            request, model=self._model, max_tokens=self._max_tokens, stream=stream,
            thinking=self._thinking,
        )

    # -- one HTTP attempt --------------------------------------------------------------

    # Errors are raised outside the ``except`` blocks that detect them, so the exception
    # that revealed the problem (holding the raw body or the error event) is not their
    # ``__context__``; ``HTTPModel`` detaches whatever the retry layer adds on the way out.

    async def _generate_once(self, body: bytes, deadline: Deadline) -> Response:
        async with self._post(body, self._headers, deadline) as response:
            content = await self._read(response)
        data: Any = None
        deep = False
        try:
            data = loads(content)
        except TooDeep:  # a tool call's input, most likely: it is the only free-form JSON
            deep = True
        except ValueError:  # UnicodeDecodeError included
            pass
        if deep:
            raise self._malformed("the reply nests too deeply to parse (tool call arguments?)")
        if data is None:
            raise self._malformed("response body is not JSON")
        if isinstance(data, dict) and data.get("type") == "error":
            raise self._event_error(data)
        shape = "?"
        try:
            return decode_message(data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            shape = type(e).__name__
        raise self._malformed(f"unexpected response shape ({shape})")

    async def _stream_once(self, body: bytes, deadline: Deadline, budget: ReplyBudget,
                           ) -> AsyncIterator[StreamEvent]:
        limits = self._limits
        async with self._post(body, self._headers, deadline, stream=True) as response:
            decoder = StreamDecoder(budget)
            async for sse in iter_sse(response, PROVIDER, max_line=limits.sse_line_bytes,
                                      max_event=limits.sse_event_bytes):
                failure: LLMError | None = None
                try:
                    events = decoder.feed(sse)
                except _ErrorEvent as e:
                    failure = self._event_error(e.body)
                except TooDeep:
                    failure = self._malformed(f"a {sse.event!r} event nests too deeply to parse")
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    failure = self._malformed(f"bad {sse.event!r} event ({type(e).__name__})")
                if failure is not None:
                    raise failure
                for event in events:
                    yield event
                if decoder.done:
                    return
        raise cut_short(PROVIDER, "the stream ended before message_stop")

    # -- errors ------------------------------------------------------------------------

    def _error_fields(self, raw: bytes) -> tuple[str, tuple[str | None, ...]]:
        kind, message = _error_fields(raw)
        return message, (kind,)

    def _event_error(self, body: Any) -> LLMError:
        kind, message = _error_fields(body)
        fault = retry_class(_ERROR_STATUS.get(kind, 500), quota_exhausted(message, kind))
        return self._error(f"{kind or 'error'}: {message or 'error event in stream'}", fault)


def _error_fields(body: bytes | Any) -> tuple[str, str]:
    """Anthropic's error ``(type, message)`` from an error body, or empty strings."""
    if isinstance(body, bytes):
        try:
            body = loads(body)
        except ValueError:  # not JSON (an HTML page, a body cut at ERROR_BODY_LIMIT)
            return "", ""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", ""
    return str(error.get("type") or ""), str(error.get("message") or "")


# -- encoding ----------------------------------------------------------------------------


def thinking_style(model: str) -> ThinkingStyle:
    """How ``model`` takes thinking: ``"budget"`` for the models before adaptive thinking,
    ``"adaptive"`` for every other (current and later) model."""
    return "budget" if _BUDGET_ONLY.match(model.strip().lower()) else "adaptive"


def encode_request(
    request: Request,
    *,
    model: str,
    max_tokens: int,
    stream: bool,
    thinking: ThinkingStyle | None = None,
) -> bytes:
    """The Messages API body for ``request``, as deterministic bytes (see module doc).
    ``thinking`` defaults to ``thinking_style(model)``."""
    hint = request.cache
    parts = [f'"model":{compact_json(model)}']
    if request.tools:
        tools = [
            {"name": t.name, **({"description": t.description} if t.description else {}),
             "input_schema": t.input_schema}
            for t in request.tools
        ]
        parts.append(f'"tools":{_marked_list([compact_json(t) for t in tools], hint.prefix)}')
    system = [request.system] if request.system else []
    system += [m.text_content() for m in request.messages if m.role is Role.SYSTEM]
    if system:
        blocks = [compact_json({"type": "text", "text": s}) for s in system]
        parts.append(f'"system":{_marked_list(blocks, hint.prefix)}')
    messages = [m for m in request.messages if m.role is not Role.SYSTEM]
    parts.append(f'"messages":{_encode_messages(messages, hint.stable_messages)}')
    effort = request.reasoning_effort
    if (choice := _encode_tool_choice(request)) is not None:
        parts.append(f'"tool_choice":{compact_json(choice)}')
    answer = request.max_tokens or max_tokens
    if effort is None:
        parts.append(f'"max_tokens":{answer}')
    else:
        budget = THINKING_BUDGETS[effort]
        parts.append(f'"max_tokens":{answer + budget}')
        if (thinking or thinking_style(model)) == "budget":
            parts.append(f'"thinking":{compact_json({"type": "enabled", "budget_tokens": budget})}')
        else:
            parts.append('"thinking":{"type":"adaptive"}')
            parts.append(f'"output_config":{compact_json({"effort": effort})}')
    # request.sampling is deliberately not sent (module doc)
    if stream:
        parts.append('"stream":true')
    return encode_text("{" + ",".join(parts) + "}")


def _encode_tool_choice(request: Request) -> dict[str, Any] | None:
    """The wire's ``tool_choice``, or None to send none (``auto``, or no tools); a choice
    that forces a call with thinking on is refused (module doc)."""
    choice = request.tool_choice
    if choice.mode == "auto" or not request.tools:
        return None
    if choice.forces and request.reasoning_effort is not None:
        raise LLMError(
            f"Anthropic does not take a tool_choice that forces a call ({choice}) with "
            f"thinking (reasoning_effort={request.reasoning_effort!r}): use tool_choice "
            "'auto' or 'none', or no reasoning_effort",
            fault=Fault.TERMINAL, provider=PROVIDER,
        )
    if choice.mode == "tool":
        return {"type": "tool", "name": choice.name}
    return {"type": "any" if choice.mode == "required" else "none"}


def _marked_list(items: Sequence[str], mark: bool) -> str:
    """A JSON array of encoded objects, the last one carrying a cache marker if ``mark``."""
    items = list(items)
    if mark and items:
        items[-1] = _with_marker(items[-1])
    return "[" + ",".join(items) + "]"


def _with_marker(encoded: str) -> str:
    return encoded[:-1] + "," + _CACHE_MARKER + "}"


def _encode_messages(messages: Sequence[Message], stable: int) -> str:
    encoded = [[_encode_block(b) for b in m.blocks] for m in messages]
    slot = _marker_slot(messages, encoded, stable)
    if slot is not None:
        i, j = slot
        encoded[i][j] = _with_marker(encoded[i][j])  # type: ignore[arg-type]
    out = []
    for i, message in enumerate(messages):
        content = ",".join(b for b in encoded[i] if b is not None)
        out.append(f'{{"role":{compact_json(message.role.value)},"content":[{content}]}}')
    return "[" + ",".join(out) + "]"


def _marker_slot(
    messages: Sequence[Message], encoded: list[list[str | None]], stable: int
) -> tuple[int, int] | None:
    """Where the message cache marker goes: the last block at or before message
    ``stable - 1`` that can carry one, so the cached prefix ends at the stable boundary (or
    just before it, when that message ends in thinking blocks, which cannot be marked)."""
    for i in range(min(stable, len(messages)) - 1, -1, -1):
        for j in range(len(encoded[i]) - 1, -1, -1):
            if encoded[i][j] is not None and not isinstance(messages[i].blocks[j], OpaqueBlock):
                return i, j
    return None


def _encode_block(block: Any) -> str | None:
    """One content block as JSON text; None for a block Anthropic must not see."""
    match block:
        case TextBlock(text=text):
            # The API rejects empty text blocks; an empty one carries nothing anyway.
            return compact_json({"type": "text", "text": text}) if text else None
        case ToolUse(id=id_, name=name, input=args):
            return compact_json({"type": "tool_use", "id": id_, "name": name, "input": args})
        case ToolResult(tool_use_id=id_, content=content, is_error=is_error):
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": id_,
                                      "content": content}
            if is_error:
                result["is_error"] = True
            return compact_json(result)
        case ImageBlock(media_type=media_type, data=data):
            if not supported_image_media_type(media_type):
                raise LLMError(
                    f"unsupported image media type {media_type!r}: "
                    "Anthropic accepts image/png, image/jpeg, image/gif and image/webp",
                    fault=Fault.TERMINAL, provider=PROVIDER,
                )
            source = {"type": "base64", "media_type": media_type.strip().lower(),
                      "data": base64.b64encode(data).decode()}
            return compact_json({"type": "image", "source": source})
        case OpaqueBlock(provider=provider, raw=raw):
            if provider != PROVIDER:
                return None
            if not is_json_object(raw):
                raise LLMError("opaque Anthropic block is not a JSON object",
                               fault=Fault.TERMINAL, provider=PROVIDER)
            return raw  # verbatim: a thinking signature covers these exact contents
    raise TypeError(f"unknown block {type(block).__name__}")


# -- decoding ----------------------------------------------------------------------------


def _opaque(block: dict[str, Any]) -> OpaqueBlock:
    return OpaqueBlock(provider=PROVIDER, raw=compact_json(block))


def _stop_reason(value: str | None) -> StopReason:
    return _STOP_REASONS.get(value or "end_turn", StopReason.END_TURN)


def _usage(counts: dict[str, Any]) -> Usage:
    read = counts.get("cache_read_input_tokens") or 0
    return Usage(
        input_tokens=(counts.get("input_tokens") or 0) + read,
        output_tokens=counts.get("output_tokens") or 0,
        cache_read_tokens=read,
        cache_write_tokens=counts.get("cache_creation_input_tokens") or 0,
    )


def decode_message(data: dict[str, Any]) -> Response:
    """A non-streaming Messages API reply as a ``Response``."""
    blocks: list[Any] = []
    ids = CallIds()
    for block in data["content"]:
        kind = block["type"]
        if kind == "text":
            blocks.append(TextBlock(text=block["text"]))
        elif kind == "tool_use":
            blocks.append(ToolUse(id=ids.take(block.get("id")), name=block["name"],
                                  input=block["input"]))
        else:
            blocks.append(_opaque(block))
    return Response(
        message=Message(role=Role.ASSISTANT, blocks=tuple(blocks)),
        stop_reason=_stop_reason(data.get("stop_reason")),
        usage=_usage(data.get("usage") or {}),
        model=data.get("model") or "",
    )


class _ErrorEvent(Exception):
    def __init__(self, body: Any) -> None:
        self.body = body


class StreamDecoder:
    """Turns Anthropic SSE events into port events, one event at a time.

    Anthropic's ``index`` is the block's position in the final message, so it is used as the
    port's block index unchanged. Opaque blocks are gathered (thinking and signature deltas
    folded into the block that ``content_block_start`` announced) and emitted whole at
    ``content_block_stop``, in the same compact JSON ``decode_message`` produces; what they
    gather is spent from ``budget`` as it arrives (none: uncounted, for a caller that
    decodes a stream it already holds).
    """

    def __init__(self, budget: ReplyBudget | None = None) -> None:
        self._budget = budget
        self.done = False
        self._model = ""
        self._counts: dict[str, Any] = {}
        self._stop: str | None = None
        self._tools: set[int] = set()
        self._ids = CallIds()
        self._opaque: dict[int, dict[str, Any]] = {}

    def feed(self, sse: SSEEvent) -> list[StreamEvent]:
        if sse.event == "ping":
            return []
        data = loads(sse.data)
        if not isinstance(data, dict):
            raise TypeError("event data is not an object")
        kind = data.get("type", sse.event)
        if kind == "error" or sse.event == "error":
            raise _ErrorEvent(data)
        if kind == "message_start":
            message = data["message"]
            self._model = message.get("model") or ""
            self._counts = dict(message.get("usage") or {})
            return [UsageUpdate(usage=_usage(self._counts))]
        if kind == "content_block_start":
            return self._start(data["index"], data["content_block"])
        if kind == "content_block_delta":
            return self._delta(data["index"], data["delta"])
        if kind == "content_block_stop":
            i = data["index"]
            if i in self._tools:
                return [ToolCallEnd(index=i)]
            if i in self._opaque:
                block = {k: "".join(v) if k in _GATHERED and type(v) is list else v
                         for k, v in self._opaque.pop(i).items()}
                return [OpaqueDone(index=i, block=_opaque(block))]
            return []
        if kind == "message_delta":
            self._stop = data["delta"].get("stop_reason")
            # Counts here are cumulative; the ones present (non-null) replace message_start's.
            self._counts.update({k: v for k, v in (data.get("usage") or {}).items()
                                 if v is not None})
            return [UsageUpdate(usage=_usage(self._counts))]
        if kind == "message_stop":
            self.done = True
            return [Stop(stop_reason=_stop_reason(self._stop), model=self._model)]
        return []  # an event type added after this adapter was written

    def _start(self, i: int, block: dict[str, Any]) -> list[StreamEvent]:
        kind = block["type"]
        if kind == "text":
            return [TextDelta(index=i, text=block["text"])]
        if kind == "tool_use":
            self._tools.add(i)
            return [ToolCallStart(index=i, id=self._ids.take(block.get("id")),
                                  name=block["name"])]
        if self._budget is not None:
            self._budget.spend(sum(len(v) for v in block.values() if type(v) is str))
        self._opaque[i] = {k: [v] if k in _GATHERED and type(v) is str else v
                           for k, v in block.items()}
        return []

    def _delta(self, i: int, delta: dict[str, Any]) -> list[StreamEvent]:
        kind = delta["type"]
        if kind == "text_delta":
            return [TextDelta(index=i, text=delta["text"])]
        if kind == "input_json_delta":
            return [ToolCallDelta(index=i, arguments=delta["partial_json"])]
        if kind in ("thinking_delta", "signature_delta"):
            field = kind.removesuffix("_delta")
            text = delta[field]
            if type(text) is not str:
                raise TypeError(f"{kind} is not text")
            if self._budget is not None:
                self._budget.spend(len(text))
            block = self._opaque[i]
            parts = block.get(field)
            if type(parts) is list:
                parts.append(text)
            else:  # absent (or not text) in the block's start
                block[field] = [text]
        return []  # e.g. citations_delta: not modelled by the port
