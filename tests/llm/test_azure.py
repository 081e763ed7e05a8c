"""Azure OpenAI: deployment URLs, api-version, the two credentials (an ``api-key``, or a
Microsoft Entra ID token or token provider), what each api-version takes, secrets, and
resolution as ``azure:<deployment>``. Against ``FakeAzureOpenAI`` (Azure's routing and
annotations over the OpenAI fake, validated with the official SDK's types; the official
``AsyncAzureOpenAI`` client reads it too). The contract suite runs the same adapter as its
``azure`` backend; this module is what only Azure makes meaningful.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from runtime.llm import (
    CacheHint,
    ConfigurationError,
    Fault,
    LLMError,
    Message,
    Request,
    Response,
    Role,
    StopReason,
    TextBlock,
    Tool,
    ToolCallStart,
    ToolResult,
    ToolUse,
    Usage,
    assemble,
)
from runtime.llm.providers.openai import AzureOpenAIModel
from runtime.llm.providers.presets import AZURE_DEFAULT_API_VERSION, MAX_AZURE_DEPLOYMENT_CHARS
from runtime.llm.resolve import model_settings, resolve_model

from .backend_azure import API_KEY, DEPLOYMENT
from .fake_azure import FakeAzureOpenAI
from .fake_openai import render_completion, validate_chunk, validate_completion, validate_request
from .harness import Sleeps, policy
from .loopback import Exchange, LoopbackServer, Recorded
from .steps import HTTPError

pytestmark = pytest.mark.anyio

TOKEN = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.entra-test-token.c2lnbmF0dXJl"
ROUTE = f"/openai/deployments/{DEPLOYMENT}/chat/completions"
WEATHER = Tool(name="get_weather", description="Current weather for a city.",
               input_schema={"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]})


@pytest.fixture
def fake() -> Iterator[FakeAzureOpenAI]:
    with FakeAzureOpenAI(DEPLOYMENT, api_key=API_KEY, token=TOKEN) as f:
        yield f


def model_for(fake: FakeAzureOpenAI, **kw: Any) -> AzureOpenAIModel:
    kw.setdefault("api_key", None if "token" in kw else API_KEY)
    return AzureOpenAIModel(DEPLOYMENT, base_url=fake.endpoint, **kw)


def reply(*blocks: Any, stop: StopReason = StopReason.END_TURN,
          usage: Usage | None = None) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(message=Message(role=Role.ASSISTANT, blocks=content), stop_reason=stop,
                    usage=usage or Usage(input_tokens=10, output_tokens=3), model="gpt-4o")


def ask(text: str = "Hi", **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), **kw)


# -- the wire --------------------------------------------------------------------------


async def test_deployment_url_api_version_and_api_key_header(fake: FakeAzureOpenAI) -> None:
    fake.script(reply("hello"), reply("hello"))
    model = model_for(fake, max_tokens=200)
    request = ask(cache=CacheHint(prefix=True, stable_messages=1, key="conv-9"))
    assert (await model.generate(request)).message.text_content() == "hello"
    assert (await assemble(model.stream(request))).message.text_content() == "hello"

    plain, streamed = fake.requests
    assert plain.path == f"{ROUTE}?api-version={AZURE_DEFAULT_API_VERSION}" == streamed.path
    assert plain.headers["api-key"] == API_KEY and "authorization" not in plain.headers
    # a current api-version: OpenAI's ceiling and the usage chunk, but no prompt_cache_key
    assert plain.body == {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "Hi"}],
                          "max_completion_tokens": 200}
    assert streamed.body["stream_options"] == {"include_usage": True}
    assert "prompt_cache_key" not in streamed.body
    for sent in (plain, streamed):
        validate_request(sent.body)
    assert fake.rejected == []


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_tool_round_trip_through_azure_annotations(fake: FakeAzureOpenAI,
                                                          mode: str) -> None:
    """Azure's replies carry content filter results, and a stream opens with its prelude
    chunk (no choices, empty id and model): the adapter reads past both."""
    use = ToolUse(id="call_paris", name="get_weather", input={"city": "Paris"})
    first = reply("Checking.", use, stop=StopReason.TOOL_USE,
                  usage=Usage(input_tokens=40, output_tokens=9, cache_read_tokens=32))
    fake.script(first, reply("Sunny in Paris."))
    model = model_for(fake)

    async def run(request: Request) -> Response:
        return await (model.generate(request) if mode == "generate"
                      else assemble(model.stream(request)))

    request = ask("Paris?", tools=(WEATHER,))
    got = await run(request)
    assert got.message == first.message and got.usage == first.usage
    assert got.stop_reason is StopReason.TOOL_USE
    follow = request.model_copy(update={"messages": (
        *request.messages, got.message,
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id=use.id, content="sunny"),)))})
    assert (await run(follow)).message.text_content() == "Sunny in Paris."
    tool_messages = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert tool_messages == [{"role": "tool", "tool_call_id": "call_paris", "content": "sunny"}]


async def test_the_stream_events_match_generate(fake: FakeAzureOpenAI) -> None:
    want = reply("Both.", ToolUse(id="t1", name="get_weather", input={"city": "Rome"}),
                 stop=StopReason.TOOL_USE)
    fake.script(want, want)
    model = model_for(fake)
    request = ask("Rome?", tools=(WEATHER,))
    generated = await model.generate(request)
    events = [e async for e in model.stream(request)]
    assert sum(isinstance(e, ToolCallStart) for e in events) == 1

    async def replay():  # the same events, assembled
        for e in events:
            yield e

    assert await assemble(replay()) == generated


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_the_content_filter_is_a_refusal(fake: FakeAzureOpenAI, mode: str) -> None:
    fake.script(reply("I can't help with that.", stop=StopReason.REFUSAL))
    model = model_for(fake)
    got = await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    assert got.stop_reason is StopReason.REFUSAL


async def test_an_older_api_version_gets_max_tokens_and_no_stream_options(
        fake: FakeAzureOpenAI) -> None:
    """2024-06-01 refuses ``stream_options`` and ``max_completion_tokens`` ("Unrecognized
    request argument supplied"): the adapter sends neither, and its streams carry no
    usage (zero, not an error)."""
    fake.script(reply("old"), reply("old", usage=Usage(input_tokens=5, output_tokens=1)))
    model = model_for(fake, api_version="2024-06-01", max_tokens=64)
    assert (await model.generate(ask())).usage == Usage(input_tokens=10, output_tokens=3)
    streamed = await assemble(model.stream(ask()))
    assert streamed.message.text_content() == "old" and streamed.usage == Usage()
    plain, stream = fake.requests
    assert plain.path.endswith("?api-version=2024-06-01")
    assert plain.body["max_tokens"] == 64 and "max_completion_tokens" not in plain.body
    assert "stream_options" not in stream.body and fake.rejected == []


async def test_a_field_the_api_version_does_not_know_is_a_terminal_400(
        fake: FakeAzureOpenAI) -> None:
    """``reasoning_effort`` is sent when asked for, as everywhere: an api-version without it
    refuses it (choose one that has it: ``api_version=``)."""
    fake.script(reply("never"))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await model_for(fake, retry=policy(sleeps)).generate(ask(reasoning_effort="low"))
    assert (info.value.status, info.value.fault, info.value.provider) == (
        400, Fault.TERMINAL, "azure")
    assert "Unrecognized request argument supplied: reasoning_effort" in str(info.value)
    assert sleeps.waits == [] and fake.remaining() == 1


async def test_errors_are_classified_and_named_azure(fake: FakeAzureOpenAI) -> None:
    sleeps = Sleeps()
    fake.script(HTTPError(429, "rate_limit", retry_after=3), reply("after"),
                HTTPError(429, "quota", message="You exceeded your current quota"))
    model = model_for(fake, retry=policy(sleeps))
    assert (await model.generate(ask())).message.text_content() == "after"
    assert sleeps.waits == [3.0]
    with pytest.raises(LLMError) as info:
        await assemble(model.stream(ask()))
    assert (info.value.status, info.value.fault, info.value.provider) == (
        429, Fault.TERMINAL, "azure")


async def test_a_wrong_key_is_a_terminal_401(fake: FakeAzureOpenAI) -> None:
    fake.script(reply("never"))
    with pytest.raises(LLMError) as info:
        await model_for(fake, api_key="not-the-key").generate(ask())
    assert (info.value.status, info.value.fault) == (401, Fault.TERMINAL)
    assert fake.remaining() == 1


# -- Entra ID tokens -------------------------------------------------------------------


async def test_a_static_token_is_a_bearer_token_and_stays_out_of_the_repr(
        fake: FakeAzureOpenAI) -> None:
    fake.script(reply("with a token"))
    model = model_for(fake, token=TOKEN)
    assert (await model.generate(ask())).message.text_content() == "with a token"
    sent = fake.requests[0]
    assert sent.headers["authorization"] == f"Bearer {TOKEN}" and "api-key" not in sent.headers
    assert TOKEN not in repr(model) and "auth=token" in repr(model)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_token_provider_is_asked_before_every_attempt(fake: FakeAzureOpenAI,
                                                             kind: str) -> None:
    """A sync provider runs in a worker thread (a credential may fetch a token over the
    network; the event loop must not wait on it), an async one is awaited."""
    calls: list[int] = []
    loop_thread = threading.get_ident()

    def sync_provider() -> str:
        calls.append(threading.get_ident())
        return TOKEN

    async def async_provider() -> str:
        calls.append(threading.get_ident())
        return TOKEN

    provider = sync_provider if kind == "sync" else async_provider
    sleeps = Sleeps()
    fake.script(HTTPError(503, "server"), reply("one"), reply("two"))
    model = model_for(fake, token=provider, retry=policy(sleeps))
    assert (await model.generate(ask())).message.text_content() == "one"
    assert (await assemble(model.stream(ask()))).message.text_content() == "two"
    assert len(calls) == 3 and len(fake.requests) == 3  # a retry gets a fresh token too
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in fake.requests)
    if kind == "sync":
        assert loop_thread not in calls
    else:
        assert calls == [loop_thread] * 3
    assert "auth=token provider" in repr(model)


class _Refused(Exception):
    pass


def _failing() -> str:
    raise _Refused("DefaultAzureCredential failed to retrieve a token")


@pytest.mark.parametrize(("provider", "words"), [
    (_failing, "token provider failed (_Refused: DefaultAzureCredential failed"),
    (lambda: None, "returned NoneType, not a token string"),
    (lambda: f"{TOKEN}\n", "a newline at its end"),
    (lambda: "", "returned str, not a token string"),
])
async def test_a_failing_token_provider_ends_the_call_before_anything_is_sent(
        fake: FakeAzureOpenAI, provider: Any, words: str) -> None:
    sleeps = Sleeps()
    fake.script(reply("never"))
    for call in ("generate", "stream"):
        model = model_for(fake, token=provider, retry=policy(sleeps))
        with pytest.raises(LLMError) as info:
            await (model.generate(ask()) if call == "generate"
                   else assemble(model.stream(ask())))
        assert info.value.fault is Fault.TERMINAL and words in str(info.value)
        assert TOKEN not in str(info.value) + repr(info.value)
    assert fake.requests == [] and sleeps.waits == []


async def test_a_slow_token_provider_is_held_to_the_attempts_deadline(
        fake: FakeAzureOpenAI) -> None:
    started = anyio.Event()

    async def stuck() -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    model = model_for(fake, token=stuck, timeout=0.2, retry=policy(Sleeps(), 1))
    with pytest.raises(LLMError) as info:
        await model.generate(ask())
    assert started.is_set() and info.value.fault is Fault.TRANSIENT
    assert "deadline of 0.2 s" in str(info.value) and fake.requests == []


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "words"), [
    ({"base_url": None}, "no Azure OpenAI endpoint"),
    ({"base_url": "https://res.openai.azure.com/openai/deployments/x"}, "resource's root"),
    ({"base_url": "https://res.openai.azure.com/OpenAI"}, "resource's root"),
    ({"base_url": "https://gw.example/x/%6fpenai/"}, "resource's root"),  # percent-encoded
    ({"base_url": "http://res.openai.azure.com"}, "must be https"),
    # the API's path and api-version go after the endpoint: a query would take them in
    ({"base_url": "https://res.openai.azure.com?api-version=evil"}, "endpoint .*a query"),
    ({"base_url": "https://res.openai.azure.com#frag"}, "endpoint .*a fragment"),
    ({"base_url": "https://user:hunter2pw@res.openai.azure.com"}, "a user name or password"),
    ({"api_version": "latest"}, "is not a dated version"),
    ({"api_version": "2024-10-21&x=1"}, "is not a dated version"),
    ({"api_version": "\uff12\uff10\uff12\uff14-10-21"}, "is not a dated version"),  # fullwidth
    ({"api_key": None}, "not neither"),
    ({"token": TOKEN}, "not both"),
    ({"api_key": None, "token": 42}, "string or a callable"),
])
def test_bad_configuration_is_refused_at_construction(kw: dict[str, Any], words: str) -> None:
    args = {"api_key": API_KEY, "base_url": "https://res.openai.azure.com", **kw}
    with pytest.raises(ConfigurationError, match=words) as info:
        AzureOpenAIModel(DEPLOYMENT, **args)
    assert API_KEY not in str(info.value) and TOKEN not in str(info.value)
    assert "hunter2pw" not in str(info.value) and "evil" not in str(info.value)


@pytest.mark.parametrize("endpoint", ["https://res.openai.azure.com/",
                                      "https://apim.example.com/openaiproxy",
                                      "https://gw.example/my-openai", "http://127.0.0.1:8443"])
def test_an_endpoint_behind_a_gateway_is_taken(endpoint: str) -> None:
    """Only a path segment ``openai`` (the API's own) is refused, not one containing it."""
    model = AzureOpenAIModel(DEPLOYMENT, api_key=API_KEY, base_url=endpoint)
    assert model.provider == "azure"


@pytest.mark.parametrize("deployment", ["../admin", "gpt/4o", "gpt 4o", "", ".hidden", "a?b",
                                        "x" * (MAX_AZURE_DEPLOYMENT_CHARS + 1)])
def test_a_deployment_name_cannot_change_the_url(deployment: str) -> None:
    with pytest.raises(ConfigurationError, match="deployment name") as info:
        AzureOpenAIModel(deployment, api_key=API_KEY, base_url="https://res.openai.azure.com")
    assert len(str(info.value)) < 300  # a long name is not shown whole


def test_a_deployment_name_may_have_64_characters() -> None:
    name = "gpt-4o-" + "x" * (MAX_AZURE_DEPLOYMENT_CHARS - 7)
    assert AzureOpenAIModel(name, api_key=API_KEY,
                            base_url="https://res.openai.azure.com").name == name
    with pytest.raises(ConfigurationError, match="65 characters long, more than the 64"):
        AzureOpenAIModel(name + "y", api_key=API_KEY, base_url="https://res.openai.azure.com")


def test_identity_and_repr() -> None:
    model = AzureOpenAIModel("gpt-4o-prod", api_key=API_KEY,
                             base_url="https://res.openai.azure.com/")
    assert (model.name, model.provider) == ("gpt-4o-prod", "azure")
    assert repr(model) == ("AzureOpenAIModel(deployment='gpt-4o-prod', "
                           "endpoint='https://res.openai.azure.com', api_version='2024-10-21', "
                           "auth=api-key)")


# -- secrets ---------------------------------------------------------------------------


async def test_the_key_and_token_never_appear_in_errors_reprs_or_logs(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    def echo(rec: Recorded, ex: Exchange) -> None:  # a server echoing the credential
        sent = rec.headers.get("api-key") or rec.headers.get("authorization", "")
        ex.send_json(401, {"error": {"message": f"Access denied for {sent}", "type": "auth",
                                     "param": None, "code": "401"}})

    errors: list[BaseException] = []
    with LoopbackServer(echo) as srv:
        models = [AzureOpenAIModel(DEPLOYMENT, api_key=API_KEY, base_url=srv.url),
                  AzureOpenAIModel(DEPLOYMENT, token=TOKEN, base_url=srv.url),
                  AzureOpenAIModel(DEPLOYMENT, token=lambda: TOKEN, base_url=srv.url)]
        for model in models:
            for call in (model.generate, lambda r, m=model: assemble(m.stream(r))):
                with pytest.raises(LLMError) as info:
                    await call(ask())
                errors.append(info.value)
        sent = [r.headers.get("api-key") or r.headers["authorization"] for r in srv.requests]
    assert sent[0] == API_KEY and sent[-1] == f"Bearer {TOKEN}"  # they were sent
    assert all("[redacted]" in str(e) for e in errors)
    texts = [caplog.text, *(repr(m) for m in models)]
    texts += [f"{e!s} {e!r} {e.args!r} {e.__cause__!r}" for e in errors]
    for text in texts:
        assert API_KEY not in text and TOKEN not in text


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_a_token_starting_an_overlong_tool_name_never_leaks(
        fake: FakeAzureOpenAI, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A server echoing the bearer token as a tool name past the cap: the error quotes its
    first 40 characters, a piece of the token, redacted like the whole of it."""
    caplog.set_level(logging.INFO, logger="celldialog.llm.retry")
    call = ToolUse(id="call_1", name=TOKEN + "y" * 300, input={"city": "Paris"})
    fake.script(reply(call, stop=StopReason.TOOL_USE))
    model = model_for(fake, token=lambda: TOKEN)
    with pytest.raises(LLMError, match="tool name cap") as info:
        await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))
    assert "[redacted]" in info.value.message
    for text in (str(info.value), repr(info.value.args), caplog.text):
        assert not [TOKEN[i:i + 8] for i in range(len(TOKEN) - 7) if TOKEN[i:i + 8] in text]


async def test_a_key_the_server_names_a_tool_with_is_kept_out_of_errors_and_retry_logs(
        caplog: pytest.LogCaptureFixture) -> None:
    """A tool named with the api-key, its arguments not an object: the decoder's error
    (transient) quotes the name; the WARNING before the retry and the error raised carry
    ``[redacted]`` instead."""
    caplog.set_level(logging.INFO, logger="celldialog.llm.retry")
    body = render_completion(reply("x"))
    body["choices"][0]["finish_reason"] = "tool_calls"
    body["choices"][0]["message"]["tool_calls"] = [{
        "id": "call_1", "type": "function", "function": {"name": API_KEY, "arguments": "[1]"}}]
    validate_completion(body)
    sleeps = Sleeps()
    with LoopbackServer(lambda rec, ex: ex.send_json(200, body)) as srv:
        model = AzureOpenAIModel(DEPLOYMENT, api_key=API_KEY, base_url=srv.url,
                                 retry=policy(sleeps, attempts=2))
        with pytest.raises(LLMError, match="arguments are not a JSON object") as info:
            await model.generate(ask())
    assert (info.value.provider, info.value.attempts) == ("azure", 2)
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "'[redacted]'" in warning[0].getMessage()
    assert "'[redacted]'" in str(info.value)
    assert API_KEY not in caplog.text + str(info.value) + repr(info.value.args)


# -- the fake against the official SDK -------------------------------------------------


async def test_the_official_azure_client_reads_the_fake(fake: FakeAzureOpenAI) -> None:
    """Microsoft's addressing as the official client builds it (path, api-version, api-key
    header) is the fake's route, and the client parses its bodies and its stream, prelude
    and filter results included."""
    use = ToolUse(id="call_1", name="get_weather", input={"city": "Oslo"})
    want = reply("Checking.", use, stop=StopReason.TOOL_USE,
                 usage=Usage(input_tokens=30, output_tokens=8, cache_read_tokens=16))
    fake.script(want, want, want)
    messages: Any = [{"role": "user", "content": "Hi"}]
    for credential in ({"api_key": API_KEY}, {"azure_ad_token": TOKEN}):
        client = openai.AsyncAzureOpenAI(azure_endpoint=fake.endpoint, max_retries=0,
                                         api_version=AZURE_DEFAULT_API_VERSION, **credential)
        try:
            if "api_key" in credential:
                done = await client.chat.completions.create(model=DEPLOYMENT,
                                                            messages=messages)
                assert done.choices[0].message.tool_calls[0].id == "call_1"
                stream = await client.chat.completions.create(
                    model=DEPLOYMENT, messages=messages, stream=True,
                    stream_options={"include_usage": True})
                chunks = [c async for c in stream]
                assert chunks[0].choices == [] and chunks[-1].usage is not None
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert text == "Checking."
            else:
                done = await client.chat.completions.create(model=DEPLOYMENT,
                                                            messages=messages)
                assert done.usage is not None and done.usage.prompt_tokens == 30
        finally:
            await client.close()
    assert fake.rejected == [] and len(fake.requests) == 3
    assert fake.requests[2].headers["authorization"] == f"Bearer {TOKEN}"


async def test_the_fake_refuses_what_azure_would(fake: FakeAzureOpenAI) -> None:
    fake.script(reply("never"))
    body = {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "Hi"}]}
    ok = {"api-key": API_KEY}
    async with httpx.AsyncClient(base_url=fake.endpoint) as client:
        cases = [
            (f"{ROUTE}?api-version=2024-10-21", {**body, "prompt_cache_key": "k"}, ok, 400),
            (f"{ROUTE}?api-version=2024-06-01", {**body, "max_completion_tokens": 5}, ok, 400),
            (f"{ROUTE}?api-version=2099-01-01", body, ok, 404),
            (f"{ROUTE}", body, ok, 404),
            ("/openai/deployments/other/chat/completions?api-version=2024-10-21", body, ok, 404),
            (f"{ROUTE}?api-version=2024-10-21", body, {"api-key": "wrong"}, 401),
            (f"{ROUTE}?api-version=2024-10-21", body,
             {"api-key": API_KEY, "authorization": f"Bearer {TOKEN}"}, 401),
        ]
        for path, payload, headers, status in cases:
            r = await client.post(path, json=payload, headers=headers)
            assert r.status_code == status, (path, r.text)
    assert "Unrecognized request argument supplied: prompt_cache_key" in fake.rejected[0]
    assert fake.remaining() == 1


def test_the_annotated_chunks_are_the_sdks_but_for_azure_keys(fake: FakeAzureOpenAI) -> None:
    fake.script(reply("hi"))
    prepared = fake._steps[0]
    assert prepared.chunks is not None and prepared.completion is not None
    prelude, *rest = prepared.chunks
    assert prelude["choices"] == [] and prelude["prompt_filter_results"][0]["prompt_index"] == 0
    for chunk in rest:
        validate_chunk({**chunk, "choices": [
            {k: v for k, v in c.items() if k != "content_filter_results"}
            for c in chunk["choices"]]})
    assert "content_filter_results" in prepared.completion["choices"][0]


# -- resolution ------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    return {"AZURE_OPENAI_ENDPOINT": "https://res.openai.azure.com", **extra}


def test_resolve_azure_from_the_environment(tmp_path: Path) -> None:
    none = tmp_path / "none"
    s = model_settings("azure:gpt-4o-prod", env=_env(AZURE_OPENAI_API_KEY=API_KEY),
                       dotenv_path=none)
    assert (s.provider, s.model, s.api_key, s.base_url, s.api_version, s.token) == (
        "azure", "gpt-4o-prod", API_KEY, "https://res.openai.azure.com", "2024-10-21", None)
    assert API_KEY not in repr(s)
    versioned = model_settings("gpt-4o-prod", "azure", dotenv_path=none, env=_env(
        AZURE_OPENAI_API_KEY=API_KEY, OPENAI_API_VERSION="2025-04-01-preview"))
    assert versioned.api_version == "2025-04-01-preview"
    # as in Microsoft's SDK, a token from the environment beats a key from it
    both = model_settings("azure:d", env=_env(AZURE_OPENAI_API_KEY=API_KEY,
                                              AZURE_OPENAI_AD_TOKEN=TOKEN), dotenv_path=none)
    assert (both.api_key, both.token) == (None, TOKEN) and TOKEN not in repr(both)
    # explicit arguments win over both
    given = model_settings("azure:d", api_key="given-key", api_version="2024-06-01",
                           env=_env(AZURE_OPENAI_AD_TOKEN=TOKEN), dotenv_path=none)
    assert (given.api_key, given.token, given.api_version) == ("given-key", None, "2024-06-01")


@pytest.mark.parametrize(("name", "env", "kw", "words"), [
    ("azure:d", {"AZURE_OPENAI_API_KEY": API_KEY}, {}, "set AZURE_OPENAI_ENDPOINT"),
    ("azure:d", _env(), {}, "set AZURE_OPENAI_API_KEY or AZURE_OPENAI_AD_TOKEN"),
    ("azure:d", _env(AZURE_OPENAI_API_KEY=API_KEY, OPENAI_API_VERSION="v1"), {},
     "not a dated version"),
    ("azure:a/b", _env(AZURE_OPENAI_API_KEY=API_KEY), {}, "deployment name"),
    ("azure:d", {"AZURE_OPENAI_API_KEY": API_KEY,
                 "AZURE_OPENAI_ENDPOINT": "https://res.openai.azure.com/?api-version=x"}, {},
     "Azure OpenAI endpoint .*a query"),
    ("azure:d", {"AZURE_OPENAI_API_KEY": API_KEY,
                 "AZURE_OPENAI_ENDPOINT": "https://u:hunter2pw@res.openai.azure.com"}, {},
     "a user name or password"),
    ("azure:d", _env(AZURE_OPENAI_API_KEY=API_KEY,  # fullwidth digits
                     OPENAI_API_VERSION="\uff12\uff10\uff12\uff14-10-21"), {},
     "not a dated version"),
    ("azure:d", _env(), {"api_key": API_KEY, "token": TOKEN}, "not both"),
    ("gpt-5", {"OPENAI_API_KEY": API_KEY}, {"token": TOKEN}, "are Azure OpenAI's"),
])
def test_resolve_azure_errors_name_the_fix(tmp_path: Path, name: str, env: dict[str, str],
                                           kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words) as info:
        model_settings(name, env=env, dotenv_path=tmp_path / "none", **kw)
    assert API_KEY not in str(info.value) and TOKEN not in str(info.value)
    assert "hunter2pw" not in str(info.value)


async def test_resolve_model_builds_a_working_azure_model(fake: FakeAzureOpenAI,
                                                          tmp_path: Path) -> None:
    fake.script(reply("resolved"), reply("with a provider"))
    env = {"AZURE_OPENAI_ENDPOINT": fake.endpoint, "AZURE_OPENAI_API_KEY": API_KEY}
    model = resolve_model(f"azure:{DEPLOYMENT}", env=env, dotenv_path=tmp_path / "none")
    assert isinstance(model, AzureOpenAIModel) and model.provider == "azure"
    assert (await model.generate(ask())).message.text_content() == "resolved"
    provided = resolve_model(f"azure:{DEPLOYMENT}", token=lambda: TOKEN, env=env,
                             dotenv_path=tmp_path / "none", max_tokens=10)
    assert (await provided.generate(ask())).message.text_content() == "with a provider"
    assert fake.requests[1].headers["authorization"] == f"Bearer {TOKEN}"
    assert fake.requests[1].body["max_completion_tokens"] == 10
