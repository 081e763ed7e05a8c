"""The OpenAI-compatible presets (Ollama, vLLM, llama.cpp's server, LM Studio, OpenRouter,
Groq, Together): what ``resolve_model("<preset>:<model>")`` knows of each (base URL, key
variable, ``<NAME>_BASE_URL``, Ollama's ``OLLAMA_HOST``), and every quirk handled, each against
``FakeOpenAI`` switched to that quirk: tool calls without ids, streams without usage, servers
without (full) ``tool_choice``, Groq's model-blaming 400.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.llm import (
    CacheHint,
    ConfigurationError,
    Fault,
    LLMError,
    Message,
    OpaqueBlock,
    Request,
    Response,
    Role,
    StopReason,
    TextBlock,
    Tool,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    ToolUse,
    Usage,
    assemble,
)
from runtime.llm.history import replayable_call_id
from runtime.llm.providers.openai import OpenAIModel
from runtime.llm.providers.presets import PRESETS, ollama_host_url
from runtime.llm.resolve import model_settings, parse_model_name, resolve_model

from .fake_openai import FakeOpenAI, validate_error
from .harness import Sleeps, policy
from .loopback import Exchange, LoopbackServer, Recorded
from .steps import HTTPError, MalformedEvent

pytestmark = pytest.mark.anyio

SECRET = "gsk-preset-SECRET-4c7e19a0b2"
WEATHER = Tool(name="get_weather", input_schema={"type": "object",
                                                 "properties": {"city": {"type": "string"}}})
CLOCK = Tool(name="get_time", input_schema={"type": "object"})
HOSTED = [p.name for p in PRESETS.values() if p.key_required]
LOCAL = [p.name for p in PRESETS.values() if not p.key_required]


def reply(*blocks: Any, stop: StopReason = StopReason.END_TURN,
          usage: Usage | None = None) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(message=Message(role=Role.ASSISTANT, blocks=content), stop_reason=stop,
                    usage=usage or Usage(input_tokens=10, output_tokens=3), model="served")


def ask(text: str = "Hi", **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), **kw)


async def run(model: OpenAIModel, request: Request, mode: str) -> Response:
    return await (model.generate(request) if mode == "generate"
                  else assemble(model.stream(request)))


def on(fake: FakeOpenAI, preset: str, **kw: Any) -> OpenAIModel:
    return OpenAIModel("qwen2.5:7b", base_url=fake.base_url, preset=preset, **kw)


@pytest.fixture
def none(tmp_path: Path) -> Path:
    return tmp_path / "no.env"


# -- what each preset knows --------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_resolves_with_its_defaults(preset: str, none: Path) -> None:
    p = PRESETS[preset]
    env = {p.api_key_var: SECRET} if p.key_required else {}
    assert parse_model_name(f"{preset}:org/model:tag") == (preset, "org/model:tag")
    model = resolve_model(f"{preset}:org/model:tag", env=env, dotenv_path=none)
    assert isinstance(model, OpenAIModel)
    assert (model.provider, model.name) == (preset, "org/model:tag")
    assert model._base_url == p.base_url  # type: ignore[attr-defined]
    assert f"preset={preset!r}" in repr(model) and SECRET not in repr(model)
    # what another process rebuilds the choice from: (name, provider)
    assert parse_model_name(model.name, model.provider) == (preset, "org/model:tag")


@pytest.mark.parametrize("preset", HOSTED)
def test_a_hosted_preset_needs_its_key(preset: str, none: Path) -> None:
    var = PRESETS[preset].api_key_var
    with pytest.raises(ConfigurationError, match=f"set {var}"):
        model_settings(f"{preset}:m", env={"OPENAI_API_KEY": SECRET}, dotenv_path=none)
    with pytest.raises(ConfigurationError, match=var):
        OpenAIModel("m", preset=preset)  # the adapter names the variable too
    # a loopback gateway in front of it may go without one
    local = model_settings(f"{preset}:m", base_url="http://127.0.0.1:4000/v1", env={},
                           dotenv_path=none)
    assert local.api_key is None


@pytest.mark.parametrize("preset", LOCAL)
def test_a_local_preset_needs_no_key_but_sends_one_when_set(preset: str, none: Path) -> None:
    bare = model_settings(f"{preset}:m", env={}, dotenv_path=none)
    assert (bare.api_key, bare.base_url) == (None, None)  # the preset's default applies
    var = PRESETS[preset].api_key_var
    keyed = model_settings(f"{preset}:m", env={var: SECRET}, dotenv_path=none)
    assert keyed.api_key == SECRET and SECRET not in repr(keyed)
    # a remote server of the same kind may need none either
    remote = model_settings(f"{preset}:m", env={PRESETS[preset].base_url_var:
                                                 "https://gpu.example.com/v1"},
                            dotenv_path=none)
    assert (remote.api_key, remote.base_url) == (None, "https://gpu.example.com/v1")


@pytest.mark.parametrize(("preset", "url", "want"), [
    ("vllm", "http://127.0.0.1:9000", "http://127.0.0.1:9000/v1"),  # no path: the API's
    ("vllm", "http://127.0.0.1:9000/", "http://127.0.0.1:9000/v1"),
    ("vllm", "http://127.0.0.1:9000/custom", "http://127.0.0.1:9000/custom"),  # as given
    ("openrouter", "https://openrouter.ai", "https://openrouter.ai/api/v1"),
    ("groq", "https://api.groq.com", "https://api.groq.com/openai/v1"),
    ("ollama", "http://localhost:11434", "http://localhost:11434/v1"),
])
def test_base_url_variable_and_its_default_path(preset: str, url: str, want: str,
                                                none: Path) -> None:
    p = PRESETS[preset]
    env = {p.base_url_var: url, p.api_key_var: SECRET}
    assert model_settings(f"{preset}:m", env=env, dotenv_path=none).base_url == want
    given = model_settings(f"{preset}:m", base_url=url, env={p.api_key_var: SECRET},
                           dotenv_path=none)
    assert given.base_url == want  # an argument is completed the same way


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_built_directly_completes_its_base_url_as_resolve_does(preset: str,
                                                                        none: Path) -> None:
    p = PRESETS[preset]
    for url, want in (("http://127.0.0.1:9000", f"http://127.0.0.1:9000{p.default_path}"),
                      ("http://127.0.0.1:9000/", f"http://127.0.0.1:9000{p.default_path}"),
                      ("http://127.0.0.1:9000/custom", "http://127.0.0.1:9000/custom")):
        model = OpenAIModel("m", SECRET, url, preset=preset)
        assert model._base_url == want  # type: ignore[attr-defined]
        resolved = resolve_model(f"{preset}:m", api_key=SECRET, base_url=url, env={},
                                 dotenv_path=none)
        assert resolved._base_url == want  # type: ignore[attr-defined]


async def test_a_preset_built_directly_on_a_servers_root_reaches_its_api() -> None:
    """``OpenAIModel(..., base_url="http://localhost:11434", preset="ollama")``, the root as
    other tools configure it: the request goes to ``/v1/chat/completions``, not a 404."""
    with FakeOpenAI() as fake:
        fake.script(reply("ok"), reply("ok"))
        model = OpenAIModel("qwen2.5:7b", base_url=fake.url, preset="ollama")
        assert (await model.generate(ask())).message.text_content() == "ok"
        assert (await assemble(model.stream(ask()))).message.text_content() == "ok"
    assert [r.path for r in fake.requests] == ["/v1/chat/completions"] * 2


@pytest.mark.parametrize(("host", "want"), [
    ("0.0.0.0", "http://127.0.0.1:11434/v1"),  # bound everywhere: reached on loopback
    ("0.0.0.0:11500", "http://127.0.0.1:11500/v1"),
    ("127.0.0.1:8081", "http://127.0.0.1:8081/v1"),
    (":11500", "http://127.0.0.1:11500/v1"),
    ("localhost", "http://localhost:11434/v1"),
    ("http://localhost:9999", "http://localhost:9999/v1"),
    ("https://ollama.internal.example", "https://ollama.internal.example:443/v1"),
    ("[::]:11434", "http://[::1]:11434/v1"),
    ("::1", "http://[::1]:11434/v1"),
])
def test_ollama_host(host: str, want: str, none: Path) -> None:
    assert ollama_host_url(host) == want
    s = model_settings("ollama:qwen2.5", env={"OLLAMA_HOST": host}, dotenv_path=none)
    assert s.base_url == want


def test_ollama_base_url_beats_ollama_host_and_an_argument_beats_both(none: Path) -> None:
    env = {"OLLAMA_HOST": "127.0.0.1:1111", "OLLAMA_BASE_URL": "http://127.0.0.1:2222/v1"}
    assert model_settings("ollama:m", env=env, dotenv_path=none).base_url.endswith(":2222/v1")
    s = model_settings("ollama:m", base_url="http://127.0.0.1:3333/v1", env=env,
                       dotenv_path=none)
    assert s.base_url == "http://127.0.0.1:3333/v1"


def test_a_plain_http_remote_is_refused_whatever_the_preset(none: Path) -> None:
    with pytest.raises(ConfigurationError, match="https, or http to a loopback host") as info:
        model_settings("ollama:m", env={"OLLAMA_HOST": "192.168.1.20", "OLLAMA_API_KEY":
                                        SECRET}, dotenv_path=none)
    assert SECRET not in str(info.value)


def test_an_unknown_preset_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown preset 'olama'.*ollama"):
        OpenAIModel("m", preset="olama")


# -- the wire to a preset ------------------------------------------------------------------


async def test_a_preset_gets_max_tokens_and_no_cache_key(none: Path) -> None:
    with FakeOpenAI() as fake:
        fake.script(reply("ok"), reply("ok"))
        model = on(fake, "vllm", max_tokens=77)
        request = ask(cache=CacheHint(prefix=True, stable_messages=1, key="conv-1"))
        await model.generate(request)
        await assemble(model.stream(request))
    plain, streamed = (r.body for r in fake.requests)
    assert plain["max_tokens"] == 77 and "max_completion_tokens" not in plain
    assert "prompt_cache_key" not in plain and "prompt_cache_key" not in streamed
    assert streamed["stream_options"] == {"include_usage": True}  # asked for, where known


async def test_a_presets_opaque_blocks_and_openais_are_spliced_others_dropped() -> None:
    part = '{"type":"text","text":"spliced as sent"}'
    history = (Message.text(Role.USER, "Hi"),
               Message(role=Role.ASSISTANT, blocks=(
                   OpaqueBlock(provider="ollama", raw=part),
                   OpaqueBlock(provider="openai", raw='{"type":"text","text":"openai too"}'),
                   OpaqueBlock(provider="vllm", raw='{"type":"text","text":"not mine"}'),
                   TextBlock(text="Hello."))),
               Message.text(Role.USER, "Again"))
    with FakeOpenAI() as fake:
        fake.script(reply("ok"))
        await on(fake, "ollama").generate(Request(messages=history))
    raw = fake.requests[0].raw
    assert part.encode() in raw and b"openai too" in raw and b"not mine" not in raw


# -- quirk: tool calls without ids ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("ids", ["missing", "empty"])
async def test_calls_without_ids_get_fresh_stable_ones(ids: str, mode: str) -> None:
    """A server that sends no id (or an empty one) still yields calls a history can hold:
    each gets a fresh replayable id, the same in every event of a stream, and that id goes
    back with the call and its result."""
    a = ToolUse(id="placeholder_a", name="get_weather", input={"city": "Oslo"})
    b = ToolUse(id="placeholder_b", name="get_time", input={"city": "Lima"})
    with FakeOpenAI(call_ids=ids) as fake:
        fake.script(reply("Checking.", a, b, stop=StopReason.TOOL_USE), reply("Done."))
        model = on(fake, "llamacpp")
        request = ask("Oslo weather, Lima time?", tools=(WEATHER, CLOCK))
        if mode == "stream":
            events = [e async for e in model.stream(request)]
            starts = [e for e in events if isinstance(e, ToolCallStart)]
            assert [e.name for e in starts] == ["get_weather", "get_time"]
            starts_by_index = {e.index: e.id for e in starts}
            assert {e.index for e in events if isinstance(e, ToolCallDelta | ToolCallEnd)} \
                <= set(starts_by_index)

            async def replay():
                for e in events:
                    yield e

            got = await assemble(replay())
            assert [u.id for u in got.message.tool_uses()] == list(starts_by_index.values())
        else:
            got = await model.generate(request)
        uses = got.message.tool_uses()
        assert [(u.name, u.input) for u in uses] == [(a.name, a.input), (b.name, b.input)]
        assert len({u.id for u in uses}) == 2
        assert all(replayable_call_id(u.id) and u.id.startswith("call_") for u in uses)
        assert not {u.id for u in uses} & {a.id, b.id, ""}

        results = Message(role=Role.USER, blocks=tuple(
            ToolResult(tool_use_id=u.id, content="ok") for u in uses))
        follow = request.model_copy(update={"messages": (*request.messages, got.message,
                                                         results)})
        assert (await run(model, follow, mode)).message.text_content() == "Done."
    sent = fake.requests[1].body["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == [u.id for u in uses]
    assert [m["tool_call_id"] for m in sent[2:4]] == [u.id for u in uses]
    assert fake.rejected == []


# -- quirk: no usage in streams ------------------------------------------------------------


async def test_a_stream_without_usage_is_tolerated() -> None:
    """The usage chunk is asked for; a server that never sends it gives a reply with zero
    usage, not an error (and ``generate`` still reports what the body says)."""
    want = reply("Counted, or not.", usage=Usage(input_tokens=21, output_tokens=4))
    with FakeOpenAI(stream_usage=False) as fake:
        fake.script(want, want)
        model = on(fake, "ollama")
        streamed = await assemble(model.stream(ask()))
        generated = await model.generate(ask())
    assert fake.requests[0].body["stream_options"] == {"include_usage": True}
    assert streamed.message == generated.message == want.message
    assert streamed.usage == Usage() and generated.usage == want.usage
    assert streamed.stop_reason is StopReason.END_TURN


# -- quirk: tool_choice ----------------------------------------------------------------------


def _forced(choice: str) -> Request:
    return ask("Weather?", tools=(WEATHER, CLOCK), tool_choice=choice)


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_ollama_gets_no_tool_choice_and_a_narrowed_tool_list(mode: str) -> None:
    """Ollama takes no ``tool_choice``: none is sent (this fake refuses any, as a check);
    ``"none"`` offers no tools, a named tool is offered alone, ``"required"`` offers all
    and cannot be enforced."""
    call = ToolUse(id="call_w", name="get_weather", input={"city": "Oslo"})
    with FakeOpenAI(tool_choice="refused") as fake:
        fake.script(reply("No tools then."), reply(call, stop=StopReason.TOOL_USE),
                    reply("I chose to answer."))
        model = on(fake, "ollama")
        assert (await run(model, _forced("none"), mode)).message.text_content() \
            == "No tools then."
        assert (await run(model, _forced("get_weather"), mode)).message.tool_uses() == [call]
        unforced = await run(model, _forced("required"), mode)  # passed on as the model gave
        assert unforced.message.text_content() == "I chose to answer."
    none, named, required = (r.body for r in fake.requests)
    assert all("tool_choice" not in b for b in (none, named, required))
    assert "tools" not in none
    assert [t["function"]["name"] for t in named["tools"]] == ["get_weather"]
    assert [t["function"]["name"] for t in required["tools"]] == ["get_weather", "get_time"]
    assert fake.rejected == []


async def test_llamacpp_gets_words_only_and_a_named_tool_as_required_with_it_alone() -> None:
    call = ToolUse(id="call_w", name="get_weather", input={"city": "Oslo"})
    with FakeOpenAI(tool_choice="strings") as fake:
        fake.script(reply(call, stop=StopReason.TOOL_USE), reply(call, stop=StopReason.TOOL_USE),
                    reply("Words only."))
        model = on(fake, "llamacpp")
        for choice in ("get_weather", "required", "none"):
            await model.generate(_forced(choice))
    named, required, none = (r.body for r in fake.requests)
    assert named["tool_choice"] == "required"
    assert [t["function"]["name"] for t in named["tools"]] == ["get_weather"]
    assert required["tool_choice"] == "required" and len(required["tools"]) == 2
    assert none["tool_choice"] == "none" and len(none["tools"]) == 2
    assert fake.rejected == []


async def test_a_full_tool_choice_server_gets_the_named_function() -> None:
    call = ToolUse(id="call_w", name="get_weather", input={"city": "Oslo"})
    with FakeOpenAI() as fake:
        fake.script(reply(call, stop=StopReason.TOOL_USE))
        await on(fake, "vllm").generate(_forced("get_weather"))
    body = fake.requests[0].body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert len(body["tools"]) == 2


async def test_the_strict_fakes_do_refuse_what_those_servers_cannot_honour() -> None:
    """The checks above can fail: the unnarrowed OpenAI encoding is refused by both."""
    for quirk, choice in (("refused", "none"), ("strings", "get_weather")):
        with FakeOpenAI(tool_choice=quirk) as fake:
            fake.script(reply("never"))
            with pytest.raises(LLMError) as info:
                await on(fake, "vllm").generate(_forced(choice))  # vLLM: full tool_choice
            assert info.value.status == 400 and "takes no tool_choice" in str(info.value)


# -- quirk: Groq's model-blaming 400 ---------------------------------------------------------


def _groq_error(code: str) -> dict[str, Any]:
    body = {"error": {"message": "Failed to call a function. Please adjust your prompt.",
                      "type": "invalid_request_error", "param": None, "code": code}}
    validate_error(body)
    return body


@pytest.fixture
def groq_server() -> Iterator[LoopbackServer]:
    answers = [(400, _groq_error("tool_use_failed")), (200, None),
               (400, _groq_error("invalid_request"))]

    def respond(rec: Recorded, ex: Exchange) -> None:
        status, body = answers.pop(0)
        if body is None:
            from .fake_openai import render_completion

            ex.send_json(200, render_completion(reply("second sample")))
        else:
            ex.send_json(status, body)

    with LoopbackServer(respond) as srv:
        yield srv


async def test_groq_tool_use_failed_is_retried_other_400s_are_not(
        groq_server: LoopbackServer) -> None:
    sleeps = Sleeps()
    model = OpenAIModel("llama-3.3-70b", api_key=SECRET, base_url=f"{groq_server.url}/v1",
                        preset="groq", retry=policy(sleeps))
    assert (await model.generate(ask())).message.text_content() == "second sample"
    assert len(sleeps.waits) == 1
    with pytest.raises(LLMError) as info:
        await model.generate(ask())
    assert (info.value.status, info.value.fault, info.value.provider) == (
        400, Fault.TERMINAL, "groq")
    assert len(sleeps.waits) == 1


async def test_tool_use_failed_is_groqs_quirk_only(groq_server: LoopbackServer) -> None:
    model = OpenAIModel("m", api_key=SECRET, base_url=f"{groq_server.url}/v1",
                        preset="together", retry=policy(Sleeps()))
    with pytest.raises(LLMError) as info:
        await model.generate(ask())
    assert (info.value.status, info.value.fault) == (400, Fault.TERMINAL)


# -- errors say which server -----------------------------------------------------------------


async def test_errors_logs_and_reprs_name_the_preset_never_the_key(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celldialog.llm.retry")
    sleeps = Sleeps()
    with FakeOpenAI() as fake:
        fake.script(HTTPError(503, "server"), reply("ok"), MalformedEvent(reply("x")),
                    HTTPError(429, "quota", message=f"key {SECRET} has no credit"))
        model = OpenAIModel("m", api_key=SECRET, base_url=fake.base_url, preset="openrouter",
                            retry=policy(sleeps))
        assert (await model.generate(ask())).message.text_content() == "ok"
        with pytest.raises(LLMError) as malformed:
            await assemble(model.stream(ask()))
        with pytest.raises(LLMError) as quota:
            await model.generate(ask())
    assert caplog.records[0].provider == "openrouter"  # type: ignore[attr-defined]
    assert malformed.value.provider == "openrouter" and malformed.value.fault is Fault.TERMINAL
    assert (quota.value.provider, quota.value.status) == ("openrouter", 429)
    assert str(quota.value).startswith("openrouter 429 (terminal)")
    assert "[redacted]" in str(quota.value)
    for text in (caplog.text, repr(model), str(malformed.value), repr(quota.value)):
        assert SECRET not in text
