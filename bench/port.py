"""Client-side overhead per request: our adapters vs the official SDK clients.

    python bench/port.py [--rounds 9] [--batch 40]

Both talk to the same loopback fake servers (``tests/llm/fake_*.py``, run in a separate
process so they never compete with the clients for the GIL) with the same small conversation
(system prompt, one tool, a tool round trip), non-streaming and streaming, in the same run.
Rounds interleave every contender in a shuffled order so drift (CPU frequency, GC, other load)
hits all alike; each figure is the median over rounds of the mean per request in a batch.

The overhead proper is the client process's CPU time per request (encoding, HTTP, parsing,
assembling the reply): the server's work is in the other process and does not count. Wall
time is shown too. A "floor" contender posts pre-encoded bytes with bare httpx and reads the
raw reply: the transport's own cost, below which no client can go. "ours" is an adapter with
its own pooled client (the default); "ours, shared client" the OpenAI adapter given a caller's
``httpx.AsyncClient``, which should cost the same. The fakes' SDK validation
of every body is switched off here (server-side cost, only noise); the replies are still the
ones the tests validate.
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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import warnings

import anthropic
import httpx
import openai

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
from runtime.llm.providers.openai import OpenAIModel
from tests.llm import fake_anthropic, fake_openai

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
TEXT = REPLY.message.text_content()

Call = Callable[[], Awaitable[str]]  # one request, fully consumed; returns the reply text


@dataclass
class Contender:
    provider: str
    mode: str  # "generate" | "stream"
    client: str  # "floor" | "ours" | "ours, shared client" | "sdk"
    call: Call
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def _quiet_server() -> None:
    """Server-side costs that are the same for every contender, made small so they do not
    drown the client's: SDK validation off (see module doc), and Nagle off on the server's
    sockets (headers and body go out as two writes; with Nagle and delayed ACKs every
    keep-alive reply would stall ~40 ms)."""
    http.server.BaseHTTPRequestHandler.disable_nagle_algorithm = True
    for module, names in (
        (fake_anthropic, ("check_request", "check_message", "check_event", "check_error")),
        (fake_openai, ("validate_request",)),  # its replies are validated once, when scripted
    ):
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name} is gone: update the bench"
            setattr(module, name, lambda *a, **k: None)


def _floor(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes,
           stream: bool) -> Call:
    async def call() -> str:
        async with client.stream("POST", url, content=body, headers=headers) as r:
            data = b"".join([chunk async for chunk in r.aiter_bytes()])
        assert r.status_code == 200 and len(data) > 100, data[:200]
        return TEXT if stream else json.loads(data) and TEXT
    return call


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


def _sdk_openai(client: openai.AsyncOpenAI, stream: bool) -> Call:
    if stream:
        async def call() -> str:
            parts = []
            async for chunk in await client.chat.completions.create(
                **OPENAI_PARAMS, stream=True, stream_options={"include_usage": True}
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            return "".join(parts)
    else:
        async def call() -> str:
            completion = await client.chat.completions.create(**OPENAI_PARAMS)
            return completion.choices[0].message.content or ""
    return call


def _serve(conn: Connection, count: int) -> None:
    """The fake servers, in their own process so they never compete with the clients for
    the GIL; each has ``count`` replies queued up front."""
    _quiet_server()
    with fake_anthropic.FakeAnthropic() as fa, fake_openai.FakeOpenAI() as fo:
        fa.script(*[REPLY] * count)
        fo.script(*[REPLY] * count)
        conn.send((fa.url, fo.base_url))
        conn.recv()  # until the bench is done


async def bench(rounds: int, batch: int) -> list[Contender]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(child, (rounds + 1) * batch * 8), daemon=True)
    server.start()
    a_url, o_url = parent.recv()
    try:
        return await _measure(a_url, o_url, rounds, batch)
    finally:
        parent.send("stop")
        server.join(timeout=10)


async def _measure(a_url: str, o_url: str, rounds: int, batch: int) -> list[Contender]:
    raw, shared = httpx.AsyncClient(), httpx.AsyncClient()
    ours_a = AnthropicModel("claude-sonnet-4-5", KEY, a_url, retry=NO_RETRY)
    ours_o = OpenAIModel("gpt-4.1", KEY, o_url, retry=NO_RETRY)
    ours_o_shared = OpenAIModel("gpt-4.1", KEY, o_url, retry=NO_RETRY, http_client=shared)
    # This SDK release authenticates with a bearer header; the fake (like the adapter) speaks
    # the documented x-api-key one, so the SDK sends that too.
    sdk_a = anthropic.AsyncAnthropic(api_key=KEY, base_url=a_url, max_retries=0,
                                     default_headers={"x-api-key": KEY})
    sdk_o = openai.AsyncOpenAI(api_key=KEY, base_url=o_url, max_retries=0)
    a_headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01",
                 "content-type": "application/json"}
    o_headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}

    contenders: list[Contender] = []
    for mode in ("generate", "stream"):
        stream = mode == "stream"
        a_body = ours_a.encode(REQUEST, stream=stream)
        o_body = openai_adapter.encode_request("gpt-4.1", REQUEST, stream=stream)
        contenders += [
            Contender("anthropic", mode, "floor",
                      _floor(raw, f"{a_url}/v1/messages", a_headers, a_body, stream)),
            Contender("anthropic", mode, "ours", _ours(ours_a, stream)),
            Contender("anthropic", mode, "sdk", _sdk_anthropic(sdk_a, stream)),
            Contender("openai", mode, "floor",
                      _floor(raw, f"{o_url}/chat/completions", o_headers, o_body, stream)),
            Contender("openai", mode, "ours", _ours(ours_o, stream)),
            Contender("openai", mode, "ours, shared client", _ours(ours_o_shared, stream)),
            Contender("openai", mode, "sdk", _sdk_openai(sdk_o, stream)),
        ]

    for c in contenders:  # warm up, and check every contender gets the same reply
        for _ in range(batch):
            got = await c.call()
            assert got == TEXT, (c.provider, c.mode, c.client, got)

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

    for client in (raw, shared, ours_a, ours_o, sdk_a, sdk_o):
        await client.aclose() if hasattr(client, "aclose") else await client.close()
    return contenders


def report(contenders: list[Contender]) -> str:
    def med(c: Contender) -> tuple[float, float]:
        return statistics.median(c.cpu) * 1e6, statistics.median(c.wall) * 1e6

    sdk = {(c.provider, c.mode): med(c) for c in contenders if c.client == "sdk"}
    rows = [("provider", "mode", "client", "client CPU µs", "wall µs", "CPU ours/SDK",
             "wall ours/SDK")]
    for c in contenders:
        cpu, wall = med(c)
        s_cpu, s_wall = sdk[(c.provider, c.mode)]
        ours = c.client.startswith("ours")
        rows.append((c.provider, c.mode, c.client, f"{cpu:,.0f}", f"{wall:,.0f}",
                     f"{cpu / s_cpu:.2f}" if ours else "", f"{wall / s_wall:.2f}" if ours else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=40)
    args = parser.parse_args()
    # The SDK warns that the (fake-served) model id is deprecated; irrelevant here.
    warnings.filterwarnings("ignore", message="The model .* is deprecated")
    contenders = asyncio.run(bench(args.rounds, args.batch))
    print(f"per request, median of {args.rounds} rounds x {args.batch} requests against "
          "loopback fakes in another process.\nclient CPU = CPU time of the client process "
          "(the overhead proper); wall includes the server.\nratios < 1: ours is cheaper than "
          "the official SDK. floor = bare httpx posting pre-encoded bytes.\n")
    print(report(contenders))


if __name__ == "__main__":
    main()
