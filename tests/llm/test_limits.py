"""Deadlines and caps (``runtime/llm/limits.py``): how much a hostile or broken server can make
an adapter hold, and for how long. Both adapters, against real loopback servers that stream
an endless line, an endless event, a flood of valid deltas, a page of HTML; every valid
event they send is checked against the provider SDK's types first.
"""

from __future__ import annotations

import itertools
import json
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.llm import (
    Fault,
    LLMError,
    Message,
    OpaqueBlock,
    Pause,
    Request,
    Response,
    RetryPolicy,
    Role,
    ScriptedModel,
    StopReason,
    TextBlock,
    TextDelta,
    ToolUse,
    Usage,
    assemble,
    delayed,
    with_retry,
)
from runtime.llm.limits import (
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_CALL_TIMEOUT,
    MAX_SSE_LINE_BYTES,
    MAX_TOOL_NAME_CHARS,
    ReplyLimits,
)
from runtime.llm.providers._http import HTTPModel
from runtime.llm.providers._sse import SSEDecoder, SSEEvent
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.openai import OpenAIModel

from .fake_anthropic import check_event, message_body, stream_events
from .fake_openai import render_chunks, render_completion, validate_chunk, validate_completion
from .harness import Sleeps, policy
from .loopback import Exchange, LoopbackServer, Recorded

pytestmark = pytest.mark.anyio

PROVIDERS = ["anthropic", "openai"]
MODES = ["generate", "stream"]
MiB = 1024 * 1024


def adapter(provider: str, root: str, **kw: Any) -> HTTPModel:
    kw.setdefault("retry", RetryPolicy(max_attempts=1))
    if provider == "anthropic":
        return AnthropicModel("claude-sonnet-4-5", api_key="sk-test", base_url=root, **kw)
    return OpenAIModel("gpt-4.1", api_key="sk-test", base_url=f"{root}/v1", **kw)


def ask() -> Request:
    return Request(messages=(Message.text(Role.USER, "Hi"),), max_tokens=64)


async def run(model: HTTPModel, mode: str) -> Response:
    return await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))


async def failed_stream(model: HTTPModel) -> tuple[pytest.ExceptionInfo[LLMError], int]:
    """A streamed call that must fail (bounded by a deadline), and the most memory traced
    while it ran."""
    tracemalloc.start()
    try:
        with anyio.fail_after(30), pytest.raises(LLMError) as info:
            await run(model, "stream")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info, peak


def reply(*blocks: Any, stop: StopReason = StopReason.END_TURN) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(message=Message(role=Role.ASSISTANT, blocks=content), stop_reason=stop,
                    usage=Usage(input_tokens=3, output_tokens=1), model="m")


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


# -- the wire: valid events, checked against the SDKs ----------------------------------------


def sse(name: str | None, data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return ((f"event: {name}\n" if name else "") + f"data: {text}\n\n").encode()


def streamed(provider: str, response: Response) -> list[bytes]:
    """The whole SSE stream of ``response`` in ``provider``'s wire format, event by event."""
    if provider == "anthropic":
        events = stream_events(response, model="claude-sonnet-4-5")
        for name, data in events:
            check_event(name, data)
        return [sse(name, data) for name, data in events]
    chunks = render_chunks(response, include_usage=True)
    for c in chunks:
        validate_chunk(c)
    return [sse(None, c) for c in chunks] + [sse(None, "[DONE]")]


def flood(provider: str, piece: str) -> tuple[list[bytes], bytes, list[bytes]]:
    """(the events that open a text reply, one valid text delta of ``piece``, the events
    that close it): a server repeats the delta as often as it likes."""
    whole = streamed(provider, reply(piece))
    if provider == "anthropic":  # start, block start, one delta, ping, block stop, ...
        return whole[:2], whole[2], whole[3:]
    return whole[:1], whole[1], whole[2:]  # role chunk, one content chunk, finish, ...


def flooding(provider: str, piece: str = "lorem ipsum ", deltas: int = 2_000,
             ) -> Callable[[Recorded, Exchange], None]:
    """A server answering with ``deltas`` valid text deltas (a reply far longer than any
    test waits for), then a proper end; it stops at once when the client leaves."""
    head, delta, tail = flood(provider, piece)

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        out = ex.handler.wfile
        for part in itertools.chain(head, itertools.repeat(delta, deltas), tail):
            out.write(part)
        out.flush()

    return respond


async def slowly(model: HTTPModel, got: list[TextDelta]) -> None:
    """Read a stream as a consumer with work to do per event (the dialog writing its
    partial text, say), 5 ms each, keeping the text deltas it got."""
    async for event in model.stream(ask()):
        if isinstance(event, TextDelta):
            got.append(event)
        await anyio.sleep(0.005)  # the consumer's own work, not a wait for the server


# -- 1. buffers that grow with the input: lines, events, bodies ------------------------------


def endless(first: bytes, then: bytes, total: int = 64 * MiB) -> tuple[
        Callable[[Recorded, Exchange], None], threading.Event]:
    """A 200 event stream of ``first`` then ``then`` repeated, up to ``total`` bytes (then a
    close), and the event set once all of it went out: far more than any cap."""
    sent_all = threading.Event()

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        out = ex.handler.wfile
        out.write(first)
        for _ in range(total // len(then)):
            out.write(then)
        out.flush()
        sent_all.set()

    return respond, sent_all


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_line_without_end_fails_as_malformed_and_holds_one_cap_of_it(
        serve: Any, provider: str) -> None:
    respond, sent_all = endless(b"data: ", b"x" * 65536)
    srv = serve(respond)
    sleeps = Sleeps()
    info, peak = await failed_stream(adapter(provider, srv.url, retry=policy(sleeps, attempts=4)))
    err = info.value
    assert err.fault is Fault.TERMINAL and err.message.startswith("malformed response")
    assert "line cap" in err.message and f"{MAX_SSE_LINE_BYTES:,} bytes" in err.message
    assert len(srv.requests) == 1 and sleeps.waits == []  # terminal: never retried
    assert peak < 4 * MAX_SSE_LINE_BYTES, f"held {peak:,} bytes"
    assert not sent_all.is_set(), "the client read all 64 MiB of one line"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_data_lines_without_a_blank_line_fail_at_the_event_cap(
        serve: Any, provider: str) -> None:
    respond, sent_all = endless(b"", b"data: " + b"y" * 1000 + b"\n")
    srv = serve(respond)
    limits = ReplyLimits(sse_event_bytes=MiB)
    info, peak = await failed_stream(adapter(provider, srv.url, limits=limits))
    assert info.value.fault is Fault.TERMINAL
    assert "event cap" in info.value.message and "1,048,576 bytes" in info.value.message
    assert peak < 4 * MiB, f"held {peak:,} bytes"
    assert not sent_all.is_set()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_generate_body_past_the_body_cap_is_malformed_and_not_read_further(
        serve: Any, provider: str) -> None:
    total = 64 * MiB
    sent_all = threading.Event()

    def respond(rec: Recorded, ex: Exchange) -> None:
        h = ex.handler
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(total))
        h.end_headers()
        h.wfile.write(b'{"content": "')
        chunk = b"z" * 65536
        for _ in range(total // len(chunk)):
            h.wfile.write(chunk)
        h.wfile.flush()
        sent_all.set()

    srv = serve(respond)
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, srv.url, limits=ReplyLimits(body_bytes=MiB)), "generate")
    assert info.value.fault is Fault.TERMINAL and "body cap" in info.value.message
    assert not sent_all.is_set()


def long_reply(provider: str, blocks: tuple[Any, ...], mode: str) -> Callable[
        [Recorded, Exchange], None]:
    response = reply(*blocks, stop=StopReason.TOOL_USE if len(blocks) > 1 else
                     StopReason.END_TURN)
    if mode == "stream":
        events = streamed(provider, response)

        def respond(rec: Recorded, ex: Exchange) -> None:
            ex.start_stream()
            for e in events:
                ex.handler.wfile.write(e)
            ex.handler.wfile.flush()

        return respond
    if provider == "anthropic":
        body = message_body(response, model="claude-sonnet-4-5")
    else:
        body = render_completion(response)
        validate_completion(body)
    return lambda rec, ex: ex.send_json(200, body)


@pytest.mark.parametrize("what", ["text", "tool arguments"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_reply_past_the_reply_cap_fails_terminal(
        serve: Any, provider: str, mode: str, what: str) -> None:
    """10,000 characters (text, or one call's arguments) against a cap of 5,000: on a stream
    the call fails as the cap is crossed, not at the end of the reply."""
    big = "w" * 10_000
    blocks = (big,) if what == "text" else ("ok", ToolUse(id="call_a", name="save",
                                                           input={"doc": big}))
    srv = serve(long_reply(provider, blocks, mode))
    sleeps = Sleeps()
    model = adapter(provider, srv.url, limits=ReplyLimits(reply_chars=5_000),
                    retry=policy(sleeps, attempts=4))
    with pytest.raises(LLMError) as info:
        await run(model, mode)
    err = info.value
    assert err.fault is Fault.TERMINAL and "reply cap" in err.message
    assert "5,000 characters" in err.message and "ReplyLimits(reply_chars=" in err.message
    assert len(srv.requests) == 1 and sleeps.waits == []
    # the same reply under the cap is fine
    srv2 = serve(long_reply(provider, blocks, mode))
    got = await run(adapter(provider, srv2.url, limits=ReplyLimits(reply_chars=20_000)), mode)
    assert big in (got.message.text_content() + json.dumps(
        [u.input for u in got.message.tool_uses()]))


def assert_capped(info: pytest.ExceptionInfo[LLMError], srv: LoopbackServer, sleeps: Sleeps,
                  what: str = "reply cap") -> None:
    """The call failed terminal at ``what``, after one request and no retry."""
    err = info.value
    assert err.fault is Fault.TERMINAL and what in err.message, err.message
    assert len(srv.requests) == 1 and sleeps.waits == []
    assert len(err.message) < 1_000


@pytest.mark.parametrize("field", ["thinking", "signature"])
async def test_anthropic_thinking_and_signatures_count_toward_the_reply_cap_as_they_stream(
        serve: Any, field: str) -> None:
    """16 MiB of thinking (or signature) deltas against a cap of 256,000 characters: they
    were gathered uncounted, by quadratic string joining (RSS +311 MB in 2.5 s), and the
    turn went on to carry the block in every later request."""
    thought = OpaqueBlock(provider="anthropic", raw=json.dumps(
        {"type": "thinking", "thinking": "hm", "signature": "c2ln"}))
    head = streamed("anthropic", reply(thought, "ok"))[:2]  # message_start, the block's start
    delta = {"type": "content_block_delta", "index": 0,
             "delta": {"type": f"{field}_delta", field: "t" * 16384}}
    check_event("content_block_delta", delta)
    respond, sent_all = endless(b"".join(head), sse("content_block_delta", delta), 16 * MiB)
    srv = serve(respond)
    sleeps = Sleeps()
    model = adapter("anthropic", srv.url, limits=ReplyLimits(reply_chars=256_000),
                    retry=policy(sleeps, attempts=4))
    info, peak = await failed_stream(model)
    assert_capped(info, srv, sleeps)
    assert peak < 4 * MiB, f"held {peak:,} bytes"
    assert not sent_all.is_set()


async def test_anthropic_thinking_under_the_cap_is_replayed_as_it_came(serve: Any) -> None:
    """The deltas are gathered as lists now: the block still assembles to the same JSON."""
    raw = json.dumps({"type": "thinking", "thinking": "a" * 5000 + "é", "signature": "c2ln" * 9},
                     separators=(",", ":"), ensure_ascii=False)
    srv = serve(long_reply("anthropic", (OpaqueBlock(provider="anthropic", raw=raw), "ok"),
                           "stream"))
    got = await run(adapter("anthropic", srv.url), "stream")
    assert got.message.blocks[0] == OpaqueBlock(provider="anthropic", raw=raw)


@pytest.mark.parametrize("what", ["arguments", "ids"])
async def test_openai_what_comes_before_a_call_name_counts_toward_the_reply_cap(
        serve: Any, what: str) -> None:
    """Argument fragments (or the ids of ever more calls) whose name has not come yet are
    held back until it does: a server that never names the call grew the process by 555 MB
    in 3 s, uncounted."""
    chunks = render_chunks(reply("ok", ToolUse(id="call_a", name="save", input={"k": 1}),
                                 stop=StopReason.TOOL_USE), include_usage=True)
    head = [c for c in chunks if not c["choices"] or "tool_calls" not in c["choices"][0][
        "delta"]][:2]  # the role chunk, the text

    def nameless(k: int) -> bytes:
        chunk = json.loads(json.dumps(head[-1]))
        call = ({"index": 0, "function": {"arguments": "x" * 16384}} if what == "arguments"
                else {"index": k, "id": f"{k:016384d}", "type": "function"})
        chunk["choices"][0]["delta"] = {"tool_calls": [call]}
        validate_chunk(chunk)
        return sse(None, chunk)

    for c in head:
        validate_chunk(c)
    sent_all = threading.Event()

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        out = ex.handler.wfile
        out.write(b"".join(sse(None, c) for c in head))
        for k in range(16 * MiB // 16384):
            out.write(nameless(k))
        out.flush()
        sent_all.set()

    srv = serve(respond)
    sleeps = Sleeps()
    model = adapter("openai", srv.url, limits=ReplyLimits(reply_chars=256_000),
                    retry=policy(sleeps, attempts=4))
    info, peak = await failed_stream(model)
    assert_capped(info, srv, sleeps)
    assert peak < 4 * MiB, f"held {peak:,} bytes"
    assert not sent_all.is_set()


async def test_openai_arguments_before_a_call_name_are_counted_once(serve: Any) -> None:
    """What was held back and then announced counts once: a reply just under the cap whose
    arguments all came before the name passes."""
    chunks = render_chunks(reply(ToolUse(id="call_a", name="save", input={"d": "y" * 3000}),
                                 stop=StopReason.TOOL_USE), include_usage=True)
    calls = [c for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
    named, *fragments = calls  # the name first, as OpenAI sends it: move it last
    order = [c for c in chunks if c not in calls]
    for f in fragments:
        f["choices"][0]["delta"]["tool_calls"][0].update(id="call_a")
    named["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] = ""
    stream = [order[0], *fragments, named, *order[1:]]
    for c in stream:
        validate_chunk(c)
    body = b"".join(sse(None, c) for c in stream) + sse(None, "[DONE]")

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        ex.handler.wfile.write(body)

    srv = serve(respond)
    model = adapter("openai", srv.url, limits=ReplyLimits(reply_chars=3_100))
    got = await run(model, "stream")
    assert got.message.tool_uses()[0].input == {"d": "y" * 3000}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_tool_name_past_the_name_cap_fails_terminal(
        serve: Any, provider: str, mode: str) -> None:
    """Calls named by 900 KB strings were accepted, stored and replayed (40 of them made a
    144 MB next request); a tool name has at most ``MAX_TOOL_NAME_CHARS`` characters."""
    huge = "n" * 900_000
    blocks = ("ok", *(ToolUse(id=f"call_{k}", name=huge, input={}) for k in range(3)))
    srv = serve(long_reply(provider, blocks, mode))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, srv.url, retry=policy(sleeps, attempts=4)), mode)
    assert_capped(info, srv, sleeps, "tool name cap")
    assert "900,000 characters" in info.value.message
    # a name of MAX_TOOL_NAME_CHARS is a name
    longest = "n" * MAX_TOOL_NAME_CHARS
    srv = serve(long_reply(provider, ("ok", ToolUse(id="call_a", name=longest)), mode))
    got = await run(adapter(provider, srv.url), mode)
    assert got.message.tool_uses()[0].name == longest


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_tool_names_and_ids_count_toward_the_reply_cap(
        serve: Any, provider: str, mode: str) -> None:
    """40 calls with empty arguments, each with a 200-character name and a 64-character id:
    about 10,700 characters against a cap of 8,000 (only the arguments counted: 80)."""
    blocks = ("ok", *(ToolUse(id=f"{k:064d}", name=f"{k:0200d}", input={})
                      for k in range(40)))
    srv = serve(long_reply(provider, blocks, mode))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, srv.url, limits=ReplyLimits(reply_chars=8_000),
                          retry=policy(sleeps, attempts=4)), mode)
    assert_capped(info, srv, sleeps)
    srv = serve(long_reply(provider, blocks, mode))
    got = await run(adapter(provider, srv.url, limits=ReplyLimits(reply_chars=12_000)), mode)
    assert len(got.message.tool_uses()) == 40


DEEP = "[" * 200_000 + "]" * 200_000
"""200,000 levels of nesting: 400 KB, under every size cap, past any recursion limit."""


def deeply_nested(provider: str, mode: str) -> Callable[[Recorded, Exchange], None]:
    """A reply whose one tool call's arguments are ``{"q": DEEP}``, valid wire otherwise."""
    call = ToolUse(id="call_a", name="save", input={"q": "PLACEHOLDER"})
    response = reply("ok", call, stop=StopReason.TOOL_USE)
    args = '{"q": ' + DEEP + "}"
    if mode == "generate":
        if provider == "anthropic":
            text = json.dumps(message_body(response, model="claude-sonnet-4-5"))
            data = text.replace('"PLACEHOLDER"', DEEP).encode()
        else:
            body = render_completion(response)
            body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = args
            validate_completion(body)
            data = json.dumps(body).encode()
        return lambda rec, ex: ex.send_bytes(200, data)
    if provider == "anthropic":
        events = stream_events(response, model="claude-sonnet-4-5")
        parts = [d["delta"] for _, d in events
                 if d["type"] == "content_block_delta" and "partial_json" in d["delta"]]
    else:
        events = [(None, c) for c in render_chunks(response, include_usage=True)]
        parts = [t["function"] for _, c in events if c["choices"]
                 for t in c["choices"][0]["delta"].get("tool_calls") or ()]
    key = "partial_json" if provider == "anthropic" else "arguments"
    for k, part in enumerate(p for p in parts if p[key]):
        part[key] = args if k == 0 else ""
    for name, data in events:
        check_event(name, data) if provider == "anthropic" else validate_chunk(data)
    wire = b"".join(sse(name, data) for name, data in events)
    wire += sse(None, "[DONE]") if provider == "openai" else b""

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        ex.handler.wfile.write(wire)

    return respond


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_arguments_nested_too_deeply_are_a_terminal_malformed_reply(
        serve: Any, provider: str, mode: str) -> None:
    """They raised ``RecursionError`` out of the adapters and the assembler."""
    srv = serve(deeply_nested(provider, mode))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, srv.url, retry=policy(sleeps, attempts=4)), mode)
    assert_capped(info, srv, sleeps, "too deeply to parse")
    assert "malformed" in info.value.message


# -- 2. deadlines: an attempt, a call ---------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_that_keeps_delivering_ends_at_the_attempts_deadline(
        serve: Any, provider: str) -> None:
    """A flood of valid deltas read by a consumer with work to do: almost no time is spent
    waiting on the network, yet the attempt ends at its wall-clock deadline."""
    srv = serve(flooding(provider))
    model = adapter(provider, srv.url, timeout=0.5)
    got: list[TextDelta] = []
    with pytest.raises(LLMError) as info:
        await slowly(model, got)
    err = info.value
    assert "deadline of 0.5 s" in err.message and "timeout=seconds" in err.message
    assert err.fault is Fault.TRANSIENT and err.status is None
    # 0.5 s of a 5 ms consumer is at most 100 deltas: none is delivered past the deadline,
    # although one network read brings hundreds of them at once
    assert 0 < len(got) <= 120


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_that_keeps_delivering_ends_at_the_calls_deadline(
        serve: Any, provider: str) -> None:
    srv = serve(flooding(provider))
    model = adapter(provider, srv.url, retry=RetryPolicy(max_attempts=3, max_elapsed=0.5))
    got: list[TextDelta] = []
    with pytest.raises(LLMError) as info:
        await slowly(model, got)
    assert 0 < len(got) <= 120
    err = info.value
    assert "the call passed its deadline of 0.5 s" in err.message
    assert "RetryPolicy(max_elapsed=seconds)" in err.message
    assert err.fault is Fault.TRANSIENT and err.attempts == 1 and len(srv.requests) == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_calls_deadline_cuts_an_attempt_that_is_running(
        serve: Any, provider: str, mode: str) -> None:
    """``max_elapsed`` used to bound only the waits between attempts: a server that holds
    the request open kept the call for the whole attempt timeout (5 s here)."""
    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.hang_until_client_leaves()

    srv = serve(respond)
    model = adapter(provider, srv.url, timeout=5, retry=RetryPolicy(max_elapsed=0.5))
    with pytest.raises(LLMError) as info:
        await run(model, mode)
    assert "the call passed its deadline of 0.5 s" in info.value.message
    assert srv.exchanges[0].closed_by_client.wait(5), "the request was left open"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_attempt_that_hangs_ends_at_its_deadline_and_is_retried(
        serve: Any, provider: str, mode: str) -> None:
    hang_first = iter([True, False])

    def respond(rec: Recorded, ex: Exchange) -> None:
        if next(hang_first):
            ex.hang_until_client_leaves()
        elif mode == "stream":
            ex.start_stream()
            for e in streamed(provider, reply("ok")):
                ex.handler.wfile.write(e)
        else:
            body = (message_body(reply("ok"), model="claude-sonnet-4-5")
                    if provider == "anthropic" else render_completion(reply("ok")))
            ex.send_json(200, body)

    srv = serve(respond)
    sleeps = Sleeps()
    got = await run(adapter(provider, srv.url, timeout=0.5, retry=policy(sleeps)), mode)
    assert got.message.text_content() == "ok" and len(srv.requests) == 2
    assert len(sleeps.waits) == 1  # the timeout was a transient fault: retried after a wait


async def test_the_calls_deadline_holds_for_any_model_behind_with_retry() -> None:
    """``with_retry`` gives a model with no deadline of its own (a third-party backend, here
    a scripted one that never stops talking) the same call deadline."""
    endless_reply = (TextDelta(index=0, text="blah ") for _ in itertools.count())
    model = with_retry(ScriptedModel([endless_reply]), RetryPolicy(max_elapsed=0.2))
    with pytest.raises(LLMError) as info:
        await assemble(model.stream(ask()))
    assert "the call passed its deadline of 0.2 s" in info.value.message
    assert info.value.provider == "scripted"

    model = with_retry(ScriptedModel([delayed(60, "too late")]), RetryPolicy(max_elapsed=0.2))
    with pytest.raises(LLMError, match=r"deadline of 0\.2 s"):
        await model.generate(ask())

    silent = [TextDelta(index=0, text="and then"), Pause(60)]  # a wait the scope must cut
    model = with_retry(ScriptedModel([silent]), RetryPolicy(max_elapsed=0.2))
    with pytest.raises(LLMError, match=r"deadline of 0\.2 s"):
        await assemble(model.stream(ask()))


def test_the_defaults_are_what_the_docs_say() -> None:
    model = OpenAIModel("gpt-4.1", api_key="sk-test")
    assert (DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CALL_TIMEOUT) == (300.0, 600.0)
    assert model._seconds == DEFAULT_ATTEMPT_TIMEOUT
    assert RetryPolicy().max_elapsed == DEFAULT_CALL_TIMEOUT
    assert ReplyLimits() == ReplyLimits(sse_line_bytes=MiB, sse_event_bytes=4 * MiB,
                                        body_bytes=16 * MiB, reply_chars=1_000_000)
    with pytest.raises(ValueError, match="reply_chars"):
        ReplyLimits(reply_chars=0)


# -- 3. a page of HTML answering a stream ------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_html_page_answering_a_stream_is_malformed_and_not_retried(
        serve: Any, provider: str) -> None:
    page = b"<!DOCTYPE html><html><body><h1>Welcome to the captive portal</h1></body></html>"
    srv = serve(lambda rec, ex: ex.send_bytes(200, page, "text/html; charset=utf-8"))
    sleeps = Sleeps()
    with pytest.raises(LLMError) as info:
        await run(adapter(provider, srv.url, retry=policy(sleeps, attempts=4)), "stream")
    err = info.value
    assert err.fault is Fault.TERMINAL and "malformed" in err.message
    assert "text/html" in err.message
    assert len(srv.requests) == 1 and sleeps.waits == []


# -- the SSE decoder: bounded, and blind to how the bytes are cut ----------------------------

SSE_STREAM = (b": comment\r\nevent: a\r\ndata: one\r\ndata:  two\r\n\r\n"
              b"data: \xc3\xa9t\xc3\xa9\n\nevent: b\rdata: x\r\r"
              b"data: cut off at the end")


def test_the_sse_decoder_reads_every_line_ending_and_no_partial_event() -> None:
    events = SSEDecoder("p").feed(SSE_STREAM)
    assert events == [SSEEvent("a", "one\n two"), SSEEvent("message", "été"),
                      SSEEvent("b", "x")]


@given(st.lists(st.integers(0, len(SSE_STREAM)), max_size=12))
def test_the_sse_decoder_gives_the_same_events_however_the_bytes_are_cut(
        cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(SSE_STREAM)]
    decoder = SSEDecoder("p")
    got = [e for a, b in itertools.pairwise(bounds) for e in decoder.feed(SSE_STREAM[a:b])]
    assert got == SSEDecoder("p").feed(SSE_STREAM)
