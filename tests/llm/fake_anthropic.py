"""A fake Anthropic Messages API on the loopback server, driven by a script of steps.

Each ``POST /v1/messages`` takes the next step: a ``Response`` is rendered as Anthropic's JSON
message (or, for ``"stream": true``, as its SSE events), an ``HTTPError`` as Anthropic's error
body, and the broken-stream steps as what their names say. Everything the fake sends is first
validated against the official ``anthropic`` SDK types in strict mode, and every request it
receives against the SDK's request params, so the fake cannot drift from the real wire format.

A request's ``tool_choice`` (the SDK's ``ToolChoiceParam``) is held to what the API does
with it: answered 400 without tools, for a tool the request does not offer, and for a
choice that forces a call (``any``, ``tool``) with thinking on; a scripted reply that breaks
it (a call under ``none``, none under ``any``, another tool than the one named) is refused
as a failure of the test that scripted it, since the API never sends one.

How a port ``Response`` maps onto the wire:

- ``TextBlock`` -> ``text``, ``ToolUse`` -> ``tool_use``, ``OpaqueBlock(provider="anthropic")``
  -> its ``raw`` JSON as the content block (``thinking`` with its signature, ...).
- ``Usage`` is the inverse of the adapter's normalisation: ``input_tokens`` =
  port input - cache reads, ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` =
  the port's cache read / write counts.
- Streams follow the real order: ``message_start`` (input usage), then per block
  ``content_block_start`` / deltas / ``content_block_stop`` (a ``ping`` after the first start),
  ``message_delta`` (stop reason, output usage), ``message_stop``. Text and tool arguments are
  split into several deltas, so reassembly is exercised.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import anthropic.types as sdk
import pydantic
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)

from runtime.llm.types import OpaqueBlock, Response, StopReason, TextBlock, ToolUse

from .loopback import Exchange, LoopbackServer, Recorded
from .sdk_check import WireDrift, contradiction, drain, no_extras, pieces, tool_choice_problem
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent, Step

# -- fake-only steps (beyond the shared ones in steps.py) ---------------------------------


@dataclass(frozen=True)
class StreamError:
    """Stream ``after_events`` events of ``response``, then an SSE ``error`` event."""

    response: Response
    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    after_events: int = 1


@dataclass(frozen=True)
class Events:
    """Stream exactly these ``(event name, data)`` pairs (each still validated), for SSE
    edge cases a ``Response`` cannot express."""

    events: tuple[tuple[str, dict[str, Any]], ...]


@dataclass(frozen=True)
class Body:
    """Answer with exactly this (validated) non-streaming message body."""

    body: dict[str, Any]


FakeStep = Step | StreamError | Events | Body

KIND_TO_ERROR_TYPE = {
    "rate_limit": "rate_limit_error",
    "quota": "billing_error",
    "overloaded": "overloaded_error",
    "server": "api_error",
    "bad_request": "invalid_request_error",
    "auth": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
}
STOP_TO_WIRE = {
    StopReason.END_TURN: "end_turn",
    StopReason.TOOL_USE: "tool_use",
    StopReason.MAX_TOKENS: "max_tokens",
    StopReason.REFUSAL: "refusal",
    StopReason.CONTEXT_EXCEEDED: "model_context_window_exceeded",
}

# -- strict validation against the SDK -----------------------------------------------------

_MESSAGE = pydantic.TypeAdapter(sdk.Message)
_EVENT = pydantic.TypeAdapter(sdk.RawMessageStreamEvent)
_ERROR = pydantic.TypeAdapter(sdk.ErrorResponse)
_BLOCK_PARAM = pydantic.TypeAdapter(sdk.ContentBlockParam)
_TOOL_PARAM = pydantic.TypeAdapter(sdk.ToolUnionParam)
_SYSTEM_PARAM = pydantic.TypeAdapter(sdk.TextBlockParam)
_MESSAGE_PARAM = pydantic.TypeAdapter(sdk.MessageParam)
_TOOL_CHOICE_PARAM = pydantic.TypeAdapter(sdk.ToolChoiceParam)
_PARAMS = {
    False: pydantic.TypeAdapter(MessageCreateParamsNonStreaming),
    True: pydantic.TypeAdapter(MessageCreateParamsStreaming),
}


def _strict(adapter: pydantic.TypeAdapter[Any], value: Any, what: str) -> Any:
    """Validate in pydantic strict mode (no coercion: a "1" is not an int, an unknown
    literal is an error) and refuse unknown fields."""
    try:
        parsed = adapter.validate_python(value, strict=True)
    except pydantic.ValidationError as e:
        raise WireDrift(f"{what} does not match the SDK: {e}") from None
    no_extras(parsed, what)
    return parsed


def check_message(body: dict[str, Any]) -> None:
    _strict(_MESSAGE, body, "message")


def check_error(body: dict[str, Any]) -> None:
    _strict(_ERROR, body, "error body")


def check_event(name: str, data: dict[str, Any]) -> None:
    """An SSE event: its name must equal its data's ``type``; ``ping`` and ``error`` are not
    in ``RawMessageStreamEvent`` (the SDK skips or raises on them by name)."""
    if data.get("type") != name:
        raise WireDrift(f"event name {name!r} != data type {data.get('type')!r}")
    if name == "ping":
        if data != {"type": "ping"}:
            raise WireDrift(f"ping carries data: {data}")
    elif name == "error":
        check_error(data)
    else:
        _strict(_EVENT, data, f"{name} event")


def _same_param(adapter: pydantic.TypeAdapter[Any], value: Any, what: str) -> None:
    """Strict-validate a request part against an SDK ``TypedDict`` param. Those ignore
    unknown keys, so the validated value must also equal the input."""
    try:
        parsed = drain(adapter.validate_python(value, strict=True))
    except pydantic.ValidationError as e:
        raise WireDrift(f"{what} does not match the SDK params: {e}") from None
    if parsed != value:
        raise WireDrift(f"{what} has fields the SDK params do not know: {value}")


def check_request(body: dict[str, Any]) -> None:
    """A Messages API request body against the SDK's params, all of it, with nothing checked
    by hand. Tools, system blocks and message content go block by block: where the params'
    unions also admit response models, those would accept unknown fields."""
    for i, tool in enumerate(body.get("tools", [])):
        _same_param(_TOOL_PARAM, tool, f"tools[{i}]")
    system = body.get("system", [])
    if not isinstance(system, str):
        for i, block in enumerate(system):
            _same_param(_SYSTEM_PARAM, block, f"system[{i}]")
    for i, message in enumerate(body["messages"]):
        _same_param(_MESSAGE_PARAM, {**message, "content": []}, f"messages[{i}]")
        for j, block in enumerate(message["content"]):
            _same_param(_BLOCK_PARAM, block, f"messages[{i}].content[{j}]")
    if "tool_choice" in body:
        _same_param(_TOOL_CHOICE_PARAM, body["tool_choice"], "tool_choice")
    rest = {k: v for k, v in body.items() if k not in ("tools", "system")}
    rest["messages"] = []
    _same_param(_PARAMS[body.get("stream") is True], rest, "request")


def tool_choice(body: dict[str, Any]) -> tuple[str, str | None]:
    """A (checked) request's tool choice as (mode, tool name), in the port's words."""
    choice = body.get("tool_choice", {"type": "auto"})
    mode = {"any": "required"}.get(choice["type"], choice["type"])
    return mode, choice.get("name")


def tool_choice_refusal(body: dict[str, Any]) -> str | None:
    """The API's 400 for the request's tool choice, or None."""
    if "tool_choice" not in body:
        return None
    mode, name = tool_choice(body)
    if problem := tool_choice_problem(mode, name, [t["name"] for t in body.get("tools", [])]):
        return problem
    if mode in ("required", "tool") and body.get("thinking", {}).get("type", "disabled") \
            != "disabled":
        return "Thinking may not be enabled when tool_choice forces tool use."
    return None


# -- rendering ------------------------------------------------------------------------------


def wire_usage(response: Response) -> dict[str, int]:
    u = response.usage
    assert u.input_tokens >= u.cache_read_tokens, "cache reads are part of the input total"
    return {
        "input_tokens": u.input_tokens - u.cache_read_tokens,
        "output_tokens": u.output_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
    }


def wire_block(block: Any) -> dict[str, Any] | None:
    match block:
        case TextBlock(text=text):
            return {"type": "text", "text": text}
        case ToolUse(id=id_, name=name, input=args):
            return {"type": "tool_use", "id": id_, "name": name, "input": args}
        case OpaqueBlock(provider="anthropic", raw=raw):
            return json.loads(raw)
    return None  # another provider's opaque block: Anthropic never sends one


def message_body(response: Response, *, model: str, msg_id: str = "msg_fake") -> dict[str, Any]:
    """The non-streaming Messages API reply for ``response``."""
    content = [b for b in map(wire_block, response.message.blocks) if b is not None]
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": response.model or model,
        "content": content,
        "stop_reason": STOP_TO_WIRE[response.stop_reason],
        "stop_sequence": None,
        "usage": wire_usage(response),
    }


def _block_events(i: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    def delta(d: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}

    kind = block["type"]
    if kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [delta({"type": "text_delta", "text": p}) for p in pieces(block["text"], 12)]
    elif kind == "tool_use":
        start = {**block, "input": {}}
        args = json.dumps(block["input"])
        deltas = [delta({"type": "input_json_delta", "partial_json": p})
                  for p in ["", *pieces(args, 7)]]
    elif kind == "thinking":
        start = {k: "" if k in ("thinking", "signature") else v for k, v in block.items()}
        deltas = [delta({"type": "thinking_delta", "thinking": p})
                  for p in pieces(block["thinking"], 10)]
        deltas.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    else:  # redacted_thinking and the like arrive whole
        start, deltas = block, []
    return [
        ("content_block_start",
         {"type": "content_block_start", "index": i, "content_block": start}),
        *deltas,
        ("content_block_stop", {"type": "content_block_stop", "index": i}),
    ]


def stream_events(response: Response, *, model: str, msg_id: str = "msg_fake",
                  ) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events (name, data) of a streamed reply for ``response``."""
    body = message_body(response, model=model, msg_id=msg_id)
    usage = body["usage"]
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": min(usage["output_tokens"], 1)}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(body["content"]):
        events += _block_events(i, block)
        if i == 0:
            events.append(("ping", {"type": "ping"}))
    events.append(("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": usage["output_tokens"]},
    }))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def error_body(error_type: str, message: str, request_id: str = "req_fake") -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message},
            "request_id": request_id}


# -- the server --------------------------------------------------------------------------------


class FakeAnthropic:
    """``with FakeAnthropic() as fake:`` serves ``fake.url`` until the block ends.

    A wire-format failure inside the server (``WireDrift`` or any other exception) is
    recorded and re-raised when the block exits, so it fails the test even if the adapter
    coped with the dropped connection it caused.
    """

    def __init__(self) -> None:
        self._steps: deque[FakeStep] = deque()
        self._lock = threading.Lock()
        self._count = 0
        self.failures: list[BaseException] = []
        self.hanging = threading.Event()  # set once a Hang step is waiting on the client
        self.server = LoopbackServer(self._respond)

    def __enter__(self) -> FakeAnthropic:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)
        if self.failures and exc[0] is None:
            raise self.failures[0]

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def requests(self) -> list[Recorded]:
        return self.server.requests

    @property
    def exchanges(self) -> list[Exchange]:
        return self.server.exchanges

    def script(self, *steps: FakeStep) -> None:
        with self._lock:
            self._steps.extend(steps)

    @property
    def remaining(self) -> int:
        return len(self._steps)

    def _next(self) -> tuple[FakeStep | None, str]:
        with self._lock:
            self._count += 1
            return (self._steps.popleft() if self._steps else None), f"msg_fake_{self._count}"

    # Each request is answered in its own server thread.
    def _respond(self, rec: Recorded, ex: Exchange) -> None:
        try:
            self._answer(rec, ex)
        except (BrokenPipeError, ConnectionResetError):
            raise
        except BaseException as e:
            self.failures.append(e)
            ex.drop()

    def _answer(self, rec: Recorded, ex: Exchange) -> None:
        if rec.path != "/v1/messages":
            return self._error(ex, 404, "not_found_error", f"no route {rec.path}")
        if not rec.headers.get("x-api-key"):
            return self._error(ex, 401, "authentication_error", "x-api-key header is required")
        if not rec.headers.get("anthropic-version"):
            return self._error(ex, 400, "invalid_request_error",
                               "anthropic-version header is required")
        body = rec.body
        try:
            check_request(body)
        except WireDrift as e:
            self.failures.append(e)
            return self._error(ex, 400, "invalid_request_error", str(e))
        if refusal := tool_choice_refusal(body):
            return self._error(ex, 400, "invalid_request_error", refusal)
        step, msg_id = self._next()
        if isinstance(step, Response) and (broken := contradiction(
                *tool_choice(body), [c.name for c in step.message.tool_uses()])):
            self.failures.append(WireDrift(f"scripted reply: {broken}, which the API never "
                                           "sends"))
            return self._error(ex, 400, "invalid_request_error", f"fake: {broken}")
        streaming = body.get("stream") is True
        model = body["model"]
        match step:
            case None:
                self._error(ex, 400, "invalid_request_error", "fake anthropic: script used up")
            case HTTPError(status=status, kind=kind, retry_after=after, message=message):
                headers = {"retry-after": f"{after:g}"} if after is not None else {}
                self._error(ex, status, KIND_TO_ERROR_TYPE.get(kind, "api_error"), message,
                            headers)
            case Response() if streaming:
                self._stream(ex, stream_events(step, model=model, msg_id=msg_id))
            case Response():
                self._json(ex, message_body(step, model=model, msg_id=msg_id))
            case Body(body=reply):
                self._json(ex, reply)
            case Events(events=events):
                self._stream(ex, list(events))
            case StreamError(response=r, error_type=etype, message=message, after_events=n):
                events = stream_events(r, model=model, msg_id=msg_id)[:n]
                self._stream(ex, [*events, ("error", error_body(etype, message))])
            case DropMidStream(response=r, after_events=n):
                if streaming:
                    self._stream(ex, stream_events(r, model=model, msg_id=msg_id)[:n])
                else:
                    self._partial_json(ex, message_body(r, model=model, msg_id=msg_id))
                ex.drop()
            case MalformedEvent(response=r, after_events=n):
                if streaming:
                    self._stream(ex, stream_events(r, model=model, msg_id=msg_id)[:n])
                    ex.send_event("{not json", "content_block_delta")
                else:
                    self._partial_json(ex, message_body(r, model=model, msg_id=msg_id),
                                       complete=True)
            case Hang(response=r, after_events=n):
                if streaming:
                    self._stream(ex, stream_events(r, model=model, msg_id=msg_id)[:n])
                self.hanging.set()
                ex.hang_until_client_leaves()
            case _:
                raise TypeError(f"unknown script step {step!r}")
        return None

    def _json(self, ex: Exchange, body: dict[str, Any]) -> None:
        check_message(body)
        ex.send_json(200, body, {"request-id": "req_fake"})

    def _error(self, ex: Exchange, status: int, error_type: str, message: str,
               headers: dict[str, str] | None = None) -> None:
        body = error_body(error_type, message)
        check_error(body)
        ex.send_json(status, body, {"request-id": "req_fake", **(headers or {})})

    def _stream(self, ex: Exchange, events: list[tuple[str, dict[str, Any]]]) -> None:
        ex.start_stream({"request-id": "req_fake"})
        for name, data in events:
            check_event(name, data)
            ex.send_event(json.dumps(data), name)

    def _partial_json(self, ex: Exchange, body: dict[str, Any], complete: bool = False) -> None:
        """A 200 whose JSON body is cut in half: dropped before the end, or (``complete``)
        delivered in full as the broken text it is."""
        check_message(body)
        whole = json.dumps(body).encode()
        data = whole[: len(whole) // 2]
        ex.send_bytes(200, data, length=len(data) if complete else len(whole))
