"""A fake OpenAI Chat Completions server on loopback, speaking the real wire format.

``FakeOpenAI`` answers each ``POST /v1/chat/completions`` with the next scripted step
(``tests/llm/steps.py``): a ``Response`` as a ``chat.completion`` body or, when the request
says ``"stream": true``, as ``chat.completion.chunk`` SSE events ending in ``data: [DONE]``
(with the usage chunk when ``stream_options.include_usage``); an ``HTTPError`` with OpenAI's
error body; or a fault (dropped connection, malformed event, hang).

Every body and chunk is rendered and checked against the official ``openai`` SDK types when it
is scripted, in the test's own thread, so a drift fails the test that scripted it instead of
surfacing as a mysterious transport error. The check is ``strict=True`` (no coercion: an int
must be an int, a literal exactly the literal) plus "no unknown fields": the SDK models allow
extra keys so they survive API additions, which would let a misspelt field through, so we walk
the validated tree and reject any ``model_extra``.

Requests are checked the same way against the SDK's ``CompletionCreateParams`` (strict, extra
keys forbidden); one that does not match is answered 400, as the real API would, with the
validation errors as the message, and kept in ``rejected``. ``tool_choice`` is one of those
keys (the SDK's ``ChatCompletionToolChoiceOptionParam``), and the fake then holds a request to
it as the API does: a choice without tools, or naming a function the request does not
offer, is answered 400; and a scripted reply that breaks the choice (a call under ``none``,
none under ``required``, another function than the one named) is refused the same way
(the API never sends one, so the test that scripted it is wrong), also kept in ``rejected``.

Compatible servers' quirks, each off by default (the presets' tests turn them on):
``call_ids="empty"`` / ``"missing"`` sends tool calls with an empty id or none at all (a chunk
may omit its id in the SDK's types; a completion may not, so ``"missing"`` removes it from a
completion that was validated with it: the one deviation from the types, and the quirk
itself); ``stream_usage=False`` never sends the usage chunk, whatever the request asks; and
``tool_choice="strings"`` / ``"refused"`` answers 400 to a request whose ``tool_choice`` is
the named-function object / is there at all: stricter than llama.cpp's server and Ollama,
which take such a request and ignore what they cannot honour, so that a test proves the
adapter never sends what such a server would silently drop.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import pydantic
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from openai.types.shared import ErrorObject

from runtime.llm.types import Response, StopReason, TextBlock, ToolUse, Usage

from .loopback import Exchange, FakeServer, Recorded
from .sdk_check import WireDrift, contradiction, drain, no_extras, pieces, tool_choice_problem
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent, Step

PATH = "/v1/chat/completions"
CREATED = 1_700_000_000
_FINISH = {
    StopReason.END_TURN: "stop",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.MAX_TOKENS: "length",
    StopReason.REFUSAL: "content_filter",
}
# HTTPError.kind -> OpenAI's (type, code) for that failure.
_ERROR_KINDS: dict[str, tuple[str, str | None]] = {
    "rate_limit": ("requests", "rate_limit_exceeded"),
    "quota": ("insufficient_quota", "insufficient_quota"),
    "overloaded": ("server_error", "overloaded"),
    "server": ("server_error", None),
    "bad_request": ("invalid_request_error", None),
    "auth": ("invalid_request_error", "invalid_api_key"),
}


# -- validation against the official SDK types ------------------------------------------------

_COMPLETION = pydantic.TypeAdapter(ChatCompletion)
_CHUNK = pydantic.TypeAdapter(ChatCompletionChunk)
_ERROR = pydantic.TypeAdapter(ErrorObject)


def validate_completion(body: dict[str, Any]) -> ChatCompletion:
    value = _COMPLETION.validate_python(body, strict=True)
    no_extras(value, "ChatCompletion")
    return value


def validate_chunk(chunk: dict[str, Any]) -> ChatCompletionChunk:
    value = _CHUNK.validate_python(chunk, strict=True)
    no_extras(value, "ChatCompletionChunk")
    return value


# TypedDicts cannot take a config of their own in a TypeAdapter, but nested in a list they
# inherit it: that is how unknown request keys become errors.
_STRICT = pydantic.ConfigDict(strict=True, extra="forbid")
_REQUEST = pydantic.TypeAdapter(list[CompletionCreateParamsNonStreaming], config=_STRICT)
_STREAM_REQUEST = pydantic.TypeAdapter(list[CompletionCreateParamsStreaming], config=_STRICT)


def validate_request(body: dict[str, Any]) -> dict[str, Any]:
    """A request body as the SDK would build it: known keys only, each of the right type."""
    adapter = _STREAM_REQUEST if body.get("stream") is True else _REQUEST
    return drain(adapter.validate_python([body]))[0]


def tool_choice(body: dict[str, Any]) -> tuple[str, str | None]:
    """A (validated) request's tool choice as (mode, tool name): ``auto`` when absent."""
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, str):
        return choice, None
    if choice.get("type") == "function":
        return "tool", choice["function"]["name"]
    return "auto", None  # allowed_tools, custom: choices the adapter never sends


def validate_error(body: dict[str, Any]) -> ErrorObject:
    """OpenAI's error body is ``{"error": ErrorObject}`` and nothing else."""
    if set(body) != {"error"}:
        raise WireDrift(f"error body keys {sorted(body)} != ['error']")
    value = _ERROR.validate_python(body["error"], strict=True)
    no_extras(value, "ErrorObject")
    return value


# -- rendering --------------------------------------------------------------------------------


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


@dataclass(frozen=True)
class _Reply:
    """What a ``Response`` says on the wire: one text, maybe a refusal, the calls, the finish."""

    text: str
    refusal: str | None
    calls: list[ToolUse]
    finish: str

    @classmethod
    def of(cls, response: Response) -> _Reply:
        if response.stop_reason not in _FINISH:
            raise ValueError(f"Chat Completions cannot express stop reason {response.stop_reason}")
        # Several text blocks become one ``content``; opaque blocks have no Chat Completions
        # form, so a scripted one is not rendered.
        text = "".join(b.text for b in response.message.blocks if isinstance(b, TextBlock))
        refused = response.stop_reason is StopReason.REFUSAL
        return cls(
            text="" if refused else text,
            refusal=(text or None) if refused else None,
            calls=response.message.tool_uses(),
            finish=_FINISH[response.stop_reason],
        )


def _arguments(call: ToolUse) -> str:
    return json.dumps(call.input)


def render_completion(response: Response, id: str = "chatcmpl-fake") -> dict[str, Any]:
    reply = _Reply.of(response)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text or None,
        "refusal": reply.refusal,
        "annotations": [],
    }
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments(c)},
            }
            for c in reply.calls
        ]
    return {
        "id": id,
        "object": "chat.completion",
        "created": CREATED,
        "model": response.model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish}
        ],
        "usage": _usage(response.usage),
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }


def render_chunks(
    response: Response,
    *,
    include_usage: bool,
    interleave: bool = False,
    id: str = "chatcmpl-fake",
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply (``[DONE]`` not included).

    Tool calls go one after the other as OpenAI sends them, or with ``interleave`` their
    fragments alternate (as a server generating calls in parallel may), each by its index.
    """
    reply = _Reply.of(response)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": response.model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            c["usage"] = None
        return c

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    if reply.text:
        out += [chunk({"content": p}) for p in pieces(reply.text, 5)]
    if reply.refusal:
        out += [chunk({"refusal": p}) for p in pieces(reply.refusal, 5)]
    per_call = []
    for i, call in enumerate(reply.calls):
        head = {
            "index": i,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        tail = [{"index": i, "function": {"arguments": p}} for p in pieces(_arguments(call), 7)]
        per_call.append([head, *tail])
    if interleave:
        for k in range(max(map(len, per_call), default=0)):
            out += [chunk({"tool_calls": [d[k]]}) for d in per_call if k < len(d)]
    else:
        out += [chunk({"tool_calls": [d]}) for deltas in per_call for d in deltas]
    out.append(chunk({}, reply.finish))
    if include_usage:
        last = chunk({})
        last["choices"] = []
        last["usage"] = _usage(response.usage)
        out.append(last)
    return out


def render_error(step: HTTPError) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, body) of an OpenAI error response."""
    if step.kind not in _ERROR_KINDS:
        raise ValueError(f"unknown HTTPError kind {step.kind!r}; one of {sorted(_ERROR_KINDS)}")
    type_, code = _ERROR_KINDS[step.kind]
    body = {"error": {"message": step.message, "type": type_, "param": None, "code": code}}
    headers = {}
    if step.retry_after is not None:
        headers["retry-after"] = f"{step.retry_after:g}"
    return step.status, headers, body


# -- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    """A step with its wire payloads rendered and validated up front."""

    step: Step
    completion: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] | None = None  # with the usage chunk
    chunks_no_usage: list[dict[str, Any]] | None = None
    error: tuple[int, dict[str, str], dict[str, Any]] | None = None


class FakeOpenAI(FakeServer):
    """``with FakeOpenAI() as fake:`` serves OpenAI's API at ``fake.base_url``."""

    def __init__(self, *, interleave_tool_calls: bool = False, call_ids: str = "sent",
                 stream_usage: bool = True, tool_choice: str = "full") -> None:
        if call_ids not in ("sent", "empty", "missing") or tool_choice not in (
                "full", "strings", "refused"):
            raise ValueError(f"unknown quirk: call_ids={call_ids!r}, tool_choice={tool_choice!r}")
        self.interleave_tool_calls = interleave_tool_calls
        self.call_ids = call_ids
        self.stream_usage = stream_usage
        self.tool_choice = tool_choice
        self._steps: deque[_Prepared] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.rejected: list[str] = []
        super().__init__()

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    def script(self, *steps: Step) -> None:
        prepared = [self._prepare(s) for s in steps]
        with self._lock:
            self._steps.extend(prepared)

    def remaining(self) -> int:
        with self._lock:
            return len(self._steps)

    def _prepare(self, step: Step) -> _Prepared:
        if isinstance(step, HTTPError):
            error = render_error(step)
            validate_error(error[2])
            return _Prepared(step, error=error)
        response = step if isinstance(step, Response) else step.response
        cid = f"chatcmpl-fake{next(self._ids)}"
        completion = render_completion(response, id=cid)
        validate_completion(completion)
        chunks, bare = (
            render_chunks(response, include_usage=u, interleave=self.interleave_tool_calls, id=cid)
            for u in (True, False)
        )
        for c in chunks + bare:
            validate_chunk(c)
        if self.call_ids != "sent":  # the quirk, applied to what was validated (module doc)
            _strip_call_ids(completion, chunks + bare, empty=self.call_ids == "empty")
            if self.call_ids == "empty":  # still the SDK's shape
                validate_completion(completion)
            for c in chunks + bare:
                validate_chunk(c)
        return _Prepared(step, completion=completion, chunks=chunks, chunks_no_usage=bare)

    def _respond(self, rec: Recorded, ex: Exchange) -> None:
        if rec.path != PATH:
            ex.send_json(404, _error_body(f"no route {rec.path}", "invalid_request_error"))
            return
        body = rec.body
        try:
            validate_request(body)
        except pydantic.ValidationError as e:
            self.rejected.append(str(e))
            ex.send_json(
                400, _error_body(f"fake: not a valid request: {e}", "invalid_request_error")
            )
            return
        mode, name = tool_choice(body)
        if "tool_choice" in body and self.tool_choice != "full" and (
                self.tool_choice == "refused" or not isinstance(body["tool_choice"], str)):
            self._refuse(ex, f"fake: this server takes no tool_choice {body['tool_choice']!r}")
            return
        if "tool_choice" in body and (problem := tool_choice_problem(
                mode, name, [t["function"]["name"] for t in body.get("tools", [])])):
            self._refuse(ex, problem)
            return
        with self._lock:
            prepared = self._steps.popleft() if self._steps else None
        if prepared is None:  # terminal, so a surplus call fails at once instead of retrying
            ex.send_json(400, _error_body("fake: no scripted reply left", "invalid_request_error"))
            return
        if isinstance(prepared.step, Response) and (broken := contradiction(
                mode, name, [c.name for c in prepared.step.message.tool_uses()])):
            self._refuse(ex, f"fake: {broken}, which the API never sends")
            return
        if body.get("stream") is True:
            usage = self.stream_usage and bool(
                (body.get("stream_options") or {}).get("include_usage"))
            self._stream(prepared, ex, prepared.chunks if usage else prepared.chunks_no_usage)
        else:
            self._json(prepared, ex)

    def _refuse(self, ex: Exchange, message: str) -> None:
        self.rejected.append(message)
        ex.send_json(400, _error_body(message, "invalid_request_error"))

    def _json(self, p: _Prepared, ex: Exchange) -> None:
        if p.error is not None:
            status, headers, body = p.error
            ex.send_json(status, body, headers)
            return
        assert p.completion is not None
        data = json.dumps(p.completion).encode()
        match p.step:
            case Response():
                ex.send_json(200, p.completion)
            case DropMidStream():
                ex.send_bytes(200, data[: len(data) // 2], length=len(data))
                ex.drop()
            case MalformedEvent():
                ex.send_bytes(200, b"this is not {")
            case Hang():
                ex.hang_until_client_leaves()

    def _stream(self, p: _Prepared, ex: Exchange, chunks: list[dict[str, Any]] | None) -> None:
        if p.error is not None:
            self._json(p, ex)
            return
        assert chunks is not None
        ex.start_stream()
        match p.step:
            case Response():
                for c in chunks:
                    ex.send_event(json.dumps(c))
                ex.send_event("[DONE]")
            case DropMidStream(after_events=n):
                for c in chunks[:n]:
                    ex.send_event(json.dumps(c))
                ex.drop()
            case MalformedEvent(after_events=n):
                for c in chunks[:n]:
                    ex.send_event(json.dumps(c))
                ex.send_event("{not json")
            case Hang(after_events=n):
                for c in chunks[:n]:
                    ex.send_event(json.dumps(c))
                ex.hang_until_client_leaves()


def _strip_call_ids(completion: dict[str, Any], chunks: list[dict[str, Any]], *,
                    empty: bool) -> None:
    """Tool calls with an empty id (``empty``) or none (module doc), in place."""
    calls = [c for choice in completion["choices"]
             for c in choice["message"].get("tool_calls") or []]
    calls += [c for chunk in chunks for choice in chunk["choices"]
              for c in choice["delta"].get("tool_calls") or [] if "id" in c]
    for call in calls:
        if empty:
            call["id"] = ""
        else:
            del call["id"]


def _error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    validate_error(body)
    return body
