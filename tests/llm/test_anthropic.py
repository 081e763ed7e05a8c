"""Anthropic-specific behaviour of ``AnthropicModel`` against ``FakeAnthropic``: the wire
encoding, verbatim thinking replay, cache markers, usage normalisation, SSE edge cases, fault
injection, cancellation and key secrecy. The generic behaviours are in ``test_contract.py``.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from runtime.llm import (
    CacheHint,
    ConfigurationError,
    Fault,
    ImageBlock,
    LLMError,
    Message,
    OpaqueBlock,
    OpaqueDone,
    Request,
    Response,
    RetryPolicy,
    Role,
    Sampling,
    Stop,
    StopReason,
    TextBlock,
    TextDelta,
    Tool,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    ToolUse,
    Usage,
    UsageUpdate,
    assemble,
)
from runtime.llm.providers.anthropic import THINKING_BUDGETS, AnthropicModel, thinking_style

from .fake_anthropic import (
    Body,
    Events,
    FakeAnthropic,
    StreamError,
    WireDrift,
    check_event,
    check_message,
    check_request,
    message_body,
)
from .harness import Sleeps, policy
from .loopback import LoopbackServer
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent

pytestmark = pytest.mark.anyio

KEY = "sk-ant-api03-SECRET-do-not-leak-4242"
MODEL = "claude-sonnet-4-5"
THINKING = '{"type":"thinking","thinking":"Rain means umbrella.","signature":"RXVfc2lnbmVk+/=="}'
REDACTED = '{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"}'
WEATHER = Tool(name="get_weather", description="Weather for a city.",
               input_schema={"type": "object", "properties": {"city": {"type": "string"}}})


def connect(url: str, *, retry: RetryPolicy | None = None, **kw: Any) -> AnthropicModel:
    return AnthropicModel(MODEL, api_key=KEY, base_url=url,
                          retry=retry or RetryPolicy(max_attempts=1), **kw)


def reply(*blocks: Any, stop: StopReason = StopReason.END_TURN,
          usage: Usage | None = None) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(message=Message(role=Role.ASSISTANT, blocks=content), stop_reason=stop,
                    usage=usage or Usage(input_tokens=10, output_tokens=4))


def ask(text: str = "Hi", **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), max_tokens=256, **kw)


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- configuration -----------------------------------------------------------------------


def test_the_adapter_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configuration is resolved in one place (``resolve_model``): the adapter takes what it
    is given, and a key or base URL in the environment changes nothing."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/")
    with pytest.raises(ConfigurationError, match="api_key"):
        AnthropicModel(MODEL)
    model = AnthropicModel(MODEL, api_key="sk-ant-given")
    assert model.base_url == "https://api.anthropic.com"
    assert AnthropicModel(MODEL, api_key=KEY, base_url="https://gw.example/").base_url == (
        "https://gw.example")
    assert (model.name, model.provider) == (MODEL, "anthropic")


def test_a_missing_key_is_a_configuration_error() -> None:
    for key in (None, ""):
        with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
            AnthropicModel(MODEL, api_key=key)


@pytest.mark.parametrize("url", ["http://api.example.com", "ftp://127.0.0.1",
                                 f"http://user:{KEY}@evil.example:80/"])
def test_an_unsafe_base_url_is_refused_without_echoing_secrets(url: str) -> None:
    with pytest.raises(ConfigurationError, match="https") as info:
        AnthropicModel(MODEL, api_key=KEY, base_url=url)
    assert KEY not in str(info.value) and KEY not in repr(info.value)


def test_repr_names_the_model_but_not_the_key() -> None:
    text = repr(AnthropicModel(MODEL, api_key=KEY, base_url="https://gw.example"))
    assert MODEL in text and "gw.example" in text and KEY not in text


# -- request encoding --------------------------------------------------------------------


async def test_a_minimal_request_is_compact_deterministic_json(fake: FakeAnthropic) -> None:
    fake.script(reply("a"), reply("b"))
    async with connect(fake.url) as model:
        await model.generate(ask())
        await model.generate(ask())
    sent = [r.raw for r in fake.requests]
    assert sent[0] == sent[1] == (
        b'{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":'
        b'[{"type":"text","text":"Hi"}]}],"max_tokens":256}'
    )
    headers = fake.requests[0].headers
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert headers["content-type"] == "application/json"
    assert fake.requests[0].path == "/v1/messages"


async def test_the_full_vocabulary_on_the_wire(fake: FakeAnthropic) -> None:
    use = ToolUse(id="toolu_1", name="get_weather", input={"city": "Oslo"})
    request = Request(
        system="Be brief.",
        tools=(WEATHER, Tool(name="noop")),
        messages=(
            Message(role=Role.USER, blocks=(TextBlock(text="Look:"),
                                            ImageBlock(media_type="IMAGE/PNG", data=b"\x89PNG"))),
            Message(role=Role.ASSISTANT, blocks=(TextBlock(text=""), use)),
            Message(role=Role.USER, blocks=(
                ToolResult(tool_use_id="toolu_1", content="boom", is_error=True),
                ToolResult(tool_use_id="toolu_2", content="ok"))),
            Message(role=Role.SYSTEM, blocks=(TextBlock(text="Answer in French."),)),
        ),
    )
    fake.script(reply("ok"))
    async with connect(fake.url, max_tokens=1000) as model:
        await model.generate(request)
    assert fake.requests[0].body == {
        "model": MODEL,
        "tools": [
            {"name": "get_weather", "description": "Weather for a city.",
             "input_schema": WEATHER.input_schema},
            {"name": "noop", "input_schema": {"type": "object"}},
        ],
        "system": [{"type": "text", "text": "Be brief."},
                   {"type": "text", "text": "Answer in French."}],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(b"\x89PNG").decode()}}]},
            {"role": "assistant", "content": [  # the empty text block is dropped
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom",
                 "is_error": True},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "ok"}]},
        ],
        "max_tokens": 1000,
    }


async def test_streaming_requests_say_so_at_the_end(fake: FakeAnthropic) -> None:
    fake.script(reply("a"))
    async with connect(fake.url) as model:
        await assemble(model.stream(ask()))
    raw = fake.requests[0].raw
    assert raw.endswith(b',"stream":true}')


async def test_an_unsupported_image_is_refused_before_anything_is_sent(
        fake: FakeAnthropic) -> None:
    request = Request(messages=(Message(role=Role.USER, blocks=(
        ImageBlock(media_type="image/bmp", data=b"BM"),)),))
    async with connect(fake.url) as model:
        with pytest.raises(LLMError, match="image/bmp") as info:
            await model.generate(request)
        with pytest.raises(LLMError, match="image/bmp"):
            await assemble(model.stream(request))
    assert info.value.fault is Fault.TERMINAL
    assert fake.requests == []


@pytest.mark.parametrize("sampling", [
    Sampling(temperature=0.0, seed=7),
    Sampling(temperature=0.7, top_p=0.9),
    Sampling(temperature=1.8, top_p=1.0),
])
async def test_sampling_is_not_sent_to_anthropic(fake: FakeAnthropic, sampling: Sampling) -> None:
    """The Messages API (as the SDK types it) has no sampling knobs: the body is the one
    without sampling, byte for byte, and the fake accepts it against the SDK params."""
    fake.script(reply("ok"), reply("ok"))
    async with connect(fake.url) as model:
        await model.generate(ask(sampling=sampling))
        await model.generate(ask())
    assert fake.requests[0].raw == fake.requests[1].raw
    assert not {"temperature", "top_p", "top_k", "seed"} & set(fake.requests[0].body)


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
@pytest.mark.parametrize("model_id", ["claude-sonnet-4-5", "claude-opus-4-1-20250805",
                                      "claude-3-7-sonnet-latest"])
async def test_reasoning_effort_on_older_models_buys_a_thinking_budget(
        fake: FakeAnthropic, effort: Any, model_id: str) -> None:
    fake.script(reply("ok"))
    async with AnthropicModel(model_id, api_key=KEY, base_url=fake.url) as model:
        await model.generate(ask(reasoning_effort=effort, sampling=Sampling(temperature=0.2)))
    body = fake.requests[0].body
    budget = THINKING_BUDGETS[effort]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == 256 + budget  # the budget on top of the answer
    assert "output_config" not in body and "temperature" not in body


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
@pytest.mark.parametrize("model_id", ["claude-opus-4-7", "claude-sonnet-4-6", "claude-opus-5"])
async def test_reasoning_effort_on_current_models_is_adaptive_thinking_at_that_effort(
        fake: FakeAnthropic, effort: Any, model_id: str) -> None:
    fake.script(reply("ok"))
    async with AnthropicModel(model_id, api_key=KEY, base_url=fake.url) as model:
        await model.generate(ask(reasoning_effort=effort))
    raw, body = fake.requests[0].raw, fake.requests[0].body
    assert body["thinking"] == {"type": "adaptive"}
    assert body["output_config"] == {"effort": effort}
    assert body["max_tokens"] == 256 + THINKING_BUDGETS[effort]  # headroom for the thinking
    assert raw.endswith(b'"thinking":{"type":"adaptive"},"output_config":{"effort":"'
                        + effort.encode() + b'"}}')


async def test_no_reasoning_effort_sends_no_thinking(fake: FakeAnthropic) -> None:
    fake.script(reply("ok"), reply("ok"))
    for model_id in ("claude-sonnet-4-5", "claude-opus-4-7"):
        async with AnthropicModel(model_id, api_key=KEY, base_url=fake.url) as model:
            await model.generate(ask())
    for rec in fake.requests:
        assert not {"thinking", "output_config"} & set(rec.body)
        assert rec.body["max_tokens"] == 256


@pytest.mark.parametrize(("model_id", "style"), [
    ("claude-sonnet-4-5", "budget"), ("claude-sonnet-4-5-20250929", "budget"),
    ("claude-haiku-4-5", "budget"), ("claude-opus-4-5@20251101", "budget"),
    ("claude-opus-4-1", "budget"), ("claude-sonnet-4-0", "budget"),
    ("claude-sonnet-4-20250514", "budget"), ("claude-opus-4", "budget"),
    ("claude-3-7-sonnet-20250219", "budget"),
    ("claude-sonnet-4-6", "adaptive"), ("claude-opus-4-6", "adaptive"),
    ("claude-opus-4-7", "adaptive"), ("claude-opus-4-50", "adaptive"),
    ("claude-sonnet-5-5", "adaptive"), ("claude-haiku-5-5", "adaptive"),
    ("my-gateway-alias", "adaptive"),
])
def test_thinking_style_by_model(model_id: str, style: str) -> None:
    assert thinking_style(model_id) == style


async def test_the_thinking_style_can_be_set(fake: FakeAnthropic) -> None:
    fake.script(reply("ok"))
    async with AnthropicModel("corp-claude", api_key=KEY, base_url=fake.url,
                              thinking="budget") as model:
        await model.generate(ask(reasoning_effort="medium"))
    assert fake.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 4096}


# -- cache markers -----------------------------------------------------------------------

MARK = {"type": "ephemeral"}


def marked(body: dict[str, Any]) -> list[str]:
    """Where the cache_control markers are, as readable paths."""
    where = [f"{k}[{i}]" for k in ("tools", "system")
             for i, b in enumerate(body.get(k, [])) if b.get("cache_control") == MARK]
    where += [f"messages[{i}][{j}]" for i, m in enumerate(body["messages"])
              for j, b in enumerate(m["content"]) if b.get("cache_control") == MARK]
    return where


def history() -> tuple[Message, ...]:
    use = ToolUse(id="toolu_9", name="get_weather", input={"city": "Bergen"})
    return (
        Message.text(Role.USER, "Weather?"),
        Message(role=Role.ASSISTANT, blocks=(TextBlock(text="Checking."), use)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="toolu_9", content="rain"),)),
        Message(role=Role.ASSISTANT, blocks=(TextBlock(text="Rain."),
                                             OpaqueBlock(provider="anthropic", raw=THINKING))),
    )


@pytest.mark.parametrize(("hint", "where"), [
    (CacheHint(), []),
    (CacheHint(prefix=True), ["tools[1]", "system[0]"]),
    (CacheHint(stable_messages=1), ["messages[0][0]"]),
    (CacheHint(prefix=True, stable_messages=2), ["tools[1]", "system[0]", "messages[1][1]"]),
    # message 3 ends in a thinking block, which cannot carry a marker: the text before it does
    (CacheHint(stable_messages=4), ["messages[3][0]"]),
    (CacheHint(stable_messages=99), ["messages[3][0]"]),
    (CacheHint(key="conv-1"), []),  # Anthropic has no routing key
])
async def test_cache_markers_land_on_the_declared_boundaries(
        fake: FakeAnthropic, hint: CacheHint, where: list[str]) -> None:
    fake.script(reply("ok"))
    request = Request(system="Sys.", tools=(WEATHER, Tool(name="noop")), messages=history(),
                      cache=hint)
    async with connect(fake.url) as model:
        await model.generate(request)
    assert marked(fake.requests[0].body) == where
    assert fake.requests[0].raw.count(b"cache_control") == len(where)
    assert b"conv-1" not in fake.requests[0].raw


# -- thinking blocks ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_thinking_blocks_come_back_as_opaque_compact_json(fake: FakeAnthropic,
                                                                mode: str) -> None:
    want = reply(OpaqueBlock(provider="anthropic", raw=THINKING),
                 OpaqueBlock(provider="anthropic", raw=REDACTED), "Take an umbrella.",
                 ToolUse(id="toolu_1", name="get_weather", input={"city": "Oslo", "days": [1, 2]}),
                 stop=StopReason.TOOL_USE)
    fake.script(want)
    async with connect(fake.url) as model:
        if mode == "generate":
            got = await model.generate(ask())
        else:
            got = await assemble(model.stream(ask()))
    assert got.message == want.message
    assert got.model == MODEL


async def test_opaque_blocks_are_spliced_back_byte_for_byte(fake: FakeAnthropic) -> None:
    # Deliberately not in our own compact encoding: spacing, key order and escapes survive.
    odd = '{ "signature": "c2ln\\u002Bx", "type": "thinking",\n "thinking": "caf\u00e9 \\"q\\"" }'
    request = ask().model_copy(update={"messages": (
        Message.text(Role.USER, "Hi"),
        Message(role=Role.ASSISTANT, blocks=(
            OpaqueBlock(provider="anthropic", raw=odd),
            OpaqueBlock(provider="openai", raw='{"type":"reasoning","id":"rs_1"}'),
            TextBlock(text="Hello."))),
        Message.text(Role.USER, "More"),
    )})
    fake.script(reply("ok"))
    async with connect(fake.url) as model:
        await model.generate(request)
    raw = fake.requests[0].raw
    assert b'"content":[' + odd.encode() + b',{"type":"text","text":"Hello."}]' in raw
    assert b"rs_1" not in raw  # another provider's opaque block is dropped


async def test_a_broken_opaque_block_is_refused(fake: FakeAnthropic) -> None:
    request = ask().model_copy(update={"messages": (
        Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider="anthropic", raw="[1,"),)),
        Message.text(Role.USER, "Hi"))})
    async with connect(fake.url) as model:
        with pytest.raises(LLMError, match="opaque") as info:
            await model.generate(request)
    assert info.value.fault is Fault.TERMINAL and fake.requests == []


# -- decoding: usage and stop reasons ----------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_usage_counts_cache_reads_inside_the_input_and_writes_beside_it(
        fake: FakeAnthropic, mode: str) -> None:
    fake.script(reply("ok", usage=Usage(input_tokens=1000, output_tokens=7,
                                        cache_read_tokens=900, cache_write_tokens=60)))
    async with connect(fake.url) as model:
        got = await (model.generate(ask()) if mode == "generate"
                     else assemble(model.stream(ask())))
    # on the wire: input_tokens=100, cache_read_input_tokens=900, cache_creation=60
    assert got.usage == Usage(input_tokens=1000, output_tokens=7, cache_read_tokens=900,
                              cache_write_tokens=60)


def _message(**over: Any) -> dict[str, Any]:
    body = message_body(reply("x"), model=MODEL)
    body.update(over)
    return body


@pytest.mark.parametrize(("wire", "port"), [
    ("end_turn", StopReason.END_TURN),
    ("stop_sequence", StopReason.END_TURN),
    ("pause_turn", StopReason.END_TURN),
    ("tool_use", StopReason.TOOL_USE),
    ("max_tokens", StopReason.MAX_TOKENS),
    ("refusal", StopReason.REFUSAL),
    ("model_context_window_exceeded", StopReason.CONTEXT_EXCEEDED),
])
async def test_stop_reasons_are_mapped(fake: FakeAnthropic, wire: str, port: StopReason) -> None:
    fake.script(Body(_message(stop_reason=wire, stop_sequence="STOP" if wire == "stop_sequence"
                              else None)))
    async with connect(fake.url) as model:
        assert (await model.generate(ask())).stop_reason is port


async def test_usage_missing_cache_fields_counts_zero(fake: FakeAnthropic) -> None:
    fake.script(Body(_message(usage={"input_tokens": 5, "output_tokens": 2})))
    async with connect(fake.url) as model:
        assert (await model.generate(ask())).usage == Usage(input_tokens=5, output_tokens=2)


# -- streaming ---------------------------------------------------------------------------


def ev(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
    return kind, {"type": kind, **data}


START = ev("message_start", message={
    "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "content": [],
    "stop_reason": None, "stop_sequence": None,
    "usage": {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 0,
              "cache_creation_input_tokens": 0}})
STOP = ev("message_stop")


def delta(i: int, **d: Any) -> tuple[str, dict[str, Any]]:
    return ev("content_block_delta", index=i, delta=d)


async def test_stream_events_in_order(fake: FakeAnthropic) -> None:
    fake.script(Events((
        START,
        ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        ev("ping"),
        delta(0, type="text_delta", text="Let me "),
        delta(0, type="text_delta", text="check."),
        ev("content_block_stop", index=0),
        ev("content_block_start", index=1, content_block={
            "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
        delta(1, type="input_json_delta", partial_json=""),
        delta(1, type="input_json_delta", partial_json='{"city": "Os'),
        delta(1, type="input_json_delta", partial_json='lo"}'),
        ev("content_block_stop", index=1),
        ev("content_block_start", index=2, content_block={
            "type": "thinking", "thinking": "", "signature": ""}),
        delta(2, type="thinking_delta", thinking="Hm"),
        delta(2, type="thinking_delta", thinking="m."),
        delta(2, type="signature_delta", signature="c2ln"),
        ev("content_block_stop", index=2),
        ev("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None},
           usage={"output_tokens": 30, "input_tokens": 20, "cache_read_input_tokens": 5,
                  "cache_creation_input_tokens": None}),
        STOP,
    )))
    async with connect(fake.url) as model:
        events = [e async for e in model.stream(ask())]
    assert events == [
        UsageUpdate(usage=Usage(input_tokens=20, output_tokens=1)),
        TextDelta(index=0, text=""),
        TextDelta(index=0, text="Let me "),
        TextDelta(index=0, text="check."),
        ToolCallStart(index=1, id="toolu_1", name="get_weather"),
        ToolCallDelta(index=1, arguments=""),
        ToolCallDelta(index=1, arguments='{"city": "Os'),
        ToolCallDelta(index=1, arguments='lo"}'),
        ToolCallEnd(index=1),
        OpaqueDone(index=2, block=OpaqueBlock(
            provider="anthropic",
            raw='{"type":"thinking","thinking":"Hmm.","signature":"c2ln"}')),
        # message_delta's non-null counts replace message_start's
        UsageUpdate(usage=Usage(input_tokens=25, output_tokens=30, cache_read_tokens=5)),
        Stop(stop_reason=StopReason.TOOL_USE, model=MODEL),
    ]


async def test_stream_assembles_to_what_generate_returns(fake: FakeAnthropic) -> None:
    want = reply(OpaqueBlock(provider="anthropic", raw=THINKING), "Sure — ünïcödé ok. " * 5,
                 ToolUse(id="a", name="get_weather", input={"city": "Oslo"}),
                 ToolUse(id="b", name="noop", input={}),
                 stop=StopReason.TOOL_USE,
                 usage=Usage(input_tokens=50, output_tokens=9, cache_read_tokens=40,
                             cache_write_tokens=3))
    fake.script(want, want)
    async with connect(fake.url) as model:
        generated = await model.generate(ask())
        streamed = await assemble(model.stream(ask()))
    assert streamed == generated
    assert generated.message == want.message and generated.usage == want.usage


async def test_a_stream_that_ends_before_message_stop_is_a_transient_fault(
        fake: FakeAnthropic) -> None:
    fake.script(Events((START, ev("content_block_start", index=0,
                                  content_block={"type": "text", "text": "Hi"}))))
    async with connect(fake.url) as model:
        with pytest.raises(LLMError, match="message_stop") as info:
            await assemble(model.stream(ask()))
    assert (info.value.fault, info.value.status) == (Fault.TRANSIENT, None)


@pytest.mark.parametrize(("error_type", "fault"), [
    ("overloaded_error", Fault.TRANSIENT),
    ("api_error", Fault.TRANSIENT),
    ("rate_limit_error", Fault.TRANSIENT),
    ("billing_error", Fault.TERMINAL),
    ("invalid_request_error", Fault.TERMINAL),
])
async def test_an_error_event_mid_stream_is_classified_by_its_type(
        fake: FakeAnthropic, error_type: str, fault: Fault) -> None:
    fake.script(StreamError(reply("partial answer"), error_type=error_type,
                            message="It broke", after_events=3))
    seen: list[Any] = []
    async with connect(fake.url, retry=policy(Sleeps())) as model:
        with pytest.raises(LLMError, match="It broke") as info:
            async for e in model.stream(ask()):
                seen.append(e)
    assert info.value.fault is fault and info.value.provider == "anthropic"
    assert error_type in str(info.value)
    assert seen and not any(isinstance(e, Stop) for e in seen)
    assert len(fake.requests) == 1  # output was delivered: never replayed


async def test_an_error_event_before_any_output_is_retried(fake: FakeAnthropic) -> None:
    sleeps = Sleeps()
    fake.script(StreamError(reply("x"), after_events=0), reply("second try"))
    async with connect(fake.url, retry=policy(sleeps)) as model:
        got = await assemble(model.stream(ask()))
    assert got.message.text_content() == "second try"
    assert len(fake.requests) == 2 and len(sleeps.waits) == 1


# -- fault injection ---------------------------------------------------------------------

MODES = ["generate", "stream"]


async def run(model: AnthropicModel, mode: str, request: Request | None = None) -> Response:
    request = request or ask()
    if mode == "generate":
        return await model.generate(request)
    return await assemble(model.stream(request))


@pytest.mark.parametrize("mode", MODES)
async def test_429_honours_retry_after_then_succeeds(fake: FakeAnthropic, mode: str) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(429, "rate_limit", retry_after=3.5),
                HTTPError(429, "rate_limit", retry_after=1), reply("done"))
    async with connect(fake.url, retry=policy(sleeps, attempts=3)) as model:
        got = await run(model, mode)
    assert got.message.text_content() == "done"
    assert sleeps.waits == [3.5, 1.0] and len(fake.requests) == 3


@pytest.mark.parametrize("mode", MODES)
async def test_429_without_retry_after_backs_off_exponentially(fake: FakeAnthropic,
                                                              mode: str) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(429, "rate_limit"), HTTPError(429, "rate_limit"), reply("done"))
    retry = RetryPolicy(max_attempts=3, base_delay=1.0, jitter=0.0, sleep=sleeps,
                        clock=lambda: 0.0)
    async with connect(fake.url, retry=retry) as model:
        await run(model, mode)
    assert sleeps.waits == [1.0, 2.0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("status", "step"), [
    (429, HTTPError(429, "quota", message="Insufficient funds")),
    (429, HTTPError(429, "rate_limit", message="Your credit balance is too low.")),
    (400, HTTPError(400, "bad_request", message="Your credit balance is too low.")),
])
async def test_an_exhausted_quota_fails_at_once_with_one_request(
        fake: FakeAnthropic, mode: str, status: int, step: HTTPError) -> None:
    sleeps = Sleeps()
    fake.script(step, reply("never"))
    async with connect(fake.url, retry=policy(sleeps)) as model:
        with pytest.raises(LLMError) as info:
            await run(model, mode)
    err = info.value
    assert (err.fault, err.status, err.provider) == (Fault.TERMINAL, status, "anthropic")
    assert err.message == step.message
    assert len(fake.requests) == 1 and sleeps.waits == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_retried_within_the_bound(fake: FakeAnthropic, mode: str,
                                                          status: int) -> None:
    sleeps = Sleeps()
    kind = "overloaded" if status == 529 else "server"
    fake.script(*(HTTPError(status, kind, message=f"down {i}") for i in range(4)), reply("late"))
    async with connect(fake.url, retry=policy(sleeps, attempts=4)) as model:
        with pytest.raises(LLMError) as info:
            await run(model, mode)
    assert (info.value.fault, info.value.status) == (Fault.TRANSIENT, status)
    assert info.value.message == "down 3"
    assert len(fake.requests) == 4 and len(sleeps.waits) == 3
    assert fake.remaining == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("status", "kind"), [(400, "bad_request"), (401, "auth"),
                                              (403, "permission"), (404, "not_found")])
async def test_client_errors_are_terminal_with_one_request(fake: FakeAnthropic, mode: str,
                                                           status: int, kind: str) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(status, kind, message="messages: field required"), reply("never"))
    async with connect(fake.url, retry=policy(sleeps)) as model:
        with pytest.raises(LLMError) as info:
            await run(model, mode)
    assert (info.value.fault, info.value.status) == (Fault.TERMINAL, status)
    assert info.value.message.startswith("messages: field required")
    assert len(fake.requests) == 1 and sleeps.waits == []


def _odd_server(status: int, body: bytes, content_type: str) -> LoopbackServer:
    def respond(rec: Any, ex: Any) -> None:
        ex.send_bytes(status, body, content_type)

    return LoopbackServer(respond)


async def test_a_non_json_error_page_still_gets_a_status_and_a_class() -> None:
    with _odd_server(502, b"<html>Bad Gateway</html>", "text/html") as srv:
        async with connect(srv.url) as model:
            with pytest.raises(LLMError) as info:
                await model.generate(ask())
    assert (info.value.fault, info.value.status, info.value.message) == (
        Fault.TRANSIENT, 502, "HTTP 502 Bad Gateway")


@pytest.mark.parametrize("mode", MODES)
async def test_connection_refused_is_transient_and_retried(mode: str) -> None:
    sleeps = Sleeps()
    async with connect(f"http://127.0.0.1:{free_port()}", retry=policy(sleeps)) as model:
        with pytest.raises(LLMError, match="could not connect") as info:
            await run(model, mode)
    assert (info.value.fault, info.value.status) == (Fault.TRANSIENT, None)
    assert len(sleeps.waits) == 2


async def test_a_connection_dropped_mid_stream_fails_after_the_delivered_events(
        fake: FakeAnthropic) -> None:
    fake.script(DropMidStream(reply("This never completes."), after_events=4), reply("unused"))
    seen: list[Any] = []
    async with connect(fake.url, retry=policy(Sleeps())) as model:
        with pytest.raises(LLMError) as info:
            async for e in model.stream(ask()):
                seen.append(e)
    assert (info.value.fault, info.value.status) == (Fault.TRANSIENT, None)
    assert any(isinstance(e, TextDelta) and e.text for e in seen)
    assert len(fake.requests) == 1  # partial output is never replayed


@pytest.mark.parametrize("mode", MODES)
async def test_a_connection_dropped_before_any_output_is_retried(fake: FakeAnthropic,
                                                                 mode: str) -> None:
    sleeps = Sleeps()
    fake.script(DropMidStream(reply("lost"), after_events=0), reply("recovered"))
    async with connect(fake.url, retry=policy(sleeps)) as model:
        got = await run(model, mode)
    assert got.message.text_content() == "recovered"
    assert len(fake.requests) == 2 and len(sleeps.waits) == 1


async def test_a_malformed_event_is_a_terminal_protocol_error(fake: FakeAnthropic) -> None:
    sleeps = Sleeps()
    fake.script(MalformedEvent(reply("Hello"), after_events=2), reply("unused"))
    async with connect(fake.url, retry=policy(sleeps)) as model:
        with pytest.raises(LLMError, match="malformed") as info:
            await assemble(model.stream(ask()))
    assert (info.value.fault, info.value.status) == (Fault.TERMINAL, None)
    assert len(fake.requests) == 1 and sleeps.waits == []


async def test_a_whole_body_that_is_not_json_is_not_retried(fake: FakeAnthropic) -> None:
    """A 200 whose body arrived in full (its content-length honoured) but is not JSON comes
    from a broken server: a terminal protocol error, not worth the backoff."""
    sleeps = Sleeps()
    fake.script(MalformedEvent(reply("lost")), reply("unused"))
    async with connect(fake.url, retry=policy(sleeps)) as model:
        with pytest.raises(LLMError, match="not JSON") as info:
            await model.generate(ask())
    assert info.value.fault is Fault.TERMINAL
    assert len(fake.requests) == 1 and sleeps.waits == []


# -- cancellation ------------------------------------------------------------------------


async def test_cancelling_a_stream_returns_promptly_and_closes_the_connection(
        fake: FakeAnthropic) -> None:
    fake.script(Hang(reply("never finished"), after_events=3))
    first = anyio.Event()
    async with connect(fake.url) as model:

        async def consume() -> None:
            async for _ in model.stream(ask()):
                first.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await first.wait()
                assert await anyio.to_thread.run_sync(fake.hanging.wait, 5)
                cancelled_at = time.monotonic()
                tg.cancel_scope.cancel()
        assert time.monotonic() - cancelled_at < 1.0
        closed = await anyio.to_thread.run_sync(fake.exchanges[0].closed_by_client.wait, 5)
    assert closed


async def test_cancelling_generate_closes_the_connection(fake: FakeAnthropic) -> None:
    fake.script(Hang(reply("never finished")), reply("next"))
    async with connect(fake.url) as model:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(model.generate, ask())
                assert await anyio.to_thread.run_sync(fake.hanging.wait, 5)
                tg.cancel_scope.cancel()
        assert await anyio.to_thread.run_sync(fake.exchanges[0].closed_by_client.wait, 5)
        assert (await model.generate(ask())).message.text_content() == "next"


# -- the key stays secret ----------------------------------------------------------------


async def test_the_key_never_reaches_errors_reprs_or_logs(
        fake: FakeAnthropic, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "runtime"):
        caplog.set_level(logging.DEBUG, logger=name)
    errors: list[BaseException] = []
    fake.script(
        HTTPError(401, "auth", message=f"invalid x-api-key: {KEY}"),  # a server echoing it
        HTTPError(400, "bad_request"),
        DropMidStream(reply("gone"), after_events=2),
        MalformedEvent(reply("bad"), after_events=1),
        StreamError(reply("x"), error_type="api_error", message=f"key {KEY} rejected"),
    )
    async with connect(fake.url) as model:
        assert KEY not in repr(model)
        for mode in ("generate", "generate", "stream", "stream", "stream"):
            with pytest.raises(LLMError) as info:
                await run(model, mode)
            errors.append(info.value)
    async with connect(f"http://127.0.0.1:{free_port()}") as model:
        with pytest.raises(LLMError) as info:
            await model.generate(ask())
        errors.append(info.value)
    assert len(errors) == 6
    assert "[redacted]" in str(errors[0]) and "[redacted]" in str(errors[4])
    texts = [str(e) for e in errors] + [repr(e) for e in errors] + [e.message for e in errors]
    texts += [caplog.text] + [str(r.__dict__) for r in caplog.records]
    assert "HTTP Request: POST" in caplog.text  # httpx's logs were captured
    assert not [t for t in texts if KEY in t]


# -- the fake cannot drift from the SDK's wire types -------------------------------------


def test_the_fake_rejects_bodies_the_sdk_would_not_parse() -> None:
    good = message_body(reply(OpaqueBlock(provider="anthropic", raw=THINKING), "hi"),
                        model=MODEL)
    check_message(good)
    bad_bodies = [
        {**good, "invented": 1},  # a field the SDK does not know
        {**good, "stop_reason": "finished"},  # an unknown literal
        {**good, "usage": {**good["usage"], "input_tokens": "10"}},  # strict: no coercion
        {**good, "content": [{"type": "text", "text": "hi", "cache_read": 1}]},  # nested extra
        {**good, "content": [{"type": "thinking", "thinking": "no signature"}]},
    ]
    for body in bad_bodies:
        with pytest.raises(WireDrift):
            check_message(body)


def test_the_fake_rejects_events_the_sdk_would_not_parse() -> None:
    check_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "signature_delta", "signature": "s"}})
    bad_events = [
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "reasoning_delta", "text": "s"}}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 1, "cache_write_tokens": 2}}),
        ("ping", {"type": "ping", "n": 1}),
        ("message_stop", {"type": "message_start"}),
        ("error", {"type": "error", "error": {"type": "oops_error", "message": "m"}}),
    ]
    for name, data in bad_events:
        with pytest.raises(WireDrift):
            check_event(name, data)


def test_the_requests_the_adapter_sends_match_the_sdk_params() -> None:
    use = ToolUse(id="toolu_1", name="get_weather", input={"city": "Oslo"})
    request = Request(
        system="Sys.", tools=(WEATHER,), reasoning_effort="low",
        cache=CacheHint(prefix=True, stable_messages=2),
        messages=(Message(role=Role.USER, blocks=(
            TextBlock(text="Look"), ImageBlock(media_type="image/gif", data=b"GIF89a"))),
                  Message(role=Role.ASSISTANT, blocks=(
                      OpaqueBlock(provider="anthropic", raw=THINKING),
                      OpaqueBlock(provider="anthropic", raw=REDACTED), use)),
                  Message(role=Role.USER, blocks=(
                      ToolResult(tool_use_id="toolu_1", content="x", is_error=True),))))
    for model_id in (MODEL, "claude-opus-4-7"):  # budget thinking, adaptive thinking
        model = AnthropicModel(model_id, api_key=KEY, base_url="https://gw.example")
        for stream in (False, True):
            check_request(json.loads(model.encode(request, stream=stream)))
    body = json.loads(model.encode(request, stream=False))
    body["messages"][0]["content"][0]["cache"] = True
    with pytest.raises(WireDrift):
        check_request(body)
    for drift in ({"temperature": 0.5}, {"top_p": 0.9},  # not in the SDK's params any more
                  {"output_config": {"effort": "extreme"}},
                  {"thinking": {"type": "adaptive", "budget_tokens": 1024}}):
        with pytest.raises(WireDrift):
            check_request({**json.loads(model.encode(request, stream=False)), **drift})
