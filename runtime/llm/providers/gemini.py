"""Google Gemini's native API (``generateContent``, ``streamGenerateContent``) over httpx
(no vendor SDK at run time).

Wire mapping, in brief:

- ``POST {base}/v1beta/models/{model}:generateContent``, and for a stream
  ``:streamGenerateContent?alt=sse`` (server-sent events, one ``GenerateContentResponse`` per
  event, no end sentinel: the chunk carrying ``finishReason`` is the last). The key goes in
  the ``x-goog-api-key`` header, never in the URL, so no log of a URL can hold it. A base URL
  whose path already ends in an API version (``/v1``, ``/v1beta``) is used as is. The model id
  goes into the URL path, so it is held to letters, digits, ``.``, ``_`` and ``-``.
- The body is built as text in a fixed order, ``systemInstruction``, ``tools``, ``contents``,
  then the per-call ``toolConfig`` and ``generationConfig``, so one conversation's turns share
  a byte-identical prefix (Gemini caches prompt prefixes by itself; explicit caching needs a
  ``cachedContent`` resource, which the port does not manage, so a ``CacheHint`` sends
  nothing). Generate and stream send the same body.
- Roles: ``user`` and ``model``; the system prompt (and any system-role message) is
  ``systemInstruction``. Tool results are ``functionResponse`` parts of the user turn, named
  after the call they answer (Gemini pairs them by name and id); the result goes in
  ``response`` as ``{"output": value}``, or ``{"error": value}`` for a failed call, since
  ``response`` must be an object: the value is the JSON object or array the result's text
  holds, else the text itself. Images are ``inlineData`` parts (user turns only).
- **Tool schemas go out as ``parametersJsonSchema``, unchanged (Decision).** Gemini has two
  fields: ``parameters``, an OpenAPI-3 ``Schema`` (upper-case types, ``nullable``, no
  ``const``, no ``$ref``, no type arrays), which would need a lossy translation with refusals,
  and ``parametersJsonSchema``, which takes JSON Schema as it is written. Gemini reads the
  keywords of its documented subset (``$id``, ``$defs``, ``$ref``, ``$anchor``, ``type``,
  ``format``, ``title``, ``description``, ``enum``, ``items``, ``prefixItems``,
  ``minItems``, ``maxItems``, ``minimum``, ``maximum``, ``anyOf``, ``oneOf``, ``properties``,
  ``additionalProperties``, ``required``, ``propertyOrdering``) and ignores the rest; the step
  engine checks every call's arguments against the whole schema anyway, so a keyword Gemini
  ignores (``pattern``, ``const``...) is still enforced, by an error result the model can
  correct. Refused before sending, as a ``ConfigurationError`` naming the tool: a schema whose
  ``type`` is not ``"object"`` (the field must describe an object of named parameters), and
  a tool name Gemini does not take (a letter or ``_`` first, then letters, digits, ``_``,
  ``.``, ``:``, ``-``; at most 128).
- Function calls come back as ``functionCall`` parts, whole (never in fragments). Gemini
  often sends no ``id``: one is made from the reply (``call_`` and 32 hex digits of a hash of
  its ``responseId``, the call's position, name and arguments), so the same reply decodes to
  the same ids streamed or not, and sent back on both the call and its ``functionResponse``.
  An id a provider would refuse back (``replayable_call_id``) is replaced the same way, and
  one the reply already used by a fresh one (``CallIds``). Arguments that are not an object
  (the API sends a JSON object, parsed by the server) are a malformed reply.
- **Thought signatures and thought parts round-trip as ``OpaqueBlock("gemini", raw)``.** A
  ``thoughtSignature`` on a text or ``functionCall`` part becomes an opaque block
  ``{"thoughtSignature": ...}`` right after the block of that part, and goes back on the part
  encoded just before it (a multi-step tool turn needs it: Gemini 3 refuses a function call
  of the current turn without its signature). A thought part (``"thought": true``), and any
  part kind the port does not model (``executableCode``...), is an opaque block holding the
  whole part, spliced back verbatim. Adjacent plain text parts are one text block, and
  adjacent thought parts one opaque block, so a stream (which cuts parts into pieces)
  assembles to exactly what ``generate`` returns: both run the same decoder
  (``ChunkDecoder``), ``generate`` over its one response.
- **A model turn Gemini did not sign gets Google's placeholder signature (Decision).** A
  history from another provider, a ``ScriptedModel``, a store written before signatures were
  kept, or a 2.x model has function calls with no signature, and Gemini 3 answers 400
  ("Function call is missing a thought_signature") to every retry. Google documents a dummy
  value for exactly this case, ``skip_thought_signature_validator``; the field is bytes, so
  on the wire it is their base64. For the models that check (every ``thinking_style`` but
  ``"budget"``), it goes on the first ``functionCall`` part of each model turn whose first
  call has no signature of its own (Gemini checks that part of each step); a real signature
  is never replaced, and nothing is added for the 1.x / 2.x models.
- ``tool_choice`` is ``toolConfig.functionCallingConfig``: ``ANY`` for ``required``, ``ANY``
  with ``allowedFunctionNames`` for a named tool, ``NONE`` for ``none``; ``auto`` (the
  default) and any choice without tools are not sent.
- ``generationConfig``: ``maxOutputTokens`` (the request's ``max_tokens``, else the
  constructor's, else the model's own limit), ``temperature`` / ``topP`` / ``seed`` from
  ``Sampling`` (normalised), and ``reasoning_effort`` as ``thinkingConfig``: a
  ``thinkingLevel`` (``LOW``, ``MEDIUM``, ``HIGH``) for Gemini 3 and later, except that
  Gemini 3 Pro (``gemini-3-pro*``, style ``"low-high"``) takes only ``LOW`` and ``HIGH``
  (it answers 400 "Thinking level MEDIUM is not supported for this model"), so ``medium``
  is sent as ``HIGH``, its default, for it (3.1 Pro and the Flash models take ``MEDIUM``); a
  ``thinkingBudget`` of 1k / 4k / 16k tokens for the 2.x and 1.x models
  (``thinking_style``), that budget then added to ``maxOutputTokens``, which thinking
  tokens count against.
- ``Usage``: ``input_tokens`` = ``promptTokenCount`` (which includes the cached part) +
  ``toolUsePromptTokenCount``; ``cache_read_tokens`` = ``cachedContentTokenCount``;
  ``output_tokens`` = ``candidatesTokenCount`` + ``thoughtsTokenCount`` (thinking is billed
  as output); no cache writes are reported. A count that is not a whole number from 0 to
  2**53, or more cached tokens than input tokens, is a malformed reply.
- Stop reasons: ``STOP`` is ``end_turn`` (``tool_use`` with calls); ``MAX_TOKENS``, and
  ``CONTINUATION`` (the per-request token limit cut a reply that was not done; the port
  does not continue one), are ``max_tokens``. Output withheld by a filter is ``refusal``,
  with whatever content came before it: ``SAFETY``, ``RECITATION``, ``BLOCKLIST``,
  ``PROHIBITED_CONTENT``, ``SPII``, ``LANGUAGE``, ``MODEL_ARMOR``, ``ESCALATION`` (an
  escalation rule), and the image ones ``IMAGE_SAFETY``, ``IMAGE_PROHIBITED_CONTENT``,
  ``IMAGE_RECITATION`` and ``IMAGE_OTHER`` (an image stopped for an unnamed reason, which is
  how an image model reports a block of no listed kind). ``NO_IMAGE`` (an image was
  expected but the model answered without one) is ``end_turn``: the port never asks for
  images, so the text that came is the whole, well-formed answer, nothing was withheld. A
  reply the model botched (``MALFORMED_FUNCTION_CALL``, ``UNEXPECTED_TOOL_CALL``,
  ``TOO_MANY_TOOL_CALLS``, ``MALFORMED_RESPONSE``) is a transient fault, as a new sample
  usually differs; ``MISSING_THOUGHT_SIGNATURE`` is terminal (the history lacks one, so
  asking again fails again), and so is ``PUP_LIMITED_DISABLED`` (the account is limited for
  policy violations: every call will stop so). A blocked prompt
  (``promptFeedback.blockReason``, no candidate) is terminal. Any other reason (``OTHER``,
  ``FINISH_REASON_UNSPECIFIED``, ones added later) is ``end_turn``.
- A stream ends with the chunk that carries ``finishReason``. Nothing needs to follow it;
  what may (a relay's or a later version's tail) is a chunk with ``usageMetadata`` alone, or
  one repeating that reason with no content (at most empty text parts): its usage is taken.
  Any content or signature after it, or another finish reason, is a malformed reply, never
  appended to the finished one.
- Faults: HTTP statuses are classified as for every adapter (``retry_class``), except how a
  429 (``RESOURCE_EXHAUSTED``) tells a rate limit from an empty quota: Gemini says "You
  exceeded your current quota" for both, so its ``QuotaFailure`` details decide: a
  per-minute limit is transient, a per-day (or per-month) one, or a limit of 0 (a model the
  plan does not include), terminal; without details, a ``RetryInfo`` means transient, and
  only then is the message read (``quota_exhausted``). ``RetryInfo.retryDelay`` is the wait
  hint when no ``Retry-After`` header came. An ``{"error": ...}`` event inside a stream is
  classified the same way by its ``code``.
- Hostile replies: NaN and Infinity (which Python's JSON reader accepts) are not JSON; a
  thought signature must be base64; every shape is checked, and what breaks it is a
  malformed reply (terminal). Server text quoted in an error (a block or finish message)
  has the key removed before it is shortened.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, get_args

import httpx

from ..errors import ConfigurationError, Fault, LLMError, quota_exhausted, retry_class
from ..events import (
    Assembler,
    OpaqueDone,
    Stop,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
)
from ..history import CallIds, replayable_call_id
from ..limits import DEFAULT_ATTEMPT_TIMEOUT, ReplyLimits
from ..retry_policy import RetryPolicy, parse_retry_after
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
    loads,
    malformed,
)
from ._sse import iter_sse

__all__ = ["DEFAULT_BASE_URL", "PROVIDER", "THINKING_BUDGETS", "ChunkDecoder", "GeminiModel",
           "decode_response", "encode_request", "thinking_style"]

PROVIDER = "gemini"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
API_VERSION = "v1beta"
THINKING_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}
"""``thinkingBudget`` per ``reasoning_effort`` for the models that take a budget, and the
headroom added to ``maxOutputTokens`` then."""

ThinkingStyle = Literal["level", "low-high", "budget"]
_BUDGET_MODELS = re.compile(r"^gemini-[12]\.")
_LOW_HIGH_MODELS = re.compile(r"^gemini-3-pro(-|$)")
_SKIP_SIGNATURE = base64.b64encode(b"skip_thought_signature_validator").decode()
"""Google's documented dummy thought signature, for a function call Gemini did not sign
(module doc): the bytes it names, as base64 like every signature on the wire."""
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
_VERSIONED = re.compile(r"/v\d+(alpha|beta)?\d*$")

# Finish reasons (module doc): output a filter withheld, a reply cut at a token limit.
_REFUSED = frozenset({
    "SAFETY", "RECITATION", "LANGUAGE", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
    "MODEL_ARMOR", "ESCALATION", "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT",
    "IMAGE_RECITATION", "IMAGE_OTHER",
})
_CUT = frozenset({"MAX_TOKENS", "CONTINUATION"})
# Finish reasons that mean the model botched this reply: another sample usually does not.
_RESAMPLE = frozenset({
    "MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS",
    "MALFORMED_RESPONSE",
})
_MAX_COUNT = 2**53
"""The largest token count taken from a reply: JSON's safe integers, beyond any real count."""
_DAILY = re.compile(r"per_?(day|month)", re.I)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)s")
# What a well-formed JSON value of the wrong shape raises while we pick it apart.
_SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)

ErrorFactory = Callable[[str, Fault], LLMError]


class GeminiModel(HTTPModel):
    """A ``Model`` over Gemini's ``generateContent`` API (the Gemini Developer API).

    ``api_key`` is required and ``base_url`` defaults to Google's: the adapter never reads
    the environment (``resolve_model`` reads ``GEMINI_API_KEY`` from it and from ``.env``).
    A base URL that is not https, or http to loopback, is refused, and so is a model id that
    could change the URL it goes into.

    Safe for concurrent use. Without ``http_client`` it owns one pooled client, created on
    first use and released by ``aclose()`` (or ``async with``); it belongs to the event loop
    that created it, and a call from another loop gets a fresh one (``providers/_http.py``).
    A given ``httpx.AsyncClient`` is used as is and left open. ``timeout`` is each attempt's
    wall-clock deadline in seconds (``providers/_http.py``; connecting: at most 10); the
    retry policy's ``max_elapsed`` is the call's; ``limits`` caps what a reply may hold.
    ``thinking`` overrides ``thinking_style(model)`` for a model id the rule cannot place.
    """

    PROVIDER = PROVIDER
    LABEL = "Gemini"

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
        thinking: ThinkingStyle | None = None,
    ) -> None:
        key = api_key or ""
        if not key:
            raise ConfigurationError(
                "no Gemini API key: pass api_key= (resolve_model reads GEMINI_API_KEY from "
                "the environment or .env; the adapter never does)"
            )
        model_id = _model_id(model)
        if thinking not in (None, *get_args(ThinkingStyle)):
            raise ConfigurationError(
                f"unknown Gemini thinking style {thinking!r}: use 'level' (Gemini 3 and "
                "later), 'low-high' (Gemini 3 Pro) or 'budget' (1.x and 2.x)")
        base = (base_url or DEFAULT_BASE_URL).rstrip("/")
        method = f"{'' if _VERSIONED.search(base) else '/' + API_VERSION}/models/{model_id}"
        super().__init__(model=model_id, base_url=base, endpoint=f"{method}:generateContent",
                         key=key, retry=retry, timeout=timeout, http_client=http_client,
                         limits=limits)
        self._max_tokens = max_tokens
        self._thinking: ThinkingStyle = thinking or thinking_style(model_id)
        self._json_headers = {"x-goog-api-key": key, "content-type": "application/json",
                              "accept": "application/json"}
        self._sse_headers = {**self._json_headers, "accept": "text/event-stream"}
        # ``HTTPModel`` posts to one URL; a stream is another method at another URL, so it
        # posts through a shallow copy aimed there: the same client slot, key, limits and
        # error reading, only the URL differs.
        self._streaming = copy.copy(self)
        self._streaming._url = f"{base}{method}:streamGenerateContent?alt=sse"

    def __repr__(self) -> str:
        return f"GeminiModel(model={self._model!r}, base_url={self._where!r})"

    def encode(self, request: Request, *, stream: bool) -> bytes:
        """The exact request body sent for ``request`` (deterministic; the same for a
        stream, which differs by its URL)."""
        return encode_request(request, thinking=self._thinking, max_tokens=self._max_tokens)

    # -- one HTTP exchange -------------------------------------------------------------------

    # Errors are raised outside the ``except`` blocks that detect them, so the exception
    # that revealed the problem (holding the raw body) is not their ``__context__``;
    # ``HTTPModel`` detaches whatever the retry layer adds on the way out.

    async def _generate_once(self, body: bytes, deadline: Deadline) -> Response:
        async with self._post(body, self._json_headers, deadline) as response:
            raw = await self._read(response)
        failure: LLMError | None = None
        try:
            data = loads(raw)
            if isinstance(data, dict) and "error" in data and "candidates" not in data:
                failure = self._stream_error(data["error"])
            else:
                return decode_response(data, self._error)
        except LLMError as e:
            failure = e
        except TooDeep:
            failure = self._malformed("the reply nests too deeply to parse")
        except _SHAPE_ERRORS:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            failure = self._malformed("the response body is not a GenerateContentResponse")
        raise failure

    async def _stream_once(self, body: bytes, deadline: Deadline, budget: ReplyBudget,
                           ) -> AsyncIterator[StreamEvent]:
        limits = self._limits
        decoder = ChunkDecoder(budget, self._error)
        async with self._streaming._post(body, self._sse_headers, deadline,
                                         stream=True) as response:
            async for sse in iter_sse(response, PROVIDER, max_line=limits.sse_line_bytes,
                                      max_event=limits.sse_event_bytes):
                events, failure = self._decode_chunk(decoder, sse.data)
                if failure is not None:
                    raise failure
                for event in events:
                    yield event
        for event in decoder.done(stream=True):  # raises if no finishReason came
            yield event

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
            return [], e
        except _SHAPE_ERRORS:
            return [], self._malformed("a stream event is not a GenerateContentResponse")

    # -- errors ------------------------------------------------------------------------------

    def _error_fields(self, raw: bytes) -> tuple[str, tuple[str | None, ...]]:
        error = _rpc_status(raw)
        if error is None:
            try:
                loads(raw)
            except ValueError:  # an HTML page, a body cut at ERROR_BODY_LIMIT, not UTF-8
                return body_text(raw), ()
            return "", ()
        status = error.get("status")
        return str(error.get("message") or ""), (status if isinstance(status, str) else None,)

    def _status_error(self, response: httpx.Response, raw: bytes) -> LLMError:
        """The base class's classified error, with Gemini's own reading of a 429 and of its
        ``RetryInfo`` (module doc)."""
        error = super()._status_error(response, raw)
        status = _rpc_status(raw)
        if error.retry_after is None:
            error.retry_after = _retry_delay(status)
        if error.status == 429:
            error.fault = Fault.TERMINAL if _quota_gone(status, error.message) \
                else Fault.TRANSIENT
        return error

    def _stream_error(self, error: Any) -> LLMError:
        """An ``{"error": ...}`` object in a 200 reply (a stream's event): classified by its
        ``code`` as the HTTP status it stands for."""
        if not isinstance(error, dict):
            return self._malformed("an error event is not an object")
        code = error.get("code")
        code = code if type(code) is int and 100 <= code <= 599 else 500
        message = str(error.get("message") or "") or "error event in the stream"
        fault = retry_class(code, code == 429 and _quota_gone(error, message))
        failure = self._error(message, fault)
        failure.retry_after = _retry_delay(error)
        return failure


def thinking_style(model: str) -> ThinkingStyle:
    """How ``model`` takes ``reasoning_effort``: ``"budget"`` (``thinkingBudget``) for the
    1.x and 2.x models, ``"low-high"`` (``thinkingLevel`` ``LOW`` or ``HIGH`` only) for
    Gemini 3 Pro, ``"level"`` (``LOW``, ``MEDIUM``, ``HIGH``) for every other Gemini 3 and
    every later one. The two level styles also mean the model checks thought signatures."""
    name = model.strip().lower()
    if _BUDGET_MODELS.match(name):
        return "budget"
    return "low-high" if _LOW_HIGH_MODELS.match(name) else "level"


def _model_id(model: str) -> str:
    """The model id as it goes into the URL path (``models/`` prefix dropped); refuses one
    that could change the URL (a ``/``, ``?``, ``#``, ``..``, a space)."""
    name = model.strip().removeprefix("models/") if isinstance(model, str) else ""
    if not _MODEL_ID.fullmatch(name) or ".." in name:
        shown = repr(model) if len(str(model)) <= 64 else f"{str(model)[:64]!r}..."
        raise ConfigurationError(
            f"unusable Gemini model name {shown}: a model id is letters, digits, '.', '_' and "
            "'-' (at most 128; it goes into the URL path), e.g. 'gemini-2.5-flash'"
        )
    return name


# -- encoding ---------------------------------------------------------------------------------


def encode_request(
    request: Request, *, thinking: ThinkingStyle = "level", max_tokens: int | None = None
) -> bytes:
    """The ``generateContent`` body for ``request``, as deterministic bytes (module doc for
    the order). ``max_tokens`` is the default output ceiling."""
    fields: list[str] = []
    system = [request.system] if request.system else []
    system += [t for m in request.messages if m.role is Role.SYSTEM if (t := m.text_content())]
    if system:
        instruction = {"parts": [{"text": s} for s in system]}
        fields.append(f'"systemInstruction":{compact_json(instruction)}')
    if request.tools:
        declarations = [_declaration(t) for t in request.tools]
        fields.append(f'"tools":{compact_json([{"functionDeclarations": declarations}])}')
    names = {b.id: b.name for m in request.messages for b in m.blocks if type(b) is ToolUse}
    signs = thinking != "budget"
    contents = [c for m in request.messages if m.role is not Role.SYSTEM
                if (c := _encode_content(m, names, signs)) is not None]
    fields.append(f'"contents":[{",".join(contents)}]')
    if (choice := _tool_config(request)) is not None:
        fields.append(f'"toolConfig":{compact_json(choice)}')
    if config := _generation_config(request, thinking, max_tokens):
        fields.append(f'"generationConfig":{compact_json(config)}')
    return encode_text("{" + ",".join(fields) + "}")


def _declaration(tool: Tool) -> dict[str, Any]:
    """A ``FunctionDeclaration`` with the schema as ``parametersJsonSchema`` (module doc)."""
    if not _TOOL_NAME.fullmatch(tool.name):
        raise ConfigurationError(
            f"tool {tool.name[:64]!r}: Gemini takes a function name of letters, digits, '_', "
            "'.', ':' and '-', starting with a letter or '_', at most 128 characters: "
            "rename the tool"
        )
    kind = tool.input_schema.get("type", "object")
    if kind != "object":
        raise ConfigurationError(
            f"tool {tool.name!r}: Gemini takes a tool's parameters as one JSON object "
            f"(parametersJsonSchema must describe an object), but its input_schema has "
            f'"type": {compact_json(kind)[:64]}: make the value a property of an object schema'
        )
    declaration: dict[str, Any] = {"name": tool.name}
    if tool.description:
        declaration["description"] = tool.description
    declaration["parametersJsonSchema"] = tool.input_schema
    return declaration


def _tool_config(request: Request) -> dict[str, Any] | None:
    """The wire's ``toolConfig``, or None to send none (``auto``, or no tools)."""
    choice = request.tool_choice
    if choice.mode == "auto" or not request.tools:
        return None
    if choice.mode == "tool":
        calling = {"mode": "ANY", "allowedFunctionNames": [choice.name]}
    else:
        calling = {"mode": "ANY" if choice.mode == "required" else "NONE"}
    return {"functionCallingConfig": calling}


def _generation_config(
    request: Request, thinking: ThinkingStyle, max_tokens: int | None
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    limit = request.max_tokens or max_tokens
    effort = request.reasoning_effort
    if limit is not None:
        budget = THINKING_BUDGETS[effort] if effort and thinking == "budget" else 0
        config["maxOutputTokens"] = limit + budget
    if request.sampling is not None:
        sampling = request.sampling.normalized()
        config["temperature"] = sampling.temperature
        if sampling.top_p > 0:
            config["topP"] = sampling.top_p
        if sampling.seed is not None:
            config["seed"] = sampling.seed
    if effort is not None:
        config["thinkingConfig"] = ({"thinkingBudget": THINKING_BUDGETS[effort]}
                                    if thinking == "budget" else
                                    {"thinkingLevel": _thinking_level(effort, thinking)})
    return config


def _thinking_level(effort: str, thinking: ThinkingStyle) -> str:
    """``thinkingLevel`` for ``effort``: ``medium`` is ``HIGH`` (the model's default) where
    the model takes only ``LOW`` and ``HIGH``."""
    if thinking == "low-high" and effort == "medium":
        return "HIGH"
    return effort.upper()


def _encode_content(message: Message, names: dict[str, str], signs: bool) -> str | None:
    """One port message as a ``Content``; None when nothing of it goes to Gemini (only
    another provider's opaque blocks, or empty text). ``signs``: the model checks thought
    signatures, so an unsigned model turn gets the placeholder (module doc)."""
    role = "model" if message.role is Role.ASSISTANT else "user"
    parts: list[dict[str, Any] | str] = []  # a dict is ours to sign; a str is spliced verbatim
    for block in message.blocks:
        match block:
            case TextBlock(text=text):
                if text:  # Gemini refuses an empty part; an empty text carries nothing
                    parts.append({"text": text})
            case ImageBlock(media_type=media_type, data=data) if message.role is Role.USER:
                if not supported_image_media_type(media_type):
                    raise _refused(f"image type {media_type!r} is not supported (use png, "
                                   "jpeg, gif or webp)")
                parts.append({"inlineData": {"mimeType": media_type.strip().lower(),
                                             "data": base64.b64encode(data).decode()}})
            case ToolUse(id=cid, name=name, input=args) if message.role is Role.ASSISTANT:
                parts.append({"functionCall": {"id": cid, "name": name, "args": args}})
            case ToolResult(tool_use_id=cid, content=content, is_error=failed) if (
                    message.role is Role.USER):
                if cid not in names:
                    raise _refused(f"the tool result for call {cid[:200]!r} answers no tool "
                                   "call in the history: Gemini's functionResponse needs the "
                                   "function's name, which only that call holds")
                parts.append({"functionResponse": {"id": cid, "name": names[cid],
                                                   "response": _result(content, failed)}})
            case OpaqueBlock(provider=provider, raw=raw):
                if provider == PROVIDER:
                    _add_opaque(parts, raw)
            case _:
                raise _refused(f"a {block.kind} block cannot go in a {message.role.value} "
                               "message")
    if not parts:
        return None
    if signs and role == "model":
        _sign_first_call(parts)
    encoded = ",".join(p if isinstance(p, str) else compact_json(p) for p in parts)
    return f'{{"role":"{role}","parts":[{encoded}]}}'


def _sign_first_call(parts: list[dict[str, Any] | str]) -> None:
    """Google's placeholder signature on the first ``functionCall`` part, if it has no
    signature of its own (run once the turn's own signatures are in place)."""
    call = next((p for p in parts if isinstance(p, dict) and "functionCall" in p), None)
    if call is not None and "thoughtSignature" not in call:
        call["thoughtSignature"] = _SKIP_SIGNATURE


def _add_opaque(parts: list[dict[str, Any] | str], raw: str) -> None:
    """A signature goes back on the part encoded just before it (or alone on an empty text
    part when there is none it can go on); any other opaque block is a whole part, spliced
    verbatim."""
    try:
        part = json.loads(raw)
    except ValueError:
        part = None
    if not isinstance(part, dict):
        raise _refused("a gemini opaque block must be one JSON object (a part)")
    if set(part) != {"thoughtSignature"}:
        parts.append(raw.strip())
        return
    signature = part["thoughtSignature"]
    if type(signature) is not str:
        raise _refused("a gemini thought signature must be a string")
    last = parts[-1] if parts else None
    if isinstance(last, dict) and "thoughtSignature" not in last:
        last["thoughtSignature"] = signature
    else:
        parts.append({"text": "", "thoughtSignature": signature})


def _result(content: str, failed: bool) -> dict[str, Any]:
    """``functionResponse.response``: an object, ``{"output": ...}`` or ``{"error": ...}``
    (Gemini's own keys for the two), holding the JSON object or array the text is, or the
    text itself."""
    value: Any = content
    text = content.strip()
    if text[:1] in ("{", "["):
        try:
            value = json.loads(text, parse_constant=_not_json)
        except (ValueError, RecursionError):  # not JSON after all: the text it is
            value = content
    return {"error": value} if failed else {"output": value}


def _refused(message: str) -> LLMError:
    """A request we will not send: retrying cannot fix it."""
    return LLMError(message, fault=Fault.TERMINAL, provider=PROVIDER)


# -- decoding ---------------------------------------------------------------------------------


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def decode_response(data: Any, error: ErrorFactory | None = None) -> Response:
    """A non-streaming ``GenerateContentResponse`` as a ``Response``: the same decoder a
    stream runs, over the one response, so the two cannot disagree. ``error`` builds the
    errors that quote the server (the model's, which removes its key)."""
    if not isinstance(data, dict):
        raise TypeError("the response is not a JSON object")
    decoder = ChunkDecoder(None, error)
    assembler = Assembler(PROVIDER)
    for event in decoder.feed(data):
        assembler.feed(event)
    for event in decoder.done(stream=False):
        assembler.feed(event)
    return assembler.response()


class _Thought:
    """Adjacent thought parts being gathered into one opaque block."""

    __slots__ = ("index", "part", "texts")

    def __init__(self, index: int, part: dict[str, Any]) -> None:
        self.index = index
        self.part = part
        self.texts: list[str] = []


class ChunkDecoder:
    """Turns ``GenerateContentResponse`` chunks (or one whole response) into stream events.

    Parts fold into blocks (module doc): plain text into one text block until anything else
    comes, thought parts into one opaque block, a signature into an opaque block after the
    block of its part, a ``functionCall`` into a call. Each block takes the next index when
    it opens. What an opaque block gathers is spent from ``budget`` as it arrives (none:
    uncounted, for ``generate``, whose attempt counts the blocks). ``error`` builds the errors
    that quote the server.
    """

    def __init__(self, budget: ReplyBudget | None = None,
                 error: ErrorFactory | None = None) -> None:
        self._budget = budget
        self._error = error or (lambda m, f: LLMError(m, fault=f, provider=PROVIDER))
        self._next = 0
        self._text: int | None = None  # the open text block's index
        self._thought: _Thought | None = None
        self._ids = CallIds()
        self._calls = 0
        self._candidate = False  # a candidate has come
        self._finish: str | None = None
        self._model = ""
        self._response_id = ""

    def feed(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if isinstance(model := chunk.get("modelVersion"), str) and model:
            self._model = model
        if isinstance(rid := chunk.get("responseId"), str) and not self._response_id:
            self._response_id = rid
        candidates = chunk.get("candidates")
        if not candidates:
            feedback = chunk.get("promptFeedback")
            if isinstance(feedback, dict) and (reason := feedback.get("blockReason")):
                detail = feedback.get("blockReasonMessage")
                detail = f": {detail}" if isinstance(detail, str) and detail else ""
                raise self._error(f"Gemini blocked the prompt (blockReason {str(reason)[:64]}"
                                  f"{detail}): nothing was generated", Fault.TERMINAL)
        for candidate in candidates or []:
            if candidate.get("index", 0) != 0:  # only one is asked for
                continue
            if self._finish is not None:
                self._after_finish(candidate)
                continue
            self._candidate = True
            content = candidate.get("content") or {}
            for part in content.get("parts") or []:
                out.extend(self._part(part))
            if finish := candidate.get("finishReason"):
                if type(finish) is not str:
                    raise TypeError("finishReason is not a string")
                self._finish = finish
                self._check_finish(finish, candidate.get("finishMessage"))
        if (usage := chunk.get("usageMetadata")) is not None:
            out.append(UsageUpdate(usage=_usage(usage)))
        return out

    def done(self, *, stream: bool) -> list[StreamEvent]:
        """The closing events, once the reply has ended. A stream must have ended in a
        ``finishReason`` (it has no other end marker: without one it was cut short)."""
        if not self._candidate:
            raise malformed(PROVIDER, "the reply has no candidate and no promptFeedback "
                            "block reason")
        if stream and self._finish is None:
            raise cut_short(PROVIDER, "the stream ended before a finishReason")
        out = self._close()
        finish = self._finish or "STOP"
        if finish in _CUT:
            reason = StopReason.MAX_TOKENS
        elif finish in _REFUSED:
            reason = StopReason.REFUSAL
        else:
            reason = StopReason.TOOL_USE if self._calls else StopReason.END_TURN
        out.append(Stop(stop_reason=reason, model=self._model))
        return out

    def _after_finish(self, candidate: dict[str, Any]) -> None:
        """A candidate after the chunk that carried ``finishReason``: the reply is over, so
        it may repeat that reason and hold no content (at most empty text parts); anything
        else is malformed, never more of the reply (module doc)."""
        finish = candidate.get("finishReason")
        parts = (candidate.get("content") or {}).get("parts") or []
        if (finish is not None and finish != self._finish) or any(
                part != {"text": ""} for part in parts):
            raise malformed(PROVIDER, "the stream went on after the chunk with its "
                            "finishReason")

    def _check_finish(self, finish: str, message: Any) -> None:
        detail = f": {message}" if isinstance(message, str) and message else ""
        if finish in _RESAMPLE:
            raise self._error(f"the model's reply was malformed (finishReason {finish}"
                              f"{detail})", Fault.TRANSIENT)
        if finish == "MISSING_THOUGHT_SIGNATURE":
            raise self._error(
                f"Gemini refused the history: a thought signature is missing (finishReason "
                f"{finish}{detail}); a model turn must be sent back with the opaque blocks "
                "it came with", Fault.TERMINAL)
        if finish == "PUP_LIMITED_DISABLED":
            raise self._error(
                f"Gemini stopped: the account is limited or disabled for Prohibited Use "
                f"Policy violations (finishReason {finish}{detail}); every call will stop "
                "so until Google lifts it", Fault.TERMINAL)

    def _part(self, part: dict[str, Any]) -> list[StreamEvent]:
        if not isinstance(part, dict):
            raise TypeError("a part is not an object")
        signature = part.get("thoughtSignature")
        if signature is not None:
            _check_signature(signature)
        if part.get("thought") is True:
            return self._thought_part(part, signature)
        if "thought" in part and type(part["thought"]) is not bool:
            raise TypeError("thought is not a boolean")
        if (call := part.get("functionCall")) is not None:
            out = self._close()
            out += self._call(call)
            out += self._signed(signature)
            return out
        if "text" in part or set(part) <= {"thought", "thoughtSignature"}:
            text = part.get("text", "")
            if type(text) is not str:
                raise TypeError("text is not a string")
            out = self._close_thought()
            if text:
                if self._text is None:
                    self._text = self._open()
                out.append(TextDelta(index=self._text, text=text))
            if signature is not None:
                self._text = None
                out += self._signed(signature)
            return out
        # a kind of part the port does not model (executableCode...): kept whole, verbatim
        out = self._close()
        raw = compact_json(part)
        self._spend(len(raw))
        out.append(OpaqueDone(index=self._open(), block=OpaqueBlock(provider=PROVIDER, raw=raw)))
        return out

    def _thought_part(self, part: dict[str, Any], signature: str | None) -> list[StreamEvent]:
        text = part.get("text", "")
        if type(text) is not str:
            raise TypeError("a thought's text is not a string")
        out: list[StreamEvent] = []
        if self._thought is None:
            self._text = None
            self._thought = _Thought(self._open(), part)
        self._thought.texts.append(text)
        self._spend(len(text))
        if signature is not None:
            self._spend(len(signature))
            self._thought.part = {**self._thought.part, "thoughtSignature": signature}
            out += self._close_thought()
        return out

    def _call(self, call: Any) -> list[StreamEvent]:
        if not isinstance(call, dict):
            raise TypeError("functionCall is not an object")
        name = call.get("name")
        if type(name) is not str or not name:
            raise malformed(PROVIDER, "a functionCall has no name")
        args = call.get("args")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise malformed(PROVIDER, f"functionCall {name[:200]!r} args are not a JSON object")
        try:
            arguments = compact_json(args)
        except RecursionError:
            raise malformed(PROVIDER, f"functionCall {name[:200]!r} args nest too deeply "
                            "to parse") from None
        self._calls += 1
        wanted = call.get("id")
        if not replayable_call_id(wanted):
            digest = hashlib.sha256("\x00".join(
                (self._response_id, str(self._calls), name, arguments)
            ).encode("utf-8", "replace")).hexdigest()
            wanted = f"call_{digest[:32]}"
        index = self._open()
        return [ToolCallStart(index=index, id=self._ids.take(wanted), name=name),
                ToolCallDelta(index=index, arguments=arguments), ToolCallEnd(index=index)]

    def _signed(self, signature: str | None) -> list[StreamEvent]:
        """The opaque block of a signature, after the block of its part."""
        if signature is None:
            return []
        raw = compact_json({"thoughtSignature": signature})
        self._spend(len(raw))
        return [OpaqueDone(index=self._open(), block=OpaqueBlock(provider=PROVIDER, raw=raw))]

    def _open(self) -> int:
        index = self._next
        self._next += 1
        return index

    def _close(self) -> list[StreamEvent]:
        self._text = None
        return self._close_thought()

    def _close_thought(self) -> list[StreamEvent]:
        thought, self._thought = self._thought, None
        if thought is None:
            return []
        part = {**thought.part, "text": "".join(thought.texts)}
        block = OpaqueBlock(provider=PROVIDER, raw=compact_json(part))
        return [OpaqueDone(index=thought.index, block=block)]

    def _spend(self, chars: int) -> None:
        if self._budget is not None:
            self._budget.spend(chars)


def _check_signature(signature: Any) -> None:
    """A thought signature is replayed to Gemini as it came, so it must be what Gemini
    sends: base64 text (anything else would make the next request fail)."""
    if type(signature) is not str or not signature:
        raise TypeError("thoughtSignature is not a string")
    try:
        base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise malformed(PROVIDER, "a thoughtSignature is not base64") from None


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= _MAX_COUNT:
        raise malformed(PROVIDER, f"usageMetadata.{name} is not a token count")
    return value


def _usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        raise TypeError("usageMetadata is not an object")
    total = _count(usage, "promptTokenCount") + _count(usage, "toolUsePromptTokenCount")
    cached = _count(usage, "cachedContentTokenCount")
    if cached > total:
        raise malformed(PROVIDER, "usageMetadata has more cached tokens than prompt tokens")
    thoughts = _count(usage, "thoughtsTokenCount")
    return Usage(
        input_tokens=total,
        output_tokens=_count(usage, "candidatesTokenCount") + thoughts,
        cache_read_tokens=cached,
        reasoning_tokens=thoughts,
    )


# -- errors ---------------------------------------------------------------------------------


def _rpc_status(raw: bytes) -> dict[str, Any] | None:
    """The ``error`` object (a ``google.rpc.Status``) of an error body, or None."""
    try:
        body = loads(raw)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None


def _details(error: dict[str, Any] | None, kind: str) -> list[dict[str, Any]]:
    """The ``details`` entries of ``error`` of the type ``google.rpc.<kind>``."""
    details = error.get("details") if error else None
    if not isinstance(details, list):
        return []
    return [d for d in details if isinstance(d, dict)
            and str(d.get("@type", "")).endswith(f"google.rpc.{kind}")]


def _retry_delay(error: dict[str, Any] | None) -> float | None:
    """``RetryInfo.retryDelay`` (a duration such as ``"37s"``) in seconds, by the rules of
    ``parse_retry_after``; None without a usable one."""
    for info in _details(error, "RetryInfo"):
        delay = info.get("retryDelay")
        if isinstance(delay, str) and (m := _DURATION.fullmatch(delay.strip())):
            return parse_retry_after(m.group(1))
    return None


def _quota_gone(error: dict[str, Any] | None, message: str) -> bool:
    """Whether a 429 means a quota that waiting will not restore (module doc)."""
    violations = [v for failure in _details(error, "QuotaFailure")
                  for v in (failure.get("violations") or []) if isinstance(v, dict)]
    if violations:
        return any(_DAILY.search(f"{v.get('quotaId', '')} {v.get('quotaMetric', '')}")
                   or str(v.get("quotaValue", "")) == "0" for v in violations)
    if _retry_delay(error) is not None:
        return False
    status = error.get("status") if error else None
    return quota_exhausted(message, status if isinstance(status, str) else None)
