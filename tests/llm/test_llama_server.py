"""The OpenAI adapter against a server nobody here wrote (issue 15): llama-cpp-python's own
OpenAI-compatible server, ``python -m llama_cpp.server``, on the bundled SmolLM2 GGUF.

The loopback fake (``fake_openai.py``) speaks the wire format as we read it; this server
speaks it as someone else implemented it. One server runs for the module (it loads a 100 MB
model); every test drives ``OpenAIModel`` through an httpx transport that keeps a copy of the
bytes the server sent, and holds those bytes to the official ``openai`` SDK types (strict,
no unknown fields: ``fake_openai.validate_completion`` / ``validate_chunk``), so the adapter's
reading and the SDK's are compared on the same reply.

Server flags, and why:

- ``--chat_format chatml-function-calling``: the format of llama-cpp-python that puts the
  tools in the system prompt and honours a named ``tool_choice`` (a grammar compiled from the
  tool's schema). Its template is ChatML, which is SmolLM2's own. The GGUF's template (no
  ``--chat_format``) forces a named call too, but never shows the model the tools.
- ``--n_threads 1 --n_threads_batch 1``: on two cores shared with pytest (and whatever else
  runs), llama.cpp's spinning threads collapse when oversubscribed: 3 s per token measured
  with two threads beside one busy process, 19 ms with one.

What this server does that OpenAI does not, each pinned by a test below: it ignores
``stream_options`` (its request model has no such field), so a stream carries no usage and
the streamed response reports none; a streamed tool call repeats its id and name in every
chunk, beside a legacy ``function_call`` delta; a call's id is ``call__<i>_<name>_<completion
id>``, kept as sent while it is at most 64 characters.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from runtime.llm import (
    Message,
    Request,
    Response,
    RetryPolicy,
    Role,
    Sampling,
    StopReason,
    TextBlock,
    TextDelta,
    Tool,
    ToolCallDelta,
    ToolCallStart,
    ToolUse,
    Usage,
    UsageUpdate,
    assemble,
)
from runtime.llm.providers.local import default_model_path
from runtime.llm.providers.openai import OpenAIModel

from .fake_openai import validate_chunk, validate_completion, validate_request

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: "
                    "pip install -e '.[local]' (or deselect with -m 'not local')")

pytestmark = [pytest.mark.local, pytest.mark.anyio]

MODEL = "smollm2"  # the server's --model_alias (it answers any name with its one model)
N_CTX = 2048
STARTUP_DEADLINE = 60.0  # seconds; the model loads in about 2 s on two cores
GREEDY = Sampling(seed=15, temperature=0.0)

QUESTION = Request(
    system="Answer in one sentence.",
    messages=(Message.text(Role.USER, "What is the capital of France?"),),
    max_tokens=32,
    sampling=GREEDY,
)
TITLE = {"type": "string", "minLength": 1, "maxLength": 40}
ADD_ITEM = Tool(name="addItem", description="Add an item to the todo list.", input_schema={
    "type": "object",
    "properties": {"title": TITLE, "priority": {"enum": ["low", "high"]}},
    "required": ["title", "priority"], "additionalProperties": False})
REMOVE_ITEM = Tool(name="removeItem", description="Remove an item from the todo list.",
                   input_schema={"type": "object", "properties": {"title": TITLE},
                                 "required": ["title"], "additionalProperties": False})
TOOLS = (ADD_ITEM, REMOVE_ITEM)


def todo_request(tool: str) -> Request:
    """Strings are bounded by the schemas, so a forced call always fits in ``max_tokens``."""
    return Request(
        system="You manage the user's todo list.",
        messages=(Message.text(Role.USER, "Put 'buy milk' on my list, it is urgent."),),
        tools=TOOLS, tool_choice=tool, max_tokens=64, sampling=GREEDY,
    )


# -- the server -------------------------------------------------------------------------------


@dataclass
class Server:
    base_url: str
    argv: list[str]
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen[bytes], server: Server) -> None:
    """Poll ``GET /v1/models`` until it answers 200. The model is loaded before uvicorn
    listens, so an answer means the server can generate."""
    deadline = time.monotonic() + STARTUP_DEADLINE
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{server.base_url}/models", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        try:
            code = proc.wait(timeout=0.1)  # the pause between polls, and a crash seen at once
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"llama_cpp.server exited with {code} before it was ready (its "
                    "dependencies come with the local extra: pip install -e '.[local]'):\n"
                    f"{server.log_tail()}")
    pytest.fail(f"llama_cpp.server not ready after {STARTUP_DEADLINE:.0f} s:\n"
                f"{server.log_tail()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = _free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path()),
            "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(N_CTX), "--chat_format", "chatml-function-calling",
            "--n_threads", "1", "--n_threads_batch", "1", "--verbose", "False"]
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    running = Server(base_url=f"http://127.0.0.1:{port}/v1", argv=argv, log=log)
    try:
        _wait_ready(proc, running)
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the adapter, with a copy of what went over the wire -------------------------------------


@dataclass
class Exchange:
    request: dict[str, Any]
    body: bytearray = field(default_factory=bytearray)

    def completion(self) -> Any:
        """The body as the SDK's ``ChatCompletion``."""
        return validate_completion(json.loads(self.body))

    def chunks(self) -> list[Any]:
        """The SSE stream's ``data`` as the SDK's ``ChatCompletionChunk``s, ``[DONE]`` last."""
        events = [e for e in self.body.decode().replace("\r\n", "\n").split("\n\n") if e]
        datas = ["\n".join(line[5:].lstrip() for line in e.split("\n")
                           if line.startswith("data:")) for e in events]
        datas = [d for d in datas if d]  # an event of comments only: ": ping - <time>"
        assert datas[-1] == "[DONE]", datas[-1]
        return [validate_chunk(json.loads(d)) for d in datas[:-1]]


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, sink: bytearray) -> None:
        self._inner, self._sink = inner, sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._sink.extend(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class Recording(httpx.AsyncBaseTransport):
    """A real transport that keeps each request's JSON and a copy of the response body as
    the adapter reads it (the adapter sees the server's bytes unchanged)."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = Exchange(request=json.loads(request.content))
        self.exchanges.append(exchange)
        response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Tee(response.stream, exchange.body),
                              extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def adapter(server: Server) -> AsyncIterator[tuple[OpenAIModel, Recording]]:
    """``OpenAIModel`` on the server, one attempt per call: a retried failure would hide
    what the server answered first."""
    wire = Recording()
    async with httpx.AsyncClient(transport=wire) as client:
        yield OpenAIModel(MODEL, base_url=server.base_url, http_client=client, timeout=60,
                          retry=RetryPolicy(max_attempts=1)), wire


async def streamed(model: OpenAIModel, request: Request) -> tuple[list[Any], Response]:
    events = [e async for e in model.stream(request)]

    async def replay() -> AsyncIterator[Any]:
        for e in events:
            yield e

    return events, await assemble(replay())


async def token_count(server: Server, text: str) -> int:
    async with httpx.AsyncClient() as client:
        got = await client.post(server.base_url.removesuffix("/v1") + "/extras/tokenize/count",
                                json={"input": text})
    return got.json()["count"]


def chatml(request: Request) -> str:
    """The prompt chatml-function-calling renders for a request without tools."""
    turns = [("system", request.system)] if request.system else []
    turns += [(m.role.value, m.text_content()) for m in request.messages]
    return "".join(f"<|im_start|>{r}\n{t}<|im_end|>\n" for r, t in turns) + (
        "<|im_start|>assistant\n")


# -- the tests --------------------------------------------------------------------------------


async def test_a_text_reply(server: Server) -> None:
    """The request is one the SDK would build (``max_tokens``, as to any loopback server);
    the reply is the server's text, read as the SDK reads it."""
    async with adapter(server) as (model, wire):
        got = await model.generate(QUESTION)
    [exchange] = wire.exchanges
    body = validate_request(exchange.request)
    assert body["max_tokens"] == 32 and body["temperature"] == 0.0 and body["seed"] == 15
    sdk = exchange.completion()
    assert got.stop_reason is StopReason.END_TURN and sdk.choices[0].finish_reason == "stop"
    [block] = got.message.blocks
    assert isinstance(block, TextBlock)
    assert block.text == sdk.choices[0].message.content and "Paris" in block.text
    assert got.model == sdk.model == MODEL


async def test_a_stream_arrives_in_pieces_and_assembles_to_the_same_reply(
        server: Server) -> None:
    """Several text deltas, assembling to what ``generate`` returns at temperature 0, except
    usage: the server ignores ``stream_options.include_usage`` (its request model has no
    such field), so no chunk carries usage and the streamed reply reports none."""
    async with adapter(server) as (model, wire):
        whole = await model.generate(QUESTION)
        events, got = await streamed(model, QUESTION)
    exchange = wire.exchanges[1]
    assert validate_request(exchange.request)["stream_options"] == {"include_usage": True}
    chunks = exchange.chunks()
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 3 and "".join(deltas) == whole.message.text_content()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        whole.message.text_content())
    assert got.message == whole.message and got.stop_reason is whole.stop_reason
    assert got.model == whole.model
    assert all(c.usage is None for c in chunks)
    assert not any(isinstance(e, UsageUpdate) for e in events)
    assert got.usage == Usage() and whole.usage.input_tokens > 0


async def test_usage_is_what_the_server_counts(server: Server) -> None:
    """``input_tokens`` and ``output_tokens`` are the body's ``prompt_tokens`` and
    ``completion_tokens``, and those are the server tokenizer's count of the prompt it
    rendered and of the reply (its ``/extras/tokenize/count``); it reports no cache."""
    async with adapter(server) as (model, wire):
        got = await model.generate(QUESTION)
    sdk = wire.exchanges[0].completion()
    assert sdk.usage is not None and sdk.usage.prompt_tokens_details is None
    assert got.usage == Usage(input_tokens=sdk.usage.prompt_tokens,
                              output_tokens=sdk.usage.completion_tokens)
    assert got.usage.input_tokens == await token_count(server, chatml(QUESTION)) > 0
    assert got.usage.output_tokens == await token_count(server, got.message.text_content()) > 0
    assert sdk.usage.total_tokens == got.usage.input_tokens + got.usage.output_tokens


@pytest.mark.parametrize("tool", ["addItem", "removeItem"])
async def test_a_tool_choice_naming_a_tool_gets_a_valid_call_of_it(
        server: Server, tool: str) -> None:
    """Whichever of the two tools is named, the reply is one call of it (not the one the
    prompt suggests) whose arguments validate against its schema; the server's call id is
    valid, so it is kept as sent."""
    async with adapter(server) as (model, wire):
        got = await model.generate(todo_request(tool))
    [exchange] = wire.exchanges
    assert validate_request(exchange.request)["tool_choice"] == {
        "type": "function", "function": {"name": tool}}
    [choice] = exchange.completion().choices
    [call] = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert got.stop_reason is StopReason.TOOL_USE
    [use] = got.message.blocks
    assert isinstance(use, ToolUse) and use.name == tool == call.function.name
    jsonschema.validate(use.input, {t.name: t for t in TOOLS}[tool].input_schema)
    assert use.input == json.loads(call.function.arguments)
    assert use.id == call.id and call.id.startswith(f"call__0_{tool}_")
    assert got.usage.input_tokens > 0 and got.usage.output_tokens > 0


async def test_a_streamed_tool_call_assembles_to_the_same_call(server: Server) -> None:
    """Every chunk of the server's streamed call repeats its id and name (beside a legacy
    ``function_call`` delta); the adapter announces the call once and joins the argument
    pieces into what ``generate`` returns."""
    request = todo_request("addItem")
    async with adapter(server) as (model, wire):
        whole = await model.generate(request)
        events, got = await streamed(model, request)
    chunks = wire.exchanges[1].chunks()
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert len(calls) >= 3 and all(c.id == calls[0].id and c.function.name == "addItem"
                                   for c in calls)
    assert all(c.choices[0].delta.function_call for c in chunks if c.choices[0].delta.tool_calls)
    [start] = [e for e in events if isinstance(e, ToolCallStart)]
    assert (start.id, start.name) == (calls[0].id, "addItem")
    assert len([e for e in events if isinstance(e, ToolCallDelta)]) >= 2
    [use] = got.message.blocks
    [expected] = whole.message.blocks
    assert isinstance(use, ToolUse) and isinstance(expected, ToolUse)
    assert (use.name, use.input) == (expected.name, expected.input)
    assert got.stop_reason is StopReason.TOOL_USE and got.usage == Usage()
