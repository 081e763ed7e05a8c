"""Client-side overhead per request: our adapters vs the official SDK clients.

    python bench/port.py [--rounds 9] [--batch 40] [--providers anthropic,gemini,...]

Both talk to the same loopback fake servers (``tests/llm/fake_*.py``, run in a separate
process so they never compete with the clients for the GIL) with the same small conversation
(system prompt, one tool, a tool round trip), non-streaming and streaming, in the same run.
Providers (``--providers``, default all): Anthropic Messages (``anthropic``), OpenAI Chat
Completions (``openai``) and Responses (``openai-responses``), both with the ``openai`` SDK,
Gemini (``gemini``, ``google-genai``'s async client) and Azure OpenAI (``azure``,
``openai.AsyncAzureOpenAI``). Rounds interleave every contender in a shuffled order so drift
(CPU frequency, GC, other load) hits all alike; each figure is the median over rounds of the
mean per request in a batch.

The overhead proper is the client process's CPU time per request (encoding, HTTP, parsing,
assembling the reply): the server's work is in the other process and does not count. Wall
time is shown too. A "floor" contender posts pre-encoded bytes with bare httpx and reads the
raw reply: the transport's own cost, below which no client can go. "ours" is an adapter with
its own pooled client (the default); "ours, shared client" the OpenAI adapter given a caller's
``httpx.AsyncClient``, which should cost the same. The target (issue 19) is ours no slower
than the SDK in client CPU: PASS when the CPU ratio is at most 1.00.

The warm-up checks, untimed, that every contender gets the reply text (the floor's read
from its raw bytes), and fetches from the server the last request each one sent: the notes
under the table say where an SDK's body differs from ours as JSON (each SDK is given the
conversation in its own parameters; a spelling it has of its own shows there), and where the
floor's does. In the server process each fake's reply is checked against the SDK types
once; then the fakes' SDK validation is switched off (server-side cost, only noise): the
replies are still the ones the tests validate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.server
import json
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import warnings

import anthropic
import httpx
import openai
from _common import load, source_state
from google import genai
from google.genai import types as genai_types

from runtime.llm import (
    NO_RETRY,
    Message,
    Request,
    Response,
    Role,
    StopReason,
    TextBlock,
    Tool,
    ToolResult,
    ToolUse,
    Usage,
    assemble,
)
from runtime.llm.providers import openai as openai_adapter
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.gemini import GeminiModel
from runtime.llm.providers.openai import AzureOpenAIModel, OpenAIModel
from runtime.llm.providers.openai_responses import OpenAIResponsesModel
from runtime.llm.providers.presets import AZURE_DEFAULT_API_VERSION
from tests.llm import fake_anthropic, fake_azure, fake_gemini, fake_openai, fake_openai_responses

PROVIDERS = ("anthropic", "openai", "openai-responses", "gemini", "azure")
KEY = "sk-bench-not-a-real-key"
SYSTEM = "You are a concise weather assistant. Call tools when you need data."
WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]},
)
REQUEST = Request(
    system=SYSTEM,
    tools=(WEATHER,),
    max_tokens=256,
    messages=(
        Message.text(Role.USER, "What's the weather in Paris?"),
        Message(role=Role.ASSISTANT, blocks=(
            ToolUse(id="call_1", name="get_weather", input={"city": "Paris"}),)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_1", content="sunny, 21C"),)),
    ),
)
REPLY = Response(
    message=Message(role=Role.ASSISTANT, blocks=(TextBlock(
        text="It is sunny in Paris right now, about 21 degrees Celsius. A fine day for a walk "
             "along the Seine; no umbrella needed."),)),
    stop_reason=StopReason.END_TURN,
    usage=Usage(input_tokens=180, output_tokens=31, cache_read_tokens=128),
)

# The same conversation in each SDK's own parameters.
TOOL_ARGS = json.dumps({"city": "Paris"})
ANTHROPIC_PARAMS: dict[str, Any] = dict(
    model="claude-sonnet-4-5",
    max_tokens=256,
    system=SYSTEM,
    tools=[{"name": WEATHER.name, "description": WEATHER.description,
            "input_schema": WEATHER.input_schema}],
    messages=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny, 21C"}]},
    ],
)
OPENAI_PARAMS: dict[str, Any] = dict(
    model="gpt-4.1",
    max_completion_tokens=256,
    tools=[{"type": "function", "function": {"name": WEATHER.name,
                                             "description": WEATHER.description,
                                             "parameters": WEATHER.input_schema}}],
    messages=[
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": TOOL_ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ],
)
# Stateless and non-strict, as the adapter asks (runtime/llm/providers/openai_responses.py).
RESPONSES_PARAMS: dict[str, Any] = dict(
    model="gpt-4.1",
    instructions=SYSTEM,
    tools=[{"type": "function", "name": WEATHER.name, "description": WEATHER.description,
            "parameters": WEATHER.input_schema, "strict": False}],
    input=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": json.dumps({"city": "Paris"}, separators=(",", ":"))},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21C"},
    ],
    max_output_tokens=256,
    store=False,
)
GEMINI_MODEL = "gemini-2.5-flash"
GEMINI_PARAMS: dict[str, Any] = dict(
    model=GEMINI_MODEL,
    contents=[
        genai_types.Content(role="user", parts=[
            genai_types.Part(text="What's the weather in Paris?")]),
        genai_types.Content(role="model", parts=[genai_types.Part(
            function_call=genai_types.FunctionCall(id="call_1", name="get_weather",
                                                   args={"city": "Paris"}))]),
        genai_types.Content(role="user", parts=[genai_types.Part(
            function_response=genai_types.FunctionResponse(
                id="call_1", name="get_weather", response={"output": "sunny, 21C"}))]),
    ],
    config=genai_types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(
            name=WEATHER.name, description=WEATHER.description,
            parameters_json_schema=WEATHER.input_schema)])],
        max_output_tokens=256,
    ),
)
DEPLOYMENT = "gpt-4o-bench"
AZURE_PARAMS: dict[str, Any] = {**OPENAI_PARAMS, "model": DEPLOYMENT}
TEXT = REPLY.message.text_content()

Call = Callable[[], Awaitable[Any]]  # one request, fully consumed; returns the reply


def _same(reply: Any) -> Any:
    return reply


@dataclass
class Contender:
    provider: str
    mode: str  # "generate" | "stream"
    client: str  # "floor" | "ours" | "ours, shared client" | "sdk"
    call: Call
    text: Callable[[Any], str] = _same  # the reply text of what ``call`` returns (untimed)
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    sent: tuple[str, bytes] | None = None  # (path, body) of its last request (warm-up)


# -- the server process ----------------------------------------------------------------------

# Each fake module's SDK checks: those run on every request, switched off from the start, and
# those run on every reply (when scripted, or as sent), switched off once one reply passed.
# Azure's fake is the OpenAI one behind Azure's routing: the same module's checks.
_CHECKS: dict[str, tuple[Any, tuple[str, ...], tuple[str, ...]]] = {
    "anthropic": (fake_anthropic, ("check_request",),
                  ("check_message", "check_event", "check_error")),
    "openai": (fake_openai, ("validate_request",), ("validate_completion", "validate_chunk")),
    "openai-responses": (fake_openai_responses, ("validate_request",),
                         ("validate_response", "validate_event")),
    # Gemini's fake reads the parsed request (its signature and thinking rules): kept on; it
    # runs in the server's process, so the clients' CPU is the same either way
    "gemini": (fake_gemini, (), ("check_response", "check_error")),
    "azure": (fake_openai, ("validate_request",), ("validate_completion", "validate_chunk")),
}


def _switch_off(names: list[str], kind: Literal["request", "reply"]) -> None:
    for name in names:
        module, on_request, on_reply = _CHECKS[name]
        for check in on_request if kind == "request" else on_reply:
            assert hasattr(module, check), f"{module.__name__}.{check} is gone: update the bench"
            setattr(module, check, lambda *a, **k: None)


def _start(name: str, stack: ExitStack) -> tuple[Any, str]:
    """The fake for provider ``name``, started, and the base URL its clients are given."""
    match name:
        case "anthropic":
            fake = stack.enter_context(fake_anthropic.FakeAnthropic())
            return fake, fake.url
        case "openai":
            fake = stack.enter_context(fake_openai.FakeOpenAI())
            return fake, fake.base_url
        case "openai-responses":
            fake = stack.enter_context(fake_openai_responses.FakeOpenAIResponses())
            return fake, fake.base_url
        case "gemini":
            fake = stack.enter_context(fake_gemini.FakeGemini())
            return fake, fake.url
        case "azure":
            fake = stack.enter_context(fake_azure.FakeAzureOpenAI(DEPLOYMENT, api_key=KEY))
            return fake, fake.endpoint
    raise ValueError(name)


def _check_once(name: str, fake: Any) -> int:
    """Put the bench's reply through the fake's SDK checks once; how many replies that
    scripted. (Anthropic's fake checks replies as it sends them: here, directly.)"""
    if name != "anthropic":
        fake.script(REPLY)
        return 1
    model = ANTHROPIC_PARAMS["model"]
    fake_anthropic.check_message(fake_anthropic.message_body(REPLY, model=model))
    for event, data in fake_anthropic.stream_events(REPLY, model=model):
        fake_anthropic.check_event(event, data)
    return 0


def _serve(conn: Connection, names: list[str], count: int) -> None:
    """The fake servers, in their own process so they never compete with the clients for
    the GIL; each has ``count`` replies queued up front. Then, until told to stop (None),
    it answers a provider's name with the path and body of the last request its fake got."""
    # Nagle off on the server's sockets: headers and body go out as two writes; with Nagle
    # and delayed ACKs every keep-alive reply would stall ~40 ms.
    http.server.BaseHTTPRequestHandler.disable_nagle_algorithm = True
    _switch_off(names, "request")
    with ExitStack() as stack:
        fakes, urls = {}, {}
        for name in names:
            fakes[name], urls[name] = _start(name, stack)
        scripted = {name: _check_once(name, fakes[name]) for name in names}
        _switch_off(names, "reply")
        for name in names:
            fakes[name].script(*[REPLY] * (count - scripted[name]))
        conn.send(urls)
        while (name := conn.recv()) is not None:
            last = fakes[name].requests[-1]
            conn.send((last.path, last.raw))


# -- the contenders --------------------------------------------------------------------------


def _floor(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes,
           stream: bool) -> Call:
    async def call() -> Any:
        async with client.stream("POST", url, content=body, headers=headers) as r:
            data = b"".join([chunk async for chunk in r.aiter_bytes()])
        assert r.status_code == 200 and len(data) > 100, data[:200]
        return data if stream else json.loads(data)
    return call


def _sse(data: bytes) -> list[dict[str, Any]]:
    """The JSON of each ``data:`` line of a raw SSE body (not OpenAI's ``[DONE]``)."""
    return [json.loads(line[5:]) for line in data.splitlines()
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]


def _anthropic_text(body: dict[str, Any]) -> str:
    return "".join(b["text"] for b in body["content"] if b["type"] == "text")


def _anthropic_stream_text(data: bytes) -> str:
    return "".join(e["delta"]["text"] for e in _sse(data)
                   if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta")


def _chat_text(body: dict[str, Any]) -> str:
    return body["choices"][0]["message"]["content"]


def _chat_stream_text(data: bytes) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in _sse(data)
                   if c["choices"])


def _responses_text(body: dict[str, Any]) -> str:
    return "".join(p["text"] for item in body["output"] if item["type"] == "message"
                   for p in item["content"] if p["type"] == "output_text")


def _responses_stream_text(data: bytes) -> str:
    return "".join(e["delta"] for e in _sse(data) if e["type"] == "response.output_text.delta")


def _gemini_text(body: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in body["candidates"][0]["content"]["parts"]
                   if not p.get("thought"))


def _gemini_stream_text(data: bytes) -> str:
    return "".join(_gemini_text(chunk) for chunk in _sse(data))


# The reply text in a floor's raw reply (generate: the parsed body; stream: the raw bytes).
FLOOR_TEXT: dict[str, tuple[Callable[[Any], str], Callable[[bytes], str]]] = {
    "anthropic": (_anthropic_text, _anthropic_stream_text),
    "openai": (_chat_text, _chat_stream_text),
    "openai-responses": (_responses_text, _responses_stream_text),
    "gemini": (_gemini_text, _gemini_stream_text),
    "azure": (_chat_text, _chat_stream_text),
}


def _ours(model: Any, stream: bool) -> Call:
    if stream:
        async def call() -> str:
            return (await assemble(model.stream(REQUEST))).message.text_content()
    else:
        async def call() -> str:
            return (await model.generate(REQUEST)).message.text_content()
    return call


def _sdk_anthropic(client: anthropic.AsyncAnthropic, stream: bool) -> Call:
    if stream:
        async def call() -> str:
            parts = []
            async for event in await client.messages.create(**ANTHROPIC_PARAMS, stream=True):
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    parts.append(event.delta.text)
                elif event.type == "content_block_start" and event.content_block.type == "text":
                    parts.append(event.content_block.text)
            return "".join(parts)
    else:
        async def call() -> str:
            message = await client.messages.create(**ANTHROPIC_PARAMS)
            return "".join(b.text for b in message.content if b.type == "text")
    return call


def _sdk_openai(client: openai.AsyncOpenAI, stream: bool,
                params: dict[str, Any] = OPENAI_PARAMS) -> Call:
    if stream:
        async def call() -> str:
            parts = []
            async for chunk in await client.chat.completions.create(
                **params, stream=True, stream_options={"include_usage": True}
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return "".join(parts)
    else:
        async def call() -> str:
            completion = await client.chat.completions.create(**params)
            return completion.choices[0].message.content or ""
    return call


def _sdk_responses(client: openai.AsyncOpenAI, stream: bool) -> Call:
    if stream:
        async def call() -> str:
            parts = []
            async for event in await client.responses.create(**RESPONSES_PARAMS, stream=True):
                if event.type == "response.output_text.delta":
                    parts.append(event.delta)
            return "".join(parts)
    else:
        async def call() -> str:
            return (await client.responses.create(**RESPONSES_PARAMS)).output_text
    return call


def _sdk_gemini(client: genai.Client, stream: bool) -> Call:
    models = client.aio.models
    if stream:
        async def call() -> str:
            parts = []
            async for chunk in await models.generate_content_stream(**GEMINI_PARAMS):
                parts.append(chunk.text or "")
            return "".join(parts)
    else:
        async def call() -> str:
            return (await models.generate_content(**GEMINI_PARAMS)).text or ""
    return call


@dataclass
class _Setup:
    """What the client side opened for the run: contenders, and what to close after it."""

    raw: httpx.AsyncClient = field(default_factory=httpx.AsyncClient)
    contenders: list[Contender] = field(default_factory=list)
    clients: list[Any] = field(default_factory=list)

    def open(self, *clients: Any) -> None:
        self.clients += clients

    def floor(self, provider: str, mode: str, url: str, headers: dict[str, str],
              body: bytes) -> None:
        stream = mode == "stream"
        self.contenders.append(Contender(
            provider, mode, "floor", _floor(self.raw, url, headers, body, stream),
            FLOOR_TEXT[provider][stream]))

    def add(self, provider: str, mode: str, client: str, call: Call) -> None:
        self.contenders.append(Contender(provider, mode, client, call))

    async def close(self) -> None:
        for client in (self.raw, *self.clients):
            if isinstance(client, genai.Client):  # a sync and an async client
                client.close()
                await client.aio.aclose()
            else:
                await client.aclose() if hasattr(client, "aclose") else await client.close()


JSON = {"content-type": "application/json"}
MODES = ("generate", "stream")


def _anthropic(setup: _Setup, url: str) -> None:
    ours = AnthropicModel("claude-sonnet-4-5", KEY, url, retry=NO_RETRY)
    # This SDK release authenticates with a bearer header; the fake (like the adapter) speaks
    # the documented x-api-key one, so the SDK sends that too.
    sdk = anthropic.AsyncAnthropic(api_key=KEY, base_url=url, max_retries=0,
                                   default_headers={"x-api-key": KEY})
    setup.open(ours, sdk)
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", **JSON}
    for mode in MODES:
        stream = mode == "stream"
        setup.floor("anthropic", mode, f"{url}/v1/messages", headers,
                    ours.encode(REQUEST, stream=stream))
        setup.add("anthropic", mode, "ours", _ours(ours, stream))
        setup.add("anthropic", mode, "sdk", _sdk_anthropic(sdk, stream))


def _openai(setup: _Setup, url: str) -> None:
    shared = httpx.AsyncClient()
    ours = OpenAIModel("gpt-4.1", KEY, url, retry=NO_RETRY)
    ours_shared = OpenAIModel("gpt-4.1", KEY, url, retry=NO_RETRY, http_client=shared)
    sdk = openai.AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0)
    setup.open(shared, ours, sdk)
    headers = {"authorization": f"Bearer {KEY}", **JSON}
    for mode in MODES:
        stream = mode == "stream"
        setup.floor("openai", mode, f"{url}/chat/completions", headers,
                    openai_adapter.encode_request("gpt-4.1", REQUEST, stream=stream))
        setup.add("openai", mode, "ours", _ours(ours, stream))
        setup.add("openai", mode, "ours, shared client", _ours(ours_shared, stream))
        setup.add("openai", mode, "sdk", _sdk_openai(sdk, stream))


def _openai_responses(setup: _Setup, url: str) -> None:
    ours = OpenAIResponsesModel(RESPONSES_PARAMS["model"], KEY, url, retry=NO_RETRY)
    sdk = openai.AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0)
    setup.open(ours, sdk)
    headers = {"authorization": f"Bearer {KEY}", **JSON}
    for mode in MODES:
        stream = mode == "stream"
        setup.floor("openai-responses", mode, f"{url}/responses", headers,
                    ours.encode(REQUEST, stream=stream))
        setup.add("openai-responses", mode, "ours", _ours(ours, stream))
        setup.add("openai-responses", mode, "sdk", _sdk_responses(sdk, stream))


def _gemini(setup: _Setup, url: str) -> None:
    ours = GeminiModel(GEMINI_MODEL, KEY, url, retry=NO_RETRY)
    # One attempt, as the other SDKs' max_retries=0 and our NO_RETRY.
    sdk = genai.Client(api_key=KEY, http_options=genai_types.HttpOptions(
        base_url=url, api_version="v1beta",
        retry_options=genai_types.HttpRetryOptions(attempts=1)))
    setup.open(ours, sdk)
    headers = {"x-goog-api-key": KEY, **JSON}
    for mode in MODES:
        stream = mode == "stream"
        method = ":streamGenerateContent?alt=sse" if stream else ":generateContent"
        setup.floor("gemini", mode, f"{url}/v1beta/models/{GEMINI_MODEL}{method}", headers,
                    ours.encode(REQUEST, stream=stream))
        setup.add("gemini", mode, "ours", _ours(ours, stream))
        setup.add("gemini", mode, "sdk", _sdk_gemini(sdk, stream))


def _azure(setup: _Setup, url: str) -> None:
    ours = AzureOpenAIModel(DEPLOYMENT, KEY, url, retry=NO_RETRY)
    sdk = openai.AsyncAzureOpenAI(azure_endpoint=url, api_key=KEY, max_retries=0,
                                  api_version=AZURE_DEFAULT_API_VERSION)
    setup.open(ours, sdk)
    route = (f"{url}/openai/deployments/{DEPLOYMENT}/chat/completions"
             f"?api-version={AZURE_DEFAULT_API_VERSION}")
    for mode in MODES:
        stream = mode == "stream"
        setup.floor("azure", mode, route, {"api-key": KEY, **JSON},
                    ours.encode(REQUEST, stream=stream))
        setup.add("azure", mode, "ours", _ours(ours, stream))
        setup.add("azure", mode, "sdk", _sdk_openai(sdk, stream, AZURE_PARAMS))


CONTENDERS: dict[str, Callable[[_Setup, str], None]] = {
    "anthropic": _anthropic,
    "openai": _openai,
    "openai-responses": _openai_responses,
    "gemini": _gemini,
    "azure": _azure,
}


# -- the run ---------------------------------------------------------------------------------


async def bench(rounds: int, batch: int, providers: list[str]) -> list[Contender]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(child, providers, (rounds + 1) * batch * 8),
                         daemon=True)
    server.start()
    urls = parent.recv()
    try:
        return await _measure(urls, parent, rounds, batch)
    finally:
        parent.send(None)
        server.join(timeout=10)


async def _measure(urls: dict[str, str], server: Connection, rounds: int, batch: int,
                   ) -> list[Contender]:
    setup = _Setup()
    for provider, url in urls.items():
        CONTENDERS[provider](setup, url)
    # Rows by mode, then provider (the rounds shuffle them anyway).
    contenders = sorted(setup.contenders, key=lambda c: MODES.index(c.mode))

    for c in contenders:  # warm up; check every contender gets the reply, note what it sent
        for _ in range(batch):
            got = c.text(await c.call())
            assert got == TEXT, (c.provider, c.mode, c.client, got)
        server.send(c.provider)
        c.sent = server.recv()

    rng = random.Random(7)
    for _ in range(rounds):
        order = contenders[:]
        rng.shuffle(order)
        for c in order:
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(batch):
                await c.call()
            c.cpu.append((time.process_time() - cpu) / batch)
            c.wall.append((time.perf_counter() - wall) / batch)

    await setup.close()
    return contenders


# -- the report ------------------------------------------------------------------------------


def report(contenders: list[Contender]) -> str:
    def med(c: Contender) -> tuple[float, float]:
        return statistics.median(c.cpu) * 1e6, statistics.median(c.wall) * 1e6

    sdk = {(c.provider, c.mode): med(c) for c in contenders if c.client == "sdk"}
    rows = [("provider", "mode", "client", "client CPU µs", "wall µs", "CPU ours/SDK",
             "wall ours/SDK", "target")]
    for c in contenders:
        cpu, wall = med(c)
        s_cpu, s_wall = sdk[(c.provider, c.mode)]
        ours = c.client.startswith("ours")
        rows.append((c.provider, c.mode, c.client, f"{cpu:,.0f}", f"{wall:,.0f}",
                     f"{cpu / s_cpu:.2f}" if ours else "", f"{wall / s_wall:.2f}" if ours else "",
                     ("PASS" if cpu <= s_cpu else "FAIL") if ours else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i < 3 or i == 7 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def differences(ours: Any, theirs: Any, path: str = "$") -> list[str]:
    """Where two JSON values differ, as paths (the first difference down each branch)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = [f"{path}.{k} ({'ours' if k in ours else 'theirs'} only)"
               for k in [*ours, *theirs] if (k in ours) != (k in theirs)]
        return out + [d for k in ours if k in theirs
                      for d in differences(ours[k], theirs[k], f"{path}.{k}")]
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                for d in differences(a, b, f"{path}[{i}]")]
    return [] if ours == theirs and type(ours) is type(theirs) else [path]


def request_notes(contenders: list[Contender]) -> str:
    """How each contender's last request compares with ours, as JSON (and its path)."""
    ours = {(c.provider, c.mode): c.sent for c in contenders if c.client == "ours"}
    lines = []
    for c in contenders:
        if c.client == "ours" or c.sent is None:
            continue
        path, body = c.sent
        o_path, o_body = ours[(c.provider, c.mode)]
        found = ([f"path {path} (ours: {o_path})"] if path != o_path else []) + differences(
            json.loads(o_body), json.loads(body))
        same = "same bytes" if body == o_body else "same JSON"
        shown = "; ".join(found[:6]) + (f"; +{len(found) - 6} more" if len(found) > 6 else "")
        lines.append(f"  {c.provider} {c.mode} {c.client}: {shown or same}")
    return "request bodies against ours (last request of each warm-up):\n" + "\n".join(lines)


def _providers(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if unknown := [n for n in names if n not in PROVIDERS]:
        raise argparse.ArgumentTypeError(
            f"unknown provider {unknown[0]!r}: choose from {', '.join(PROVIDERS)}")
    if not names:
        raise argparse.ArgumentTypeError(f"no provider named: choose from {', '.join(PROVIDERS)}")
    return list(dict.fromkeys(names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--providers", type=_providers, default=list(PROVIDERS),
                        help=f"comma-separated, of {','.join(PROVIDERS)} (default: all)")
    args = parser.parse_args()
    # The SDK warns that the (fake-served) model id is deprecated; irrelevant here.
    warnings.filterwarnings("ignore", message="The model .* is deprecated")
    print(f"source: {source_state()}\n{load()} (at the start)\nSDKs: anthropic "
          f"{anthropic.__version__}, openai {openai.__version__}, google-genai "
          f"{genai.__version__}; httpx {httpx.__version__}\n")
    contenders = asyncio.run(bench(args.rounds, args.batch, args.providers))
    print(f"per request, median of {args.rounds} rounds x {args.batch} requests against "
          "loopback fakes in another process.\nclient CPU = CPU time of the client process "
          "(the overhead proper); wall includes the server.\nratios < 1: ours is cheaper than "
          "the official SDK. floor = bare httpx posting pre-encoded bytes.\ntarget: ours no "
          "slower than the SDK in client CPU (PASS: CPU ours/SDK <= 1.00).\n")
    print(report(contenders))
    print(f"\n{request_notes(contenders)}\n{load()} (at the end)")


if __name__ == "__main__":
    main()
