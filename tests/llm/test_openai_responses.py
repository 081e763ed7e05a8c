"""The OpenAI Responses adapter: wire encoding, the stateless reasoning round trip, stream
decoding, usage and stop mapping, faults, hostile replies and configuration, against the
loopback fake (and hand-written responders for what the fake would never send). Generic
behaviour shared with every backend is in ``test_contract.py``; this module is what only the
Responses wire format makes meaningful.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import openai
import pydantic
import pytest

from runtime.llm import (
    CacheHint,
    ConfigurationError,
    Fault,
    ImageBlock,
    LLMError,
    Message,
    Model,
    OpaqueBlock,
    OpaqueDone,
    ReplyLimits,
    Request,
    Response,
    Role,
    Sampling,
    StepsStatus,
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
    run_steps,
)
from runtime.llm.providers.openai_responses import (
    MAX_OUTPUT_ITEMS,
    PARTS_PER_ITEM,
    PROVIDER,
    OpenAIResponsesModel,
    reasoning_model,
)

from .backend_openai_responses import API_KEY, MODEL
from .fake_openai_responses import (
    FakeOpenAIResponses,
    render_events,
    render_response,
    validate_event,
    validate_request,
    validate_response,
)
from .harness import Sleeps, policy
from .loopback import Exchange, LoopbackServer, Recorded
from .sdk_check import WireDrift
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent

pytestmark = pytest.mark.anyio

WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)
CLOCK = Tool(name="get_time", input_schema={"type": "object"})
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
REASONING = {"id": "rs_1", "type": "reasoning",
             "summary": [{"type": "summary_text", "text": "The user wants Oslo's weather."}],
             "encrypted_content": "gAAAAABo-3ncrypted+/=="}
REASONING_RAW = json.dumps(REASONING, separators=(",", ":"))


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests state their configuration; the developer's environment must not leak in."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def fake() -> Iterator[FakeOpenAIResponses]:
    with FakeOpenAIResponses() as f:
        yield f


def model_for(fake: FakeOpenAIResponses, **kw: Any) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(MODEL, api_key=API_KEY, base_url=fake.base_url, **kw)


def reply(*blocks: Any, stop: StopReason = StopReason.END_TURN, usage: Usage | None = None,
          model: str = "gpt-5-2025-08-07") -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(message=Message(role=Role.ASSISTANT, blocks=content), stop_reason=stop,
                    usage=usage or Usage(input_tokens=10, output_tokens=3), model=model)


def ask(text: str = "Hi", **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), **kw)


async def run(model: OpenAIResponsesModel, request: Request, mode: str) -> Response:
    if mode == "generate":
        return await model.generate(request)
    return await assemble(model.stream(request))


def thought(item: dict[str, Any] = REASONING) -> OpaqueBlock:
    return OpaqueBlock(provider=PROVIDER, raw=json.dumps(item, separators=(",", ":")))


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[Recorded, Exchange], None]], LoopbackServer]]:
    """A bare loopback server with a hand-written responder, for replies the fake would never
    produce (other servers' habits, failures, hostile output)."""
    servers: list[LoopbackServer] = []

    def start(respond: Callable[[Recorded, Exchange], None]) -> LoopbackServer:
        srv = LoopbackServer(respond).__enter__()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.__exit__(None, None, None)


def sse(*events: dict[str, Any] | str, check: bool = True) -> Callable[[Recorded, Exchange], None]:
    """A responder streaming these events (dicts are checked against the SDK first unless
    ``check`` is off for deliberately wrong ones)."""
    for e in events:
        if check and isinstance(e, dict):
            validate_event(e)

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        for e in events:
            if isinstance(e, str):
                ex.send_event(e)
            else:
                ex.send_event(json.dumps(e), event=str(e.get("type")))

    return respond


def body(respond_with: dict[str, Any], *, check: bool = True,
         ) -> Callable[[Recorded, Exchange], None]:
    if check:
        validate_response(respond_with)
    return lambda rec, ex: ex.send_json(200, respond_with)


def local(srv: LoopbackServer, **kw: Any) -> OpenAIResponsesModel:
    """The adapter pointed at a bare server, one attempt unless told otherwise."""
    kw.setdefault("retry", policy(Sleeps(), 1))
    return OpenAIResponsesModel(MODEL, base_url=f"{srv.url}/v1", **kw)


# -- wire encoding ----------------------------------------------------------------------


async def test_request_encoding_on_the_wire(fake: FakeOpenAIResponses) -> None:
    a = ToolUse(id="call_a", name="get_weather", input={"city": "Oslo"})
    b = ToolUse(id="call_b", name="get_time", input={"city": "Lima", "tz": {"dst": False}})
    request = Request(
        system="Be brief.",
        tools=(WEATHER, CLOCK),
        messages=(
            Message.text(Role.USER, "Oslo weather, Lima time?"),
            Message(role=Role.ASSISTANT, blocks=(
                OpaqueBlock(provider="anthropic", raw='{"type":"thinking","thinking":"hm"}'),
                thought(), TextBlock(text="Checking."), a, b)),
            Message(role=Role.USER, blocks=(
                ToolResult(tool_use_id="call_a", content="rain"),
                ToolResult(tool_use_id="call_b", content="unknown city", is_error=True),
                TextBlock(text="And this?"),
                ImageBlock(media_type="IMAGE/PNG", data=PNG),
            )),
        ),
        max_tokens=300,
        cache=CacheHint(prefix=True, stable_messages=2, key="conv-1"),
        sampling=Sampling(seed=7, temperature=0.2, top_p=0.9),
        reasoning_effort="low",
        tool_choice="get_weather",
    )
    fake.script(reply(ToolUse(id="call_c", name="get_weather", input={"city": "Rome"}),
                      stop=StopReason.TOOL_USE))
    await model_for(fake).generate(request)

    [sent] = fake.requests
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.headers["accept"] == "application/json"
    assert sent.body == {
        "model": MODEL,
        "tools": [
            {"type": "function", "name": "get_weather", "description": "Current weather for a "
             "city.", "parameters": WEATHER.input_schema, "strict": False},
            {"type": "function", "name": "get_time", "parameters": {"type": "object"},
             "strict": False},
        ],
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Oslo weather, Lima time?"},
            REASONING,
            {"role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "call_a", "name": "get_weather",
             "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "call_b", "name": "get_time",
             "arguments": '{"city":"Lima","tz":{"dst":false}}'},
            {"type": "function_call_output", "call_id": "call_a", "output": "rain"},
            {"type": "function_call_output", "call_id": "call_b",
             "output": "Error: unknown city"},
            {"role": "user", "content": [
                {"type": "input_text", "text": "And this?"},
                {"type": "input_image", "detail": "auto",
                 "image_url": f"data:image/png;base64,{base64.b64encode(PNG).decode()}"},
            ]},
        ],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 300,
        "reasoning": {"effort": "low"},
        "temperature": 0.2,  # no seed: the API has none
        "top_p": 0.9,
        "prompt_cache_key": "conv-1",
        "include": ["reasoning.encrypted_content"],
        "store": False,
    }
    assert list(json.loads(sent.raw)) == list(sent.body)  # the stable part first
    assert REASONING_RAW.encode() in sent.raw  # spliced byte for byte
    assert b"thinking" not in sent.raw  # another provider's opaque block is dropped
    assert fake.rejected == []  # the fake checked it against the SDK's params


async def test_a_minimal_request_for_a_model_that_does_not_reason(
        fake: FakeOpenAIResponses) -> None:
    fake.script(reply("ok"), reply("ok"))
    model = OpenAIResponsesModel("gpt-4.1", api_key=API_KEY, base_url=fake.base_url)
    await model.generate(ask(cache=CacheHint(prefix=True, stable_messages=1)))
    # no include (such a model answers it with a 400), no reasoning settings
    assert fake.requests[0].raw == (
        b'{"model":"gpt-4.1","input":[{"role":"user","content":"Hi"}],"store":false}')
    await model.generate(ask(reasoning_effort="high"))  # the caller says it reasons
    sent = fake.requests[1].body
    assert sent["reasoning"] == {"effort": "high"}
    assert sent["include"] == ["reasoning.encrypted_content"]


@pytest.mark.parametrize(("name", "reasons"), [
    ("gpt-5", True), ("gpt-5-mini-2025-08-07", True), ("gpt-5.1", True), ("o3", True),
    ("o4-mini", True), ("o1", True), ("codex-mini-latest", True), ("openai/gpt-5", True),
    ("gpt-5-chat-latest", False), ("gpt-4.1", False), ("gpt-4o", False), ("omni", False),
    ("o", False),
    # fine-tuned: ft:<base>:<org>:<suffix>:<id>, reasoning as its base does
    ("ft:o4-mini-2025-04-16:acme::abc", True), ("openai/ft:gpt-5-mini:acme:x:1", True),
    ("ft:gpt-4.1-2025-04-14:acme:o3:abc", False), ("ft:", False),
])
def test_which_models_reason(name: str, reasons: bool) -> None:
    assert reasoning_model(name) is reasons


async def test_reasoning_can_be_set_and_summaries_asked_for(fake: FakeOpenAIResponses) -> None:
    fake.script(reply("a"), reply("b"), reply("c"))
    await OpenAIResponsesModel("my-gateway-alias", api_key=API_KEY, base_url=fake.base_url,
                               reasoning=True, reasoning_summary="auto").generate(ask())
    await OpenAIResponsesModel("gpt-5", api_key=API_KEY, base_url=fake.base_url,
                               reasoning=False).generate(ask())
    await OpenAIResponsesModel("gpt-4.1", api_key=API_KEY, base_url=fake.base_url,
                               reasoning_summary="auto").generate(ask())
    first, second, third = (r.body for r in fake.requests)
    assert first["reasoning"] == {"summary": "auto"}
    assert first["include"] == ["reasoning.encrypted_content"]
    assert "include" not in second and "reasoning" not in second
    assert "reasoning" not in third  # a summary only for a model that reasons
    assert fake.rejected == []


@pytest.mark.parametrize(("choice", "wire"), [
    ("required", "required"),
    ("none", "none"),
    ("get_time", {"type": "function", "name": "get_time"}),
    ("auto", None),
])
async def test_tool_choice_on_the_wire(fake: FakeOpenAIResponses, choice: str, wire: Any,
                                       ) -> None:
    calls = choice in ("required", "get_time")
    fake.script(reply(ToolUse(id="c1", name="get_time"), stop=StopReason.TOOL_USE)
                if calls else reply("no call"))
    await model_for(fake).generate(ask(tools=(WEATHER, CLOCK), tool_choice=choice))
    assert fake.requests[0].body.get("tool_choice") == wire
    assert fake.rejected == []


async def test_no_tool_choice_without_tools(fake: FakeOpenAIResponses) -> None:
    fake.script(reply("ok"))
    await model_for(fake).generate(ask(tool_choice="none"))
    assert "tool_choice" not in fake.requests[0].body


async def test_stream_requests_say_so_at_the_end(fake: FakeOpenAIResponses) -> None:
    fake.script(reply("ok"))
    await assemble(model_for(fake).stream(ask()))
    sent = fake.requests[0]
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.raw.endswith(b',"store":false,"stream":true}')


async def test_the_output_ceiling() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=render_response(reply("ok")))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIResponsesModel("gpt-5", api_key=API_KEY, max_tokens=900,
                                     http_client=client)
        await model.generate(ask())
        await model.generate(ask(max_tokens=50))
    assert str(seen[0].url) == "https://api.openai.com/v1/responses"
    assert [json.loads(r.content)["max_output_tokens"] for r in seen] == [900, 50]


@pytest.mark.parametrize(("message", "complaint"), [
    (Message(role=Role.ASSISTANT, blocks=(ImageBlock(media_type="image/png", data=PNG),)),
     "user messages"),
    (Message(role=Role.USER, blocks=(ImageBlock(media_type="image/tiff", data=b"II*"),)),
     "image/tiff"),
    (Message(role=Role.USER, blocks=(ToolUse(id="x", name="f"),)), "tool_use"),
    (Message(role=Role.ASSISTANT, blocks=(ToolResult(tool_use_id="x", content="r"),)),
     "tool_result"),
    (Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider=PROVIDER, raw="[1]"),)),
     "JSON object"),
    # a history stored before NaN was refused: spliced in, the request would not be JSON
    (Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(
        provider=PROVIDER, raw='{"type":"reasoning","id":"rs","summary":[],"x":NaN}'),)),
     "JSON object"),
])
async def test_requests_we_cannot_express_are_refused_before_sending(
        fake: FakeOpenAIResponses, message: Message, complaint: str) -> None:
    request = Request(messages=(Message.text(Role.USER, "Hi"), message))
    for mode in ("generate", "stream"):
        with pytest.raises(LLMError) as info:
            await run(model_for(fake), request, mode)
        assert info.value.fault is Fault.TERMINAL and info.value.status is None
        assert complaint in str(info.value) and info.value.provider == PROVIDER
    assert fake.requests == []


# -- the reasoning round trip -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_tool_turn_keeps_its_reasoning(fake: FakeOpenAIResponses, mode: str) -> None:
    """The reasoning item of the step that called the tool goes back, verbatim and before
    its call, with the tool's output: stateless (``store: false``), as OpenAI documents."""
    use = ToolUse(id="call_oslo", name="get_weather", input={"city": "Oslo"})
    fake.script(reply(thought(), use, stop=StopReason.TOOL_USE), reply("Rain in Oslo."))
    model = model_for(fake)
    history = [Message.text(Role.USER, "Weather in Oslo?")]

    async def get_weather(call: ToolUse) -> str:
        return "rain, 8C"

    if mode == "stream":  # the step engine, which streams
        outcome = await run_steps(
            model, lambda h, step: Request(messages=tuple(h), tools=(WEATHER,)),
            execute=get_weather, history=history)
        assert outcome.status is StepsStatus.COMPLETED
        first = outcome.messages[0]
    else:
        first = (await model.generate(Request(messages=tuple(history), tools=(WEATHER,)))).message
        history += [first, Message(role=Role.USER, blocks=(
            ToolResult(tool_use_id=use.id, content="rain, 8C"),))]
        final = await model.generate(Request(messages=tuple(history), tools=(WEATHER,)))
        assert final.message.text_content() == "Rain in Oslo."
    assert first.blocks == (thought(), use)

    second = fake.requests[1]
    assert second.body["input"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        REASONING,
        {"type": "function_call", "call_id": "call_oslo", "name": "get_weather",
         "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_oslo", "output": "rain, 8C"},
    ]
    assert REASONING_RAW.encode() in second.raw
    assert all(r.body["store"] is False for r in fake.requests)
    assert fake.rejected == []


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_reasoning_without_encrypted_content_is_left_out_of_requests(
        fake: FakeOpenAIResponses, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A reasoning model the adapter was told does not reason gets no include, so its
    reasoning items come back with no encrypted content; under ``store: false`` the API
    cannot look one up (the fake answers 404, as the API does). Such an item is left out of
    the next request, which says so in a DEBUG line: the turn loses that reasoning and goes
    on."""
    caplog.set_level(logging.DEBUG, logger="celldialog.llm.openai_responses")
    use = ToolUse(id="call_oslo", name="get_weather", input={"city": "Oslo"})
    fake.script(reply(thought(), use, stop=StopReason.TOOL_USE), reply("Rain in Oslo."))
    model = model_for(fake, reasoning=False)  # a reasoning model wrongly told it does not
    request = Request(messages=(Message.text(Role.USER, "Weather in Oslo?"),), tools=(WEATHER,))
    first = (await run(model, request, mode)).message
    assert json.loads(first.blocks[0].raw)["encrypted_content"] is None  # type: ignore[union-attr]
    assert caplog.records == []
    follow = request.model_copy(update={"messages": (*request.messages, first, Message(
        role=Role.USER, blocks=(ToolResult(tool_use_id=use.id, content="rain"),)))})
    assert (await run(model, follow, mode)).message.text_content() == "Rain in Oslo."
    assert fake.requests[1].body["input"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "call_oslo", "name": "get_weather",
         "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_oslo", "output": "rain"},
    ]
    assert fake.rejected == []
    [record] = caplog.records
    assert record.levelno == logging.DEBUG
    assert "1 reasoning item(s) without encrypted content" in record.getMessage()
    assert "reasoning=True" in record.getMessage()


async def test_a_fine_tuned_reasoning_model_keeps_its_reasoning(fake: FakeOpenAIResponses,
                                                                ) -> None:
    """``ft:o4-mini-...`` reasons: it gets the include, and its reasoning goes back whole."""
    use = ToolUse(id="call_oslo", name="get_weather", input={"city": "Oslo"})
    fake.script(reply(thought(), use, stop=StopReason.TOOL_USE), reply("Rain in Oslo."))
    model = OpenAIResponsesModel("ft:o4-mini-2025-04-16:acme::abc", api_key=API_KEY,
                                 base_url=fake.base_url)
    request = Request(messages=(Message.text(Role.USER, "Weather in Oslo?"),), tools=(WEATHER,))
    first = (await model.generate(request)).message
    assert first.blocks == (thought(), use)
    follow = request.model_copy(update={"messages": (*request.messages, first, Message(
        role=Role.USER, blocks=(ToolResult(tool_use_id=use.id, content="rain"),)))})
    await model.generate(follow)
    assert all(r.body["include"] == ["reasoning.encrypted_content"] for r in fake.requests)
    assert fake.requests[1].body["input"][1] == REASONING
    assert REASONING_RAW.encode() in fake.requests[1].raw and fake.rejected == []


@pytest.mark.parametrize(("item", "sent"), [
    ({**REASONING, "encrypted_content": None}, False),
    ({k: v for k, v in REASONING.items() if k != "encrypted_content"}, False),
    ({**REASONING, "encrypted_content": ""}, False),
    ({**REASONING, "encrypted_content": 7}, False),
    (REASONING, True),
    # only reasoning is looked up by its id: other items the port does not model go back
    ({"id": "ws_1", "type": "web_search_call", "status": "completed",
      "action": {"type": "search", "query": "rain"}}, True),
])
def test_which_opaque_items_go_back(item: dict[str, Any], sent: bool) -> None:
    raw = json.dumps(item, separators=(",", ":"))
    request = Request(messages=(Message.text(Role.USER, "Hi"), Message(
        role=Role.ASSISTANT, blocks=(OpaqueBlock(provider=PROVIDER, raw=raw),
                                     TextBlock(text="Hello."))),
        Message.text(Role.USER, "Again")))
    wire = OpenAIResponsesModel("gpt-4.1", api_key=API_KEY).encode(request, stream=False)
    assert (raw.encode() in wire) is sent
    assert json.loads(wire)["input"][1:] == [
        *([item] if sent else []), {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"}]


# -- decoding ---------------------------------------------------------------------------------

RICH = reply(
    thought(), "Checking both.",
    ToolUse(id="call_a", name="get_weather", input={"city": "Oslo", "units": "metric"}),
    ToolUse(id="call_b", name="get_time", input={"city": "Lima"}),
    stop=StopReason.TOOL_USE,
    usage=Usage(input_tokens=2048, output_tokens=300, cache_read_tokens=1920),
)


@pytest.mark.parametrize("want", [
    RICH,
    reply("I can't help with that.", stop=StopReason.REFUSAL),
    reply(thought(), "The answer is cut", stop=StopReason.MAX_TOKENS),
    reply(thought(), stop=StopReason.MAX_TOKENS),  # the reasoning used the whole budget
    reply("Plain.", usage=Usage(input_tokens=1500, output_tokens=42, cache_read_tokens=1200,
                                cache_write_tokens=250)),
], ids=["tool-turn", "refusal", "cut", "reasoning-only", "cache-writes"])
async def test_the_stream_assembles_to_what_generate_returns(
        fake: FakeOpenAIResponses, want: Response) -> None:
    fake.script(want, want)
    model = model_for(fake)
    generated = await model.generate(ask(tools=(WEATHER, CLOCK)))
    streamed = await assemble(model.stream(ask(tools=(WEATHER, CLOCK))))
    assert generated == streamed == want


async def test_output_items_the_port_does_not_model_travel_as_opaque_blocks(
        fake: FakeOpenAIResponses) -> None:
    """A hosted tool's item (here a web search a gateway ran) is kept whole and sent back in
    its place, like reasoning; a system message of the history stays one, in its place."""
    search = OpaqueBlock(provider=PROVIDER, raw='{"id":"ws_1","type":"web_search_call",'
                         '"status":"completed","action":{"type":"search","query":"rain"}}')
    want = reply(search, "It rains.")
    fake.script(want, want, reply("ok"))
    model = model_for(fake)
    generated, streamed = await model.generate(ask()), await assemble(model.stream(ask()))
    assert generated == streamed == want
    history = (Message.text(Role.USER, "Rain?"), generated.message,
               Message.text(Role.SYSTEM, "Answer in French from now on."),
               Message.text(Role.USER, "Thanks"))
    await model.generate(Request(messages=history))
    assert fake.requests[2].body["input"] == [
        {"role": "user", "content": "Rain?"}, json.loads(search.raw),
        {"role": "assistant", "content": "It rains."},
        {"role": "system", "content": "Answer in French from now on."},
        {"role": "user", "content": "Thanks"}]
    assert search.raw.encode() in fake.requests[2].raw and fake.rejected == []


async def test_stream_events_in_order(fake: FakeOpenAIResponses) -> None:
    fake.script(RICH)
    events = [e async for e in model_for(fake).stream(ask(tools=(WEATHER, CLOCK)))]
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert len(texts) > 1 and "".join(t.text for t in texts) == "Checking both."
    [opaque] = [e for e in events if isinstance(e, OpaqueDone)]
    assert opaque == OpaqueDone(index=0, block=thought())  # output item 0, whole at its end
    assert {t.index for t in texts} == {PARTS_PER_ITEM}  # item 1, content part 0
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.id, s.name) for s in starts] == [
        (2 * PARTS_PER_ITEM, "call_a", "get_weather"), (3 * PARTS_PER_ITEM, "call_b", "get_time")]
    assert len([e for e in events if isinstance(e, ToolCallDelta)]) > 2  # arguments in pieces
    assert [e.index for e in events if isinstance(e, ToolCallEnd)] == [s.index for s in starts]
    assert events[-2:] == [UsageUpdate(usage=RICH.usage),
                           Stop(stop_reason=StopReason.TOOL_USE, model=RICH.model)]


def _usage_body(usage: dict[str, Any], **kw: Any) -> dict[str, Any]:
    wire = render_response(reply("ok"))
    wire["usage"] = usage
    wire.update(kw)
    return wire


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_usage_keeps_cached_tokens_inside_the_input_and_writes_beside_it(
        server: Any, mode: str) -> None:
    wire = _usage_body({
        "input_tokens": 4096, "output_tokens": 300, "total_tokens": 4396,
        "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 1024},
        "output_tokens_details": {"reasoning_tokens": 256},
    })
    validate_response(wire)
    events = render_events(reply("ok"))
    events[-1]["response"] = wire
    srv = server(body(wire) if mode == "generate" else sse(*events))
    got = await run(local(srv), ask(), mode)
    # reasoning tokens are counted inside output_tokens and said apart
    assert got.usage == Usage(input_tokens=3072, output_tokens=300, cache_read_tokens=2048,
                              cache_write_tokens=1024, reasoning_tokens=256)
    assert got.usage.cache_read_tokens / got.usage.input_tokens == 2048 / 3072


async def test_usage_from_a_server_that_reports_no_details(server: Any) -> None:
    wire = _usage_body({"input_tokens": 20, "output_tokens": 4}, model="local-model")
    srv = server(body(wire, check=False))  # older servers send no token details
    got = await local(srv).generate(ask())
    assert got.usage == Usage(input_tokens=20, output_tokens=4) and got.model == "local-model"
    srv2 = server(body(_usage_body(None)))  # type: ignore[arg-type]
    assert (await local(srv2).generate(ask())).usage == Usage()


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize(("reason", "stop"), [("max_output_tokens", StopReason.MAX_TOKENS),
                                              ("content_filter", StopReason.REFUSAL)])
async def test_incomplete_responses(server: Any, mode: str, reason: str, stop: StopReason,
                                    ) -> None:
    wire = render_response(reply("cut o", stop=StopReason.MAX_TOKENS))
    wire["incomplete_details"] = {"reason": reason}
    events = render_events(reply("cut o", stop=StopReason.MAX_TOKENS))
    events[-1]["response"] = wire
    srv = server(body(wire) if mode == "generate" else sse(*events))
    got = await run(local(srv), ask(), mode)
    assert (got.stop_reason, got.message.text_content()) == (stop, "cut o")


# -- what servers other than the fake send ------------------------------------------------------


def _kinds(events: list[dict[str, Any]], *drop: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] not in drop]


@pytest.mark.parametrize("drop", [
    # only the final event: every item is read from its output
    ("response.output_item.added", "response.output_item.done", "response.content_part.added",
     "response.output_text.delta", "response.function_call_arguments.delta",
     "response.reasoning_summary_text.delta"),
    # no done events: the final event finishes the items left open
    ("response.output_item.done",),
    # no deltas: the done events say it all
    ("response.output_text.delta", "response.function_call_arguments.delta"),
], ids=["final-only", "no-item-done", "no-deltas"])
async def test_streams_that_skip_events_still_assemble_to_the_body(server: Any,
                                                                  drop: tuple[str, ...]) -> None:
    srv = server(sse(*_kinds(render_events(RICH), *drop)))
    assert await assemble(local(srv).stream(ask())) == RICH


async def test_a_call_named_only_when_it_is_done(server: Any) -> None:
    events = render_events(reply(ToolUse(id="call_9", name="get_weather", input={"city": "Rome"}),
                                 stop=StopReason.TOOL_USE))
    added = next(e for e in events if e["type"] == "response.output_item.added")
    added["item"]["name"] = ""  # a server that names the call at its end
    got = await assemble(local(server(sse(*events))).stream(ask()))
    assert got.message.tool_uses() == [ToolUse(id="call_9", name="get_weather",
                                               input={"city": "Rome"})]


async def test_unknown_event_types_are_skipped(server: Any) -> None:
    events = render_events(reply("Hello there."))
    news = [{"type": "response.something_new", "sequence_number": 99, "payload": [1, 2]},
            {"type": "response.web_search_call.in_progress", "item_id": "ws_1",
             "output_index": 5, "sequence_number": 100}]
    srv = server(sse(*events[:3], *news, *events[3:], check=False))
    assert (await assemble(local(srv).stream(ask()))).message.text_content() == "Hello there."


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_call_ids_are_made_unique_and_replayable(server: Any, mode: str) -> None:
    calls = [ToolUse(id=cid, name="get_weather", input={"city": c})
             for cid, c in (("call_1", "Oslo"), ("call_1", "Rome"), ("call.x", "Lima"))]
    want = reply(*calls, stop=StopReason.TOOL_USE)
    wire = render_response(want)
    del wire["output"][0]["call_id"]  # no id at all (the SDK requires one: not checked)
    events = render_events(want)
    for e in events:
        if e["type"] in ("response.output_item.added", "response.output_item.done") and \
                e["output_index"] == 0:
            del e["item"]["call_id"]
    srv = server(body(wire, check=False) if mode == "generate" else sse(*events, check=False))
    ids = [u.id for u in (await run(local(srv), ask(), mode)).message.tool_uses()]
    assert ids[1] == "call_1" and len(set(ids)) == 3
    assert all(i.startswith("call_") and len(i) == 37 for i in (ids[0], ids[2]))


# -- faults --------------------------------------------------------------------------------


def _failed(code: str | None, message: str) -> dict[str, Any]:
    wire = render_response(reply("x"))
    wire.update(status="failed", output=[], usage=None, completed_at=None,
                error={"code": code, "message": message})
    return wire


FAILURES = [
    ("server_error", "The server had an error.", Fault.TRANSIENT),
    ("rate_limit_exceeded", "Rate limit reached for requests per min.", Fault.TRANSIENT),
    ("rate_limit_exceeded", "You exceeded your current quota.", Fault.TERMINAL),
    ("invalid_prompt", "Invalid prompt: flagged.", Fault.TERMINAL),
    ("invalid_base64_image", "The image is not base64.", Fault.TERMINAL),
]


@pytest.mark.parametrize(("code", "message", "fault"), FAILURES)
@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_failed_response_is_a_classified_fault(server: Any, mode: str, code: str,
                                                       message: str, fault: Fault) -> None:
    wire = _failed(code, message)
    validate_response(wire)
    events = [*render_events(reply("x"))[:2],
              {"type": "response.failed", "sequence_number": 2, "response": wire}]
    srv = server(body(wire) if mode == "generate" else sse(*events))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await run(local(srv, retry=policy(sleeps, 2)), ask(), mode)
    err = info.value
    assert (err.fault, err.status, err.provider) == (fault, None, PROVIDER)
    assert err.message == f"{code}: {message}"
    assert len(srv.requests) == (2 if fault is Fault.TRANSIENT else 1)  # nothing delivered


@pytest.mark.parametrize(("error", "fault"), [
    ({"code": "server_error", "message": "try again"}, Fault.TRANSIENT),
    ({"code": None, "message": "something broke"}, Fault.TRANSIENT),
    ({"code": "insufficient_quota", "message": "no money"}, Fault.TERMINAL),
    ({"code": "context_length_exceeded", "message": "too long"}, Fault.TERMINAL),
])
async def test_an_error_event_is_a_classified_fault(server: Any, error: dict[str, Any],
                                                    fault: Fault) -> None:
    events = [*render_events(reply("x"))[:2],
              {"type": "error", "sequence_number": 2, "param": None, **error}]
    srv = server(sse(*events))
    with pytest.raises(LLMError) as info:
        await assemble(local(srv, retry=policy(Sleeps(), 2)).stream(ask()))
    assert (info.value.fault, info.value.status) == (fault, None)
    assert error["message"] in info.value.message
    assert len(srv.requests) == (2 if fault is Fault.TRANSIENT else 1)


async def test_an_error_after_output_is_not_retried(server: Any) -> None:
    events = render_events(reply("Some text that streams."))
    cut = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta") + 1
    failure = {"type": "error", "sequence_number": 99, "code": "server_error",
               "message": "boom", "param": None}
    srv = server(sse(*events[:cut], failure))
    seen: list[Any] = []
    with pytest.raises(LLMError) as info:
        async for event in local(srv, retry=policy(Sleeps(), 3)).stream(ask()):
            seen.append(event)
    assert info.value.fault is Fault.TRANSIENT and seen == [TextDelta(index=0, text="Some ")]
    assert len(srv.requests) == 1  # output the caller saw is never replayed


@pytest.mark.parametrize(("status", "fault", "words"), [
    ("cancelled", Fault.TRANSIENT, "cancelled"),
    ("queued", Fault.TERMINAL, "not finished"),
    ("in_progress", Fault.TERMINAL, "not finished"),
])
async def test_a_body_that_is_not_a_finished_response(server: Any, status: str, fault: Fault,
                                                      words: str) -> None:
    wire = render_response(reply("x"))
    wire["status"] = status
    srv = server(body(wire))
    with pytest.raises(LLMError) as info:
        await local(srv).generate(ask())
    assert info.value.fault is fault and words in info.value.message


async def test_a_stream_that_ends_before_its_last_event_is_transient(server: Any) -> None:
    srv = server(sse(*render_events(reply("Hello"))[:-1]))
    with pytest.raises(LLMError, match=r"before response\.completed") as info:
        await assemble(local(srv).stream(ask()))
    assert info.value.fault is Fault.TRANSIENT


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_server_errors_and_quota(fake: FakeOpenAIResponses, mode: str) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(503, "server"), HTTPError(429, "rate_limit", retry_after=3),
                reply("finally"), HTTPError(429, "quota", message="You exceeded your quota."))
    model = model_for(fake, retry=policy(sleeps, attempts=3))
    assert (await run(model, ask(), mode)).message.text_content() == "finally"
    assert sleeps.waits[1] == 3.0 and len(fake.requests) == 3
    with pytest.raises(LLMError) as info:
        await run(model, ask(), mode)
    assert (info.value.fault, info.value.status) == (Fault.TERMINAL, 429)
    assert len(fake.requests) == 4


async def test_a_dropped_stream_after_output_fails_without_a_retry(
        fake: FakeOpenAIResponses) -> None:
    fake.script(DropMidStream(reply("A long answer that is cut."), after_events=6),
                reply("never"))
    seen: list[Any] = []
    with pytest.raises(LLMError) as info:
        async for event in model_for(fake, retry=policy(Sleeps())).stream(ask()):
            seen.append(event)
    assert info.value.fault is Fault.TRANSIENT
    assert [e.text for e in seen] == ["A lon", "g ans"]
    assert len(fake.requests) == 1


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_malformed_reply_is_terminal(fake: FakeOpenAIResponses, mode: str) -> None:
    sleeps = Sleeps()
    fake.script(MalformedEvent(reply("Some text here."), after_events=4), reply("unused"))
    with pytest.raises(LLMError, match="malformed") as info:
        await run(model_for(fake, retry=policy(sleeps)), ask(), mode)
    assert info.value.fault is Fault.TERMINAL
    assert len(fake.requests) == 1 and sleeps.waits == []


# -- hostile replies -------------------------------------------------------------------------


def _hostile_bodies() -> list[Any]:
    base = render_response(RICH)
    out: list[Any] = [["a list"], {**base, "output": "none"}]
    bad_call = json.loads(json.dumps(base))
    bad_call["output"][2]["name"] = 5
    nameless = json.loads(json.dumps(base))
    nameless["output"][2]["name"] = ""
    bad_text = json.loads(json.dumps(base))
    bad_text["output"][1]["content"][0]["text"] = {"html": "<b>"}
    out += [bad_call, nameless, bad_text, {**base, "model": 42}, {**base, "output": [7]}]
    for number in (float("nan"), float("inf"), float("-inf")):  # sent as NaN, Infinity
        thinking = {**base["output"][0], "x": number}
        out.append({**base, "output": [thinking, *base["output"][1:]]})
    for count in (float("nan"), -1, 2**60, 12.5, True, "12"):
        out.append({**base, "usage": {**base["usage"], "output_tokens": count}})
    return out


@pytest.mark.parametrize("wire", _hostile_bodies())
async def test_hostile_bodies_are_malformed_not_crashes(server: Any, wire: Any) -> None:
    srv = server(lambda rec, ex: ex.send_bytes(200, json.dumps(wire).encode()))
    sleeps = Sleeps()
    with pytest.raises(LLMError, match="malformed") as info:
        await local(srv, retry=policy(sleeps, 3)).generate(ask())
    assert info.value.fault is Fault.TERMINAL and info.value.provider == PROVIDER
    assert len(srv.requests) == 1 and sleeps.waits == []


def _hostile_streams() -> list[list[Any]]:
    events = render_events(RICH)

    def edited(kind: str, **change: Any) -> list[Any]:
        copy = json.loads(json.dumps(events))
        next(e for e in copy if e["type"] == kind).update(change)
        return copy

    done = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.done")
    late = {"type": "response.output_text.delta", "sequence_number": 999, "item_id": "x",
            "output_index": 0, "content_index": 0, "delta": "late", "logprobs": []}
    usage = {**events[-1]["response"]["usage"], "input_tokens": float("nan")}
    return [
        edited("response.output_text.delta", output_index="1"),
        edited("response.output_text.delta", content_index=PARTS_PER_ITEM),
        edited("response.output_text.delta", output_index=-1),
        edited("response.output_text.delta", delta=["not", "text"]),
        edited("response.function_call_arguments.delta", output_index=1),  # a message's
        edited("response.output_text.delta", output_index=2),  # a function call's
        [*events[:done + 1], late, *events[done + 1:]],  # after its item was done
        ["[1, 2]"],
        [json.dumps({**events[-1], "response": {**events[-1]["response"], "usage": usage}})],
        edited("response.output_item.added", item={"type": "function_call", "name": 7}),
        edited("response.output_item.done", item={**REASONING, "x": float("nan")}),
    ]


@pytest.mark.parametrize("events", _hostile_streams())
async def test_hostile_streams_are_malformed_not_crashes(server: Any, events: list[Any]) -> None:
    raw = [e if isinstance(e, str) else json.dumps(e) for e in events]
    srv = server(sse(*raw))
    sleeps = Sleeps()
    with pytest.raises(LLMError, match="malformed") as info:
        await assemble(local(srv, retry=policy(sleeps, 3)).stream(ask()))
    assert info.value.fault is Fault.TERMINAL and info.value.provider == PROVIDER
    assert len(srv.requests) == 1 and sleeps.waits == []


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("number", ["1e999", "-1E400"])
async def test_an_item_with_a_number_json_cannot_carry_is_malformed(
        server: Any, mode: str, number: str) -> None:
    """``1e999`` is JSON, but Python reads it as Infinity, which an opaque block would send
    back as ``Infinity``: not JSON. The reply is refused, never kept to break every later
    request."""
    want = reply(thought({**REASONING, "x": 0}), "ok")
    wire = json.dumps(render_response(want)).replace('"x": 0', f'"x": {number}', 1)
    events = [json.dumps(e) for e in render_events(want)]
    done = next(i for i, e in enumerate(events) if "response.output_item.done" in e)
    events[done] = events[done].replace('"x": 0', f'"x": {number}', 1)
    assert number in wire and number in events[done]
    srv = server((lambda rec, ex: ex.send_bytes(200, wire.encode())) if mode == "generate"
                 else sse(*events))
    with pytest.raises(LLMError, match="malformed") as info:
        await run(local(srv, retry=policy(Sleeps(), 3)), ask(), mode)
    assert info.value.fault is Fault.TERMINAL and len(srv.requests) == 1


def _items_added(count: int) -> list[str]:
    """A stream that announces ``count`` reasoning items and says nothing more of them, then
    completes (an item never finished and not in the output is not a block)."""
    events = render_events(reply("ok"))
    added = [{"type": "response.output_item.added", "sequence_number": 10 + i,
              "output_index": 1 + i, "item": {"id": f"rs_{i}", "type": "reasoning",
                                              "summary": []}} for i in range(count)]
    validate_event(added[0])
    return [json.dumps(e) for e in (*events[:-1], *added, events[-1])]


@pytest.mark.parametrize(("extra", "ok"), [(MAX_OUTPUT_ITEMS - 1, True),
                                           (MAX_OUTPUT_ITEMS, False)])
async def test_output_items_are_capped_in_a_stream(server: Any, extra: int, ok: bool) -> None:
    """An item's ``added`` event carries nothing the reply cap counts, so the number of
    items is capped on its own: past ``MAX_OUTPUT_ITEMS`` (here the message and ``extra``
    reasoning items) the reply is malformed, before the decoder holds any more."""
    srv = server(sse(*_items_added(extra)))
    model = local(srv, retry=policy(Sleeps(), 3))
    if ok:
        assert (await assemble(model.stream(ask()))).message.text_content() == "ok"
        return
    with pytest.raises(LLMError, match=f"more than {MAX_OUTPUT_ITEMS:,} output items") as info:
        await assemble(model.stream(ask()))
    assert info.value.fault is Fault.TERMINAL and len(srv.requests) == 1


@pytest.mark.parametrize(("count", "ok"), [(MAX_OUTPUT_ITEMS, True),
                                           (MAX_OUTPUT_ITEMS + 1, False)])
async def test_output_items_are_capped_in_a_body(server: Any, count: int, ok: bool) -> None:
    """The same cap for ``generate``: a stream and a body of one reply agree."""
    wire = render_response(reply("ok"))
    wire["output"] += [{"id": f"rs_{i}", "type": "reasoning", "summary": []}
                       for i in range(count - 1)]
    srv = server(body(wire))
    model = local(srv, retry=policy(Sleeps(), 3))
    if ok:
        got = await model.generate(ask())
        assert len(got.message.blocks) == count
        return
    with pytest.raises(LLMError, match=f"more than {MAX_OUTPUT_ITEMS:,} output items") as info:
        await model.generate(ask())
    assert info.value.fault is Fault.TERMINAL and len(srv.requests) == 1


async def test_empty_text_deltas_leave_the_text_to_the_done_item(server: Any) -> None:
    """A delta with no text says nothing of its part (nor is it kept): the part's text then
    comes whole with its item, as in the body."""
    want = reply("Hello there.")
    events = render_events(want)
    for e in events:
        if e["type"] == "response.output_text.delta":
            e["delta"] = ""
    srv = server(sse(*events))
    assert await assemble(local(srv).stream(ask())) == want


async def test_a_call_that_never_gets_a_name_is_malformed(server: Any) -> None:
    events = render_events(reply(ToolUse(id="c", name="get_weather"), stop=StopReason.TOOL_USE))
    for e in events:
        if e["type"] in ("response.output_item.added", "response.output_item.done"):
            e["item"]["name"] = ""
    events[-1]["response"]["output"][0]["name"] = ""
    with pytest.raises(LLMError, match="malformed") as info:
        await assemble(local(server(sse(*events, check=False))).stream(ask()))
    assert info.value.fault is Fault.TERMINAL


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_bad_and_deep_arguments(server: Any, mode: str) -> None:
    for arguments, fault in (("{city: Oslo", Fault.TRANSIENT), ("[" * 100_000, Fault.TERMINAL)):
        want = reply(ToolUse(id="c1", name="get_weather"), stop=StopReason.TOOL_USE)
        wire, events = render_response(want), render_events(want)
        wire["output"][0]["arguments"] = arguments
        for e in events:
            if e["type"] == "response.function_call_arguments.delta":
                e["delta"] = arguments
                break
        srv = server(body(wire) if mode == "generate" else sse(*events))
        with pytest.raises(LLMError) as info:
            await run(local(srv), ask(), mode)
        # the adapter names the call; the assembler (a stream's arguments) names its place
        named = "get_weather" if mode == "generate" else "tool call 1 (a 11-character name)"
        assert info.value.fault is fault and named in info.value.message


BIG_THOUGHT = {**REASONING, "summary": [{"type": "summary_text", "text": "hm " * 2000}],
               "encrypted_content": "A" * 3000}


async def test_a_reasoning_body_counts_toward_the_reply_cap(fake: FakeOpenAIResponses) -> None:
    fake.script(reply(thought(BIG_THOUGHT), "ok"))
    with pytest.raises(LLMError, match="reply cap") as info:
        await model_for(fake, limits=ReplyLimits(reply_chars=5000)).generate(ask())
    assert info.value.fault is Fault.TERMINAL


@pytest.mark.parametrize("through", ["response.reasoning_summary_text.done",
                                     "response.output_item.done"])
async def test_reasoning_deltas_count_toward_the_reply_cap_as_they_arrive(
        server: Any, through: str) -> None:
    """A reasoning item goes out whole at its end, but its summary deltas count as they
    arrive: a stream of them past the cap fails before the item is done (here the stream
    then ends, which would otherwise be a transient cut), and the item's encrypted content
    counts when it comes."""
    events = render_events(reply(thought(BIG_THOUGHT), "ok"))
    upto = next(i for i, e in enumerate(events) if e["type"] == through)
    srv = server(sse(*events[:upto + 1]))
    seen: list[Any] = []
    limit = 5000 if through == "response.reasoning_summary_text.done" else 7000
    with pytest.raises(LLMError, match="reply cap") as info:
        async for event in local(srv, limits=ReplyLimits(reply_chars=limit)).stream(ask()):
            seen.append(event)
    assert info.value.fault is Fault.TERMINAL and seen == []


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_tool_name_past_the_cap_is_refused(fake: FakeOpenAIResponses, mode: str) -> None:
    fake.script(reply(ToolUse(id="c1", name="n" * 300), stop=StopReason.TOOL_USE))
    with pytest.raises(LLMError, match="tool name") as info:
        await run(model_for(fake), ask(), mode)
    assert info.value.fault is Fault.TERMINAL


# -- cancellation ---------------------------------------------------------------------------


async def test_cancel_during_a_stream_closes_the_request(fake: FakeOpenAIResponses) -> None:
    fake.script(Hang(reply("Hello there, never finished."), after_events=5))
    started = time.monotonic()
    seen: list[Any] = []
    with anyio.CancelScope() as scope:
        async for event in model_for(fake).stream(ask()):
            seen.append(event)
            scope.cancel()  # as soon as output starts, the caller gives up
    assert scope.cancelled_caught and seen == [TextDelta(index=0, text="Hello")]
    assert await anyio.to_thread.run_sync(fake.exchanges[0].closed_by_client.wait, 5)
    assert time.monotonic() - started < 3


# -- configuration and secrets ----------------------------------------------------------------


async def test_a_loopback_server_without_a_key(fake: FakeOpenAIResponses) -> None:
    fake.script(reply("local hello"))
    model = OpenAIResponsesModel("gpt-oss-20b", base_url=fake.base_url)
    assert (await model.generate(ask())).message.text_content() == "local hello"
    assert "authorization" not in fake.requests[0].headers
    assert repr(model) == (f"OpenAIResponsesModel(model='gpt-oss-20b', "
                           f"base_url='{fake.base_url}', api_key=none)")


@pytest.mark.parametrize(("options", "words"), [
    ({}, "OPENAI_API_KEY"),
    ({"base_url": "https://gateway.example.com/v1"}, "OPENAI_API_KEY"),
    ({"api_key": API_KEY, "base_url": "http://models.example.com/v1"}, "loopback"),
    ({"api_key": API_KEY, "reasoning_summary": "verbose"}, "reasoning_summary"),
    ({"api_key": API_KEY, "reasoning": "yes"}, "reasoning must be"),
    ({"api_key": API_KEY, "max_tokens": 0}, "max_tokens"),
    ({"api_key": API_KEY, "timeout": -1}, "timeout"),
    ({"api_key": API_KEY + "\n"}, "newline"),
])
def test_bad_configuration_is_refused_by_name(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words) as info:
        OpenAIResponsesModel("gpt-5", **options)
    assert API_KEY not in str(info.value)


def test_the_adapter_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example.com/v1/")
    with pytest.raises(ConfigurationError, match="api_key"):
        OpenAIResponsesModel("gpt-5")
    model = OpenAIResponsesModel("gpt-5", api_key="sk-given")
    assert isinstance(model, Model)
    assert (model.name, model.provider) == ("gpt-5", "openai-responses")
    assert repr(model) == ("OpenAIResponsesModel(model='gpt-5', "
                           "base_url='https://api.openai.com/v1', api_key=set)")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_key_never_appears_in_errors_reprs_or_logs(
        server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "runtime", "celldialog"):
        caplog.set_level(logging.DEBUG, logger=name)

    def echo_status(rec: Recorded, ex: Exchange) -> None:  # a server echoing what it got
        echo = rec.headers.get("authorization", "")
        ex.send_json(401, {"error": {"message": f"Incorrect API key provided: {echo}",
                                     "type": "invalid_request_error", "param": None,
                                     "code": "invalid_api_key"}})

    def echo_failed(rec: Recorded, ex: Exchange) -> None:
        wire = _failed("server_error", f"upstream said {rec.headers['authorization']}")
        sse(*render_events(reply("x"))[:2],
            {"type": "response.failed", "sequence_number": 2, "response": wire})(rec, ex)

    errors: list[BaseException] = []
    models = [OpenAIResponsesModel("m", api_key=API_KEY, base_url=f"{server(f).url}/v1",
                                   retry=policy(Sleeps(), 1)) for f in (echo_status, echo_failed)]
    models.append(OpenAIResponsesModel("m", api_key=API_KEY, retry=policy(Sleeps(), 1),
                                       base_url=f"http://127.0.0.1:{_closed_port()}/v1"))
    for model in models:
        for mode in ("generate", "stream"):
            with pytest.raises(LLMError) as info:
                await run(model, ask(), mode)
            errors.append(info.value)
    assert "[redacted]" in str(errors[0]) and "[redacted]" in str(errors[3])
    texts = [caplog.text, *(repr(m) for m in models)]
    texts += [f"{e!s} {e!r} {e.args!r} {e.__cause__!r} {e.__context__!r}" for e in errors]
    texts += [f"{r.getMessage()} {r.args!r}" for r in caplog.records]
    for text in texts:
        assert API_KEY not in text


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_key_echoed_as_a_tool_name_is_redacted(
        server: Any, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A server that names a call with the key it was sent, arguments ``[1]`` (no JSON
    object: a transient fault, retried): neither the error nor the retry layer's WARNING
    shows the key."""
    caplog.set_level(logging.DEBUG, logger="celldialog.llm.retry")
    want = reply(ToolUse(id="c1", name="get_weather"), stop=StopReason.TOOL_USE)

    def echo(rec: Recorded, ex: Exchange) -> None:
        key = rec.headers["authorization"].removeprefix("Bearer ")
        wire, events = render_response(want), render_events(want)
        wire["output"][0].update(name=key, arguments="[1]")
        for e in events:
            if e["type"] in ("response.output_item.added", "response.output_item.done"):
                e["item"]["name"] = key
            if e["type"] == "response.function_call_arguments.delta":
                e["delta"] = "[1]"
        events[-1]["response"] = wire
        (body(wire) if mode == "generate" else sse(*events))(rec, ex)

    srv = server(echo)
    with pytest.raises(LLMError) as info:
        await run(local(srv, api_key=API_KEY, retry=policy(Sleeps(), 2)), ask(), mode)
    assert info.value.fault is Fault.TRANSIENT and API_KEY not in repr(info.value)
    assert API_KEY[:8] not in str(info.value) and API_KEY[-8:] not in str(info.value)
    if mode == "generate":  # the adapter's error, redacted; a stream's names no tool
        assert "[redacted]" in str(info.value)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    if mode == "generate":  # a stream's arguments are judged by the assembler, after it
        assert len(srv.requests) == 2 and len(warnings) == 1
    for text in (f"{info.value!s} {info.value!r}",
                 *(f"{r.getMessage()} {r.args!r}" for r in caplog.records)):
        assert API_KEY not in text


# -- the fake against the official SDK -------------------------------------------------------


async def test_the_official_sdk_reads_the_fake(fake: FakeOpenAIResponses) -> None:
    """The fake's wire format is the real one: the SDK's own client parses its bodies, and
    its stream helper, which checks each event against the snapshot it accumulates, rebuilds
    the same response from the events."""
    fake.script(RICH, RICH, HTTPError(429, "quota", message="no money"))
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
    try:
        done = await client.responses.create(model=MODEL, input="Hi")
        assert done.output_text == "Checking both."
        assert done.usage is not None and done.usage.input_tokens_details.cached_tokens == 1920
        async with client.responses.stream(model=MODEL, input="Hi") as stream:
            final = await stream.get_final_response()
        assert final.model_dump() == {**done.model_dump(), "id": final.id,
                                      "output": final.model_dump()["output"]}
        assert [i.type for i in final.output] == ["reasoning", "message", "function_call",
                                                  "function_call"]
        assert final.output[2].arguments == done.output[2].arguments  # type: ignore[union-attr]
        with pytest.raises(openai.RateLimitError) as info:
            await client.responses.create(model=MODEL, input="Hi")
        assert info.value.code == "insufficient_quota"
    finally:
        await client.close()


def test_validators_catch_drift() -> None:
    """The checks the fake relies on do reject what the real API would never send."""
    good = render_response(RICH)
    validate_response(good)
    with pytest.raises(WireDrift, match="unknown to the SDK"):
        validate_response({**good, "outputs": []})
    with pytest.raises(pydantic.ValidationError):
        validate_response({**good, "created_at": "1700000000"})  # strict: no coercion
    with pytest.raises(pydantic.ValidationError):
        validate_response({**good, "status": "done"})
    events = render_events(RICH)
    with pytest.raises(WireDrift, match="unknown to the SDK"):
        validate_event({**events[3], "text": "hi"})
    with pytest.raises(pydantic.ValidationError):
        validate_event({**events[3], "type": "response.output_text.deltas"})
    with pytest.raises(pydantic.ValidationError):
        validate_event({k: v for k, v in events[0].items() if k != "sequence_number"})
    with pytest.raises(pydantic.ValidationError):
        validate_request({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(pydantic.ValidationError):  # a function tool says whether it is strict
        validate_request({"model": "m", "input": "x",
                          "tools": [{"type": "function", "name": "f", "parameters": {}}]})


async def test_the_fake_refuses_what_the_api_would(fake: FakeOpenAIResponses) -> None:
    fake.script(reply("never"))
    bare = {"type": "reasoning", "id": "rs_9", "summary": []}
    async with httpx.AsyncClient() as client:
        orphan = await client.post(f"{fake.base_url}/responses", json={
            "model": "m", "input": [{"type": "function_call_output", "call_id": "c9",
                                     "output": "x"}]})
        typo = await client.post(f"{fake.base_url}/responses",
                                 json={"model": "m", "input": "x", "max_tokens": 5})
        unkept = await client.post(f"{fake.base_url}/responses", json={
            "model": "m", "store": False, "input": [bare, {"role": "user", "content": "x"}]})
    assert (orphan.status_code, typo.status_code, unkept.status_code) == (400, 400, 404)
    assert "No tool call found" in orphan.json()["error"]["message"]
    assert "Item with id 'rs_9' not found" in unkept.json()["error"]["message"]
    assert len(fake.rejected) == 3 and fake.remaining() == 1
