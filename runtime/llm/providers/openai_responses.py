"""OpenAI's Responses API (``POST /v1/responses``) over httpx: the API OpenAI recommends for
its reasoning models. Chat Completions (``providers/openai.py``) stays the adapter for
OpenAI-compatible servers; this one is chosen by configuration (``openai-responses:``).

Choices worth knowing:

- **Stateless, by decision.** The port sends the whole history with every call and never a
  ``previous_response_id``, so every request says ``"store": false``: nothing of the
  conversation stays on OpenAI's side (a stored response is kept 30 days), as Zero Data
  Retention needs. Reasoning then survives from one call to the next only inside the
  request, so a reasoning model's requests ask for ``include:
  ["reasoning.encrypted_content"]``. Each ``reasoning`` output item (its ``id``, summary and
  encrypted content, or none) comes back as ``OpaqueBlock("openai-responses", raw)``, the
  item as received in compact JSON, and is spliced back into ``input`` byte for byte at its
  place, before the message or function call it led to: a multi-step tool turn keeps its
  reasoning. Any other output item the port does not model travels the same way.
- **A reasoning item without encrypted content is not sent back.** Under ``store: false``
  the API can only look such an item up by its id, which it never kept: it answers 404
  ("Item with id 'rs_...' not found"). A model the adapter did not know to reason (so
  asked for no ``include``) leaves such items in a history; they are dropped from every
  request (a DEBUG line on ``celldialog.llm.openai_responses`` says how many and why), so
  that turn's reasoning is lost, and the conversation goes on. ``reasoning=True`` keeps it.
- **Which models reason**: ``reasoning_model(name)`` (the o-series, ``gpt-5`` but its
  ``-chat`` variants, ``codex-*``, and fine-tuned ones, ``ft:<base>:...``, by their base),
  or the constructor's ``reasoning=``; a request with a ``reasoning_effort`` counts as one.
  No other request gets the ``include``: a model that does not reason answers it with a 400
  ("Encrypted content is not supported with this model").
- The system prompt is ``instructions``. Each port message becomes input items in its
  order: a user message's tool results first, one ``function_call_output`` each (``call_id``
  is the id that pairs it with its ``function_call``; the wire has no error flag, so a
  failed call's output is prefixed ``"Error: "``), then one ``user`` message of its text
  (``input_text``) and images (``input_image``, a ``data:`` URL, ``"detail": "auto"``); an
  assistant message's text as ``assistant`` messages, its tool calls as ``function_call``
  items. Opaque blocks of other providers are dropped; an image outside a user message, or
  of an unsupported type, is refused.
- Tools are ``function`` tools with ``"strict": false``: the API makes a function strict
  unless told otherwise, and strict mode refuses most of the schemas the port allows.
- ``tool_choice`` goes out as ``"required"``, ``"none"`` or ``{"type": "function", "name":
  ...}``; ``auto``, the default, is not sent, nor any choice without tools.
- ``reasoning_effort`` is ``reasoning.effort``. ``reasoning_summary=`` (constructor) asks
  for summaries; OpenAI gives them to verified organisations only, so none by default.
  ``Sampling`` sends ``temperature`` and ``top_p``: the API has no seed.
- ``CacheHint.key`` is ``prompt_cache_key`` (OpenAI caches prefixes by itself). The body is
  deterministic, with ``tools``, ``instructions`` and ``input`` before the per-call fields,
  so one conversation's turns share a byte-identical prefix.
- Usage: the wire's ``input_tokens`` holds the cached tokens
  (``input_tokens_details.cached_tokens``: ``cache_read_tokens``) and those written to the
  cache (``cache_write_tokens``, which models with explicit caching report); the port counts
  writes apart from ``input_tokens``, so they are taken out of it. ``output_tokens``
  includes ``output_tokens_details.reasoning_tokens`` (``Usage.reasoning_tokens``).
- Stop: status ``incomplete`` is ``max_tokens`` (``content_filter``: a refusal); a
  ``refusal`` content part is text and a refusal; a reply with function calls is
  ``tool_use``. A ``failed`` response (its status in a body, ``response.failed`` in a
  stream) and an ``error`` event are faults classified by their code and text.
- Streams: a block's index is ``output_index * 1024 + content_index``, so a stream
  assembles in the order of the body's ``output``. Text comes from the deltas; an item's
  ``output_item.done`` supplies what no delta carried, and brings the opaque item whole (the
  ``added`` one may hold incomplete encrypted content). The stream's last event
  (``response.completed`` / ``incomplete``) finishes any item left open from its ``output``.
  Event types this adapter does not know are skipped. What an item holds back before it
  becomes an event (arguments before its call's name, reasoning deltas) counts toward the
  reply cap as it arrives.
- A reply may hold at most ``MAX_OUTPUT_ITEMS`` output items (body or stream): an item's
  ``added`` event carries no characters the reply cap would count, so without this cap a
  stream of them grew the decoder's state without bound (200,000 cost 100 MB).
- Anything the server sends is checked: wrong types, token counts that are not
  non-negative integers below 2**53, a call without a name, an output item holding a
  number JSON cannot carry (NaN, or an Infinity such as ``1e999`` decodes to: it could
  never be sent back) are malformed replies (terminal); arguments that are no JSON object
  are transient, as in Chat Completions; a missing, repeated or unreplayable ``call_id``
  gets a fresh one (``CallIds``).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from ..errors import ConfigurationError, Fault, LLMError, quota_exhausted
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
    loads,
    malformed,
)
from ._sse import SSEEvent, iter_sse
from .openai import DEFAULT_BASE_URL, _error_fields

__all__ = ["MAX_OUTPUT_ITEMS", "PARTS_PER_ITEM", "PROVIDER", "EventDecoder",
           "OpenAIResponsesModel", "decode_response", "encode_request", "reasoning_model"]

log = logging.getLogger("celldialog.llm.openai_responses")

PROVIDER = "openai-responses"
PARTS_PER_ITEM = 1024
"""Content parts an output item may have: a stream block's index is ``output_index *
PARTS_PER_ITEM + content_index``."""
MAX_OUTPUT_ITEMS = 4096
"""The most output items one reply may hold, in a body or a stream; past it the reply is
malformed (terminal). A reply holds a reasoning item, a message and its function calls:
a few, or a few dozen with parallel calls. Not a ``ReplyLimits`` knob: no honest reply
comes near, and the stream decoder's state per item stays a few hundred bytes under it."""
ENCRYPTED_REASONING = "reasoning.encrypted_content"

ReasoningSummary = Literal["auto", "concise", "detailed"]
_SUMMARIES = ("auto", "concise", "detailed")
_REASONING_MODELS = re.compile(r"^(o\d+(-|$)|gpt-5(?!.*-chat)|codex-)")
# What a well-formed JSON value of the wrong shape raises while we pick it apart.
_SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)
_MAX_COUNT = 2**53  # no honest token count comes near; JSON's safe integers end here
_MAX_OUTPUT_INDEX = 2**31
# Error codes of a failed response that waiting may heal; any other code is the request's
# fault (an invalid prompt or image, a policy), and no code at all is treated as transient.
_TRANSIENT_CODE = re.compile(r"server|overload|timeout|rate_limit|unavailable")
_FINAL = ("completed", "incomplete")


def reasoning_model(model: str) -> bool:
    """Whether ``model`` (an OpenAI id, maybe behind a gateway's ``vendor/`` prefix) reasons,
    so that its requests ask for encrypted reasoning (module doc). A fine-tuned model
    (``ft:<base>:<org>:<suffix>:<id>``) reasons as its base does."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    if name.startswith("ft:"):
        name = name[3:].split(":", 1)[0]
    return _REASONING_MODELS.match(name) is not None


class OpenAIResponsesModel(HTTPModel):
    """A ``Model`` over OpenAI's Responses API, stateless (``store: false``; module doc).

    Configured as ``OpenAIModel`` is: the key is ``api_key``, the base URL ``base_url`` or
    OpenAI's, and the adapter never reads the environment (``resolve_model`` does). A key
    is required except for a loopback base URL; a base URL that is not https, or http to
    loopback, is refused. ``max_tokens`` is the default ``max_output_tokens`` (reasoning
    included), ``reasoning`` overrides ``reasoning_model(model)``, ``reasoning_summary``
    asks for reasoning summaries. Safe for concurrent use; the client, ``timeout``,
    ``retry`` and ``limits`` behave as in every HTTP adapter (``providers/_http.py``).
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
        reasoning: bool | None = None,
        reasoning_summary: ReasoningSummary | None = None,
    ) -> None:
        key = api_key or ""
        base = (base_url or DEFAULT_BASE_URL).rstrip("/")
        if not key and not is_loopback_url(base):
            raise ConfigurationError(
                f"no OpenAI API key for {display_url(base)}: pass api_key= (only a loopback "
                "server may go without one; resolve_model reads OPENAI_API_KEY from the "
                "environment or .env, the adapter never does)"
            )
        if max_tokens is not None and not (type(max_tokens) is int and max_tokens > 0):
            raise ConfigurationError(
                f"max_tokens must be a positive whole number of tokens (or None for the "
                f"model's own limit), not {max_tokens!r}")
        if reasoning is not None and type(reasoning) is not bool:
            raise ConfigurationError(
                f"reasoning must be True, False or None (decided by the model's name), not "
                f"{reasoning!r}")
        if reasoning_summary is not None and reasoning_summary not in _SUMMARIES:
            raise ConfigurationError(
                f"reasoning_summary must be 'auto', 'concise', 'detailed' or None, not "
                f"{reasoning_summary!r}")
        super().__init__(model=model, base_url=base, endpoint="/responses", key=key,
                         retry=retry, timeout=timeout, http_client=http_client, limits=limits)
        self._max_tokens = max_tokens
        self._reasoning = reasoning_model(model) if reasoning is None else reasoning
        self._summary: ReasoningSummary | None = reasoning_summary
        auth = {"authorization": f"Bearer {key}"} if key else {}
        self._json_headers = {"content-type": "application/json", "accept": "application/json",
                              **auth}
        self._sse_headers = {**self._json_headers, "accept": "text/event-stream"}

    def __repr__(self) -> str:
        key = "set" if self._key else "none"
        return (f"OpenAIResponsesModel(model={self._model!r}, base_url={self._where!r}, "
                f"api_key={key})")

    def encode(self, request: Request, *, stream: bool) -> bytes:
        """The exact request body sent for ``request`` (deterministic)."""
        return encode_request(self._model, request, stream=stream, max_tokens=self._max_tokens,
                              reasoning=self._reasoning, summary=self._summary)

    # -- one HTTP exchange -------------------------------------------------------------------

    # Errors are raised outside the ``except`` blocks that detect them, so the exception
    # that revealed the problem (a JSONDecodeError holds the whole body) is not their
    # ``__context__``; ``HTTPModel`` detaches whatever the retry layer adds on the way out.

    async def _generate_once(self, body: bytes, deadline: Deadline) -> Response:
        async with self._post(body, self._json_headers, deadline) as response:
            raw = await self._read(response)
        failure: LLMError | None = None
        try:
            data = loads(raw)
            if not isinstance(data, dict):
                raise TypeError("not an object")
            return decode_response(data)
        except _Failed as e:
            failure = self._failed(e)
        except LLMError as e:
            failure = e
        except TooDeep:
            failure = self._malformed("the response body nests too deeply to parse")
        except _SHAPE_ERRORS:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            failure = self._malformed("the response body is not a Responses API response")
        raise failure

    async def _stream_once(self, body: bytes, deadline: Deadline, budget: ReplyBudget,
                           ) -> AsyncIterator[StreamEvent]:
        limits = self._limits
        async with self._post(body, self._sse_headers, deadline, stream=True) as response:
            decoder = EventDecoder(budget)
            async for sse in iter_sse(response, PROVIDER, max_line=limits.sse_line_bytes,
                                      max_event=limits.sse_event_bytes):
                events, failure = self._decode_event(decoder, sse)
                if failure is not None:
                    raise failure
                for event in events:
                    yield event
                if decoder.done:
                    return
        raise cut_short(PROVIDER, "the stream ended before response.completed")

    def _decode_event(
        self, decoder: EventDecoder, sse: SSEEvent
    ) -> tuple[list[StreamEvent], LLMError | None]:
        try:
            data = loads(sse.data)
        except TooDeep:
            return [], self._malformed("a stream event nests too deeply to parse")
        except ValueError:
            return [], self._malformed("a stream event's data is not JSON")
        if not isinstance(data, dict):
            return [], self._malformed("a stream event is not a JSON object")
        try:
            return decoder.feed(data, sse.event), None
        except _Failed as e:
            return [], self._failed(e)
        except LLMError as e:
            return [], e
        except _SHAPE_ERRORS:
            kind = data.get("type", sse.event)
            shown = repr(kind[:80]) if isinstance(kind, str) else "an untyped"
            return [], self._malformed(f"a {shown} event is not shaped as the Responses API "
                                       "sends it")

    # -- errors ------------------------------------------------------------------------------

    def _error_fields(self, raw: bytes) -> tuple[str, tuple[str | None, ...]]:
        try:
            data = loads(raw)
        except ValueError:  # an HTML page, a body cut at ERROR_BODY_LIMIT, not UTF-8
            return body_text(raw), ()
        return _error_fields(data.get("error", data) if isinstance(data, dict) else data)

    def _failed(self, failure: _Failed) -> LLMError:
        """A failed response or an error event, classified by its code and text."""
        code, message = failure.code, failure.message
        terminal = quota_exhausted(message, code, failure.kind) or (
            code is not None and _TRANSIENT_CODE.search(code) is None)
        what = f"{code}: {message}" if code else message
        return self._error(what or "the response failed (no message given)",
                           Fault.TERMINAL if terminal else Fault.TRANSIENT)


class _Failed(Exception):
    """A failed response (``status: "failed"``, ``response.failed``) or an ``error`` event,
    turned into an ``LLMError`` by the model (which redacts it)."""

    def __init__(self, error: Any) -> None:
        super().__init__("failed")
        error = error if isinstance(error, dict) else {}
        self.code = _optional_text(error.get("code"))
        self.kind = _optional_text(error.get("type"))
        self.message = _optional_text(error.get("message")) or ""


def _optional_text(value: Any) -> str | None:
    return value if type(value) is str else None


# -- encoding ---------------------------------------------------------------------------------


def encode_request(
    model: str,
    request: Request,
    *,
    stream: bool,
    max_tokens: int | None = None,
    reasoning: bool = False,
    summary: ReasoningSummary | None = None,
) -> bytes:
    """The request body as deterministic JSON bytes (module doc). ``reasoning``: the model
    reasons (it gets the ``include``); ``max_tokens`` is the default output ceiling."""
    splices: list[str] = []
    dropped: list[str] = []
    marker = f"\x00opaque-{uuid.uuid4().hex}-"
    body: dict[str, Any] = {"model": model}
    if request.tools:
        body["tools"] = [_encode_tool(t.name, t.description, t.input_schema)
                         for t in request.tools]
    if request.system:
        body["instructions"] = request.system
    items: list[Any] = []
    for message in request.messages:
        items.extend(_encode_message(message, splices, marker, dropped))
    body["input"] = items
    if dropped:
        log.debug("%d reasoning item(s) without encrypted content left out of the request: "
                  "under store: false the API cannot look them up (404); a model that reasons "
                  "keeps its reasoning with reasoning=True", len(dropped))
    if (choice := _encode_tool_choice(request)) is not None:
        body["tool_choice"] = choice
    if (limit := request.max_tokens or max_tokens) is not None:
        body["max_output_tokens"] = limit
    thinks = reasoning or request.reasoning_effort is not None
    if thinks and (request.reasoning_effort is not None or summary is not None):
        settings: dict[str, str] = {}
        if request.reasoning_effort is not None:
            settings["effort"] = request.reasoning_effort
        if summary is not None:
            settings["summary"] = summary
        body["reasoning"] = settings
    if request.sampling is not None:
        sampling = request.sampling.normalized()  # the API has no seed
        body["temperature"] = sampling.temperature
        if sampling.top_p > 0:
            body["top_p"] = sampling.top_p
    if request.cache.key:
        body["prompt_cache_key"] = request.cache.key
    if thinks:
        body["include"] = [ENCRYPTED_REASONING]
    body["store"] = False
    if stream:
        body["stream"] = True
    text = compact_json(body)
    for i, raw in enumerate(splices):
        text = text.replace(json.dumps(f"{marker}{i}", ensure_ascii=False), raw, 1)
    return encode_text(text)


def _encode_tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "function", "name": name}
    if description:
        tool["description"] = description
    tool["parameters"] = schema
    tool["strict"] = False
    return tool


def _encode_tool_choice(request: Request) -> str | dict[str, Any] | None:
    """The wire's ``tool_choice``, or None to send none (``auto``, or no tools)."""
    choice = request.tool_choice
    if choice.mode == "auto" or not request.tools:
        return None
    if choice.mode == "tool":
        return {"type": "function", "name": choice.name}
    return choice.mode  # "required" or "none": the same words on the wire


def _encode_message(message: Message, splices: list[str], marker: str, dropped: list[str],
                    ) -> list[Any]:
    """One port message as input items, in its order; a user message's tool results first
    (module doc). The opaque blocks left out (``_replayable``) go to ``dropped``."""
    role = message.role
    outputs: list[Any] = []
    items: list[Any] = []
    parts: list[dict[str, Any]] = []
    for block in message.blocks:
        match block:
            case TextBlock(text=text) if role is Role.ASSISTANT:
                if text:  # an empty text says nothing: not sent
                    items.append({"role": "assistant", "content": text})
            case TextBlock(text=text):
                parts.append({"type": "input_text", "text": text})
            case ImageBlock(media_type=media_type, data=data):
                _check_image(role, media_type)
                uri = f"data:{media_type.strip().lower()};base64,{base64.b64encode(data).decode()}"
                parts.append({"type": "input_image", "detail": "auto", "image_url": uri})
            case ToolUse(id=cid, name=name, input=args) if role is Role.ASSISTANT:
                items.append({"type": "function_call", "call_id": cid, "name": name,
                              "arguments": compact_json(args)})
            case ToolResult(tool_use_id=cid, content=content, is_error=failed) if (
                role is Role.USER
            ):
                outputs.append({"type": "function_call_output", "call_id": cid,
                                "output": f"Error: {content}" if failed else content})
            case OpaqueBlock(provider=provider, raw=raw) if provider == PROVIDER:
                if _replayable(raw):
                    items.append(f"{marker}{len(splices)}")
                    splices.append(raw)
                else:
                    dropped.append(raw)
            case OpaqueBlock():
                pass  # another provider's: means nothing here
            case _:
                raise _refused(f"a {block.kind} block cannot go in a {role.value} message")
    if parts:
        text_only = len(parts) == 1 and parts[0]["type"] == "input_text"
        outputs.append({"role": role.value, "content": parts[0]["text"] if text_only else parts})
    out = outputs + items
    return out or [{"role": role.value, "content": ""}]


def _check_image(role: Role, media_type: str) -> None:
    if role is not Role.USER:
        raise _refused(f"images can only be sent in user messages, not {role.value} ones")
    if not supported_image_media_type(media_type):
        raise _refused(f"image type {media_type!r} is not supported (use png, jpeg, gif or webp)")


def _replayable(raw: str) -> bool:
    """Whether an opaque block of this adapter goes back into ``input``: not a reasoning
    item without encrypted content, which the API would answer with a 404 (module doc). Raw
    text that is not one JSON object is refused: spliced in, it would break the request."""
    try:
        item = loads(raw)
    except ValueError:  # TooDeep too
        item = None
    if not isinstance(item, dict):
        raise _refused("an openai-responses opaque block must be one JSON object (an input item)")
    if item.get("type") != "reasoning":
        return True
    encrypted = item.get("encrypted_content")
    return type(encrypted) is str and encrypted != ""


def _refused(message: str) -> LLMError:
    """A request we will not send: retrying cannot fix it."""
    return LLMError(message, fault=Fault.TERMINAL, provider=PROVIDER)


# -- decoding: what both forms of a reply share -----------------------------------------------


def _final_status(response: dict[str, Any], default: str) -> str:
    """A finished response's status (``completed`` or ``incomplete``); raises for a failed,
    cancelled or unfinished one."""
    status = response.get("status")
    if status is None:
        return default
    if status == "failed":
        raise _Failed(response.get("error"))
    if status == "cancelled":
        raise cut_short(PROVIDER, "the response was cancelled before it finished")
    if status not in _FINAL:
        shown = repr(status[:40]) if isinstance(status, str) else "not a status"
        raise malformed(PROVIDER, f"the response is not finished (status {shown}): a "
                        "background response cannot be read here")
    return status


def _stop_reason(status: str, details: Any, has_calls: bool, refused: bool) -> StopReason:
    if status == "incomplete":
        reason = details.get("reason") if isinstance(details, dict) else None
        return StopReason.REFUSAL if reason == "content_filter" else StopReason.MAX_TOKENS
    if refused:
        return StopReason.REFUSAL
    return StopReason.TOOL_USE if has_calls else StopReason.END_TURN


def _count(value: Any) -> int:
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value < _MAX_COUNT:
        raise ValueError("a token count is not a count")
    return value


def _usage(usage: Any) -> Usage:
    """The port's ``Usage`` (module doc: cache writes are taken out of ``input_tokens``)."""
    if usage is None:
        return Usage()
    details = usage.get("input_tokens_details") or {}
    total = _count(usage.get("input_tokens"))
    read = _count(details.get("cached_tokens"))
    write = _count(details.get("cache_write_tokens"))
    if total - write >= read:  # else the server counted its writes apart already
        total -= write
    output = _count(usage.get("output_tokens"))
    thinking = _count((usage.get("output_tokens_details") or {}).get("reasoning_tokens"))
    return Usage(input_tokens=total, output_tokens=output, cache_read_tokens=read,
                 cache_write_tokens=write, reasoning_tokens=min(thinking, output))


def _model(response: dict[str, Any]) -> str:
    model = response.get("model")
    if model is None:
        return ""
    if type(model) is not str:
        raise TypeError("model is not text")
    return model


def _text(value: Any) -> str:
    if type(value) is not str:
        raise TypeError("not text")
    return value


def _name(value: Any) -> str:
    if type(value) is not str or not value:
        raise malformed(PROVIDER, "a function call has no name")
    return value


def _part(part: Any) -> tuple[str, bool] | None:
    """(text, is a refusal) of a message's content part; None for a kind the port does not
    model."""
    kind = part["type"]
    if kind == "output_text":
        return _text(part["text"]), False
    if kind == "refusal":
        return _text(part["refusal"]), True
    return None


def _arguments(name: str, text: str) -> dict[str, Any]:
    """A function call's arguments. Text that is no JSON object is the model's output, not
    a wire-format fault: transient, as a new sample usually parses (and as ``assemble``
    judges the same arguments in a stream)."""
    value: Any = None
    deep = False
    try:
        value = loads(text.strip() or "{}")
    except TooDeep:
        deep = True
    except ValueError:
        pass
    if deep:
        raise malformed(PROVIDER, f"function call {name[:200]!r} arguments nest too deeply "
                        "to parse")
    if not isinstance(value, dict):
        raise cut_short(PROVIDER, f"malformed tool call: {name[:200]!r} arguments are not a "
                        "JSON object")
    return value


def _too_many_items() -> LLMError:
    return malformed(PROVIDER, f"the reply has more than {MAX_OUTPUT_ITEMS:,} output items "
                     "(the output item cap, MAX_OUTPUT_ITEMS): no model's reply holds that many")


def _opaque(item: dict[str, Any]) -> OpaqueBlock:
    """An output item the port does not model, kept as the JSON it will be sent back as. A
    number JSON cannot carry (NaN, or the Infinity ``1e999`` decodes to) would make every
    later request invalid JSON: the reply is malformed instead."""
    try:
        raw = json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raw = None
    if raw is None:
        raise malformed(PROVIDER, "an output item holds a number JSON cannot carry (NaN or "
                        "Infinity), so it could never be sent back")
    return OpaqueBlock(provider=PROVIDER, raw=raw)


# -- decoding a body ----------------------------------------------------------------------------


def decode_response(data: dict[str, Any]) -> Response:
    """A non-streaming ``response`` body as a ``Response`` (raises ``_Failed`` for a failed
    one)."""
    status = _final_status(data, "completed")
    output = data["output"]
    if type(output) is not list:
        raise TypeError("output is not a list")
    if len(output) > MAX_OUTPUT_ITEMS:
        raise _too_many_items()
    blocks: list[TextBlock | ToolUse | OpaqueBlock] = []
    ids = CallIds()
    refused = has_calls = False
    for item in output:
        kind = item["type"]
        if kind == "message":
            for part in item["content"]:
                if (got := _part(part)) is None:
                    continue
                text, refusal = got
                refused = refused or refusal
                if text:
                    blocks.append(TextBlock(text=text))
        elif kind == "function_call":
            name = _name(item.get("name"))
            arguments = _arguments(name, _text(item.get("arguments") or ""))
            blocks.append(ToolUse(id=ids.take(item.get("call_id")), name=name, input=arguments))
            has_calls = True
        else:
            blocks.append(_opaque(item))
    return Response(
        message=Message(role=Role.ASSISTANT, blocks=tuple(blocks)),
        stop_reason=_stop_reason(status, data.get("incomplete_details"), has_calls, refused),
        usage=_usage(data.get("usage")),
        model=_model(data),
    )


# -- decoding a stream --------------------------------------------------------------------------


@dataclass
class _Item:
    """What the stream has said so far of one output item."""

    kind: str
    parts: set[int] = field(default_factory=set)  # content indexes that got text in a delta
    call_id: Any = None
    name: str = ""
    pending: list[str] = field(default_factory=list)  # arguments before the name came
    arguments: bool = False  # an arguments delta came
    spent: int = 0  # characters held back and charged to the budget
    started: bool = False
    done: bool = False


def _index(value: Any, bound: int) -> int:
    if type(value) is not int or not 0 <= value < bound:
        raise ValueError("an index out of range")
    return value


class EventDecoder:
    """Turns Responses API stream events into port events, one event at a time (module doc).

    What an item holds back before it becomes an event (arguments before its call's name,
    reasoning deltas) is spent from ``budget`` as it arrives; arguments are given back when
    they go out as events, which the attempt counts (none: uncounted, for a caller that
    decodes a stream it already holds).
    """

    def __init__(self, budget: ReplyBudget | None = None) -> None:
        self._budget = budget
        self.done = False
        self._model = ""
        self._items: dict[int, _Item] = {}
        self._ids = CallIds()
        self._refused = False
        self._has_calls = False

    def feed(self, data: dict[str, Any], event: str = "") -> list[StreamEvent]:
        """The port events of one stream event (its JSON data; ``event``: the SSE event
        name, for data without a ``type``)."""
        kind = data.get("type", event)
        if kind == "error":
            nested = data.get("error")
            raise _Failed(nested if isinstance(nested, dict) else data)
        handle = _HANDLERS.get(kind) if isinstance(kind, str) else None
        return handle(self, data) if handle is not None else []

    # -- events ---------------------------------------------------------------------------

    def _started(self, data: dict[str, Any]) -> list[StreamEvent]:
        self._model = _model(data["response"]) or self._model
        return []

    def _item_added(self, data: dict[str, Any]) -> list[StreamEvent]:
        oi = _index(data["output_index"], _MAX_OUTPUT_INDEX)
        item = data["item"]
        state = self._item(oi, _text(item["type"]))
        if state.kind != "function_call":
            return []
        state.call_id = item.get("call_id")
        state.name = item.get("name") or ""
        return self._arguments(oi, state, _text(item.get("arguments") or ""))

    def _part_added(self, data: dict[str, Any]) -> list[StreamEvent]:
        if data["part"]["type"] == "refusal":
            self._refused = True
        return []

    def _text_delta(self, data: dict[str, Any]) -> list[StreamEvent]:
        oi = _index(data["output_index"], _MAX_OUTPUT_INDEX)
        ci = _index(data.get("content_index", 0), PARTS_PER_ITEM)
        delta = _text(data["delta"])
        state = self._item(oi, "message")
        if state.kind != "message":
            raise malformed(PROVIDER, f"text for output item {oi}, which is a {state.kind[:40]!r}")
        if data["type"] == "response.refusal.delta":
            self._refused = True
        if not delta:  # says nothing: the part's text may still come whole with its item
            return []
        state.parts.add(ci)  # one entry per delta with text, which the reply cap counts
        return [TextDelta(index=oi * PARTS_PER_ITEM + ci, text=delta)]

    def _arguments_delta(self, data: dict[str, Any]) -> list[StreamEvent]:
        oi = _index(data["output_index"], _MAX_OUTPUT_INDEX)
        state = self._item(oi, "function_call")
        if state.kind != "function_call":
            raise malformed(PROVIDER, f"arguments for output item {oi}, which is a "
                            f"{state.kind[:40]!r}")
        state.arguments = True
        return self._arguments(oi, state, _text(data["delta"]))

    def _reasoning_delta(self, data: dict[str, Any]) -> list[StreamEvent]:
        # Held until the item is done (it goes out whole): counted now.
        oi = _index(data["output_index"], _MAX_OUTPUT_INDEX)
        delta = _text(data["delta"])
        self._spend(self._item(oi, "reasoning"), len(delta))
        return []

    def _item_done(self, data: dict[str, Any]) -> list[StreamEvent]:
        oi = _index(data["output_index"], _MAX_OUTPUT_INDEX)
        return self._finish(oi, data["item"])

    def _completed(self, data: dict[str, Any]) -> list[StreamEvent]:
        response = data["response"]
        default = "incomplete" if data["type"] == "response.incomplete" else "completed"
        status = _final_status(response, default)
        output = response.get("output") or []
        if type(output) is not list:
            raise TypeError("output is not a list")
        out: list[StreamEvent] = []
        # An item the stream left open, or never announced, is finished from the output.
        for oi, item in enumerate(output):
            state = self._items.get(oi)
            if state is None or not state.done:
                out += self._finish(oi, item)
        for oi, state in sorted(self._items.items()):
            if state.done or state.kind != "function_call":
                continue
            if not state.started:
                raise malformed(PROVIDER, f"function call {oi} never got a name")
            state.done = True
            out.append(ToolCallEnd(index=oi * PARTS_PER_ITEM))
        out.append(UsageUpdate(usage=_usage(response.get("usage"))))
        stop = _stop_reason(status, response.get("incomplete_details"), self._has_calls,
                            self._refused)
        out.append(Stop(stop_reason=stop, model=_model(response) or self._model))
        self.done = True
        return out

    def _failed(self, data: dict[str, Any]) -> list[StreamEvent]:
        raise _Failed(data["response"].get("error"))

    # -- items ----------------------------------------------------------------------------

    def _item(self, oi: int, kind: str) -> _Item:
        """Output item ``oi``'s state, made (as a ``kind``) on first mention: a server may
        skip an item's ``added`` event. At most ``MAX_OUTPUT_ITEMS`` are made: an event that
        only names an item spends nothing from the reply cap."""
        state = self._items.get(oi)
        if state is None:
            if len(self._items) >= MAX_OUTPUT_ITEMS:
                raise _too_many_items()
            state = self._items[oi] = _Item(kind)
        elif state.done:
            raise malformed(PROVIDER, f"an event for output item {oi} after it was done")
        return state

    def _spend(self, state: _Item, chars: int) -> None:
        state.spent += chars
        if self._budget is not None:
            self._budget.spend(chars)

    def _arguments(self, oi: int, state: _Item, text: str) -> list[StreamEvent]:
        index = oi * PARTS_PER_ITEM
        if state.started:
            return [ToolCallDelta(index=index, arguments=text)] if text else []
        if text:
            state.pending.append(text)
            self._spend(state, len(text))
        if not state.name:
            return []
        return self._start(index, state)

    def _start(self, index: int, state: _Item) -> list[StreamEvent]:
        state.started = True
        self._has_calls = True
        if self._budget is not None:
            self._budget.refund(state.spent)  # the attempt counts the events they become
        state.spent = 0
        name = _name(state.name)
        out: list[StreamEvent] = [
            ToolCallStart(index=index, id=self._ids.take(state.call_id), name=name)]
        if text := "".join(state.pending):
            out.append(ToolCallDelta(index=index, arguments=text))
        state.pending.clear()
        return out

    def _finish(self, oi: int, item: Any) -> list[StreamEvent]:
        """The events an item's final form adds to what its deltas said: what no delta
        carried, a call's start (if its name came only now) and end, an opaque item whole."""
        kind = _text(item["type"])
        state = self._item(oi, kind)
        if state.kind != kind:
            raise malformed(PROVIDER, f"output item {oi} changed from a {state.kind[:40]!r} "
                            f"to a {kind[:40]!r}")
        state.done = True
        index = oi * PARTS_PER_ITEM
        out: list[StreamEvent] = []
        if kind == "message":
            for ci, part in enumerate(item["content"]):
                if (got := _part(part)) is None:
                    continue
                text, refusal = got
                self._refused = self._refused or refusal
                if text and ci not in state.parts:
                    out.append(TextDelta(index=index + _index(ci, PARTS_PER_ITEM), text=text))
        elif kind == "function_call":
            arguments = _text(item.get("arguments") or "")
            if not state.started:
                state.call_id = state.call_id or item.get("call_id")
                state.name = state.name or _name(item.get("name"))
                if not state.arguments:
                    state.pending = [arguments]
                out += self._start(index, state)
            elif not state.arguments and arguments:
                out.append(ToolCallDelta(index=index, arguments=arguments))
            out.append(ToolCallEnd(index=index))
        else:
            block = _opaque(item)
            if self._budget is not None:
                self._budget.spend(max(len(block.raw) - state.spent, 0))
            out.append(OpaqueDone(index=index, block=block))
        return out


_HANDLERS: dict[str, Callable[[EventDecoder, dict[str, Any]], list[StreamEvent]]] = {
    "response.created": EventDecoder._started,
    "response.in_progress": EventDecoder._started,
    "response.queued": EventDecoder._started,
    "response.output_item.added": EventDecoder._item_added,
    "response.content_part.added": EventDecoder._part_added,
    "response.output_text.delta": EventDecoder._text_delta,
    "response.refusal.delta": EventDecoder._text_delta,
    "response.function_call_arguments.delta": EventDecoder._arguments_delta,
    "response.reasoning_summary_text.delta": EventDecoder._reasoning_delta,
    "response.reasoning_text.delta": EventDecoder._reasoning_delta,
    "response.output_item.done": EventDecoder._item_done,
    "response.completed": EventDecoder._completed,
    "response.incomplete": EventDecoder._completed,
    "response.failed": EventDecoder._failed,
}
"""The events that say something the port keeps; the ``*.done`` events of parts and
arguments repeat what the deltas said, and the rest (hosted tools, audio...) is not asked for."""
