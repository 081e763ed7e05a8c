"""The contract suite: every backend (scripted model, each adapter against its loopback fake)
passes these tests the same way. What a provider genuinely cannot express (explicit cache
markers on OpenAI, cache-write counts...) is stated once in ``CAPS`` and asserted as such.
"""

from __future__ import annotations

import gc
import socket
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

import anyio
import httpx
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
    Role,
    Stop,
    StopReason,
    TextBlock,
    Tool,
    ToolCallStart,
    ToolResult,
    ToolUse,
    Usage,
    assemble,
)
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.gemini import GeminiModel
from runtime.llm.providers.openai import AzureOpenAIModel, OpenAIModel
from runtime.llm.providers.openai_responses import OpenAIResponsesModel

from .backend_azure import API_KEY as AZURE_KEY
from .backend_azure import DEPLOYMENT as AZURE_DEPLOYMENT
from .harness import AdapterBackend, Backend, CacheLayout, Sleeps, load, policy
from .steps import DropMidStream, Hang, HTTPError, MalformedEvent

pytestmark = pytest.mark.anyio

Mode = Literal["generate", "stream"]
MODES: list[Mode] = ["generate", "stream"]


@dataclass(frozen=True)
class Caps:
    """What a backend can express of the port, where providers differ."""

    cache_markers: bool  # explicit cache markers (prefix + one message boundary)
    cache_key: bool  # sends CacheHint.key as a routing key
    cache_writes: bool  # reports cache-write tokens (automatic caching reports none)
    opaque_replies: bool  # replies may carry opaque blocks (thinking); Chat Completions: none
    opaque_sample: str  # an opaque block's raw JSON as this provider would accept it back


THINKING = '{"type":"thinking","thinking":"Rain data wanted.","signature":"c2lnbmVk+/=="}'
REASONING_ITEM = ('{"id":"rs_rain1","type":"reasoning","summary":[{"type":"summary_text",'
                  '"text":"Rain data wanted."}],"encrypted_content":"gAAAAB-c2lnbmVk+/=="}')
CAPS = {
    "scripted": Caps(cache_markers=True, cache_key=True, cache_writes=True,
                     opaque_replies=True, opaque_sample=THINKING),
    "anthropic": Caps(cache_markers=True, cache_key=False, cache_writes=True,
                      opaque_replies=True, opaque_sample=THINKING),
    "openai": Caps(cache_markers=False, cache_key=True, cache_writes=False,
                   opaque_replies=False, opaque_sample='{"type":"refusal","refusal":"as sent"}'),
    # a thought part with its signature; Gemini caches prefixes by itself, reports no writes
    "gemini": Caps(cache_markers=False, cache_key=False, cache_writes=False, opaque_replies=True,
                   opaque_sample='{"text":"Rain data wanted.","thought":true,'
                                 '"thoughtSignature":"c2lnbmVkIHRob3VnaHQ="}'),
    # Chat Completions on a deployment; prompt_cache_key is not in the dated API versions
    "azure": Caps(cache_markers=False, cache_key=False, cache_writes=False,
                  opaque_replies=False, opaque_sample='{"type":"refusal","refusal":"as sent"}'),
    # backend module openai_responses; a reasoning item, replayed whole under store: false
    "openai-responses": Caps(cache_markers=False, cache_key=True, cache_writes=True,
                             opaque_replies=True, opaque_sample=REASONING_ITEM),
}


async def run(model: Model, request: Request, mode: Mode) -> Response:
    if mode == "generate":
        return await model.generate(request)
    return await assemble(model.stream(request))


def reply(*blocks: Any, stop: StopReason = StopReason.END_TURN, usage: Usage | None = None,
          ) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(
        message=Message(role=Role.ASSISTANT, blocks=content),
        stop_reason=stop,
        usage=usage or Usage(input_tokens=12, output_tokens=5),
    )


def same(got: Response, want: Response) -> None:
    """Equal as the port sees it (the model id is the provider's, not the script's)."""
    assert got.message == want.message
    assert got.stop_reason == want.stop_reason
    assert got.usage == want.usage


def ask(text: str = "Hi", **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), max_tokens=256, **kw)


WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]},
)
CLOCK = Tool(name="get_time", description="Current time in a city.",
             input_schema={"type": "object", "properties": {"city": {"type": "string"}}})


# -- replies ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_text_reply(backend: Backend, mode: Mode) -> None:
    want = reply("Hello there, how can I help?")
    backend.script(want)
    same(await run(backend.model(), ask(), mode), want)
    assert len(backend.sent()) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_tool_round_trip(backend: Backend, mode: Mode) -> None:
    use = ToolUse(id="toolu_weather_1", name="get_weather", input={"city": "Paris"})
    first = reply("Let me check.", use, stop=StopReason.TOOL_USE)
    final = reply("It is sunny in Paris.")
    backend.script(first, final)
    model = backend.model()

    request = ask("Weather in Paris?", system="Be brief.", tools=(WEATHER,))
    got = await run(model, request, mode)
    same(got, first)
    assert got.message.tool_uses() == [use]

    result = ToolResult(tool_use_id=use.id, content="sunny, 21C")
    follow = request.model_copy(update={"messages": (
        *request.messages, got.message, Message(role=Role.USER, blocks=(result,)))})
    same(await run(model, follow, mode), final)

    raw = backend.sent_raw()[1]
    assert use.id.encode() in raw and b"sunny, 21C" in raw
    assert use.id.encode() not in backend.sent_raw()[0]


@pytest.mark.parametrize("mode", MODES)
async def test_two_parallel_tool_calls(backend: Backend, mode: Mode) -> None:
    a = ToolUse(id="call_a", name="get_weather", input={"city": "Oslo"})
    b = ToolUse(id="call_b", name="get_time", input={"city": "Lima", "tz": {"dst": False}})
    want = reply(a, b, stop=StopReason.TOOL_USE)
    backend.script(want)
    got = await run(backend.model(), ask("Oslo weather and Lima time", tools=(WEATHER, CLOCK)),
                    mode)
    same(got, want)
    assert got.message.tool_uses() == [a, b]


async def test_stream_assembles_to_the_generate_response(backend: Backend) -> None:
    want = reply("Checking both.", ToolUse(id="t1", name="get_weather", input={"city": "Rome"}),
                 ToolUse(id="t2", name="get_time", input={"city": "Rome"}),
                 stop=StopReason.TOOL_USE,
                 usage=Usage(input_tokens=40, output_tokens=22, cache_read_tokens=30))
    backend.script(want, want)
    model = backend.model()
    request = ask("Rome?", tools=(WEATHER, CLOCK))
    generated = await model.generate(request)
    events = [e async for e in model.stream(request)]
    assert isinstance(events[-1], Stop)
    assert sum(isinstance(e, ToolCallStart) for e in events) == 2

    async def replay():  # the same events, assembled
        for e in events:
            yield e

    streamed = await assemble(replay())
    assert streamed == generated
    same(streamed, want)


@pytest.mark.parametrize("mode", MODES)
async def test_usage_is_normalised_with_cache_reads_and_writes(backend: Backend,
                                                               mode: Mode) -> None:
    usage = Usage(input_tokens=1500, output_tokens=42, cache_read_tokens=1200,
                  cache_write_tokens=250)
    backend.script(reply("ok", usage=usage))
    got = await run(backend.model(), ask(), mode)
    if not CAPS[backend.name].cache_writes:
        usage = usage.model_copy(update={"cache_write_tokens": 0})
    assert got.usage == usage
    assert got.usage.input_tokens >= got.usage.cache_read_tokens  # reads are inside the total


# -- caching ----------------------------------------------------------------------------


def conversation_turns() -> list[Request]:
    """Three turns of one conversation, each hinting its whole history as stable."""
    system, tools = "You are a weather assistant. " * 20, (WEATHER, CLOCK)
    use = ToolUse(id="toolu_c1", name="get_weather", input={"city": "Bergen"})
    history = [
        Message.text(Role.USER, "Weather in Bergen?"),
        Message(role=Role.ASSISTANT, blocks=(use,)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id=use.id, content="rain"),)),
        Message.text(Role.ASSISTANT, "It rains in Bergen."),
        Message.text(Role.USER, "And tomorrow?"),
    ]
    return [
        Request(system=system, tools=tools, messages=tuple(history[:n]), max_tokens=200,
                cache=CacheHint(prefix=True, stable_messages=n, key="conv-bergen"))
        for n in (1, 3, 5)
    ]


async def test_cache_hint_placement(backend: Backend) -> None:
    caps = CAPS[backend.name]
    backend.script(reply("a"), reply("b"))
    model = backend.model()
    hinted = conversation_turns()[1].model_copy(
        update={"cache": CacheHint(prefix=True, stable_messages=2, key="conv-7")})
    await model.generate(hinted)
    await model.generate(hinted.model_copy(update={"cache": CacheHint()}))

    assert backend.cache_layout(0) == CacheLayout(
        prefix_marked=caps.cache_markers,
        message_marker_after=1 if caps.cache_markers else None,
        key="conv-7" if caps.cache_key else None,
    )
    assert backend.cache_layout(1) == CacheLayout(False, None, None)


async def test_request_prefix_is_byte_identical_across_three_turns(backend: Backend) -> None:
    turns = conversation_turns()
    backend.script(*(reply(f"turn {i}") for i in range(len(turns))))
    model = backend.model()
    for request in turns:
        await model.generate(request)

    for stable in (0, 1):
        assert backend.prefix_bytes(0, stable) == backend.prefix_bytes(1, stable) \
            == backend.prefix_bytes(2, stable)
    assert backend.prefix_bytes(1, 3) == backend.prefix_bytes(2, 3)
    assert len(backend.prefix_bytes(0, 0)) > len("You are a weather assistant. " * 20)
    assert backend.prefix_bytes(2, 3) != backend.prefix_bytes(2, 1)


# -- content kinds ----------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))


@pytest.mark.parametrize("mode", MODES)
async def test_images_reach_the_wire(backend: Backend, mode: Mode) -> None:
    backend.script(reply("A cat."))
    request = Request(messages=(Message(role=Role.USER, blocks=(
        TextBlock(text="What is this?"),
        ImageBlock(media_type="image/png", data=PNG),
        ImageBlock(media_type="image/jpeg", data=b"\xff\xd8\xff\xe0jfif"),
    )),))
    same(await run(backend.model(), request, mode), reply("A cat."))
    assert backend.images(0) == [("image/png", PNG), ("image/jpeg", b"\xff\xd8\xff\xe0jfif")]


@pytest.mark.parametrize("mode", MODES)
async def test_unsupported_image_is_refused_not_dropped(backend: Backend, mode: Mode) -> None:
    backend.script(reply("never"))
    request = Request(messages=(Message(role=Role.USER, blocks=(
        TextBlock(text="What is this?"), ImageBlock(media_type="image/bmp", data=b"BM..."))),))
    with pytest.raises(LLMError) as info:
        await run(backend.model(), request, mode)
    assert info.value.fault is Fault.TERMINAL and "image/bmp" in str(info.value)
    assert backend.sent() == []


async def test_opaque_blocks_in_replies_are_replayed_byte_for_byte(backend: Backend) -> None:
    caps = CAPS[backend.name]
    thinking = OpaqueBlock(provider=backend.name, raw=caps.opaque_sample)
    backend.script(reply(thinking, "Rain.", usage=Usage(input_tokens=9, output_tokens=3)),
                   reply("Done."))
    model = backend.model()
    first = await model.generate(ask("Rain?"))
    opaque = [b for b in first.message.blocks if isinstance(b, OpaqueBlock)]
    assert first.message.text_content() == "Rain."
    if not caps.opaque_replies:  # the provider's replies carry nothing opaque: none appear
        assert opaque == []
        return
    assert len(opaque) == 1 and opaque[0].provider == backend.name

    follow = ask("Rain?").model_copy(update={"messages": (
        Message.text(Role.USER, "Rain?"), first.message, Message.text(Role.USER, "Thanks"))})
    await model.generate(follow)
    assert backend.replayed_opaque(1) == [opaque[0].raw]


async def test_opaque_blocks_in_history_are_sent_verbatim(backend: Backend) -> None:
    raw = CAPS[backend.name].opaque_sample
    backend.script(reply("ok"))
    history = (
        Message.text(Role.USER, "Rain?"),
        Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider=backend.name, raw=raw),
                                             TextBlock(text="Rain."))),
        Message.text(Role.USER, "Thanks"),
    )
    await backend.model().generate(Request(messages=history))
    assert backend.replayed_opaque(0) == [raw]


# -- faults and retries -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_rate_limit_is_retried_after_the_servers_delay(backend: Backend,
                                                             mode: Mode) -> None:
    sleeps = Sleeps()
    backend.script(HTTPError(429, "rate_limit", retry_after=2), reply("finally"))
    got = await run(backend.model(retry=policy(sleeps)), ask(), mode)
    same(got, reply("finally"))
    assert sleeps.waits == [2.0]
    assert len(backend.sent()) == 2


@pytest.mark.parametrize("mode", MODES)
async def test_exhausted_quota_fails_at_once(backend: Backend, mode: Mode) -> None:
    sleeps = Sleeps()
    backend.script(HTTPError(429, "quota", message="You exceeded your current quota"),
                   reply("never"))
    with pytest.raises(LLMError) as info:
        await run(backend.model(retry=policy(sleeps)), ask(), mode)
    assert (info.value.fault, info.value.status) == (Fault.TERMINAL, 429)
    assert info.value.provider == backend.name
    assert len(backend.sent()) == 1 and sleeps.waits == []


@pytest.mark.parametrize("status", [500, 502, 503, 529])
@pytest.mark.parametrize("mode", MODES)
async def test_server_errors_are_retried_then_fail_transient(backend: Backend, mode: Mode,
                                                             status: int) -> None:
    sleeps = Sleeps()
    kind = "overloaded" if status == 529 else "server"
    backend.script(*(HTTPError(status, kind) for _ in range(3)))
    with pytest.raises(LLMError) as info:
        await run(backend.model(retry=policy(sleeps, attempts=3)), ask(), mode)
    assert (info.value.fault, info.value.status) == (Fault.TRANSIENT, status)
    assert info.value.provider == backend.name
    assert len(backend.sent()) == 3 and len(sleeps.waits) == 2


@pytest.mark.parametrize(("status", "kind"), [(400, "bad_request"), (401, "auth")])
@pytest.mark.parametrize("mode", MODES)
async def test_client_errors_are_terminal(backend: Backend, mode: Mode, status: int,
                                          kind: str) -> None:
    sleeps = Sleeps()
    backend.script(HTTPError(status, kind, message="no such thing"), reply("never"))
    with pytest.raises(LLMError) as info:
        await run(backend.model(retry=policy(sleeps)), ask(), mode)
    assert (info.value.fault, info.value.status) == (Fault.TERMINAL, status)
    assert "no such thing" in str(info.value)
    assert len(backend.sent()) == 1 and sleeps.waits == []


# A reply cut short (a dropped connection) is transient; one that arrived but breaks the wire
# format (an event or body that is not JSON) is a terminal protocol error: a server that sends
# one sends it again, and retrying it only costs the backoff.
BROKEN = [(DropMidStream, Fault.TRANSIENT), (MalformedEvent, Fault.TERMINAL)]


@pytest.mark.parametrize(("broken", "fault"), BROKEN)
async def test_broken_stream_fails_without_a_response(backend: Backend, broken: type,
                                                      fault: Fault) -> None:
    backend.script(broken(reply("This reply never completes, sadly.")))
    seen: list[Any] = []
    with pytest.raises(LLMError) as info:
        async for event in backend.model(retry=policy(Sleeps(), attempts=1)).stream(ask()):
            seen.append(event)
    assert info.value.fault is fault
    assert not any(isinstance(e, Stop) for e in seen)
    assert len(backend.sent()) == 1


@pytest.mark.parametrize(("broken", "fault"), BROKEN)
async def test_broken_reply_to_generate_is_retried_only_if_cut_short(
        backend: Backend, broken: type, fault: Fault) -> None:
    backend.script(broken(reply("This reply never completes, sadly.")), reply("second try"))
    sleeps = Sleeps()
    model = backend.model(retry=policy(sleeps, attempts=2))
    if fault is Fault.TRANSIENT:
        same(await model.generate(ask()), reply("second try"))  # nothing partial returned
        assert len(backend.sent()) == 2 and len(sleeps.waits) == 1
    else:
        with pytest.raises(LLMError) as info:
            await model.generate(ask())
        assert info.value.fault is Fault.TERMINAL
        assert len(backend.sent()) == 1 and sleeps.waits == []


# -- cancellation and concurrency -------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_returns_promptly_and_the_model_stays_usable(backend: Backend,
                                                                  mode: Mode) -> None:
    backend.script(Hang(reply("never finished")), reply("next"))
    model = backend.model()
    started = time.monotonic()
    with anyio.move_on_after(0.3) as scope:
        await run(model, ask(), mode)
    assert scope.cancelled_caught
    assert time.monotonic() - started < 3.0
    same(await run(model, ask(), mode), reply("next"))


async def test_concurrent_calls_each_get_one_reply(backend: Backend) -> None:
    backend.script(*(reply(f"answer {i}") for i in range(4)))
    model = backend.model()
    texts: list[str] = []

    async def one(i: int) -> None:
        texts.append((await model.generate(ask(f"q{i}"))).message.text_content())

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
    assert sorted(texts) == [f"answer {i}" for i in range(4)]


# -- adapter-only checks (not meaningful for the scripted model, so not parametrised on it) --


def _adapter(provider: str, **kw: Any
             ) -> AnthropicModel | OpenAIModel | OpenAIResponsesModel | GeminiModel:
    if provider == "anthropic":
        return AnthropicModel("claude-sonnet-4-5", **kw)
    if provider == "gemini":
        return GeminiModel("gemini-2.5-flash", **kw)
    if provider == "openai-responses":
        return OpenAIResponsesModel("gpt-5", **kw)
    if provider == "azure":
        return AzureOpenAIModel(AZURE_DEPLOYMENT, **kw)
    return OpenAIModel("gpt-4.1", **kw)


SECRET = "sk-contract-SECRET-0123456789"
ADAPTERS = ["anthropic", "openai", "openai-responses", "gemini", "azure"]


def _key(provider: str) -> str:
    """The key ``provider``'s fake takes: Azure's checks it (any other is a 401)."""
    return AZURE_KEY if provider == "azure" else SECRET


@pytest.mark.parametrize("provider", ADAPTERS)
async def test_adapter_refuses_to_send_a_key_over_plain_http(provider: str) -> None:
    with pytest.raises((ConfigurationError, LLMError)) as info:
        model = _adapter(provider, api_key=SECRET, base_url="http://models.example.invalid/v1")
        await model.generate(ask())
    err = info.value
    if isinstance(err, LLMError):
        assert err.fault is Fault.TERMINAL
    assert "http" in str(err).lower() and SECRET not in str(err) + repr(err)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", ADAPTERS)
async def test_connection_refused_is_retried_then_a_transient_fault(provider: str,
                                                                    mode: Mode) -> None:
    sleeps = Sleeps()
    model = _adapter(provider, api_key=SECRET, base_url=f"http://127.0.0.1:{_closed_port()}",
                     retry=policy(sleeps))
    with pytest.raises(LLMError) as info:
        await run(model, ask(), mode)
    assert (info.value.fault, info.value.status, info.value.provider) == (
        Fault.TRANSIENT, None, provider)
    assert "could not connect" in str(info.value) and SECRET not in repr(info.value)
    assert len(sleeps.waits) == 2  # three attempts


@pytest.fixture(params=["anthropic", "openai", "openai_responses", "gemini", "azure"])
def adapter(request: pytest.FixtureRequest) -> Iterator[AdapterBackend]:
    with load(request.param) as b:
        yield cast(AdapterBackend, b)


async def test_adapter_drops_opaque_blocks_of_other_providers(adapter: AdapterBackend) -> None:
    foreign = '{"type":"reasoning","encrypted":"not-for-you-7f3a"}'
    adapter.script(reply("ok"))
    history = (
        Message.text(Role.USER, "Rain?"),
        Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider="elsewhere", raw=foreign),
                                             TextBlock(text="Rain."))),
        Message.text(Role.USER, "Thanks"),
    )
    same(await adapter.model().generate(Request(messages=history)), reply("ok"))
    assert adapter.replayed_opaque(0) == []
    assert b"not-for-you-7f3a" not in adapter.sent_raw()[0]


@pytest.mark.parametrize("mode", MODES)
async def test_a_key_starting_an_overlong_tool_name_is_redacted_even_in_part(
        adapter: AdapterBackend, mode: Mode, caplog: pytest.LogCaptureFixture) -> None:
    """A server echoing the key as a tool name past the cap: the error quotes the name's
    start, a piece of a long key; neither the error nor the retry log shows any of it."""
    caplog.set_level("INFO", logger="celldialog.llm.retry")
    key = AZURE_KEY if adapter.name == "azure" else SECRET + "-Xq7Lm2Rv9Tz4Wc8Nb3Kd6Yg1Sf5Jh0Pa"
    adapter.script(reply(ToolUse(id="call_1", name=key + "y" * 300, input={"city": "Paris"}),
                         stop=StopReason.TOOL_USE))
    model = _adapter(adapter.name, api_key=key, base_url=adapter.base_url)
    with pytest.raises(LLMError, match="tool name cap") as info:
        await run(model, ask(), mode)
    texts = (str(info.value), repr(info.value.args), caplog.text)
    assert "[redacted]" in texts[0]
    assert not [key[i:i + 8] for i in range(len(key) - 7) if any(key[i:i + 8] in t
                                                                  for t in texts)]


async def test_an_owned_client_is_pooled_until_closed(adapter: AdapterBackend) -> None:
    adapter.script(*(reply(f"r{i}") for i in range(4)))
    model = _adapter(adapter.name, api_key=_key(adapter.name), base_url=adapter.base_url)
    async with model:
        await model.generate(ask())
        await model.generate(ask())
    await model.generate(ask())  # after aclose(): a new pool, so a new connection
    await model.aclose()
    first, second, third = adapter.client_ports()[:3]
    assert first == second != third


async def test_a_given_client_is_used_and_left_open(adapter: AdapterBackend) -> None:
    adapter.script(reply("a"))
    async with httpx.AsyncClient() as client:
        async with _adapter(adapter.name, api_key=_key(adapter.name),
                            base_url=adapter.base_url, http_client=client) as model:
            await model.generate(ask())
        assert not client.is_closed
    assert len(adapter.sent()) == 1


def test_a_model_is_usable_from_one_event_loop_after_another(adapter: AdapterBackend) -> None:
    """A script's ``anyio.run(model.generate, ...)`` twice: the owned pool of the first loop
    cannot serve the second (its connections belong to a closed loop), so the second gets
    its own."""
    adapter.script(reply("one"), reply("two"))
    model = _adapter(adapter.name, api_key=_key(adapter.name), base_url=adapter.base_url)

    async def call() -> str:
        return (await model.generate(ask())).message.text_content()

    async def call_and_close() -> str:
        async with model:
            return await call()

    with warnings.catch_warnings():  # the first loop's pool is dropped with its socket open
        warnings.simplefilter("ignore", ResourceWarning)
        assert anyio.run(call) == "one"
        assert anyio.run(call_and_close) == "two"
        gc.collect()


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_call_closes_its_request(adapter: AdapterBackend, mode: Mode) -> None:
    """Cancelling the caller's scope (mid-stream, once an event has arrived, or while
    waiting for a reply) aborts the HTTP request: the server sees its connection closed."""
    adapter.script(Hang(reply("never finished"), after_events=1))
    model = adapter.model()
    with anyio.move_on_after(0.3) as scope:
        await run(model, ask(), mode)
    assert scope.cancelled_caught
    assert await anyio.to_thread.run_sync(adapter.closed_by_client, 0, 5.0)


@pytest.mark.parametrize("mode", MODES)
async def test_reasoning_tokens_are_reported_where_the_provider_counts_them(
        backend: Backend, mode: Mode) -> None:
    usage = Usage(input_tokens=40, output_tokens=25, reasoning_tokens=18)
    backend.script(Response(message=Message.text(Role.ASSISTANT, "Thought it through."),
                            stop_reason=StopReason.END_TURN, usage=usage))
    got = await run(backend.model(), Request(messages=(Message.text(Role.USER, "Hi"),)), mode)
    counts = backend.name in ("scripted", "openai", "azure", "openai-responses", "gemini")
    assert got.usage.output_tokens == 25
    assert got.usage.reasoning_tokens == (18 if counts else 0)
