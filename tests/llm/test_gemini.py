"""The Gemini adapter: wire encoding (roles, tool schemas, results, thought signatures,
``toolConfig``, ``generationConfig``), decoding (parts folded into blocks, missing call ids,
usage, finish reasons, blocked prompts), Gemini's errors, configuration, and hostile replies,
against the loopback fake or a hand-written loopback server. Generic behaviour shared with
every backend is in ``test_contract.py``; this module is what only Gemini's wire makes
meaningful.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from runtime.llm import (
    CacheHint,
    ConfigurationError,
    Fault,
    ImageBlock,
    LLMError,
    Message,
    Model,
    OpaqueBlock,
    Request,
    Response,
    Role,
    Sampling,
    Stop,
    StopReason,
    StreamEvent,
    TextBlock,
    TextDelta,
    Tool,
    ToolResult,
    ToolUse,
    Usage,
    UsageUpdate,
    assemble,
    run_steps,
)
from runtime.llm.limits import ReplyLimits
from runtime.llm.providers.gemini import GeminiModel, decode_response, thinking_style

from .backend_gemini import API_KEY, MODEL
from .fake_gemini import (
    SKIP_SIGNATURE,
    Body,
    Chunks,
    FakeGemini,
    check_error,
    check_request,
    check_response,
    error_body,
    render_body,
    render_chunks,
)
from .harness import Sleeps, policy
from .loopback import Exchange, LoopbackServer, Recorded
from .sdk_check import WireDrift
from .steps import Hang, HTTPError

pytestmark = pytest.mark.anyio

GENERATE_PATH = f"/v1beta/models/{MODEL}:generateContent"
STREAM_PATH = f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
SIGNATURE = base64.b64encode(b"signature over the call\xfb\xff").decode()  # has + and /
THOUGHT = ('{"text":"The user wants rain data.","thought":true,'
           f'"thoughtSignature":"{base64.b64encode(b"thought sig").decode()}"}}')


@pytest.fixture(autouse=True)
def _no_gemini_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests state their configuration; the developer's environment must not leak in."""
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as f:
        yield f


def model_for(base_url: str, **kw: Any) -> GeminiModel:
    return GeminiModel(MODEL, api_key=API_KEY, base_url=base_url, **kw)


def reply(*blocks: Any, stop: StopReason = StopReason.END_TURN,
          usage: Usage | None = None) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(message=Message(role=Role.ASSISTANT, blocks=content), stop_reason=stop,
                    usage=usage or Usage(input_tokens=10, output_tokens=3))


def ask(text: str = "Hi", **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), **kw)


def signed(signature: str = SIGNATURE) -> OpaqueBlock:
    return OpaqueBlock(provider="gemini", raw=json.dumps({"thoughtSignature": signature},
                                                         separators=(",", ":")))


async def run(model: GeminiModel, request: Request, mode: str) -> Response:
    if mode == "generate":
        return await model.generate(request)
    return await assemble(model.stream(request))


WEATHER = Tool(name="get_weather", description="Current weather for a city.",
               input_schema={"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]})
CLOCK = Tool(name="get_time", input_schema={"type": "object"})
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))

Responder = Callable[[Recorded, Exchange], None]


@pytest.fixture
def server() -> Iterator[Callable[[Responder], LoopbackServer]]:
    """A bare loopback server with a hand-written responder, for replies the fake would
    never produce (hostile ones, above all)."""
    servers: list[LoopbackServer] = []

    def start(respond: Responder) -> LoopbackServer:
        srv = LoopbackServer(respond).__enter__()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.__exit__(None, None, None)


def sse(*chunks: dict[str, Any] | str) -> Responder:
    """A responder streaming these chunks as they are (no validation: hostile ones too)."""

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        for c in chunks:
            ex.send_event(c if isinstance(c, str) else json.dumps(c))

    return respond


def body(data: Any, status: int = 200) -> Responder:
    """A responder answering with this JSON (or these bytes) as is."""

    def respond(rec: Recorded, ex: Exchange) -> None:
        if isinstance(data, bytes):
            ex.send_bytes(status, data)
        else:
            ex.send_json(status, data)

    return respond


def candidate(*parts: dict[str, Any], finish: str | None = "STOP", message: str | None = None,
              **extra: Any) -> dict[str, Any]:
    """A one-candidate ``GenerateContentResponse`` with these parts (``message``: its
    ``finishMessage``; ``extra``: top-level fields)."""
    cand: dict[str, Any] = {"index": 0}
    if parts:
        cand["content"] = {"parts": list(parts), "role": "model"}
    if finish:
        cand["finishReason"] = finish
    if message is not None:
        cand["finishMessage"] = message
    return {"candidates": [cand], "modelVersion": "gemini-2.5-flash-001", **extra}


# -- wire encoding ----------------------------------------------------------------------------


async def test_request_encoding_on_the_wire(fake: FakeGemini) -> None:
    a = ToolUse(id="call_a", name="get_weather", input={"city": "Oslo"})
    b = ToolUse(id="call_b", name="get_time", input={"city": "Lima", "tz": {"dst": False}})
    request = Request(
        system="Be brief.",
        tools=(WEATHER, CLOCK),
        messages=(
            Message.text(Role.USER, "Oslo weather, Lima time?"),
            Message(role=Role.ASSISTANT, blocks=(
                OpaqueBlock(provider="gemini", raw=THOUGHT),
                OpaqueBlock(provider="anthropic", raw='{"type":"thinking","thinking":"hm"}'),
                TextBlock(text="Checking."), a, signed(), b)),
            Message(role=Role.USER, blocks=(
                ToolResult(tool_use_id="call_a", content='{"sky": "rain", "celsius": 9}'),
                ToolResult(tool_use_id="call_b", content="unknown city", is_error=True),
                TextBlock(text="And this?"),
                ImageBlock(media_type="image/PNG", data=PNG))),
        ),
        max_tokens=300,
        cache=CacheHint(prefix=True, stable_messages=2, key="conv-1"),
        sampling=Sampling(seed=7, temperature=0.2, top_p=0.9),
        tool_choice="get_weather",
    )
    fake.script(reply(ToolUse(id="call_c", name="get_weather", input={"city": "Oslo"}),
                      stop=StopReason.TOOL_USE))
    await model_for(fake.url).generate(request)

    [sent] = fake.requests
    assert sent.path == GENERATE_PATH and "key" not in sent.path
    assert sent.headers["x-goog-api-key"] == API_KEY
    assert "authorization" not in sent.headers
    assert sent.body == {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [{"functionDeclarations": [
            {"name": "get_weather", "description": "Current weather for a city.",
             "parametersJsonSchema": WEATHER.input_schema},
            {"name": "get_time", "parametersJsonSchema": {"type": "object"}},
        ]}],
        "contents": [
            {"role": "user", "parts": [{"text": "Oslo weather, Lima time?"}]},
            {"role": "model", "parts": [
                json.loads(THOUGHT),
                {"text": "Checking."},
                {"functionCall": {"id": "call_a", "name": "get_weather",
                                  "args": {"city": "Oslo"}},
                 "thoughtSignature": SIGNATURE},  # back on the part it came with
                {"functionCall": {"id": "call_b", "name": "get_time",
                                  "args": {"city": "Lima", "tz": {"dst": False}}}},
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"id": "call_a", "name": "get_weather",
                                      "response": {"output": {"sky": "rain", "celsius": 9}}}},
                {"functionResponse": {"id": "call_b", "name": "get_time",
                                      "response": {"error": "unknown city"}}},
                {"text": "And this?"},
                {"inlineData": {"mimeType": "image/png",
                                "data": base64.b64encode(PNG).decode()}},
            ]},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY",
                                                 "allowedFunctionNames": ["get_weather"]}},
        "generationConfig": {"maxOutputTokens": 300, "temperature": 0.2, "topP": 0.9,
                             "seed": 7},
    }
    # the stable part first, per-call fields after the contents
    assert list(json.loads(sent.raw)) == list(sent.body)
    assert THOUGHT.encode() in sent.raw  # a thought part is spliced back verbatim
    assert b"thinking" not in sent.raw  # another provider's opaque block is dropped
    check_request(sent.body)
    assert fake.rejected == []


async def test_a_stream_posts_the_same_body_to_the_stream_method(fake: FakeGemini) -> None:
    fake.script(reply("one"), reply("two"))
    model = model_for(fake.url)
    await model.generate(ask(max_tokens=5))
    await assemble(model.stream(ask(max_tokens=5)))
    generated, streamed = fake.requests
    assert (generated.path, streamed.path) == (GENERATE_PATH, STREAM_PATH)
    assert generated.raw == streamed.raw
    assert streamed.headers["accept"] == "text/event-stream"
    assert streamed.headers["x-goog-api-key"] == API_KEY


@pytest.mark.parametrize(("choice", "wire"), [
    ("auto", None),
    ("required", {"functionCallingConfig": {"mode": "ANY"}}),
    ("none", {"functionCallingConfig": {"mode": "NONE"}}),
    ("get_time", {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_time"]}}),
])
async def test_tool_choice_is_the_function_calling_config(
        fake: FakeGemini, choice: str, wire: dict[str, Any] | None) -> None:
    call = ToolUse(id="call_t", name="get_time", input={})
    fake.script(reply("no call") if choice in ("auto", "none")
                else reply(call, stop=StopReason.TOOL_USE))
    await model_for(fake.url).generate(ask(tools=(WEATHER, CLOCK), tool_choice=choice))
    assert fake.requests[0].body.get("toolConfig") == wire
    assert fake.rejected == []


async def test_nothing_is_sent_for_a_plain_request(fake: FakeGemini) -> None:
    fake.script(reply("ok"))
    await model_for(fake.url).generate(ask(cache=CacheHint(prefix=True, stable_messages=1,
                                                           key="conv-9")))
    assert fake.requests[0].raw == b'{"contents":[{"role":"user","parts":[{"text":"Hi"}]}]}'


@pytest.mark.parametrize(("model", "effort", "max_tokens", "config"), [
    ("gemini-2.5-flash", "low", 300,
     {"maxOutputTokens": 300 + 1024, "thinkingConfig": {"thinkingBudget": 1024}}),
    ("gemini-2.5-pro", "high", None, {"thinkingConfig": {"thinkingBudget": 16384}}),
    # Gemini 3 Pro takes LOW and HIGH only: medium is its default, HIGH
    ("gemini-3-pro-preview", "medium", 300,
     {"maxOutputTokens": 300, "thinkingConfig": {"thinkingLevel": "HIGH"}}),
    ("gemini-3-pro-preview", "low", None, {"thinkingConfig": {"thinkingLevel": "LOW"}}),
    ("gemini-3-pro", "high", None, {"thinkingConfig": {"thinkingLevel": "HIGH"}}),
    ("gemini-3.1-pro-preview", "medium", None, {"thinkingConfig": {"thinkingLevel": "MEDIUM"}}),
    ("gemini-3-flash-preview", "medium", None, {"thinkingConfig": {"thinkingLevel": "MEDIUM"}}),
    ("gemini-3-flash", None, None, None),
])
def test_reasoning_effort_is_the_thinking_config(
        model: str, effort: str | None, max_tokens: int | None,
        config: dict[str, Any] | None) -> None:
    gemini = GeminiModel(model, api_key=API_KEY)
    sent = json.loads(gemini.encode(ask(max_tokens=max_tokens, reasoning_effort=effort),
                                    stream=False))
    assert sent.get("generationConfig") == config
    check_request(sent)


def test_thinking_style_and_its_override() -> None:
    styles = {"gemini-2.5-flash": "budget", "gemini-1.5-pro": "budget",
              "gemini-3-pro": "low-high", "gemini-3-pro-preview": "low-high",
              "gemini-3.1-pro-preview": "level", "gemini-3-flash-preview": "level",
              "gemini-3-progress": "level", "gemini-exp-1206": "level"}
    assert {m: thinking_style(m) for m in styles} == styles
    gateway = GeminiModel("my-alias", api_key=API_KEY, thinking="budget", max_tokens=100)
    sent = json.loads(gateway.encode(ask(reasoning_effort="medium"), stream=False))
    assert sent["generationConfig"] == {"maxOutputTokens": 100 + 4096,
                                        "thinkingConfig": {"thinkingBudget": 4096}}
    pro = GeminiModel("my-pro", api_key=API_KEY, thinking="low-high")
    sent = json.loads(pro.encode(ask(reasoning_effort="medium"), stream=False))
    assert sent["generationConfig"] == {"thinkingConfig": {"thinkingLevel": "HIGH"}}
    with pytest.raises(ConfigurationError, match=r"'levels'.*'low-high'"):
        GeminiModel("my-alias", api_key=API_KEY, thinking="levels")  # type: ignore[arg-type]


@pytest.mark.parametrize("model", ["gemini-3-pro-preview", "gemini-3.1-pro-preview",
                                   "gemini-3-flash-preview", "gemini-2.5-pro"])
async def test_every_effort_is_a_thinking_config_the_model_takes(
        fake: FakeGemini, model: str) -> None:
    """Over the wire: the fake answers 400, as Gemini does, a level a model does not take
    (MEDIUM on Gemini 3 Pro, any level on 2.x)."""
    efforts = ("low", "medium", "high")
    fake.script(*[reply("ok")] * len(efforts))
    gemini = GeminiModel(model, api_key=API_KEY, base_url=fake.url)
    for effort in efforts:
        await gemini.generate(ask(reasoning_effort=effort))
    assert fake.rejected == [] and len(fake.requests) == len(efforts)


@pytest.mark.parametrize(("content", "failed", "response"), [
    ("sunny, 21C", False, {"output": "sunny, 21C"}),
    ('{"sky":"sunny"}', False, {"output": {"sky": "sunny"}}),
    ("[1, 2]", False, {"output": [1, 2]}),
    ("42", False, {"output": "42"}),  # scalars stay the text they are
    ("[NaN]", False, {"output": "[NaN]"}),  # not JSON: the text
    ("{broken", False, {"output": "{broken"}),
    ("boom", True, {"error": "boom"}),
    ('{"code": 7}', True, {"error": {"code": 7}}),
])
def test_a_result_is_always_an_object(content: str, failed: bool,
                                      response: dict[str, Any]) -> None:
    call = ToolUse(id="call_1", name="get_weather", input={"city": "Oslo"})
    request = Request(tools=(WEATHER,), messages=(
        Message.text(Role.USER, "Oslo?"), Message(role=Role.ASSISTANT, blocks=(call,)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_1", content=content,
                                                   is_error=failed),))))
    sent = json.loads(model_for("https://g.example.com").encode(request, stream=False))
    part = sent["contents"][2]["parts"][0]
    assert part == {"functionResponse": {"id": "call_1", "name": "get_weather",
                                         "response": response}}
    check_request(sent)


def test_system_role_messages_join_the_system_instruction() -> None:
    request = Request(system="Be brief.", messages=(
        Message.text(Role.SYSTEM, "Answer in French."), Message.text(Role.USER, "Hi")))
    sent = json.loads(model_for("https://g.example.com").encode(request, stream=False))
    assert sent["systemInstruction"] == {"parts": [{"text": "Be brief."},
                                                   {"text": "Answer in French."}]}
    assert sent["contents"] == [{"role": "user", "parts": [{"text": "Hi"}]}]


def test_a_signature_without_a_part_to_go_on_goes_alone() -> None:
    request = Request(messages=(
        Message.text(Role.USER, "Hi"),
        Message(role=Role.ASSISTANT, blocks=(signed("c2lnMQ=="), TextBlock(text="Hello."),
                                             signed("c2lnMg=="), signed("c2lnMw=="))),
        Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider="other", raw="{}"),)),
        Message.text(Role.USER, "Go on")))
    sent = json.loads(model_for("https://g.example.com").encode(request, stream=False))
    assert sent["contents"][1]["parts"] == [
        {"text": "", "thoughtSignature": "c2lnMQ=="},
        {"text": "Hello.", "thoughtSignature": "c2lnMg=="},
        {"text": "", "thoughtSignature": "c2lnMw=="},
    ]
    assert len(sent["contents"]) == 3  # a message with nothing for Gemini is left out
    check_request(sent)


def test_googles_placeholder_signature_is_the_documented_bytes() -> None:
    assert SKIP_SIGNATURE == "c2tpcF90aG91Z2h0X3NpZ25hdHVyZV92YWxpZGF0b3I="
    assert base64.b64decode(SKIP_SIGNATURE) == b"skip_thought_signature_validator"


def _unsigned_history() -> Request:
    """A tool conversation no Gemini 3 signed: calls from another provider, one signed by
    Gemini (kept), one after a signed text part (a 2.x reply), and a turn without calls."""
    a = ToolUse(id="call_a", name="get_weather", input={"city": "Oslo"})
    b = ToolUse(id="call_b", name="get_time", input={"city": "Lima"})
    c = ToolUse(id="call_c", name="get_weather", input={"city": "Rome"})
    d = ToolUse(id="call_d", name="get_time", input={})
    return Request(tools=(WEATHER, CLOCK), messages=(
        Message.text(Role.USER, "Oslo weather, Lima time?"),
        Message(role=Role.ASSISTANT, blocks=(
            OpaqueBlock(provider="anthropic", raw='{"type":"thinking","thinking":"hm"}'),
            TextBlock(text="Checking."), a, b)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_a", content="rain"),
                                        ToolResult(tool_use_id="call_b", content="9:00"))),
        Message(role=Role.ASSISTANT, blocks=(c, signed())),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_c", content="sun"),)),
        Message(role=Role.ASSISTANT, blocks=(TextBlock(text="One more."), signed("c2lnMQ=="),
                                             d)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_d", content="noon"),)),
        Message.text(Role.ASSISTANT, "Rain in Oslo, 9:00 in Lima."),
        Message.text(Role.USER, "Thanks"),
    ))


def test_an_unsigned_call_gets_googles_placeholder_for_gemini_3() -> None:
    """Gemini 3 refuses a model turn whose first call has no signature: the first call of
    each such turn carries Google's placeholder; a real signature is never replaced (even
    one that comes after its call in the blocks), and the other calls get none."""
    sent = json.loads(GeminiModel("gemini-3-flash-preview", api_key=API_KEY).encode(
        _unsigned_history(), stream=False))
    model_turns = [c["parts"] for c in sent["contents"] if c["role"] == "model"]
    assert model_turns == [
        [{"text": "Checking."},
         {"functionCall": {"id": "call_a", "name": "get_weather", "args": {"city": "Oslo"}},
          "thoughtSignature": SKIP_SIGNATURE},
         {"functionCall": {"id": "call_b", "name": "get_time", "args": {"city": "Lima"}}}],
        [{"functionCall": {"id": "call_c", "name": "get_weather", "args": {"city": "Rome"}},
          "thoughtSignature": SIGNATURE}],
        [{"text": "One more.", "thoughtSignature": "c2lnMQ=="},
         {"functionCall": {"id": "call_d", "name": "get_time", "args": {}},
          "thoughtSignature": SKIP_SIGNATURE}],
        [{"text": "Rain in Oslo, 9:00 in Lima."}],
    ]
    check_request(sent)


@pytest.mark.parametrize("model", ["gemini-2.5-flash", "gemini-1.5-pro"])
def test_no_placeholder_for_the_models_that_do_not_check(model: str) -> None:
    raw = GeminiModel(model, api_key=API_KEY).encode(_unsigned_history(), stream=False)
    assert SKIP_SIGNATURE.encode() not in raw
    assert raw.count(b"thoughtSignature") == 2  # the two real ones


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_gemini_3_tool_turn_from_another_model_is_accepted(
        fake: FakeGemini, mode: str) -> None:
    """The history of a tool turn run by another model (here a ``ScriptedModel`` step: no
    opaque blocks at all) continued on Gemini 3: without the placeholder Gemini answers 400
    "Function call is missing a thought_signature", which no retry fixes."""
    call = ToolUse(id="call_1", name="get_weather", input={"city": "Bergen"})
    history = Request(tools=(WEATHER,), messages=(
        Message.text(Role.USER, "Bergen?"), Message(role=Role.ASSISTANT, blocks=(call,)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_1", content="rain"),))))
    fake.script(reply("Rain in Bergen."))
    gemini = GeminiModel("gemini-3-flash-preview", api_key=API_KEY, base_url=fake.url,
                         retry=policy(Sleeps(), 1))
    got = await run(gemini, history, mode)
    assert got.message.text_content() == "Rain in Bergen." and fake.rejected == []
    assert fake.requests[0].body["contents"][1]["parts"][0]["thoughtSignature"] == \
        SKIP_SIGNATURE


# -- tool schemas -------------------------------------------------------------------------------


async def test_a_tool_schema_goes_out_as_json_schema_unchanged(fake: FakeGemini) -> None:
    """``parametersJsonSchema`` takes JSON Schema as written: keywords the OpenAPI-style
    ``parameters`` lacks (``$ref``, ``const``, type arrays, ``pattern``) are not translated or
    dropped, byte for byte."""
    schema = {
        "type": "object",
        "$defs": {"unit": {"enum": ["C", "F"]}},
        "properties": {
            "city": {"type": "string", "pattern": "^[A-Z]"},
            "unit": {"$ref": "#/$defs/unit"},
            "kind": {"const": "forecast"},
            "days": {"type": ["integer", "null"], "minimum": 1},
        },
        "required": ["city"],
        "additionalProperties": False,
    }
    tool = Tool(name="forecast.v2:get", input_schema=schema)
    fake.script(reply("ok"))
    await model_for(fake.url).generate(ask(tools=(tool,)))
    sent = fake.requests[0]
    assert json.dumps(schema, separators=(",", ":")).encode() in sent.raw
    assert sent.body["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"] == schema


@pytest.mark.parametrize(("tool", "complaint"), [
    (Tool(name="shout", input_schema={"type": "string"}), ['tool \'shout\'', '"type": "string"',
                                                           "object"]),
    (Tool(name="many", input_schema={"type": ["object", "null"]}), ["'many'", '"type"']),
    (Tool(name="2fast", input_schema={"type": "object"}), ["'2fast'", "letter"]),
    (Tool(name="get weather", input_schema={"type": "object"}), ["'get weather'", "rename"]),
    (Tool(name="x" * 129), ["128"]),
])
@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_schema_or_name_gemini_cannot_take_is_refused_before_sending(
        fake: FakeGemini, tool: Tool, complaint: list[str], mode: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        await run(model_for(fake.url), ask(tools=(WEATHER, tool)), mode)
    for words in complaint:
        assert words in str(info.value)
    assert fake.requests == []


# -- requests we cannot express ------------------------------------------------------------------


@pytest.mark.parametrize(("message", "complaint"), [
    (Message(role=Role.ASSISTANT, blocks=(ImageBlock(media_type="image/png", data=PNG),)),
     "image block cannot go in a assistant message"),
    (Message(role=Role.USER, blocks=(ImageBlock(media_type="image/tiff", data=b"II*"),)),
     "image/tiff"),
    (Message(role=Role.USER, blocks=(ToolUse(id="x", name="f"),)), "tool_use"),
    (Message(role=Role.ASSISTANT, blocks=(ToolResult(tool_use_id="x", content="r"),)),
     "tool_result"),
    (Message(role=Role.USER, blocks=(ToolResult(tool_use_id="nobody", content="r"),)),
     "answers no tool call"),
    (Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider="gemini", raw="[1]"),)),
     "JSON object"),
    (Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider="gemini",
                                                      raw='{"thoughtSignature":7}'),)),
     "string"),
])
async def test_requests_we_cannot_express_are_refused_before_sending(
        fake: FakeGemini, message: Message, complaint: str) -> None:
    request = Request(messages=(Message.text(Role.USER, "Hi"), message))
    for mode in ("generate", "stream"):
        with pytest.raises(LLMError) as info:
            await run(model_for(fake.url), request, mode)
        assert info.value.fault is Fault.TERMINAL and info.value.status is None
        assert complaint in str(info.value)
    assert fake.requests == []


# -- decoding: blocks, ids, signatures -----------------------------------------------------------


def _without_ids(payload: dict[str, Any]) -> dict[str, Any]:
    """A response or chunk with every ``functionCall.id`` removed (Gemini often sends none)."""
    copy = json.loads(json.dumps(payload))
    for cand in copy.get("candidates", []):
        for part in cand.get("content", {}).get("parts", []):
            part.get("functionCall", {}).pop("id", None)
    return copy


RICH = reply(
    OpaqueBlock(provider="gemini", raw=THOUGHT),
    "Checking both cities now.",
    signed(base64.b64encode(b"text sig").decode()),
    ToolUse(id="call_x", name="get_weather", input={"city": "Rome", "days": [1, 2, 3]}),
    signed(),
    ToolUse(id="call_y", name="get_time", input={}),
    OpaqueBlock(provider="gemini", raw='{"executableCode":{"language":"PYTHON","code":"1+1"}}'),
    stop=StopReason.TOOL_USE,
    usage=Usage(input_tokens=120, output_tokens=40, cache_read_tokens=100),
)


async def test_stream_assembles_exactly_to_generate_with_thoughts_signatures_and_no_ids(
        fake: FakeGemini) -> None:
    """The same reply, with the calls' ids missing as Gemini often sends them, decoded from
    the whole response and from its chunks (text and thoughts in 5-character pieces): the
    same ``Response``, ids included."""
    whole = _without_ids(render_body(RICH, "resp-1"))
    chunks = tuple(_without_ids(c) for c in render_chunks(RICH, "resp-1"))
    assert len(chunks) > 10
    fake.script(Body(whole), Chunks(chunks))
    model = model_for(fake.url)
    request = ask("Rome?", tools=(WEATHER, CLOCK))
    generated = await model.generate(request)
    events: list[StreamEvent] = [e async for e in model.stream(request)]
    assert sum(isinstance(e, TextDelta) for e in events) == 5

    async def replay() -> Any:
        for e in events:
            yield e

    assert await assemble(replay()) == generated
    kinds = [b.kind for b in generated.message.blocks]
    assert kinds == ["opaque", "text", "opaque", "tool_use", "opaque", "tool_use", "opaque"]
    ids = [u.id for u in generated.message.tool_uses()]
    assert all(re.fullmatch(r"call_[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 2
    assert generated.message.blocks[0].raw == THOUGHT  # the thought, whole again
    assert generated.stop_reason is StopReason.TOOL_USE


def test_made_ids_are_stable_for_a_reply_and_differ_between_replies() -> None:
    first = decode_response(_without_ids(render_body(RICH, "resp-1")))
    again = decode_response(_without_ids(render_body(RICH, "resp-1")))
    other = decode_response(_without_ids(render_body(RICH, "resp-2")))
    ids = [u.id for u in first.message.tool_uses()]
    assert ids == [u.id for u in again.message.tool_uses()]
    assert not set(ids) & {u.id for u in other.message.tool_uses()}


@pytest.mark.parametrize("wire_id", ["", "has space", "x" * 65, "é", 7, None])
def test_an_unusable_call_id_is_replaced(wire_id: Any) -> None:
    data = candidate({"functionCall": {"name": "f", "args": {}, "id": wire_id}})
    [use] = decode_response(data).message.tool_uses()
    assert re.fullmatch(r"call_[0-9a-f]{32}", use.id)


def test_a_repeated_call_id_gets_a_fresh_one() -> None:
    data = candidate({"functionCall": {"name": "f", "args": {}, "id": "dup"}},
                     {"functionCall": {"name": "f", "args": {"a": 1}, "id": "dup"}})
    ids = [u.id for u in decode_response(data).message.tool_uses()]
    assert ids[0] == "dup" and ids[1] != "dup"


async def test_a_multi_step_tool_turn_keeps_its_thoughts_and_signatures(
        fake: FakeGemini) -> None:
    """The step engine over the adapter: the second request sends the model turn back with
    its thought part verbatim, the signature on the very call it came with, and the result
    under that call's (made) id and name."""
    call = reply(OpaqueBlock(provider="gemini", raw=THOUGHT),
                 ToolUse(id="ignored", name="get_weather", input={"city": "Bergen"}),
                 signed(), stop=StopReason.TOOL_USE)
    fake.script(Chunks(tuple(_without_ids(c) for c in render_chunks(call, "r1"))),
                reply("Rain in Bergen."))

    async def execute(use: ToolUse) -> str:
        return "rain, 8C"

    outcome = await run_steps(
        model_for(fake.url),
        lambda history, step: Request(system="Be brief.", messages=tuple(history),
                                      tools=(WEATHER,)),
        execute=execute, history=[Message.text(Role.USER, "Bergen?")])
    assert outcome.final is not None and outcome.final.text_content() == "Rain in Bergen."
    made = outcome.messages[0].tool_uses()[0].id
    model_turn, results = fake.requests[1].body["contents"][1:3]
    assert model_turn["parts"] == [
        json.loads(THOUGHT),
        {"functionCall": {"id": made, "name": "get_weather", "args": {"city": "Bergen"}},
         "thoughtSignature": SIGNATURE},
    ]
    assert THOUGHT.encode() in fake.requests[1].raw
    assert results["parts"] == [{"functionResponse": {
        "id": made, "name": "get_weather", "response": {"output": "rain, 8C"}}}]


def test_adjacent_text_parts_are_one_block_and_a_signature_ends_it() -> None:
    data = candidate({"text": "Hel"}, {"text": "lo"}, {"text": "", "thoughtSignature": "c2ln"},
                     {"text": "More."}, {"thoughtSignature": "c2lnMg=="})
    blocks = decode_response(data).message.blocks
    assert blocks == (TextBlock(text="Hello"), signed("c2ln"), TextBlock(text="More."),
                      signed("c2lnMg=="))


def test_an_unknown_part_kind_is_kept_verbatim_and_replayed() -> None:
    part = {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "2\n"}}
    data = candidate({"text": "Computed:"}, part, {"text": " 2."})
    check_response(data)
    response = decode_response(data)
    assert response.message.blocks == (
        TextBlock(text="Computed:"),
        OpaqueBlock(provider="gemini", raw=json.dumps(part, separators=(",", ":"))),
        TextBlock(text=" 2."))
    history = Request(messages=(Message.text(Role.USER, "1+1?"), response.message,
                                Message.text(Role.USER, "Thanks")))
    sent = json.loads(model_for("https://g.example.com").encode(history, stream=False))
    assert sent["contents"][1]["parts"] == [{"text": "Computed:"}, part, {"text": " 2."}]


# -- usage and stop reasons --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_usage_counts_cached_thought_and_tool_prompt_tokens(server: Any, mode: str
                                                                  ) -> None:
    usage = {"promptTokenCount": 2000, "cachedContentTokenCount": 1500,
             "candidatesTokenCount": 30, "thoughtsTokenCount": 200,
             "toolUsePromptTokenCount": 50, "totalTokenCount": 2280}
    last = candidate({"text": "ok"}, usageMetadata=usage)
    check_response(last)
    first = candidate({"text": "o"}, finish=None,
                      usageMetadata={"promptTokenCount": 2000, "totalTokenCount": 2000})
    srv = server(sse(first, last) if mode == "stream" else body(last))
    got = await run(model_for(srv.url), ask(), mode)
    assert got.usage == Usage(input_tokens=2050, output_tokens=230, cache_read_tokens=1500,
                              reasoning_tokens=200)


async def test_stream_usage_updates_end_with_the_whole_count(fake: FakeGemini) -> None:
    usage = Usage(input_tokens=20, output_tokens=4, cache_read_tokens=8)
    fake.script(reply("Hello there.", usage=usage))
    events = [e async for e in model_for(fake.url).stream(ask())]
    updates = [e.usage for e in events if isinstance(e, UsageUpdate)]
    assert len(updates) == 3 and updates[0] == Usage(input_tokens=20)
    assert events[-2:] == [UsageUpdate(usage=usage),
                           Stop(stop_reason=StopReason.END_TURN, model="gemini-2.5-flash-fake")]


FINISH_REASONS: dict[str, StopReason | Fault] = {
    "STOP": StopReason.END_TURN,
    "MAX_TOKENS": StopReason.MAX_TOKENS,
    "CONTINUATION": StopReason.MAX_TOKENS,  # cut at the per-request limit, unfinished
    "SAFETY": StopReason.REFUSAL,
    "RECITATION": StopReason.REFUSAL,
    "LANGUAGE": StopReason.REFUSAL,
    "BLOCKLIST": StopReason.REFUSAL,
    "PROHIBITED_CONTENT": StopReason.REFUSAL,
    "SPII": StopReason.REFUSAL,
    "MODEL_ARMOR": StopReason.REFUSAL,
    "ESCALATION": StopReason.REFUSAL,
    "IMAGE_SAFETY": StopReason.REFUSAL,
    "IMAGE_PROHIBITED_CONTENT": StopReason.REFUSAL,
    "IMAGE_RECITATION": StopReason.REFUSAL,
    "IMAGE_OTHER": StopReason.REFUSAL,  # an image blocked for no listed reason
    "NO_IMAGE": StopReason.END_TURN,  # the port asks for none: the text is the answer
    "OTHER": StopReason.END_TURN,
    "FINISH_REASON_UNSPECIFIED": StopReason.END_TURN,
    "MALFORMED_FUNCTION_CALL": Fault.TRANSIENT,
    "UNEXPECTED_TOOL_CALL": Fault.TRANSIENT,
    "TOO_MANY_TOOL_CALLS": Fault.TRANSIENT,
    "MALFORMED_RESPONSE": Fault.TRANSIENT,
    "MISSING_THOUGHT_SIGNATURE": Fault.TERMINAL,
    "PUP_LIMITED_DISABLED": Fault.TERMINAL,  # the account is limited: every call stops so
}


def test_every_finish_reason_the_sdk_declares_is_placed() -> None:
    """A finish reason the official SDK declares and this table does not place is one the
    adapter reads as ``end_turn`` without anyone having decided it should."""
    assert set(FINISH_REASONS) == {r.value for r in genai_types.FinishReason}


@pytest.mark.parametrize(("finish", "stop"), [
    (f, s) for f, s in FINISH_REASONS.items() if isinstance(s, StopReason)])
@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_finish_reasons(server: Any, finish: str, stop: StopReason, mode: str) -> None:
    data = candidate({"text": "partial an"}, finish=finish)
    check_response(data)
    srv = server(sse(data) if mode == "stream" else body(data))
    got = await run(model_for(srv.url), ask(), mode)
    assert got.stop_reason is stop and got.message.text_content() == "partial an"


async def test_a_safety_stop_without_content_is_an_empty_refusal(server: Any) -> None:
    data = candidate(finish="SAFETY")
    check_response(data)
    got = await model_for(server(body(data)).url).generate(ask())
    assert (got.stop_reason, got.message.blocks) == (StopReason.REFUSAL, ())


@pytest.mark.parametrize("finish", ["MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL",
                                    "TOO_MANY_TOOL_CALLS", "MALFORMED_RESPONSE"])
@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_botched_reply_is_transient_and_sampled_again(
        fake: FakeGemini, finish: str, mode: str) -> None:
    bad = candidate(finish=finish, message="Malformed function call: get_weather(city=")
    bad["responseId"] = "r"
    fake.script(Chunks((bad,)) if mode == "stream" else Body(bad), reply("second sample"))
    sleeps = Sleeps()
    got = await run(model_for(fake.url, retry=policy(sleeps)), ask(tools=(WEATHER,)), mode)
    assert got.message.text_content() == "second sample" and len(sleeps.waits) == 1

    fake.script(Chunks((bad,)) if mode == "stream" else Body(bad))
    with pytest.raises(LLMError) as info:
        await run(model_for(fake.url, retry=policy(Sleeps(), 1)), ask(tools=(WEATHER,)), mode)
    assert info.value.fault is Fault.TRANSIENT
    assert finish in info.value.message and "get_weather(city=" in info.value.message


@pytest.mark.parametrize(("finish", "fault"), [
    (f, s) for f, s in FINISH_REASONS.items() if isinstance(s, Fault)])
async def test_finish_reasons_that_are_faults(fake: FakeGemini, finish: str, fault: Fault
                                              ) -> None:
    fake.script(Body(candidate({"text": "part"}, finish=finish, message="why")))
    with pytest.raises(LLMError) as info:
        await model_for(fake.url, retry=policy(Sleeps(), 1)).generate(ask())
    assert info.value.fault is fault and f"finishReason {finish}: why" in info.value.message


async def test_a_missing_thought_signature_is_terminal(fake: FakeGemini) -> None:
    fake.script(Body(candidate(finish="MISSING_THOUGHT_SIGNATURE")))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await model_for(fake.url, retry=policy(sleeps)).generate(ask())
    assert info.value.fault is Fault.TERMINAL and "thought signature" in info.value.message
    assert sleeps.waits == []


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_blocked_prompt_is_terminal_and_says_why(fake: FakeGemini, mode: str) -> None:
    blocked = {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT",
                                  "blockReasonMessage": "The prompt breaks the policy."},
               "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7},
               "modelVersion": "gemini-2.5-flash", "responseId": "r"}
    fake.script(Chunks((blocked,)) if mode == "stream" else Body(blocked), reply("never"))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await run(model_for(fake.url, retry=policy(sleeps)), ask(), mode)
    err = info.value
    assert (err.fault, err.provider) == (Fault.TERMINAL, "gemini")
    assert "PROHIBITED_CONTENT" in err.message and "breaks the policy" in err.message
    assert sleeps.waits == [] and fake.remaining() == 1


# -- Gemini's errors ---------------------------------------------------------------------------

QUOTA_MESSAGE = ("You exceeded your current quota, please check your plan and billing "
                 "details. For more information on this error, head to: "
                 "https://ai.google.dev/gemini-api/docs/rate-limits.")


def _violation(quota_id: str, value: str = "10") -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
        "quotaId": quota_id, "quotaValue": value}]}


RETRY_37 = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}


@pytest.mark.parametrize(("details", "message", "fault", "wait"), [
    # Gemini says "exceeded your current quota" for a per-minute limit too: the details decide
    ([_violation("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"), RETRY_37],
     QUOTA_MESSAGE, Fault.TRANSIENT, 37.0),
    ([_violation("GenerateRequestsPerDayPerProjectPerModel-FreeTier"), RETRY_37],
     QUOTA_MESSAGE, Fault.TERMINAL, 37.0),
    ([_violation("GenerateContentInputTokensPerModelPerMinute-FreeTier", value="0")],
     QUOTA_MESSAGE, Fault.TERMINAL, None),  # a limit of 0: the plan has no such model
    ([{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}],
     "Resource has been exhausted (e.g. check quota).", Fault.TRANSIENT, 1.5),
    ([], "Resource has been exhausted (e.g. check quota).", Fault.TERMINAL, None),
    ([], "Too many requests: rate limit reached.", Fault.TRANSIENT, None),
])
async def test_a_429_is_read_from_its_details(server: Any, details: list[dict[str, Any]],
                                              message: str, fault: Fault,
                                              wait: float | None) -> None:
    error = error_body(429, message, details)
    srv = server(body(error, 429))
    with pytest.raises(LLMError) as info:
        await model_for(srv.url, retry=policy(Sleeps(), 1)).generate(ask())
    assert (info.value.fault, info.value.status, info.value.retry_after) == (fault, 429, wait)
    assert info.value.message == message


async def test_retry_info_is_the_wait(fake: FakeGemini) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(503, "overloaded", retry_after=4, message="The model is overloaded."),
                reply("ok"))
    await model_for(fake.url, retry=policy(sleeps)).generate(ask())
    assert sleeps.waits == [4.0]


@pytest.mark.parametrize(("status", "fault"), [(400, Fault.TERMINAL), (403, Fault.TERMINAL),
                                               (500, Fault.TRANSIENT), (503, Fault.TRANSIENT),
                                               (504, Fault.TRANSIENT)])
@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_http_errors_are_classified(server: Any, status: int, fault: Fault, mode: str
                                          ) -> None:
    srv = server(body(error_body(status, f"the {status} message"), status))
    with pytest.raises(LLMError) as info:
        await run(model_for(srv.url, retry=policy(Sleeps(), 1)), ask(), mode)
    assert (info.value.fault, info.value.status) == (fault, status)
    assert info.value.message == f"the {status} message"


@pytest.mark.parametrize(("mode", "path"), [("generate", GENERATE_PATH),
                                            ("stream", STREAM_PATH.partition("?")[0])])
async def test_a_404_names_the_url_asked_for(server: Any, mode: str, path: str) -> None:
    srv = server(body(error_body(404, "models/x is not found for API version v1beta"), 404))
    with pytest.raises(LLMError) as info:
        await run(model_for(srv.url), ask(), mode)
    assert f"{srv.url}{path}" in info.value.message and "base URL" in info.value.message


async def test_a_non_json_error_body_still_makes_a_classified_error(server: Any) -> None:
    srv = server(lambda rec, ex: ex.send_bytes(502, b"<h1>502 Bad Gateway</h1>", "text/html"))
    with pytest.raises(LLMError) as info:
        await model_for(srv.url, retry=policy(Sleeps(), 1)).generate(ask())
    assert (info.value.status, info.value.fault) == (502, Fault.TRANSIENT)
    assert "502 Bad Gateway" in info.value.message


@pytest.mark.parametrize(("error", "fault", "requests"), [
    ({"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"},
     Fault.TRANSIENT, 2),
    ({"code": 429, "message": QUOTA_MESSAGE, "status": "RESOURCE_EXHAUSTED",
      "details": [_violation("GenerateRequestsPerDayPerProjectPerModel")]}, Fault.TERMINAL, 1),
    ({"code": 400, "message": "Invalid JSON payload.", "status": "INVALID_ARGUMENT"},
     Fault.TERMINAL, 1),
])
async def test_an_error_event_inside_the_stream(server: Any, error: dict[str, Any],
                                                fault: Fault, requests: int) -> None:
    check_error(error["code"], {"error": error})
    srv = server(sse({"error": error}))
    with pytest.raises(LLMError) as info:
        await assemble(model_for(srv.url, retry=policy(Sleeps(), 2)).stream(ask()))
    assert (info.value.fault, info.value.status) == (fault, None)
    assert info.value.message == error["message"]
    assert len(srv.requests) == requests  # nothing was delivered, so transient ones retry


# -- hostile replies -----------------------------------------------------------------------------

MALFORMED_GENERATE = [
    b"not json at all",
    b"[1, 2]",
    b"{}",  # no candidates, no block reason
    b'{"candidates": "none"}',
    b'{"candidates": [{"content": {"parts": "text"}}]}',
    b'{"candidates": [{"content": {"parts": [7]}}]}',
    b'{"candidates": [{"content": {"parts": [{"text": 7}]}}]}',
    b'{"candidates": [{"content": {"parts": [{"text": "a", "thought": "yes"}]}}]}',
    b'{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": [1]}}]}}]}',
    b'{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": "x"}}]}}]}',
    b'{"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]}}]}',
    b'{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", '
    b'"args": {"x": NaN}}}]}}]}',
    b'{"candidates": [{"content": {"parts": [{"text": "a", "thoughtSignature": "!!"}]}}]}',
    b'{"candidates": [{"content": {"parts": [{"text": "a"}]}, "finishReason": 3}]}',
    b'{"candidates": [{"finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": -1}}',
    b'{"candidates": [{"finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 1.5}}',
    b'{"candidates": [{"finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": '
    b'1000000000000000000000000000000}}',
    b'{"candidates": [{"finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": '
    b'Infinity}}',
    b'{"candidates": [{"finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 5, '
    b'"cachedContentTokenCount": 9}}',
    b'{"candidates": [{"finishReason": "STOP"}], "usageMetadata": [1]}',
    b'{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": '
    + b'{"a": ' * 100_000 + b'1' + b'}' * 100_000 + b'}}]}}]}',
]


@pytest.mark.parametrize("raw", MALFORMED_GENERATE, ids=lambda r: r[:60].decode())
async def test_a_malformed_reply_to_generate_is_terminal(server: Any, raw: bytes) -> None:
    srv = server(body(raw))
    sleeps = Sleeps()
    with pytest.raises(LLMError, match="malformed") as info:
        await model_for(srv.url, retry=policy(sleeps)).generate(ask())
    assert info.value.fault is Fault.TERMINAL and info.value.provider == "gemini"
    assert len(srv.requests) == 1 and sleeps.waits == []


MALFORMED_STREAM: list[Sequence[dict[str, Any] | str]] = [
    ["{not json"],
    ['["a list"]'],
    [{"candidates": [{"content": {"parts": [{"text": "a"}]}}]}, "nope"],
    [{"candidates": "many"}],
    [{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": 5}}]}}]}],
    ['{"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "STOP"}], '
     '"usageMetadata": {"candidatesTokenCount": NaN}}'],
    [{"usageMetadata": {"promptTokenCount": 3}}, {"modelVersion": "m"}],  # never a candidate
    [{"candidates": [{"content": {"parts": [{"thought": True, "text": "t",
                                             "thoughtSignature": 12}]}}]}],
]


@pytest.mark.parametrize("chunks", MALFORMED_STREAM, ids=lambda c: str(c)[:60])
async def test_a_malformed_stream_is_terminal(server: Any, chunks: list[Any]) -> None:
    srv = server(sse(*chunks))
    sleeps = Sleeps()
    with pytest.raises(LLMError, match="malformed") as info:
        await assemble(model_for(srv.url, retry=policy(sleeps)).stream(ask()))
    assert info.value.fault is Fault.TERMINAL
    assert len(srv.requests) == 1 and sleeps.waits == []


AFTER_THE_FINISH = [
    candidate({"text": "AFTER"}, finish=None),
    candidate({"text": "AFTER"}),
    candidate({"functionCall": {"name": "get_time", "args": {}}}, finish=None),
    candidate({"text": "", "thoughtSignature": "c2ln"}, finish=None),
    candidate({"text": "hm", "thought": True}, finish=None),
    candidate(finish="MAX_TOKENS"),  # a second, different ending
]


@pytest.mark.parametrize("tail", AFTER_THE_FINISH, ids=lambda c: str(c)[:70])
async def test_nothing_is_appended_after_the_finish_chunk(fake: FakeGemini,
                                                          tail: dict[str, Any]) -> None:
    """The chunk with ``finishReason`` ends the reply: content or another ending after it
    is a malformed stream, never more of the reply (it was assembled into 'aAFTER')."""
    fake.script(Chunks((candidate({"text": "a"}), tail)))
    sleeps = Sleeps()
    with pytest.raises(LLMError, match=r"malformed.*after the chunk with its finishReason"
                       ) as info:
        await assemble(model_for(fake.url, retry=policy(sleeps)).stream(ask()))
    assert info.value.fault is Fault.TERMINAL
    assert len(fake.requests) == 1 and sleeps.waits == []


async def test_usage_and_a_repeated_ending_may_follow_the_finish_chunk(fake: FakeGemini
                                                                       ) -> None:
    usage = {"promptTokenCount": 7, "candidatesTokenCount": 2, "totalTokenCount": 9}
    fake.script(Chunks((
        candidate({"text": "Hel"}, finish=None),
        candidate({"text": "lo"}),
        candidate({"text": ""}),  # the same ending again, with nothing in it
        {"usageMetadata": usage, "modelVersion": "gemini-2.5-flash-001", "responseId": "r"},
    )))
    got = await assemble(model_for(fake.url).stream(ask()))
    assert (got.message.text_content(), got.stop_reason) == ("Hello", StopReason.END_TURN)
    assert got.usage == Usage(input_tokens=7, output_tokens=2)


async def test_a_stream_without_a_finish_reason_was_cut_short(server: Any) -> None:
    srv = server(sse(candidate({"text": "Hel"}, finish=None)))
    with pytest.raises(LLMError, match="before a finishReason") as info:
        await assemble(model_for(srv.url, retry=policy(Sleeps(), 1)).stream(ask()))
    assert info.value.fault is Fault.TRANSIENT


async def test_huge_numbers_in_arguments_survive_exactly(server: Any) -> None:
    huge = 10**40
    data = candidate({"functionCall": {"name": "f", "args": {"n": huge, "x": 1e308}}})
    srv = server(body(data))
    [use] = (await model_for(srv.url).generate(ask())).message.tool_uses()
    assert use.input == {"n": huge, "x": 1e308}


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_reply_past_the_cap_is_terminal(server: Any, mode: str) -> None:
    thought = {"text": "t" * 3000, "thought": True}
    chunks = [candidate(thought, finish=None) for _ in range(5)] + [candidate({"text": "ok"})]
    srv = server(sse(*chunks) if mode == "stream" else body(candidate(*[thought] * 5)))
    model = model_for(srv.url, limits=ReplyLimits(reply_chars=10_000),
                      retry=policy(Sleeps(), 1))
    with pytest.raises(LLMError, match="reply cap") as info:
        await run(model, ask(), mode)
    assert info.value.fault is Fault.TERMINAL


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_tool_name_past_the_cap_is_terminal(server: Any, mode: str) -> None:
    data = candidate({"functionCall": {"name": "f" * 5000, "args": {}}})
    srv = server(sse(data) if mode == "stream" else body(data))
    with pytest.raises(LLMError, match="tool name cap") as info:
        await run(model_for(srv.url, retry=policy(Sleeps(), 1)), ask(), mode)
    assert info.value.fault is Fault.TERMINAL


async def test_other_candidates_and_unknown_fields_are_ignored(server: Any) -> None:
    data = candidate({"text": "mine"}, futureField={"x": 1})
    data["candidates"].append({"index": 1, "content": {"parts": [{"text": "other"}]},
                               "finishReason": "STOP"})
    data["candidates"][0]["content"]["parts"][0]["futurePartField"] = True
    got = await model_for(server(body(data)).url).generate(ask())
    assert got.message.text_content() == "mine" and got.model == "gemini-2.5-flash-001"


# -- configuration -------------------------------------------------------------------------------


def test_a_key_is_required() -> None:
    with pytest.raises(ConfigurationError, match="GEMINI_API_KEY"):
        GeminiModel("gemini-2.5-flash")
    with pytest.raises(ConfigurationError, match="api_key"):
        GeminiModel("gemini-2.5-flash", api_key="", base_url="http://127.0.0.1:9/")


def test_the_adapter_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", API_KEY)
    monkeypatch.setenv("GOOGLE_API_KEY", API_KEY)
    with pytest.raises(ConfigurationError):
        GeminiModel("gemini-2.5-flash")


@pytest.mark.parametrize("name", ["../tunedModels/x", "gemini/../../v1/files", "a?key=leak",
                                  "gemini 2.5", "gemini#frag", "", "models/", "x" * 129,
                                  "gemini..flash"])
def test_a_model_name_that_would_change_the_url_is_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="letters, digits"):
        GeminiModel(name, api_key=API_KEY)


@pytest.mark.parametrize(("base_url", "url"), [
    (None, "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"),
    ("https://proxy.example.com/", "https://proxy.example.com/v1beta/models/gemini-2.5-flash"),
    ("https://proxy.example.com/google/v1", "https://proxy.example.com/google/v1/models/"
                                            "gemini-2.5-flash"),
    ("https://proxy.example.com/v1alpha", "https://proxy.example.com/v1alpha/models/"
                                          "gemini-2.5-flash"),
])
async def test_the_urls_asked_for(base_url: str | None, url: str) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.path.endswith(":streamGenerateContent"):
            chunk = json.dumps(candidate({"text": "ok"}))
            return httpx.Response(200, content=f"data: {chunk}\r\n\r\n".encode(),
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=candidate({"text": "ok"}))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = GeminiModel("models/gemini-2.5-flash", api_key=API_KEY, base_url=base_url,
                            http_client=client)
        assert model.name == "gemini-2.5-flash"
        assert (await model.generate(ask())).message.text_content() == "ok"
        assert (await assemble(model.stream(ask()))).message.text_content() == "ok"
    assert seen == [f"{url}:generateContent", f"{url}:streamGenerateContent?alt=sse"]


@pytest.mark.parametrize("base_url", ["http://models.example.com", "ftp://example.com",
                                      "http://user:pw@10.0.0.5:8000/?key=t"])
def test_an_unsafe_base_url_is_refused(base_url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        GeminiModel(MODEL, api_key=API_KEY, base_url=base_url)
    message = str(info.value)
    assert "https" in message and API_KEY not in message and "pw" not in message


def test_model_identity() -> None:
    model = GeminiModel("gemini-2.5-pro", api_key=API_KEY)
    assert isinstance(model, Model)
    assert (model.name, model.provider) == ("gemini-2.5-pro", "gemini")
    assert repr(model) == ("GeminiModel(model='gemini-2.5-pro', "
                           "base_url='https://generativelanguage.googleapis.com')")


async def test_the_key_never_appears_in_errors_reprs_or_logs(
        server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "runtime"):
        caplog.set_level(logging.DEBUG, logger=name)

    def echo(rec: Recorded, ex: Exchange) -> None:  # a server echoing what it was sent
        key = rec.headers.get("x-goog-api-key", "")
        if "stream" in rec.path:
            ex.start_stream()
            ex.send_event(json.dumps(candidate(finish="MALFORMED_FUNCTION_CALL",
                                               message=f"echo {key} " * 200)))
        else:
            # the key straddles the message cap: removed before the cut, not cut in half
            ex.send_json(400, error_body(400, f"API key not valid: {'x' * 956}{key} and "
                                         f"{'y' * 100}"))

    srv = server(echo)
    model = model_for(srv.url, retry=policy(Sleeps(), 1))
    errors: list[BaseException] = []
    for mode in ("generate", "stream"):
        with pytest.raises(LLMError) as info:
            await run(model, ask(), mode)
        errors.append(info.value)
    with pytest.raises(ConfigurationError) as refused:
        GeminiModel(MODEL, api_key=API_KEY, base_url="http://remote.example.com")
    errors.append(refused.value)
    assert srv.requests[0].headers["x-goog-api-key"] == API_KEY  # it was sent
    assert "[redacted]" in str(errors[1]) and str(errors[0]).endswith("[... truncated]")
    texts = [caplog.text, repr(model), *(f"{e!s} {e!r} {e.args!r}" for e in errors)]
    texts += [f"{r.getMessage()} {r.args!r}" for r in caplog.records]
    for text in texts:
        for i in range(0, len(API_KEY) - 8):  # not even a fragment of it
            assert API_KEY[i:i + 8] not in text


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_key_echoed_in_a_malformed_call_never_shows(
        server: Any, caplog: pytest.LogCaptureFixture, mode: str) -> None:
    """A server echoing the key back as a function name, in a call whose arguments are not
    an object: the malformed-reply error quotes the name, and must not quote the key (the
    adapters' errors are redacted centrally, ``providers/_http.py``)."""
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "runtime"):
        caplog.set_level(logging.DEBUG, logger=name)

    def echo(rec: Recorded, ex: Exchange) -> None:
        key = rec.headers.get("x-goog-api-key", "")
        data = json.dumps(candidate({"functionCall": {"name": key, "args": [key]}}))
        if "stream" in rec.path:
            ex.start_stream()
            ex.send_event(data)
        else:
            ex.send_bytes(200, data.encode())

    srv = server(echo)
    model = model_for(srv.url, retry=policy(Sleeps(), 1))
    with pytest.raises(LLMError, match="malformed") as info:
        await run(model, ask(), mode)
    assert srv.requests[0].headers["x-goog-api-key"] == API_KEY  # it was sent, and echoed
    error = info.value
    texts = [caplog.text, f"{error!s} {error!r} {error.args!r} {error.message}"]
    texts += [f"{r.getMessage()} {r.args!r}" for r in caplog.records]
    for text in texts:
        for i in range(0, len(API_KEY) - 8):  # not even a fragment of it
            assert API_KEY[i:i + 8] not in text


# -- the fake against the official SDK ------------------------------------------------------------


async def test_the_official_sdk_talks_to_the_fake(fake: FakeGemini) -> None:
    """The fake's wire format is the real one: Google's own client sends requests the fake
    accepts and parses what it answers, streamed or not, errors included."""
    want = reply("Checking.", ToolUse(id="call_1", name="get_weather", input={"city": "Oslo"}),
                 signed(), stop=StopReason.TOOL_USE,
                 usage=Usage(input_tokens=30, output_tokens=8, cache_read_tokens=16))
    fake.script(want, want, HTTPError(429, "quota", message="You exceeded your current quota"))
    client = genai.Client(api_key=API_KEY, http_options=genai_types.HttpOptions(
        base_url=fake.url, api_version="v1beta",
        retry_options=genai_types.HttpRetryOptions(attempts=1)))
    tools = [genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(
        name="get_weather", parameters_json_schema=WEATHER.input_schema)])]
    config = genai_types.GenerateContentConfig(tools=tools, system_instruction="Be brief.",
                                               max_output_tokens=50)
    done = await client.aio.models.generate_content(model=MODEL, contents="Oslo?",
                                                    config=config)
    call = done.candidates[0].content.parts[1]
    assert (call.function_call.name, call.function_call.args) == ("get_weather",
                                                                  {"city": "Oslo"})
    assert base64.b64encode(call.thought_signature).decode() == SIGNATURE
    assert done.usage_metadata.cached_content_token_count == 16

    chunks = [c async for c in await client.aio.models.generate_content_stream(
        model=MODEL, contents="Oslo?", config=config)]
    assert "".join(c.text or "" for c in chunks if c.candidates[0].content.parts[0].text
                   ) == "Checking."
    assert chunks[-1].candidates[0].finish_reason == genai_types.FinishReason.STOP

    with pytest.raises(genai_errors.ClientError) as info:
        await client.aio.models.generate_content(model=MODEL, contents="Oslo?")
    assert (info.value.code, info.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert fake.rejected == [] and len(fake.requests) == 3
    assert all("key" not in r.path for r in fake.requests)


@pytest.mark.filterwarnings("ignore::UserWarning:google.genai")  # it warns of unknown enums
def test_validators_catch_drift() -> None:
    """The checks the fake relies on do reject what the real API would never send."""
    good = render_body(reply("hi"))
    check_response(good)
    drifted = [
        {**good, "candidatez": []},
        {**good, "model_version": "m"},  # the SDK's Python name, not the wire's
        {**good, "candidates": [{**good["candidates"][0], "finishReason": "stop"}]},
        {**good, "candidates": [{**good["candidates"][0], "finishReason": "DONE"}]},
        {**good, "candidates": [{**good["candidates"][0], "index": "0"}]},  # strict: no coercion
        {**good, "usageMetadata": {"promptTokenCount": 1.5}},
        candidate({"text": "a", "thoughtSignature": "not base64!"}),
    ]
    for body_ in drifted:
        with pytest.raises(WireDrift):
            check_response(body_)
    with pytest.raises(WireDrift):
        check_error(429, {"error": {"code": 429, "message": "m", "status": "UNAVAILABLE"}})
    with pytest.raises(WireDrift):
        check_error(400, {"error": {"code": 400, "message": "m", "status": "INVALID_ARGUMENT"},
                          "extra": 1})
    with pytest.raises(WireDrift):
        check_request({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]})
    with pytest.raises(WireDrift):
        check_request({"contents": [], "generationConfig": {"maxTokens": 5}})
    with pytest.raises(WireDrift):
        check_request({"contents": [], "generationConfig": {"maxOutputTokens": "5"}})
    with pytest.raises(WireDrift):
        check_request({"contents": [], "toolConfig": {"functionCallingConfig": {"mode": "ALL"}}})


async def test_the_fake_rejects_requests_the_api_would(fake: FakeGemini) -> None:
    fake.script(reply("never"))
    good = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}
    async with httpx.AsyncClient() as client:
        wrong_body = await client.post(f"{fake.url}{GENERATE_PATH}", json={"prompt": "Hi"},
                                       headers={"x-goog-api-key": API_KEY})
        key_in_url = await client.post(f"{fake.url}{GENERATE_PATH}?key={API_KEY}", json=good)
        no_key = await client.post(f"{fake.url}{GENERATE_PATH}", json=good)
    assert [r.status_code for r in (wrong_body, key_in_url, no_key)] == [400, 400, 403]
    assert no_key.json()["error"]["status"] == "PERMISSION_DENIED"
    assert len(fake.rejected) == 2 and fake.remaining() == 1


async def test_the_fake_holds_gemini_3_to_its_signatures_and_levels(fake: FakeGemini) -> None:
    """What Gemini 3 refuses and 2.5 takes: an unsigned call in the current turn, and a
    thinking level the model lacks."""
    call = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}
    result = {"role": "user", "parts": [{"functionResponse": {"name": "f",
                                                              "response": {"output": 1}}}]}
    unsigned = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}, call, result]}
    older = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}, call, result,
                          {"role": "model", "parts": [{"text": "Done."}]},
                          {"role": "user", "parts": [{"text": "Again"}]}]}
    signed_ = {"contents": [unsigned["contents"][0],
                            {"role": "model", "parts": [{**call["parts"][0],
                                                         "thoughtSignature": SKIP_SIGNATURE}]},
                            result]}
    medium = {"contents": unsigned["contents"][:1],
              "generationConfig": {"thinkingConfig": {"thinkingLevel": "MEDIUM"}}}
    fake.script(*[reply("ok")] * 5)
    sent = [("gemini-3-flash-preview", unsigned, 400), ("gemini-2.5-flash", unsigned, 200),
            ("gemini-3-flash-preview", older, 200),  # only the current turn is checked
            ("gemini-3-flash-preview", signed_, 200), ("gemini-3-pro-preview", medium, 400),
            ("gemini-3.1-pro-preview", medium, 200), ("gemini-2.5-flash", medium, 400)]
    async with httpx.AsyncClient() as client:
        answers = [await client.post(f"{fake.url}/v1beta/models/{m}:generateContent",
                                     json=b, headers={"x-goog-api-key": API_KEY})
                   for m, b, _ in sent]
    assert [a.status_code for a in answers] == [status for _, _, status in sent]
    assert "Function call is missing a thought_signature" in answers[0].json()["error"][
        "message"]
    assert "Thinking level MEDIUM is not supported" in answers[4].json()["error"]["message"]
    assert fake.remaining() == 1


async def test_the_fake_holds_replies_to_the_tool_choice(fake: FakeGemini) -> None:
    fake.script(reply(ToolUse(id="c", name="get_weather", input={"city": "Oslo"}),
                      stop=StopReason.TOOL_USE))
    with pytest.raises(LLMError):
        await model_for(fake.url).generate(ask(tools=(WEATHER,), tool_choice="none"))
    assert "under tool_choice none" in fake.rejected[0]


async def test_a_cancelled_stream_closes_its_request(fake: FakeGemini) -> None:
    fake.script(Hang(reply("Hello there, never finished."), after_events=2))
    seen: list[Any] = []
    with anyio.CancelScope() as scope:
        async for event in model_for(fake.url).stream(ask()):
            seen.append(event)
            if isinstance(event, TextDelta):
                scope.cancel()
    assert scope.cancelled_caught and seen[0] == TextDelta(index=0, text="Hello")
    assert await anyio.to_thread.run_sync(fake.exchanges[0].closed_by_client.wait, 5)


def test_requests_may_spell_fields_as_proto_does_responses_may_not() -> None:
    """Google's JSON parsers take a request's fields by their proto (snake_case) names too
    (the SDK sends ``parameters_json_schema`` so); a response always spells them in
    camelCase."""
    check_request({"contents": [], "system_instruction": {"parts": [{"text": "x"}]}})
    with pytest.raises(WireDrift):
        check_response({"candidates": [], "model_version": "m"})
