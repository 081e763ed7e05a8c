"""A fake OpenAI Responses API server on loopback, speaking the real wire format.

``FakeOpenAIResponses`` answers each ``POST /v1/responses`` with the next scripted step
(``tests/llm/steps.py``): a ``Response`` as a ``response`` object or, when the request says
``"stream": true``, as the stream OpenAI sends (``response.created``, ``in_progress``, per
output item ``output_item.added``, its content parts or summary parts with their deltas and
``done`` events, ``output_item.done``, then ``response.completed`` or
``response.incomplete``, each ``event:``-named, with sequence numbers); an ``HTTPError``
with OpenAI's error body; or a fault (dropped connection, malformed event, hang).

How a port ``Response`` is said on this wire: each text block is one assistant ``message``
item (a ``refusal`` part when the stop reason is a refusal), each tool call a
``function_call`` item, each ``OpaqueBlock("openai-responses")`` the output item its raw JSON
is (a ``reasoning`` item, say); ``max_tokens`` is status ``incomplete`` for
``max_output_tokens``. A stop reason the wire would say otherwise (``end_turn`` with calls,
``tool_use`` without) cannot be rendered, and scripting it is an error.

As the API does, a reasoning item carries its ``encrypted_content`` only to a request that
asks for it (``include: ["reasoning.encrypted_content"]``); to any other it is null.

Every body and stream event is rendered and checked against the official ``openai`` SDK
types when it is scripted (``Response``, the ``ResponseStreamEvent`` union), in the test's
own thread, strict (no coercion) and with no field the SDK does not declare (``sdk_check``).

Requests are checked against the SDK's ``ResponseCreateParams`` (strict, unknown keys
refused) and answered 400 otherwise, kept in ``rejected``; so are, as the API refuses them,
a ``tool_choice`` without tools or naming a function not offered, a scripted reply that
breaks the choice, a ``function_call_output`` whose ``call_id`` no earlier ``function_call``
of the input has, and (404, as the API answers it) a reasoning item replayed without its
encrypted content under ``store: false``, which the API cannot look up.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import pydantic
from openai.types.responses import Response as WireResponse
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response_create_params import (
    ResponseCreateParamsNonStreaming,
    ResponseCreateParamsStreaming,
)

from runtime.llm.providers.openai_responses import PROVIDER
from runtime.llm.types import OpaqueBlock, Response, StopReason, TextBlock, ToolUse, Usage

from .fake_openai import render_error, validate_error
from .loopback import Exchange, FakeServer, Recorded
from .sdk_check import contradiction, drain, no_extras, pieces, tool_choice_problem
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent, Step

PATH = "/v1/responses"
CREATED = 1_700_000_000

# -- validation against the official SDK types ------------------------------------------------

_RESPONSE = pydantic.TypeAdapter(WireResponse)
_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def validate_response(body: dict[str, Any]) -> WireResponse:
    value = _RESPONSE.validate_python(body, strict=True)
    no_extras(value, "Response")
    return value


def validate_event(event: dict[str, Any]) -> Any:
    value = _EVENT.validate_python(event, strict=True)
    no_extras(value, event.get("type", "event"))
    return value


# TypedDicts take the config of the list they are nested in: unknown request keys are errors.
_STRICT = pydantic.ConfigDict(strict=True, extra="forbid")
_REQUEST = pydantic.TypeAdapter(list[ResponseCreateParamsNonStreaming], config=_STRICT)
_STREAM_REQUEST = pydantic.TypeAdapter(list[ResponseCreateParamsStreaming], config=_STRICT)


def validate_request(body: dict[str, Any]) -> dict[str, Any]:
    """A request body as the SDK would build it: known keys only, each of the right type."""
    adapter = _STREAM_REQUEST if body.get("stream") is True else _REQUEST
    return drain(adapter.validate_python([body]))[0]


def tool_choice(body: dict[str, Any]) -> tuple[str, str | None]:
    """A (validated) request's tool choice as (mode, function name): ``auto`` when absent."""
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, str):
        return choice, None
    if choice.get("type") == "function":
        return "tool", choice["name"]
    return "auto", None  # allowed_tools, hosted tools: choices the adapter never sends


def input_problem(body: dict[str, Any]) -> tuple[int, str] | None:
    """(status, message) of what the API refuses in a (validated) request's input, or None."""
    called: set[str] = set()
    stateless = body.get("store") is False
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        kind = item.get("type")
        if kind == "function_call":
            called.add(item["call_id"])
        elif kind == "function_call_output" and item.get("call_id") not in called:
            return 400, f"No tool call found for function call output with call_id " \
                        f"{item.get('call_id')}."
        elif kind == "reasoning" and stateless and not item.get("encrypted_content"):
            return 404, f"Item with id '{item['id']}' not found. Items are not persisted " \
                        "when `store` is set to false."
    return None


# -- rendering --------------------------------------------------------------------------------


def _usage(usage: Usage, reasoning_tokens: int) -> dict[str, Any]:
    """The wire's usage: its ``input_tokens`` holds cache reads and writes alike."""
    total_in = usage.input_tokens + usage.cache_write_tokens
    return {
        "input_tokens": total_in,
        "input_tokens_details": {"cached_tokens": usage.cache_read_tokens,
                                 "cache_write_tokens": usage.cache_write_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens
                                  or usage.reasoning_tokens},
        "total_tokens": total_in + usage.output_tokens,
    }


def render_output(response: Response, id: str = "fake") -> list[dict[str, Any]]:
    """The ``output`` items of ``response`` (module doc)."""
    calls = response.message.tool_uses()
    stop = response.stop_reason
    if stop is StopReason.CONTEXT_EXCEEDED:
        raise ValueError("the Responses API has no stop reason for an exceeded context")
    if (stop is StopReason.TOOL_USE) != bool(calls) and stop is not StopReason.MAX_TOKENS:
        raise ValueError(f"a reply with {len(calls)} calls cannot stop with {stop} here: "
                         "the stop reason is read from the calls")
    refused = stop is StopReason.REFUSAL
    out: list[dict[str, Any]] = []
    for n, block in enumerate(response.message.blocks):
        if isinstance(block, TextBlock):
            part = ({"type": "refusal", "refusal": block.text} if refused else
                    {"type": "output_text", "text": block.text, "annotations": [],
                     "logprobs": []})
            out.append({"id": f"msg_{id}_{n}", "type": "message", "role": "assistant",
                        "status": "completed", "content": [part]})
        elif isinstance(block, ToolUse):
            out.append({"id": f"fc_{id}_{n}", "type": "function_call", "status": "completed",
                        "call_id": block.id, "name": block.name,
                        "arguments": json.dumps(block.input)})
        elif isinstance(block, OpaqueBlock) and block.provider == PROVIDER:
            out.append(json.loads(block.raw))
    if refused and not any(i["type"] == "message" for i in out):
        out.append({"id": f"msg_{id}_r", "type": "message", "role": "assistant",
                    "status": "completed", "content": [{"type": "refusal", "refusal": ""}]})
    return out


def render_response(response: Response, id: str = "fake", *,
                    reasoning_tokens: int = 0) -> dict[str, Any]:
    """``response`` as a Responses API ``response`` object."""
    incomplete = response.stop_reason is StopReason.MAX_TOKENS
    return {
        "id": f"resp_{id}",
        "object": "response",
        "created_at": CREATED,
        "status": "incomplete" if incomplete else "completed",
        "completed_at": None if incomplete else CREATED + 1,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": None,
        "max_output_tokens": None,
        "metadata": {},
        "model": response.model,
        "output": render_output(response, id),
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": _usage(response.usage, reasoning_tokens),
    }


def render_events(response: Response, id: str = "fake", *,
                  reasoning_tokens: int = 0) -> list[dict[str, Any]]:
    """The stream events of ``response``, as OpenAI sends them (module doc)."""
    whole = render_response(response, id, reasoning_tokens=reasoning_tokens)
    seq = itertools.count()
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": next(seq), **fields})

    start = {**whole, "status": "in_progress", "completed_at": None, "output": [],
             "usage": None, "incomplete_details": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for oi, item in enumerate(whole["output"]):
        at = {"item_id": item["id"], "output_index": oi}
        kind = item["type"]
        if kind == "message":
            emit("response.output_item.added", output_index=oi,
                 item={**item, "status": "in_progress", "content": []})
            for ci, part in enumerate(item["content"]):
                at_part = {**at, "content_index": ci}
                if part["type"] == "refusal":
                    emit("response.content_part.added", **at_part,
                         part={"type": "refusal", "refusal": ""})
                    for p in pieces(part["refusal"], 5):
                        emit("response.refusal.delta", **at_part, delta=p)
                    emit("response.refusal.done", **at_part, refusal=part["refusal"])
                else:
                    emit("response.content_part.added", **at_part,
                         part={**part, "text": "", "logprobs": []})
                    for p in pieces(part["text"], 5):
                        emit("response.output_text.delta", **at_part, delta=p, logprobs=[])
                    emit("response.output_text.done", **at_part, text=part["text"], logprobs=[])
                emit("response.content_part.done", **at_part, part=part)
        elif kind == "function_call":
            emit("response.output_item.added", output_index=oi,
                 item={**item, "status": "in_progress", "arguments": ""})
            for p in pieces(item["arguments"], 7):
                emit("response.function_call_arguments.delta", **at, delta=p)
            emit("response.function_call_arguments.done", **at, arguments=item["arguments"])
        elif kind == "reasoning":
            # The encrypted content is whole only in ``output_item.done``.
            added = {k: v for k, v in item.items() if k != "encrypted_content"}
            emit("response.output_item.added", output_index=oi, item={**added, "summary": []})
            for si, summary in enumerate(item.get("summary") or []):
                at_summary = {**at, "summary_index": si}
                emit("response.reasoning_summary_part.added", **at_summary,
                     part={"type": "summary_text", "text": ""})
                for p in pieces(summary["text"], 6):
                    emit("response.reasoning_summary_text.delta", **at_summary, delta=p)
                emit("response.reasoning_summary_text.done", **at_summary, text=summary["text"])
                emit("response.reasoning_summary_part.done", **at_summary, part=summary)
        else:
            emit("response.output_item.added", output_index=oi, item=item)
        emit("response.output_item.done", output_index=oi, item=item)
    final = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
    emit(final, response=whole)
    return events


# -- the server -------------------------------------------------------------------------------


ENCRYPTED = "reasoning.encrypted_content"


def without_encrypted_reasoning(response: Response) -> Response:
    """``response`` as the API answers a request that did not ask for encrypted reasoning:
    its reasoning items' ``encrypted_content`` null."""
    blocks = []
    for block in response.message.blocks:
        if isinstance(block, OpaqueBlock) and block.provider == PROVIDER:
            item = json.loads(block.raw)
            if item.get("type") == "reasoning" and "encrypted_content" in item:
                item["encrypted_content"] = None
                block = OpaqueBlock(provider=PROVIDER, raw=json.dumps(item, separators=(",", ":")))
        blocks.append(block)
    return response.model_copy(update={"message": response.message.model_copy(
        update={"blocks": tuple(blocks)})})


@dataclass(frozen=True)
class _Wire:
    """One reply's body and stream events, rendered and validated."""

    body: dict[str, Any]
    events: list[dict[str, Any]]


@dataclass(frozen=True)
class _Prepared:
    """A step with its wire payloads rendered and validated up front: as sent to a request
    that asks for encrypted reasoning (``full``) and to one that does not (``plain``)."""

    step: Step
    full: _Wire | None = None
    plain: _Wire | None = None
    error: tuple[int, dict[str, str], dict[str, Any]] | None = None


class FakeOpenAIResponses(FakeServer):
    """``with FakeOpenAIResponses() as fake:`` serves the Responses API at ``fake.base_url``."""

    def __init__(self, *, reasoning_tokens: int = 0) -> None:
        self.reasoning_tokens = reasoning_tokens
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
        rid = f"fake{next(self._ids)}"
        full, plain = (self._render(r, rid)
                       for r in (response, without_encrypted_reasoning(response)))
        return _Prepared(step, full=full, plain=plain)

    def _render(self, response: Response, rid: str) -> _Wire:
        body = render_response(response, rid, reasoning_tokens=self.reasoning_tokens)
        validate_response(body)
        events = render_events(response, rid, reasoning_tokens=self.reasoning_tokens)
        for event in events:
            validate_event(event)
        return _Wire(body, events)

    def _respond(self, rec: Recorded, ex: Exchange) -> None:
        if rec.path != PATH:
            ex.send_json(404, _error_body(f"no route {rec.path}"))
            return
        body = rec.body
        try:
            validate_request(body)
        except pydantic.ValidationError as e:
            self._refuse(ex, f"fake: not a valid request: {e}")
            return
        if problem := input_problem(body):
            self._refuse(ex, problem[1], problem[0])
            return
        mode, name = tool_choice(body)
        offered = [t["name"] for t in body.get("tools", []) if t.get("type") == "function"]
        if "tool_choice" in body and (problem_text := tool_choice_problem(mode, name, offered)):
            self._refuse(ex, problem_text)
            return
        with self._lock:
            prepared = self._steps.popleft() if self._steps else None
        if prepared is None:  # terminal, so a surplus call fails at once instead of retrying
            ex.send_json(400, _error_body("fake: no scripted reply left"))
            return
        if isinstance(prepared.step, Response) and (broken := contradiction(
                mode, name, [c.name for c in prepared.step.message.tool_uses()])):
            self._refuse(ex, f"fake: {broken}, which the API never sends")
            return
        wire = prepared.full if ENCRYPTED in (body.get("include") or []) else prepared.plain
        if body.get("stream") is True:
            self._stream(prepared, wire, ex)
        else:
            self._json(prepared, wire, ex)

    def _refuse(self, ex: Exchange, message: str, status: int = 400) -> None:
        self.rejected.append(message)
        ex.send_json(status, _error_body(message))

    def _json(self, p: _Prepared, wire: _Wire | None, ex: Exchange) -> None:
        if p.error is not None:
            status, headers, body = p.error
            ex.send_json(status, body, headers)
            return
        assert wire is not None
        data = json.dumps(wire.body).encode()
        match p.step:
            case Response():
                ex.send_json(200, wire.body)
            case DropMidStream():
                ex.send_bytes(200, data[: len(data) // 2], length=len(data))
                ex.drop()
            case MalformedEvent():
                ex.send_bytes(200, b"this is not {")
            case Hang():
                ex.hang_until_client_leaves()

    def _stream(self, p: _Prepared, wire: _Wire | None, ex: Exchange) -> None:
        if p.error is not None:
            self._json(p, wire, ex)
            return
        assert wire is not None
        ex.start_stream()

        def send(events: list[dict[str, Any]]) -> None:
            for event in events:
                ex.send_event(json.dumps(event), event=event["type"])

        match p.step:
            case Response():
                send(wire.events)
            case DropMidStream(after_events=n):
                send(wire.events[:n])
                ex.drop()
            case MalformedEvent(after_events=n):
                send(wire.events[:n])
                ex.send_event("{not json", event="response.output_text.delta")
            case Hang(after_events=n):
                send(wire.events[:n])
                ex.hang_until_client_leaves()


def _error_body(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    body = {"error": {"message": message, "type": type_, "param": None, "code": None}}
    validate_error(body)
    return body
