"""Lone UTF-16 surrogates in the port (the rule is ``runtime/_text.py``): refused where text
enters from users or code (the vocabulary's validation), replaced where it comes from a
provider (both adapters, the assembler, the step engine), and never able to make a request
unencodable (the encoders)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from runtime.llm import (
    Assembler,
    Message,
    Request,
    Response,
    RetryPolicy,
    Role,
    ScriptedModel,
    StepSink,
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
    assemble,
    run_steps,
)
from runtime.llm.history import replayable_call_id
from runtime.llm.providers._http import HTTPModel
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.openai import OpenAIModel

from .fake_anthropic import FakeAnthropic, check_event, check_message, message_body, stream_events
from .fake_openai import (
    FakeOpenAI,
    render_chunks,
    render_completion,
    validate_chunk,
    validate_completion,
)
from .loopback import Exchange, LoopbackServer, Recorded

pytestmark = pytest.mark.anyio

PROVIDERS = ["anthropic", "openai"]
MODES = ["generate", "stream"]
LONE = "\ud800"
REFUSED = "holds a lone UTF-16 surrogate (U+D800 at character 2)"


# -- refused where text enters ---------------------------------------------------------------

ENTRIES: dict[str, Callable[[], Any]] = {
    "a text block": lambda: TextBlock(text=f"hi{LONE}"),
    "a user message": lambda: Message.text(Role.USER, f"hi{LONE}"),
    "a message from JSON": lambda: Message.model_validate(
        {"role": "user", "blocks": [{"kind": "text", "text": f"hi{LONE}"}]}),
    "a call's input value": lambda: ToolUse(id="c", name="t", input={"q": [{"x": f"hi{LONE}"}]}),
    "a call's input key": lambda: ToolUse(id="c", name="t", input={f"hi{LONE}": 1}),
    "a call's name": lambda: ToolUse(id="c", name=f"hi{LONE}"),
    "a tool result": lambda: ToolResult(tool_use_id="c", content=f"hi{LONE}"),
    "a system prompt": lambda: Request(system=f"hi{LONE}"),
    "a tool description": lambda: Tool(name="t", description=f"hi{LONE}"),
    "a tool schema": lambda: Tool(name="t", input_schema={"description": f"hi{LONE}"}),
}


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_lone_surrogate_is_refused_with_the_clear_message(entry: str) -> None:
    with pytest.raises(ValidationError) as info:
        ENTRIES[entry]()
    assert REFUSED in str(info.value) and "cannot be encoded as UTF-8" in str(info.value)


def test_the_error_says_where_in_a_calls_input() -> None:
    with pytest.raises(ValidationError, match=r"the value at /q/0/x holds a lone"):
        ENTRIES["a call's input value"]()


@pytest.mark.parametrize("text", ["plain", "é ü ß", "雨", "🌧 and 😀", "\ufffd", ""])
def test_text_that_is_unicode_passes(text: str) -> None:
    block = ToolUse(id="c", name="t", input={text: [text]})
    assert Message(role=Role.ASSISTANT, blocks=(TextBlock(text=text), block)).blocks[1] == block


# -- replaced where a provider sends it --------------------------------------------------------

# The wire bodies are built with a marker character, checked against the SDK types, and
# only then is the marker's JSON escape turned into the one a hostile server sends: "\ud800",
# a lone surrogate once decoded. Where JSON sits inside a JSON string (an OpenAI call's
# arguments, Anthropic's partial_json) the escape lands inside that inner JSON, so both
# decoding layers are exercised.
MARK = "\u2603"
EXPECT = "\ufffd"


def hostile(provider: str, mode: str) -> Callable[[Recorded, Exchange], None]:
    # a stream cuts arguments into 7-character deltas: this input keeps the escape whole
    args = {"city": MARK, MARK: [1]} if mode == "generate" else {"c": MARK}
    response = Response(
        message=Message(role=Role.ASSISTANT, blocks=(
            TextBlock(text=f"a {MARK} b"),
            ToolUse(id=f"call_{MARK}", name="lookup", input=args),
        )),
        stop_reason=StopReason.TOOL_USE, usage=Usage(input_tokens=1, output_tokens=1),
        model="m")
    if mode == "generate":
        if provider == "anthropic":
            body = message_body(response, model="claude-sonnet-4-5")
            check_message(body)
        else:
            body = render_completion(response)
            validate_completion(body)
        text = json.dumps(body)
    else:
        if provider == "anthropic":
            events = stream_events(response, model="claude-sonnet-4-5")
            for name, data in events:
                check_event(name, data)
            frames = [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]
        else:
            chunks = render_chunks(response, include_usage=True)
            for c in chunks:
                validate_chunk(c)
            frames = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
        text = "".join(frames)
    assert text.count("u2603") >= 3
    text = text.replace("u2603", "ud800")  # behind one backslash, or two in inner JSON
    raw = text.encode()
    assert b"\\ud800" in raw and LONE.encode("utf-8", "surrogatepass") not in raw

    def respond(rec: Recorded, ex: Exchange) -> None:
        if mode == "generate":
            ex.send_bytes(200, raw)
        else:
            ex.start_stream()
            ex.handler.wfile.write(raw)
            ex.handler.wfile.flush()

    return respond


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Recorded, Exchange], None]], LoopbackServer]]:
    servers: list[LoopbackServer] = []

    def start(respond: Callable[[Recorded, Exchange], None]) -> LoopbackServer:
        srv = LoopbackServer(respond).__enter__()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.__exit__(None, None, None)


def adapter(provider: str, root: str) -> HTTPModel:
    if provider == "anthropic":
        return AnthropicModel("claude-sonnet-4-5", api_key="sk-test", base_url=root,
                              retry=RetryPolicy(max_attempts=1))
    return OpenAIModel("gpt-4.1", api_key="sk-test", base_url=f"{root}/v1",
                       retry=RetryPolicy(max_attempts=1))


def ask() -> Request:
    return Request(messages=(Message.text(Role.USER, "Weather?"),),
                   tools=(Tool(name="lookup"),))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_reply_with_surrogate_escapes_lands_as_replacement_characters(
        serve: Any, provider: str, mode: str) -> None:
    srv = serve(hostile(provider, mode))
    model = adapter(provider, srv.url)
    deltas: list[str] = []
    if mode == "generate":
        got = await model.generate(ask())
    else:
        async def tap() -> Any:
            async for event in model.stream(ask()):
                if isinstance(event, TextDelta | ToolCallDelta):
                    deltas.append(event.text if isinstance(event, TextDelta) else
                                  event.arguments)
                yield event

        got = await assemble(tap())
    (use,) = got.message.tool_uses()
    assert got.message.text_content() == f"a {EXPECT} b"
    # the id came as call_\ud800 (call_\ufffd once replaced): no provider takes it back,
    # so the adapter gave the call a fresh one (test_call_ids.py)
    assert replayable_call_id(use.id) and use.id != f"call_{EXPECT}"
    assert use.input == ({"city": EXPECT, EXPECT: [1]} if mode == "generate" else {"c": EXPECT})
    for delta in deltas:  # what a consumer sees as it streams is text too
        delta.encode()
    # and the reply goes back to a model in the next request
    answer = Message(role=Role.USER, blocks=(ToolResult(tool_use_id=use.id, content="sunny"),))
    history = Request(messages=(*ask().messages, got.message, answer), tools=ask().tools)
    model.encode(history, stream=True).decode()


def test_the_assembler_replaces_what_any_model_streams() -> None:
    asm = Assembler("third-party")
    for event in [TextDelta(index=0, text=f"a{LONE}"),
                  ToolCallStart(index=1, id=f"c{LONE}", name=f"t{LONE}"),
                  ToolCallDelta(index=1, arguments='{"q": "\\ud800", "r": "\ud800"}'),
                  ToolCallEnd(index=1), Stop(stop_reason=StopReason.TOOL_USE)]:
        asm.feed(event)
    text, use = asm.response().message.blocks
    assert text == TextBlock(text=f"a{EXPECT}")
    assert use == ToolUse(id=f"c{EXPECT}", name=f"t{EXPECT}", input={"q": EXPECT, "r": EXPECT})


async def test_the_step_engine_hands_on_text_that_is_text() -> None:
    model = ScriptedModel([[TextDelta(index=0, text=f"hi{LONE}"),
                            Stop(stop_reason=StopReason.END_TURN)]])
    heard: list[str] = []
    outcome = await run_steps(model, lambda h, s: Request(messages=tuple(h)),
                              execute=lambda use: None,  # type: ignore[arg-type,return-value]
                              history=[Message.text(Role.USER, "hi")],
                              sink=StepSink(on_text=heard.append))
    assert heard == [f"hi{EXPECT}"] and outcome.final.text_content() == f"hi{EXPECT}"


# -- a request always encodes -------------------------------------------------------------


def constructed() -> Request:
    """A request built around validation (``model_construct``), as an old stored history or
    a careless caller could: lone surrogates everywhere text goes."""
    use = ToolUse.model_construct(id=f"c{LONE}", name="lookup", input={"q": f"x{LONE}"})
    return Request.model_construct(
        system=f"be {LONE}brief",
        messages=(
            Message.model_construct(role=Role.USER, blocks=(
                TextBlock.model_construct(text=f"a{LONE}b"),)),
            Message.model_construct(role=Role.ASSISTANT, blocks=(use,)),
            Message.model_construct(role=Role.USER, blocks=(
                ToolResult.model_construct(tool_use_id=f"c{LONE}", content=f"r{LONE}"),
                TextBlock.model_construct(text="and?"))),
        ),
        tools=(Tool.model_construct(name="lookup", description=f"d{LONE}",
                                    input_schema={"type": "object"}),),
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_request_built_around_validation_still_encodes_and_is_answered(
        provider: str, mode: str) -> None:
    ok = Response(message=Message(role=Role.ASSISTANT, blocks=(TextBlock(text="fine"),)),
                  stop_reason=StopReason.END_TURN, model="m")
    fake_cls = FakeAnthropic if provider == "anthropic" else FakeOpenAI
    with fake_cls() as fake:
        fake.script(ok)
        model = adapter(provider, fake.url)
        body = model.encode(constructed(), stream=mode == "stream").decode()
        assert f"a{EXPECT}b" in body and f"be {EXPECT}brief" in body and LONE not in body
        got = await (model.generate(constructed()) if mode == "generate"
                     else assemble(model.stream(constructed())))
        assert got.message.text_content() == "fine"  # the fake checked it with the SDK
