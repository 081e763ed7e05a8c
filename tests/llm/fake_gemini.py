"""A fake Gemini API (``generateContent`` / ``streamGenerateContent``) on loopback, speaking
the real wire format.

``FakeGemini`` answers each ``POST /v1beta/models/{model}:generateContent`` with the next
scripted step (``tests/llm/steps.py``): a ``Response`` as a ``GenerateContentResponse`` body
or, at ``:streamGenerateContent?alt=sse``, as that response cut into SSE chunks (text and
thoughts in pieces, each call whole, the ``finishReason`` and the full ``usageMetadata`` on
the last chunk, no end sentinel, as Gemini streams); an ``HTTPError`` as Google's error body
(a ``google.rpc.Status`` with ``QuotaFailure`` and ``RetryInfo`` details where Gemini sends
them); or a fault (dropped connection, malformed event, hang). ``Body`` and ``Chunks`` send
exactly the (validated) JSON given, for replies a ``Response`` cannot express.

Every body and chunk is checked, when it is scripted, in the test's own thread, against the
official ``google-genai`` types: ``GenerateContentResponse`` by its wire (camelCase) names
only, strictly, every enum one the SDK declares and spells so, no unknown field
(``sdk_check.by_wire_names``). Error bodies are checked against the SDK's
``GoogleRpcStatus`` (plus the ``status`` name, which the REST error adds) and read back by
the SDK's own ``errors.APIError``.

Requests are checked the same way against the SDK's types, composed as the SDK lays out a
``generateContent`` body (``models._GenerateContentParameters_to_mldev``: ``contents``,
``systemInstruction``, ``tools``, ``toolConfig``, ``generationConfig``...), except that a
field may also be spelt by its proto (snake_case) name, as Google's JSON parsers take (the
SDK itself sends ``parameters_json_schema`` so); one that does not match is answered 400, as
the real API would, and kept in ``rejected``. (The adapter's own spelling is pinned by the
tests that compare its bodies exactly.) The key must come in
the ``x-goog-api-key`` header (a request without it is answered 403) and never in the URL (a
``key=`` query is answered 400 and kept in ``rejected``). ``toolConfig`` is held to what the
API does with it: a choice without tools, or naming a function the request does not offer,
is answered 400, and a scripted reply that breaks it (a call under ``NONE``, none under
``ANY``, another function than the one allowed) is refused as a failure of the test that
scripted it. The model in the URL is held to what Google documents for it: a Gemini 3 (or
later) model answers 400 "Function call is missing a thought_signature" when the first
``functionCall`` of a model turn in the current turn (everything after the last user
message that is not only function responses) has no ``thoughtSignature``; a
``thinkingLevel`` is refused for 1.x and 2.x models, beside a ``thinkingBudget``, and, for
Gemini 3 Pro, at any level but ``LOW`` and ``HIGH``.

How a port ``Response`` maps onto the wire (the inverse of the adapter): ``TextBlock`` ->
``{"text"}``, ``ToolUse`` -> ``{"functionCall": {"id", "name", "args"}}``, an
``OpaqueBlock("gemini")`` holding only a ``thoughtSignature`` -> that signature on the part
before it, any other -> its raw JSON as a part; ``Usage`` -> ``promptTokenCount`` (the
total), ``cachedContentTokenCount``, ``candidatesTokenCount`` (cache writes have no field).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pydantic
from google.genai import errors as genai_errors
from google.genai import types as genai
from pydantic.alias_generators import to_camel

from runtime.llm.types import OpaqueBlock, Response, StopReason, TextBlock, ToolUse, Usage

from .loopback import Exchange, FakeServer, Recorded
from .sdk_check import WireDrift, by_wire_names, contradiction, pieces, tool_choice_problem
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent, Step

PREFIX = "/v1beta/models/"
GENERATE, STREAM = ":generateContent", ":streamGenerateContent"
MODEL_VERSION = "gemini-2.5-flash-fake"
_FINISH = {
    StopReason.END_TURN: "STOP",
    StopReason.TOOL_USE: "STOP",  # Gemini has no finish reason of its own for calls
    StopReason.MAX_TOKENS: "MAX_TOKENS",
    StopReason.REFUSAL: "SAFETY",
}
# google.rpc.Code names, by the HTTP status Google's REST APIs send them with.
STATUS_NAMES = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
    404: "NOT_FOUND", 409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
    500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED", 529: "UNAVAILABLE",
}
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_METRIC = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
SKIP_SIGNATURE = base64.b64encode(b"skip_thought_signature_validator").decode()
"""The dummy thought signature Google documents for a function call it did not sign (the
bytes ``skip_thought_signature_validator``, base64 as every bytes field in JSON)."""
_MISSING_SIGNATURE = (
    "Function call is missing a thought_signature in functionCall parts. This is required "
    "for tools to work correctly, and missing thought_signature may lead to degraded model "
    "performance. Additional data, function call `{name}` , position {position}. Please "
    "refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.")


# -- fake-only steps (beyond the shared ones in steps.py) ---------------------------------


@dataclass(frozen=True)
class Body:
    """Answer a ``generateContent`` with exactly this (validated) response body."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Chunks:
    """Stream exactly these (validated) response chunks, one SSE event each."""

    chunks: tuple[dict[str, Any], ...]


FakeStep = Step | Body | Chunks


# -- validation against the official SDK types ------------------------------------------------


class GenerateContentRequest(pydantic.BaseModel):
    """A ``generateContent`` body, composed of the SDK's own types as the SDK lays one out
    (``models._GenerateContentParameters_to_mldev`` and ``_GenerateContentConfig_to_mldev``,
    which put these next to ``contents``): the SDK has no single type for the wire body."""

    model_config = pydantic.ConfigDict(extra="forbid", alias_generator=to_camel,
                                       validate_by_name=True)

    contents: list[genai.Content]
    system_instruction: genai.Content | None = None
    tools: list[genai.Tool] | None = None
    tool_config: genai.ToolConfig | None = None
    generation_config: genai.GenerationConfig | None = None
    safety_settings: list[genai.SafetySetting] | None = None
    cached_content: str | None = None


def check_response(body: dict[str, Any]) -> genai.GenerateContentResponse:
    """A response body or one stream chunk, held to ``GenerateContentResponse``."""
    return by_wire_names(genai.GenerateContentResponse, body, "GenerateContentResponse")


def check_request(body: dict[str, Any]) -> GenerateContentRequest:
    request = by_wire_names(GenerateContentRequest, body, "request", proto_names=True)
    for i, content in enumerate(request.contents):
        if content.role not in ("user", "model"):
            raise WireDrift(f"contents[{i}].role is {content.role!r}: use user or model")
        if not content.parts:
            raise WireDrift(f"contents[{i}] has no parts")
    return request


def check_error(status: int, body: dict[str, Any]) -> None:
    """Google's REST error: ``{"error": google.rpc.Status + its code's name}``, read back
    the same by the SDK's own error class."""
    if set(body) != {"error"}:
        raise WireDrift(f"error body keys {sorted(body)} != ['error']")
    error = body["error"]
    by_wire_names(genai.GoogleRpcStatus, {k: v for k, v in error.items() if k != "status"},
                  "error")
    if error.get("code") != status or error.get("status") != STATUS_NAMES.get(status):
        raise WireDrift(f"error code/status {error.get('code')}/{error.get('status')} do not "
                        f"match HTTP {status}")
    read = genai_errors.APIError(status, body)
    if (read.status, read.message) != (error["status"], error["message"]):
        raise WireDrift(f"the SDK reads the error as {read.status}: {read.message}")


def generation(model: str) -> int | None:
    """The major version of a ``gemini-N...`` model id, None for another name."""
    match = re.match(r"gemini-(\d+)", model)
    return int(match.group(1)) if match else None


def signature_problem(model: str, request: GenerateContentRequest) -> str | None:
    """Gemini 3's 400 for a model turn of the current turn whose first function call has no
    thought signature (None: the request passes)."""
    major = generation(model)
    if major is None or major < 3:
        return None
    start = max((i for i, c in enumerate(request.contents) if c.role == "user"
                 and any(p.function_response is None for p in c.parts or [])), default=-1)
    for position, content in enumerate(request.contents[start + 1:], start + 1):
        calls = [p for p in content.parts or [] if p.function_call is not None]
        if content.role == "model" and calls and not calls[0].thought_signature:
            return _MISSING_SIGNATURE.format(name=calls[0].function_call.name,
                                             position=position)
    return None


def thinking_problem(model: str, request: GenerateContentRequest) -> str | None:
    """The API's 400 for a ``thinkingConfig`` this model does not take (None: it does)."""
    config = request.generation_config.thinking_config if request.generation_config else None
    if config is None or config.thinking_level is None:
        return None
    level = str(getattr(config.thinking_level, "value", config.thinking_level))
    major = generation(model)
    if config.thinking_budget is not None:
        return ("You cannot use both thinking_level and the legacy thinking_budget parameter "
                "in the same request.")
    if major is not None and major < 3:
        return "Thinking level is not supported for this model."
    if re.match(r"gemini-3-pro(-|$)", model) and level not in ("LOW", "HIGH"):
        return (f"Thinking level {level} is not supported for this model. Please retry with "
                "other thinking level.")
    return None


def tool_choice(body: dict[str, Any]) -> tuple[str, str | None]:
    """A (validated) request's tool choice as (mode, tool name) in the port's words:
    ``auto`` when absent."""
    calling = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
    mode = calling.get("mode", "AUTO")
    allowed = calling.get("allowedFunctionNames") or []
    if mode == "ANY":
        return ("tool", allowed[0]) if len(allowed) == 1 else ("required", None)
    return ("none", None) if mode == "NONE" else ("auto", None)


def offered(body: dict[str, Any]) -> list[str]:
    return [d["name"] for t in body.get("tools", []) for d in t.get("functionDeclarations", [])]


# -- rendering --------------------------------------------------------------------------------


def wire_usage(usage: Usage) -> dict[str, Any]:
    assert usage.input_tokens >= usage.cache_read_tokens, "cache reads are inside the total"
    assert usage.output_tokens >= usage.reasoning_tokens, "thoughts are inside the output"
    meta: dict[str, Any] = {
        "promptTokenCount": usage.input_tokens,
        "candidatesTokenCount": usage.output_tokens - usage.reasoning_tokens,
        "totalTokenCount": usage.input_tokens + usage.output_tokens,
    }
    if usage.cache_read_tokens:
        meta["cachedContentTokenCount"] = usage.cache_read_tokens
    if usage.reasoning_tokens:
        meta["thoughtsTokenCount"] = usage.reasoning_tokens
    meta["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": usage.input_tokens}]
    return meta


def wire_parts(response: Response) -> list[dict[str, Any]]:
    """The ``parts`` of a ``Response``'s message (module doc)."""
    parts: list[dict[str, Any]] = []
    for block in response.message.blocks:
        match block:
            case TextBlock(text=text):
                parts.append({"text": text})
            case ToolUse(id=cid, name=name, input=args):
                parts.append({"functionCall": {"id": cid, "name": name, "args": args}})
            case OpaqueBlock(provider="gemini", raw=raw):
                part = json.loads(raw)
                if set(part) == {"thoughtSignature"}:
                    parts[-1]["thoughtSignature"] = part["thoughtSignature"]
                else:
                    parts.append(part)
    return parts


def _finish(response: Response) -> str:
    if response.stop_reason not in _FINISH:
        raise ValueError(f"Gemini cannot express stop reason {response.stop_reason}")
    return _FINISH[response.stop_reason]


def _envelope(candidate: dict[str, Any], usage: dict[str, Any], response_id: str
              ) -> dict[str, Any]:
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": MODEL_VERSION,
            "responseId": response_id}


def render_body(response: Response, response_id: str = "fake-response") -> dict[str, Any]:
    """The ``generateContent`` response for ``response``."""
    candidate: dict[str, Any] = {}
    if parts := wire_parts(response):
        candidate["content"] = {"parts": parts, "role": "model"}
    candidate["finishReason"] = _finish(response)
    candidate["index"] = 0
    return _envelope(candidate, wire_usage(response.usage), response_id)


def _pieces(part: dict[str, Any]) -> list[dict[str, Any]]:
    """A part as it streams: text (and thought text) in 5-character pieces, the signature
    on the last one; anything else whole."""
    if "text" not in part:
        return [part]
    out = [{**part, "text": p} for p in pieces(part["text"], 5)]
    for piece in out[:-1]:
        piece.pop("thoughtSignature", None)
    return out


def render_chunks(response: Response, response_id: str = "fake-response") -> list[dict[str, Any]]:
    """The ``streamGenerateContent`` chunks for ``response``: one piece of a part each, the
    prompt's usage on each, the finish reason and the whole usage on the last."""
    streamed = [p for part in wire_parts(response) for p in _pieces(part)]
    usage = response.usage
    running = {"promptTokenCount": usage.input_tokens, "totalTokenCount": usage.input_tokens}
    chunks = [_envelope({"content": {"parts": [piece], "role": "model"}, "index": 0},
                        running, response_id) for piece in streamed]
    if not chunks:
        chunks.append(_envelope({"index": 0}, running, response_id))
    last = chunks[-1]
    last["candidates"][0]["finishReason"] = _finish(response)
    last["usageMetadata"] = wire_usage(usage)
    return chunks


def render_error(step: HTTPError) -> tuple[int, dict[str, Any]]:
    """(status, body) of Gemini's error for ``step``: a rate limit is a per-minute quota
    violation, an exhausted quota a per-day one (Gemini's message is the same for both);
    ``retry_after`` is a ``RetryInfo`` detail, as Gemini sends it (no header)."""
    details: list[dict[str, Any]] = []
    if step.kind in ("rate_limit", "quota"):
        per = "PerMinute" if step.kind == "rate_limit" else "PerDay"
        details.append({"@type": _QUOTA_FAILURE, "violations": [{
            "quotaMetric": _METRIC,
            "quotaId": f"GenerateRequests{per}PerProjectPerModel-FreeTier",
            "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
            "quotaValue": "10",
        }]})
    elif step.kind not in ("overloaded", "server", "bad_request", "auth"):
        raise ValueError(f"unknown HTTPError kind {step.kind!r}")
    if step.retry_after is not None:
        details.append({"@type": _RETRY_INFO, "retryDelay": f"{step.retry_after:g}s"})
    return step.status, error_body(step.status, step.message, details)


def error_body(status: int, message: str, details: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    error: dict[str, Any] = {"code": status, "message": message,
                             "status": STATUS_NAMES.get(status, "UNKNOWN")}
    if details:
        error["details"] = details
    body = {"error": error}
    check_error(status, body)
    return body


# -- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    """A step with its wire payloads rendered and validated up front."""

    step: FakeStep
    body: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] | None = None
    error: tuple[int, dict[str, Any]] | None = None


class FakeGemini(FakeServer):
    """``with FakeGemini() as fake:`` serves Gemini's API at ``fake.url`` (the base URL)."""

    def __init__(self) -> None:
        self._steps: deque[_Prepared] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.rejected: list[str] = []
        super().__init__()

    def script(self, *steps: FakeStep) -> None:
        prepared = [self._prepare(s) for s in steps]
        with self._lock:
            self._steps.extend(prepared)

    def remaining(self) -> int:
        with self._lock:
            return len(self._steps)

    def _prepare(self, step: FakeStep) -> _Prepared:
        match step:
            case HTTPError():
                return _Prepared(step, error=render_error(step))
            case Body(body=body):
                check_response(body)
                return _Prepared(step, body=body)
            case Chunks(chunks=chunks):
                for chunk in chunks:
                    check_response(chunk)
                return _Prepared(step, chunks=list(chunks))
        response = step if isinstance(step, Response) else step.response
        rid = f"fake-response-{next(self._ids)}"
        body, chunks = render_body(response, rid), render_chunks(response, rid)
        for payload in (body, *chunks):
            check_response(payload)
        return _Prepared(step, body=body, chunks=chunks)

    def _respond(self, rec: Recorded, ex: Exchange) -> None:
        url = urlsplit(rec.path)
        method = url.path.rpartition(":")[2]
        if not url.path.startswith(PREFIX) or f":{method}" not in (GENERATE, STREAM):
            self._error(ex, 404, f"fake: no route {url.path}")
            return
        query = parse_qs(url.query)
        if "key" in query:
            self._refuse(ex, "fake: the API key came in the URL, where logs keep it")
            return
        if not rec.headers.get("x-goog-api-key"):
            self._error(ex, 403, "Method doesn't allow unregistered callers (callers without "
                        "established identity). Please use API Key or other form of API "
                        "consumer identity to call this API.")
            return
        streaming = f":{method}" == STREAM
        if streaming and query.get("alt") != ["sse"]:
            self._refuse(ex, "fake: a stream is asked for with ?alt=sse")
            return
        body = rec.body
        try:
            request = check_request(body)
        except WireDrift as e:
            self._refuse(ex, f"fake: not a valid request: {e}")
            return
        model = url.path[len(PREFIX):].rpartition(":")[0]
        if problem := signature_problem(model, request) or thinking_problem(model, request):
            self._refuse(ex, problem)
            return
        mode, name = tool_choice(body)
        if "toolConfig" in body and (problem := tool_choice_problem(mode, name, offered(body))):
            self._refuse(ex, problem)
            return
        with self._lock:
            prepared = self._steps.popleft() if self._steps else None
        if prepared is None:  # terminal, so a surplus call fails at once instead of retrying
            self._error(ex, 400, "fake: no scripted reply left")
            return
        if isinstance(prepared.step, Response) and (broken := contradiction(
                mode, name, [c.name for c in prepared.step.message.tool_uses()])):
            self._refuse(ex, f"fake: {broken}, which the API never sends")
            return
        if streaming:
            self._stream(prepared, ex)
        else:
            self._json(prepared, ex)

    def _error(self, ex: Exchange, status: int, message: str) -> None:
        ex.send_json(status, error_body(status, message))

    def _refuse(self, ex: Exchange, message: str) -> None:
        self.rejected.append(message)
        self._error(ex, 400, message)

    def _json(self, p: _Prepared, ex: Exchange) -> None:
        if p.error is not None:
            status, body = p.error
            ex.send_json(status, body)
            return
        if p.body is None:
            self._refuse(ex, "fake: a Chunks step answers a stream, not generateContent")
            return
        data = json.dumps(p.body).encode()
        match p.step:
            case DropMidStream():
                ex.send_bytes(200, data[: len(data) // 2], length=len(data))
                ex.drop()
            case MalformedEvent():
                ex.send_bytes(200, b"this is not {")
            case Hang():
                ex.hang_until_client_leaves()
            case _:
                ex.send_json(200, p.body)

    def _stream(self, p: _Prepared, ex: Exchange) -> None:
        if p.error is not None:
            self._json(p, ex)
            return
        if p.chunks is None:
            self._refuse(ex, "fake: a Body step answers generateContent, not a stream")
            return
        ex.start_stream()
        match p.step:
            case DropMidStream(after_events=n):
                self._events(ex, p.chunks[:n])
                ex.drop()
            case MalformedEvent(after_events=n):
                self._events(ex, p.chunks[:n])
                ex.send_event("{not json")
            case Hang(after_events=n):
                self._events(ex, p.chunks[:n])
                ex.hang_until_client_leaves()
            case _:
                self._events(ex, p.chunks)

    def _events(self, ex: Exchange, chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            # Gemini's events end in CRLF pairs; the port's SSE reader must take them.
            ex.handler.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
            ex.handler.wfile.flush()
