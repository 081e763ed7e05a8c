"""The OpenAI adapter: wire encoding, stream decoding, usage and stop mapping, configuration,
and fault injection against the loopback fake. Generic behaviour shared with every backend is
in ``test_contract.py``; this module is what only the OpenAI wire format makes meaningful.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
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
from runtime.llm.providers.openai import OpenAIModel

from .backend_openai import API_KEY, MODEL
from .fake_openai import (
    FakeOpenAI,
    render_chunks,
    render_completion,
    validate_chunk,
    validate_completion,
    validate_error,
    validate_request,
)
from .harness import Sleeps, policy
from .loopback import Exchange, LoopbackServer, Recorded
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests state their configuration; the developer's environment must not leak in."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as f:
        yield f


def model_for(fake: FakeOpenAI, **kw: Any) -> OpenAIModel:
    return OpenAIModel(MODEL, api_key=API_KEY, base_url=fake.base_url, **kw)


def reply(
    *blocks: Any,
    stop: StopReason = StopReason.END_TURN,
    usage: Usage | None = None,
    model: str = "gpt-4.1-2025-04-14",
) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(
        message=Message(role=Role.ASSISTANT, blocks=content),
        stop_reason=stop,
        usage=usage or Usage(input_tokens=10, output_tokens=3),
        model=model,
    )


def ask(text: str = "Hi", **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), **kw)


async def generate_and_stream(model: OpenAIModel, request: Request) -> tuple[Response, Response]:
    return await model.generate(request), await assemble(model.stream(request))


WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)
CLOCK = Tool(name="get_time", input_schema={"type": "object"})
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[Recorded, Exchange], None]], LoopbackServer]]:
    """A bare loopback server with a hand-written responder, for replies the fake would never
    produce (compatible servers' quirks, in-stream errors...)."""
    servers: list[LoopbackServer] = []

    def start(respond: Callable[[Recorded, Exchange], None]) -> LoopbackServer:
        srv = LoopbackServer(respond).__enter__()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.__exit__(None, None, None)


def sse(
    *chunks: dict[str, Any] | str, done: bool = True, check: bool = True
) -> Callable[[Recorded, Exchange], None]:
    """A responder streaming these chunks (dicts are checked against the SDK first, unless
    ``check`` is off for deliberately wrong ones; error objects are not chunks)."""
    for c in chunks:
        if check and isinstance(c, dict) and "error" not in c:
            validate_chunk(c)

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        for c in chunks:
            ex.send_event(c if isinstance(c, str) else json.dumps(c))
        if done:
            ex.send_event("[DONE]")

    return respond


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


# -- wire encoding ----------------------------------------------------------------------


async def test_request_encoding_on_the_wire(fake: FakeOpenAI) -> None:
    a = ToolUse(id="call_a", name="get_weather", input={"city": "Oslo"})
    b = ToolUse(id="call_b", name="get_time", input={"city": "Lima", "tz": {"dst": False}})
    request = Request(
        system="Be brief.",
        tools=(WEATHER, CLOCK),
        messages=(
            Message.text(Role.USER, "Oslo weather, Lima time?"),
            Message(
                role=Role.ASSISTANT,
                blocks=(
                    OpaqueBlock(provider="anthropic", raw='{"type":"thinking","thinking":"hm"}'),
                    TextBlock(text="Checking."),
                    a,
                    b,
                ),
            ),
            Message(
                role=Role.USER,
                blocks=(
                    ToolResult(tool_use_id="call_a", content="rain"),
                    ToolResult(tool_use_id="call_b", content="unknown city", is_error=True),
                    TextBlock(text="And this?"),
                    ImageBlock(media_type="image/png", data=PNG),
                ),
            ),
        ),
        max_tokens=300,
        cache=CacheHint(prefix=True, stable_messages=2, key="conv-1"),
        sampling=Sampling(seed=7, temperature=0.2, top_p=0.9),
        reasoning_effort="low",
    )
    fake.script(reply("ok"))
    await model_for(fake).generate(request)

    [sent] = fake.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {
        "model": MODEL,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": WEATHER.input_schema,
                },
            },
            {
                "type": "function",
                "function": {"name": "get_time", "parameters": {"type": "object"}},
            },
        ],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Oslo weather, Lima time?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {
                            "name": "get_time",
                            "arguments": '{"city":"Lima","tz":{"dst":false}}',
                        },
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "rain"},
            {"role": "tool", "tool_call_id": "call_b", "content": "Error: unknown city"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "And this?"},
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": f"data:image/png;base64,{base64.b64encode(PNG).decode()}"
                        },
                    },
                ],
            },
        ],
        # to a loopback (compatible) server the ceiling is ``max_tokens``
        "max_tokens": 300,
        "reasoning_effort": "low",
        "seed": 7,
        "temperature": 0.2,
        "top_p": 0.9,
        "prompt_cache_key": "conv-1",
    }
    # the stable part first, per-call fields after the messages
    assert list(json.loads(sent.raw)) == list(sent.body)
    assert b"thinking" not in sent.raw  # another provider's opaque block is dropped
    validate_request(sent.body)


async def test_stream_requests_ask_for_the_usage_chunk(fake: FakeOpenAI) -> None:
    fake.script(reply("ok"))
    await assemble(model_for(fake).stream(ask()))
    body = fake.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert fake.requests[0].headers["accept"] == "text/event-stream"
    assert fake.requests[0].raw.endswith(b',"stream":true,"stream_options":{"include_usage":true}}')


async def test_openai_gets_max_completion_tokens_and_the_default_ceiling() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=render_completion(reply("ok")))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIModel("gpt-5", api_key=API_KEY, max_tokens=900, http_client=client)
        await model.generate(ask())
        await model.generate(ask(max_tokens=50))

    assert str(seen[0].url) == "https://api.openai.com/v1/chat/completions"
    bodies = [json.loads(r.content) for r in seen]
    assert [b.get("max_completion_tokens") for b in bodies] == [900, 50]
    assert all("max_tokens" not in b for b in bodies)
    for b in bodies:
        validate_request(b)


@pytest.mark.parametrize(
    ("sampling", "sent"),
    [
        (Sampling(), {"temperature": 0.0}),
        (
            Sampling(seed=3, temperature=-1.0, top_p=2.0),
            {"seed": 3, "temperature": 0.0, "top_p": 1.0},
        ),
        (Sampling(temperature=float("nan"), top_p=0.5), {"temperature": 0.0, "top_p": 0.5}),
    ],
)
async def test_sampling_is_normalised(
    fake: FakeOpenAI, sampling: Sampling, sent: dict[str, Any]
) -> None:
    fake.script(reply("ok"))
    await model_for(fake).generate(ask(sampling=sampling))
    body = fake.requests[0].body
    assert {k: body[k] for k in ("seed", "temperature", "top_p") if k in body} == sent


async def test_no_cache_key_and_no_sampling_send_nothing(fake: FakeOpenAI) -> None:
    fake.script(reply("ok"))
    await model_for(fake).generate(ask(cache=CacheHint(prefix=True, stable_messages=1)))
    assert fake.requests[0].body == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
    }


async def test_openai_opaque_block_is_spliced_verbatim_as_a_content_part(fake: FakeOpenAI) -> None:
    raw = '{ "type": "refusal",  "refusal": "as \\u0073ent" }'  # odd spacing survives
    fake.script(reply("ok"))
    await model_for(fake).generate(
        Request(
            messages=(
                Message.text(Role.USER, "Hi"),
                Message(
                    role=Role.ASSISTANT,
                    blocks=(OpaqueBlock(provider="openai", raw=raw), TextBlock(text="Hello.")),
                ),
                Message.text(Role.USER, "Go on"),
            )
        )
    )
    sent = fake.requests[0]
    assert f'"content":[{raw},{{"type":"text","text":"Hello."}}]'.encode() in sent.raw
    assert sent.body["messages"][1]["content"][0] == {"type": "refusal", "refusal": "as sent"}


@pytest.mark.parametrize(
    ("message", "complaint"),
    [
        (
            Message(role=Role.ASSISTANT, blocks=(ImageBlock(media_type="image/png", data=PNG),)),
            "user messages",
        ),
        (
            Message(role=Role.USER, blocks=(ImageBlock(media_type="image/tiff", data=b"II*"),)),
            "image/tiff",
        ),
        (Message(role=Role.USER, blocks=(ToolUse(id="x", name="f"),)), "tool_use"),
        (
            Message(role=Role.ASSISTANT, blocks=(ToolResult(tool_use_id="x", content="r"),)),
            "tool_result",
        ),
        (
            Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider="openai", raw="[1]"),)),
            "JSON object",
        ),
        (  # Python's reader takes NaN, JSON has none: spliced in, the body would not be JSON
            Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(
                provider="openai", raw='{"type":"refusal","refusal":"no","n":NaN}'),)),
            "JSON object",
        ),
    ],
)
async def test_requests_we_cannot_express_are_refused_before_sending(
    fake: FakeOpenAI, message: Message, complaint: str
) -> None:
    request = Request(messages=(Message.text(Role.USER, "Hi"), message))
    for call in (lambda m: m.generate(request), lambda m: assemble(m.stream(request))):
        with pytest.raises(LLMError) as info:
            await call(model_for(fake))
        assert info.value.fault is Fault.TERMINAL and info.value.status is None
        assert complaint in str(info.value)
    assert fake.requests == []


# -- decoding -----------------------------------------------------------------------------


async def test_parallel_tool_calls_interleaved_by_index() -> None:
    a = ToolUse(id="call_a", name="get_weather", input={"city": "Oslo", "units": "metric"})
    b = ToolUse(id="call_b", name="get_time", input={"city": "Lima"})
    want = reply("Both.", a, b, stop=StopReason.TOOL_USE)
    wire = render_chunks(want, include_usage=True, interleave=True)
    indexes = [
        c["choices"][0]["delta"]["tool_calls"][0]["index"]
        for c in wire
        if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
    ]
    assert indexes[:4] == [0, 1, 0, 1]  # the fragments really alternate on the wire

    with FakeOpenAI(interleave_tool_calls=True) as fake:
        fake.script(want, want)
        model = model_for(fake)
        events = [e async for e in model.stream(ask(tools=(WEATHER, CLOCK)))]
        generated = await model.generate(ask(tools=(WEATHER, CLOCK)))

    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.id, s.name) for s in starts] == [("call_a", "get_weather"), ("call_b", "get_time")]
    arg_owners = [e.index for e in events if isinstance(e, ToolCallDelta)]
    assert arg_owners[:4] == [starts[0].index, starts[1].index] * 2
    ends = [e.index for e in events if isinstance(e, ToolCallEnd)]
    assert ends == [s.index for s in starts]
    assert isinstance(events[-1], Stop) and events[-1].stop_reason is StopReason.TOOL_USE

    async def replay() -> Any:
        for e in events:
            yield e

    streamed = await assemble(replay())
    assert streamed == generated == want


async def test_stream_events_in_order(fake: FakeOpenAI) -> None:
    usage = Usage(input_tokens=20, output_tokens=4)
    fake.script(reply("Hello there.", usage=usage))
    events = [e async for e in model_for(fake).stream(ask())]
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert len(texts) > 1 and "".join(t.text for t in texts) == "Hello there."
    assert events[-2:] == [
        UsageUpdate(usage=usage),
        Stop(stop_reason=StopReason.END_TURN, model="gpt-4.1-2025-04-14"),
    ]


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_usage_counts_cached_tokens_inside_the_input(fake: FakeOpenAI, mode: str) -> None:
    fake.script(
        reply("ok", usage=Usage(input_tokens=2048, output_tokens=9, cache_read_tokens=1920))
    )
    model = model_for(fake)
    got = await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    wire = render_completion(reply("ok", usage=got.usage))["usage"]
    assert (wire["prompt_tokens"], wire["prompt_tokens_details"]["cached_tokens"]) == (2048, 1920)
    assert got.usage == Usage(
        input_tokens=2048, output_tokens=9, cache_read_tokens=1920, cache_write_tokens=0
    )


def _completion(
    message: dict[str, Any],
    finish: str,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "local-llama",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    validate_completion(body)
    return body


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}


@pytest.mark.parametrize(
    ("message", "finish", "stop"),
    [
        ({"content": "done"}, "stop", StopReason.END_TURN),
        ({"content": None, "tool_calls": [CALL]}, "tool_calls", StopReason.TOOL_USE),
        ({"content": "cut o"}, "length", StopReason.MAX_TOKENS),
        ({"content": "partial"}, "content_filter", StopReason.REFUSAL),
        ({"content": None, "refusal": "I can't help with that."}, "stop", StopReason.REFUSAL),
        # llama.cpp / Ollama have been seen to finish a tool-calling turn with "stop"
        ({"content": None, "tool_calls": [CALL]}, "stop", StopReason.TOOL_USE),
    ],
)
async def test_finish_reasons(
    server: Any, message: dict[str, Any], finish: str, stop: StopReason
) -> None:
    body = _completion(message, finish)
    srv = server(lambda rec, ex: ex.send_json(200, body))
    got = await OpenAIModel("m", base_url=f"{srv.url}/v1").generate(ask())
    assert got.stop_reason is stop
    if message.get("refusal"):
        assert got.message.text_content() == "I can't help with that."


async def test_refusal_streamed_and_generated_alike(fake: FakeOpenAI) -> None:
    want = reply("I can't help with that.", stop=StopReason.REFUSAL)
    fake.script(want, want)
    generated, streamed = await generate_and_stream(model_for(fake), ask())
    assert generated == streamed == want
    assert generated.stop_reason is StopReason.REFUSAL


async def test_a_server_without_usage_reports_zero(server: Any) -> None:
    srv = server(lambda rec, ex: ex.send_json(200, _completion({"content": "hi"}, "stop")))
    got = await OpenAIModel("m", base_url=f"{srv.url}/v1").generate(ask())
    assert got.usage == Usage() and got.model == "local-llama"


async def test_tool_call_name_arriving_after_its_arguments(server: Any) -> None:
    srv = server(
        sse(
            chunk({"role": "assistant", "content": None}),
            chunk(
                {"tool_calls": [{"index": 0, "id": "call_9", "function": {"arguments": '{"ci'}}]}
            ),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "function": {"name": "get_weather", "arguments": 'ty": "Rome"}'},
                        }
                    ]
                }
            ),
            chunk({}, "tool_calls"),
        )
    )
    got = await assemble(OpenAIModel("m", base_url=f"{srv.url}/v1").stream(ask()))
    assert got.message.tool_uses() == [
        ToolUse(id="call_9", name="get_weather", input={"city": "Rome"})
    ]


async def test_bad_tool_arguments_are_a_transient_fault(server: Any) -> None:
    bad = {**CALL, "function": {"name": "get_weather", "arguments": "{city: Oslo"}}
    srv = server(
        lambda rec, ex: ex.send_json(
            200, _completion({"content": None, "tool_calls": [bad]}, "tool_calls")
        )
    )
    with pytest.raises(LLMError) as info:
        await OpenAIModel("m", base_url=f"{srv.url}/v1", retry=policy(Sleeps(), 1)).generate(ask())
    assert info.value.fault is Fault.TRANSIENT and "get_weather" in str(info.value)


# -- configuration ------------------------------------------------------------------------


async def test_loopback_server_without_a_key(fake: FakeOpenAI) -> None:
    fake.script(reply("local hello"))
    model = OpenAIModel("llama3", base_url=fake.base_url)
    assert (await model.generate(ask())).message.text_content() == "local hello"
    assert "authorization" not in fake.requests[0].headers
    assert "api_key=none" in repr(model)


@pytest.mark.parametrize("base_url", [None, "https://gateway.example.com/v1"])
def test_a_remote_server_needs_a_key(base_url: str | None) -> None:
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-4.1", base_url=base_url)


def test_the_adapter_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configuration is resolved in one place (``resolve_model``): a key or base URL in the
    environment changes nothing here."""
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example.com/v1/")
    with pytest.raises(ConfigurationError, match="api_key"):
        OpenAIModel("gpt-4.1")
    assert "https://api.openai.com/v1" in repr(OpenAIModel("gpt-4.1", api_key="sk-given"))
    local = OpenAIModel("gpt-4.1", base_url="http://127.0.0.1:8080/v1")
    assert "http://127.0.0.1:8080/v1" in repr(local) and "api_key=none" in repr(local)
    # an empty key means "none": fine for loopback only
    OpenAIModel("gpt-4.1", api_key="", base_url="http://localhost:11434/v1")
    with pytest.raises(ConfigurationError):
        OpenAIModel("gpt-4.1", api_key="")


@pytest.mark.parametrize(
    "base_url",
    [
        "http://models.example.com/v1",
        "http://user:pw@10.0.0.5:8000/v1?token=t",
        "ftp://example.com/v1",
        "http://127.0.0.1.example.com/v1",
    ],
)
def test_unsafe_base_url_is_refused_before_sending(base_url: str) -> None:
    sent: list[httpx.Request] = []
    client = httpx.AsyncClient(transport=httpx.MockTransport(sent.append))  # never used
    with pytest.raises(ConfigurationError) as info:
        OpenAIModel("gpt-4.1", api_key=API_KEY, base_url=base_url, http_client=client)
    message = str(info.value)
    assert "https" in message and "loopback" in message
    assert API_KEY not in message and "pw" not in message and "token" not in message
    assert sent == []


def test_model_identity() -> None:
    model = OpenAIModel("gpt-4.1", api_key=API_KEY)
    assert isinstance(model, Model)
    assert (model.name, model.provider) == ("gpt-4.1", "openai")
    assert repr(model) == (
        "OpenAIModel(model='gpt-4.1', base_url='https://api.openai.com/v1', api_key=set)"
    )


# -- fault injection ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_429_with_retry_after_is_retried_then_succeeds(fake: FakeOpenAI, mode: str) -> None:
    sleeps = Sleeps()
    fake.script(
        HTTPError(429, "rate_limit", retry_after=7), HTTPError(429, "rate_limit"), reply("finally")
    )
    model = model_for(fake, retry=policy(sleeps, attempts=3))
    got = await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    assert got.message.text_content() == "finally"
    assert len(fake.requests) == 3
    assert sleeps.waits[0] == 7.0 and 0.3 <= sleeps.waits[1] <= 1.3  # server's, then backoff


async def test_retry_after_ms_is_preferred(server: Any) -> None:
    replies = iter(
        [
            (429, {"retry-after-ms": "1500", "retry-after": "2"}),
            (200, {}),
        ]
    )

    def respond(rec: Recorded, ex: Exchange) -> None:
        status, headers = next(replies)
        body = (
            _completion({"content": "ok"}, "stop")
            if status == 200
            else {
                "error": {
                    "message": "slow down",
                    "type": "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
        )
        ex.send_json(status, body, headers)

    srv = server(respond)
    sleeps = Sleeps()
    await OpenAIModel("m", base_url=f"{srv.url}/v1", retry=policy(sleeps)).generate(ask())
    assert sleeps.waits == [1.5]


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_insufficient_quota_fails_at_once(fake: FakeOpenAI, mode: str) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(429, "quota", message="You exceeded your current quota."), reply("never"))
    model = model_for(fake, retry=policy(sleeps))
    with pytest.raises(LLMError) as info:
        await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    err = info.value
    assert (err.fault, err.status, err.provider) == (Fault.TERMINAL, 429, "openai")
    assert err.message == "You exceeded your current quota."
    assert len(fake.requests) == 1 and sleeps.waits == []


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        # the quota signal in the message only (compatible gateways drop the code)
        (
            {
                "message": "You exceeded your current quota, please check your plan and billing "
                "details.",
                "type": "requests",
                "param": None,
                "code": None,
            },
            Fault.TERMINAL,
        ),
        (
            {
                "message": "Billing hard limit has been reached",
                "type": "invalid_request_error",
                "param": None,
                "code": "billing_hard_limit_reached",
            },
            Fault.TERMINAL,
        ),
        # a real rate limit that merely mentions billing stays transient
        (
            {
                "message": "Rate limit reached for gpt-4.1 on requests per min. Visit "
                "https://platform.openai.com/account/billing to add a payment method.",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            },
            Fault.TRANSIENT,
        ),
    ],
)
async def test_quota_signals_in_a_429(server: Any, error: dict[str, Any], fault: Fault) -> None:
    validate_error({"error": error})
    srv = server(lambda rec, ex: ex.send_json(429, {"error": error}))
    with pytest.raises(LLMError) as info:
        await OpenAIModel("m", base_url=f"{srv.url}/v1", retry=policy(Sleeps(), 1)).generate(ask())
    assert info.value.fault is fault


@pytest.mark.parametrize("status", [500, 502, 503, 529])
@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_server_errors_retried_within_the_bound(
    fake: FakeOpenAI, status: int, mode: str
) -> None:
    sleeps = Sleeps()
    fake.script(*(HTTPError(status, "overloaded" if status == 529 else "server") for _ in range(4)))
    model = model_for(fake, retry=policy(sleeps, attempts=4))
    with pytest.raises(LLMError) as info:
        await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    assert (info.value.fault, info.value.status) == (Fault.TRANSIENT, status)
    assert len(fake.requests) == 4 and len(sleeps.waits) == 3
    assert sleeps.waits == sorted(sleeps.waits)  # exponential backoff


async def test_retries_stop_at_the_time_bound(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(503, retry_after=20), reply("too late"))
    model = model_for(
        fake, retry=RetryPolicy(max_attempts=5, max_elapsed=10, sleep=sleeps, clock=lambda: 0.0)
    )
    with pytest.raises(LLMError):
        await model.generate(ask())
    assert len(fake.requests) == 1 and sleeps.waits == []


@pytest.mark.parametrize(
    ("status", "kind"), [(400, "bad_request"), (401, "auth"), (404, "bad_request")]
)
@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_client_errors_are_terminal(
    fake: FakeOpenAI, status: int, kind: str, mode: str
) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(status, kind, message="Invalid value for 'model'."), reply("never"))
    model = model_for(fake, retry=policy(sleeps))
    with pytest.raises(LLMError) as info:
        await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    assert (info.value.fault, info.value.status) == (Fault.TERMINAL, status)
    assert info.value.message.startswith("Invalid value for 'model'.")
    assert len(fake.requests) == 1 and sleeps.waits == []


async def test_a_non_json_error_body_still_makes_a_classified_error(server: Any) -> None:
    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.send_bytes(502, b"<h1>502 Bad Gateway</h1>\r\n", "text/html")

    srv = server(respond)
    with pytest.raises(LLMError) as info:
        await OpenAIModel("m", base_url=f"{srv.url}/v1", retry=policy(Sleeps(), 1)).generate(ask())
    assert (info.value.status, info.value.fault) == (502, Fault.TRANSIENT)
    assert "502 Bad Gateway" in info.value.message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_connection_refused_is_transient_and_retried(mode: str) -> None:
    sleeps = Sleeps()
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    model = OpenAIModel("m", api_key=API_KEY, base_url=base, retry=policy(sleeps, attempts=3))
    with pytest.raises(LLMError) as info:
        await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    err = info.value
    assert (err.fault, err.status, err.provider) == (Fault.TRANSIENT, None, "openai")
    assert err.message == f"could not connect to {base}"
    assert len(sleeps.waits) == 2


async def test_connection_dropped_mid_stream_after_output(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.script(DropMidStream(reply("A long answer that is cut."), after_events=3), reply("never"))
    seen: list[Any] = []
    with pytest.raises(LLMError) as info:
        async for event in model_for(fake, retry=policy(sleeps)).stream(ask()):
            seen.append(event)
    assert info.value.fault is Fault.TRANSIENT and info.value.status is None
    assert [e.text for e in seen] == ["A lon", "g ans"]
    # output was already delivered, so it is not replayed by a retry
    assert len(fake.requests) == 1 and sleeps.waits == []


async def test_connection_dropped_before_output_is_retried(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.script(DropMidStream(reply("x"), after_events=1), reply("second try"))
    got = await assemble(model_for(fake, retry=policy(sleeps)).stream(ask()))
    assert got.message.text_content() == "second try"
    assert len(fake.requests) == 2 and len(sleeps.waits) == 1


async def test_connection_dropped_mid_body_in_generate(fake: FakeOpenAI) -> None:
    sleeps = Sleeps()
    fake.script(DropMidStream(reply("x")), reply("recovered"))
    got = await model_for(fake, retry=policy(sleeps)).generate(ask())
    assert got.message.text_content() == "recovered" and len(fake.requests) == 2


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_malformed_data_is_a_terminal_protocol_error(fake: FakeOpenAI, mode: str) -> None:
    sleeps = Sleeps()
    fake.script(MalformedEvent(reply("Some text here."), after_events=2), reply("unused"))
    model = model_for(fake, retry=policy(sleeps))
    with pytest.raises(LLMError) as info:
        await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    assert info.value.fault is Fault.TERMINAL and "malformed" in info.value.message
    assert len(fake.requests) == 1 and sleeps.waits == []


@pytest.mark.parametrize(
    ("mode", "respond"),
    [  # JSON, but not shaped like a completion / a chunk
        ("generate", lambda rec, ex: ex.send_json(200, {"choices": "none"})),
        ("stream", sse({"choices": [{"delta": {"tool_calls": [{"id": "c"}]}}]}, check=False)),
        ("stream", sse({"choices": ["text"]}, check=False)),
        ("stream", sse('["a list"]')),
    ],
)
async def test_wrong_shapes_are_malformed_not_crashes(server: Any, mode: str, respond: Any) -> None:
    srv = server(respond)
    sleeps = Sleeps()
    model = OpenAIModel("m", base_url=f"{srv.url}/v1", retry=policy(sleeps))
    with pytest.raises(LLMError, match="malformed") as info:
        await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    assert info.value.fault is Fault.TERMINAL  # a broken server: retrying costs the backoff
    assert len(srv.requests) == 1 and sleeps.waits == []


async def test_stream_ending_without_done_is_transient(server: Any) -> None:
    srv = server(sse(chunk({"role": "assistant", "content": "Hel"}), done=False))
    with pytest.raises(LLMError, match=r"before \[DONE\]") as info:
        await assemble(
            OpenAIModel("m", base_url=f"{srv.url}/v1", retry=policy(Sleeps(), 1)).stream(ask())
        )
    assert info.value.fault is Fault.TRANSIENT


@pytest.mark.parametrize(
    ("error", "fault", "requests"),
    [
        (
            {"message": "The server had an error", "type": "server_error", "code": None},
            Fault.TRANSIENT,
            2,
        ),
        (
            {"message": "quota gone", "type": "insufficient_quota", "code": "insufficient_quota"},
            Fault.TERMINAL,
            1,
        ),
        (
            {"message": "bad tools", "type": "invalid_request_error", "code": None},
            Fault.TERMINAL,
            1,
        ),
    ],
)
async def test_error_object_inside_the_stream(
    server: Any, error: dict[str, Any], fault: Fault, requests: int
) -> None:
    srv = server(sse(chunk({"role": "assistant", "content": ""}), {"error": error}, done=False))
    with pytest.raises(LLMError) as info:
        await assemble(
            OpenAIModel("m", base_url=f"{srv.url}/v1", retry=policy(Sleeps(), 2)).stream(ask())
        )
    assert (info.value.fault, info.value.status) == (fault, None)
    assert info.value.message == error["message"]
    assert len(srv.requests) == requests  # nothing was delivered, so transient ones retry


# -- cancellation ---------------------------------------------------------------------------


async def test_cancel_during_a_stream_closes_the_request(fake: FakeOpenAI) -> None:
    fake.script(Hang(reply("Hello there, never finished."), after_events=2))
    started = time.monotonic()
    seen: list[Any] = []
    with anyio.CancelScope() as scope:
        async for event in model_for(fake).stream(ask()):
            seen.append(event)
            scope.cancel()  # as soon as output starts, the caller gives up
    assert scope.cancelled_caught and seen == [TextDelta(index=0, text="Hello")]
    closed = await anyio.to_thread.run_sync(fake.exchanges[0].closed_by_client.wait, 5)
    assert closed, "the server never saw the connection close"
    assert time.monotonic() - started < 3


async def test_cancel_during_generate_closes_the_request(server: Any) -> None:
    arrived = threading.Event()

    def respond(rec: Recorded, ex: Exchange) -> None:
        arrived.set()
        ex.hang_until_client_leaves()

    srv = server(respond)
    model = OpenAIModel("m", base_url=f"{srv.url}/v1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(model.generate, ask())
        assert await anyio.to_thread.run_sync(arrived.wait, 5)
        tg.cancel_scope.cancel()
    assert await anyio.to_thread.run_sync(srv.exchanges[0].closed_by_client.wait, 5)


# -- secrets ---------------------------------------------------------------------------------


async def test_the_key_never_appears_in_errors_reprs_or_logs(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "runtime"):
        caplog.set_level(logging.DEBUG, logger=name)

    def respond(rec: Recorded, ex: Exchange) -> None:  # a server echoing what it was sent
        echo = rec.headers.get("authorization", "")
        ex.send_json(
            401,
            {
                "error": {
                    "message": f"Incorrect API key provided: {echo}",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
        )

    srv = server(respond)
    errors: list[BaseException] = []
    models = [
        OpenAIModel("m", api_key=API_KEY, base_url=f"{srv.url}/v1"),
        OpenAIModel(
            "m",
            api_key=API_KEY,
            base_url=f"http://127.0.0.1:{_closed_port()}/v1",
            retry=policy(Sleeps(), 1),
        ),
    ]
    for model in models:
        for call in (model.generate, lambda r, m=model: assemble(m.stream(r))):
            with pytest.raises(LLMError) as info:
                await call(ask())
            errors.append(info.value)
    with pytest.raises(ConfigurationError) as refused:
        OpenAIModel("m", api_key=API_KEY, base_url="http://remote.example.com/v1")
    errors.append(refused.value)

    assert srv.requests[0].headers["authorization"] == f"Bearer {API_KEY}"  # it was sent
    assert "[redacted]" in str(errors[0])
    assert any(r.name.startswith(("httpx", "httpcore")) for r in caplog.records)
    texts = [caplog.text, *(repr(m) for m in models)]
    texts += [f"{e!s} {e!r} {e.args!r} {e.__cause__!r}" for e in errors]
    texts += [f"{r.getMessage()} {r.args!r}" for r in caplog.records]
    for text in texts:
        assert API_KEY not in text


# -- the fake against the official SDK ---------------------------------------------------------


async def test_the_official_sdk_reads_the_fake(fake: FakeOpenAI) -> None:
    """The fake's wire format is the real one: the SDK's own client parses it."""
    use = ToolUse(id="call_1", name="get_weather", input={"city": "Oslo"})
    want = reply(
        "Checking.",
        use,
        stop=StopReason.TOOL_USE,
        usage=Usage(input_tokens=30, output_tokens=8, cache_read_tokens=16),
    )
    fake.script(want, want, HTTPError(429, "quota", message="no money"))
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
    messages: Any = [{"role": "user", "content": "Hi"}]
    try:
        done = await client.chat.completions.create(model=MODEL, messages=messages)
        assert done.choices[0].message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
        assert done.usage is not None and done.usage.prompt_tokens_details is not None
        assert done.usage.prompt_tokens_details.cached_tokens == 16

        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Checking." and chunks[-1].usage is not None

        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model=MODEL, messages=messages)
        assert info.value.code == "insufficient_quota"
    finally:
        await client.close()


def test_validators_catch_drift() -> None:
    """The checks the fake relies on do reject what the real API would never send."""
    good = render_completion(reply("hi"))
    validate_completion(good)
    with pytest.raises(AssertionError, match="unknown to the SDK"):
        validate_completion({**good, "choises": []})
    with pytest.raises(pydantic.ValidationError):
        validate_completion({**good, "created": "1700000000"})  # strict: no coercion
    first = render_chunks(reply("hi"), include_usage=False)[0]
    with pytest.raises(pydantic.ValidationError):
        validate_chunk({**first, "object": "chat.completion"})
    with pytest.raises(AssertionError, match="unknown to the SDK"):
        validate_chunk({**first, "choices": [{**first["choices"][0], "text": "hi"}]})
    with pytest.raises(pydantic.ValidationError):
        validate_error({"error": {"message": "m", "code": None}})  # no type
    with pytest.raises(AssertionError):
        validate_error({"error": {"message": "m", "type": "t"}, "status": 400})
    with pytest.raises(pydantic.ValidationError):
        validate_request({"model": "m", "messages": [{"role": "tool", "content": "x"}]})
    with pytest.raises(pydantic.ValidationError):
        validate_request({"model": "m", "messages": [], "max_output_tokens": 5})


async def test_the_fake_rejects_requests_the_api_would(fake: FakeOpenAI) -> None:
    fake.script(reply("never"))
    async with httpx.AsyncClient() as client:
        r = await client.post(
            f"{fake.base_url}/chat/completions", json={"model": "m", "messages": [{"role": "user"}]}
        )
    assert r.status_code == 400 and len(fake.rejected) == 1
    assert fake.remaining() == 1


async def test_a_stream_may_open_only_so_many_tool_calls(server: Any) -> None:
    """Deltas that only name a new index cost no reply characters: past
    ``MAX_STREAMED_CALLS`` of them the reply is malformed, not held."""
    from runtime.llm.providers.openai import MAX_STREAMED_CALLS

    def opening(n: int) -> list[str]:
        return [json.dumps(chunk({"tool_calls": [{"index": i}]})) for i in range(n)]

    srv = server(sse(*opening(MAX_STREAMED_CALLS + 1), done=True))
    with pytest.raises(LLMError, match="MAX_STREAMED_CALLS") as info:
        await assemble(OpenAIModel("m", base_url=f"{srv.url}/v1",
                                   retry=policy(Sleeps(), 1)).stream(ask()))
    assert info.value.fault is Fault.TERMINAL
    srv = server(sse(*opening(MAX_STREAMED_CALLS), done=True))  # at the cap: on to the end
    with pytest.raises(LLMError, match="never got a name"):
        await assemble(OpenAIModel("m", base_url=f"{srv.url}/v1",
                                   retry=policy(Sleeps(), 1)).stream(ask()))


@pytest.mark.parametrize("index", [-2, "0", 1.5, None])
async def test_a_tool_call_index_that_is_not_a_count_is_malformed(server: Any,
                                                                  index: Any) -> None:
    bad = chunk({"tool_calls": [{"index": index, "id": "c1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": "{}"}}]})
    srv = server(sse(chunk({"role": "assistant", "content": "Hi"}), bad, check=False))
    with pytest.raises(LLMError, match="malformed"):  # -2 would land on the text's index
        await assemble(OpenAIModel("m", base_url=f"{srv.url}/v1",
                                   retry=policy(Sleeps(), 1)).stream(ask()))
