"""Tool call ids: unique in every history. Adapters mint one where a server sends none or
repeats one, ``Request`` refuses a history that reuses one, and the step engine gives a
reply's call a fresh id when it collides with the history (``runtime/llm/history.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from runtime.llm import (
    Message,
    Reply,
    Request,
    Response,
    RetryPolicy,
    Role,
    ScriptedModel,
    StepsStatus,
    StopReason,
    TextBlock,
    Tool,
    ToolResult,
    ToolUse,
    Usage,
    assemble,
    run_steps,
)
from runtime.llm.history import (
    MAX_CALL_ID_CHARS,
    CallIds,
    fresh_call_id,
    repeated_call_ids,
    replayable_call_id,
    unanswered_calls,
    with_unique_call_ids,
)
from runtime.llm.providers._http import HTTPModel
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.openai import OpenAIModel
from runtime.llm.scripted import call

from .fake_anthropic import check_event, check_message, message_body, stream_events
from .fake_openai import render_chunks, render_completion, validate_chunk, validate_completion
from .loopback import Exchange, LoopbackServer, Recorded

pytestmark = pytest.mark.anyio

PROVIDERS = ["anthropic", "openai"]
MODES = ["generate", "stream"]
FRESH = re.compile(r"call_[0-9a-f]{32}")
TOOL = Tool(name="t", input_schema={"type": "object"})


def adapter(provider: str, root: str) -> HTTPModel:
    if provider == "anthropic":
        return AnthropicModel("claude-sonnet-4-5", api_key="sk-test", base_url=root,
                              retry=RetryPolicy(max_attempts=1))
    return OpenAIModel("gpt-4.1", api_key="sk-test", base_url=f"{root}/v1",
                       retry=RetryPolicy(max_attempts=1))


def calls(*ids: str) -> Response:
    return Response(
        message=Message(role=Role.ASSISTANT, blocks=tuple(
            ToolUse(id=i, name="t", input={"n": n}) for n, i in enumerate(ids))),
        stop_reason=StopReason.TOOL_USE, usage=Usage(input_tokens=1, output_tokens=1),
        model="m")


def ask(history: Sequence[Message] = ()) -> Request:
    return Request(messages=(Message.text(Role.USER, "go"), *history), tools=(TOOL,))


def wire(provider: str, response: Response, mode: str, *, drop_ids: bool = False) -> Callable[
        [Recorded, Exchange], None]:
    """A responder sending ``response`` in the provider's wire format (checked against its
    SDK), with the tool calls' ids left out of an OpenAI stream if ``drop_ids``."""
    if mode == "generate":
        if provider == "anthropic":
            body = message_body(response, model="claude-sonnet-4-5")
            check_message(body)
        else:
            body = render_completion(response)
            if drop_ids:
                for c in body["choices"][0]["message"]["tool_calls"]:
                    c["id"] = ""  # the SDK types say str: an empty one is what servers send
            validate_completion(body)
        return lambda rec, ex: ex.send_json(200, body)
    if provider == "anthropic":
        events = stream_events(response, model="claude-sonnet-4-5")
        for name, data in events:
            check_event(name, data)
        lines = [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]
    else:
        chunks = render_chunks(response, include_usage=True)
        for c in chunks:
            for d in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
                if drop_ids:
                    d.pop("id", None)
            validate_chunk(c)
        lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]

    def respond(rec: Recorded, ex: Exchange) -> None:
        ex.start_stream()
        ex.handler.wfile.write("".join(lines).encode())
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


async def reply_of(model: HTTPModel, mode: str) -> Response:
    return await (model.generate(ask()) if mode == "generate" else assemble(model.stream(ask())))


# -- the rule and its tools ----------------------------------------------------------------


def test_a_history_that_reuses_a_call_id_is_refused_with_a_clear_error() -> None:
    first = Message(role=Role.ASSISTANT, blocks=(ToolUse(id="call_0", name="t"),))
    answer = Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_0", content="a"),))
    with pytest.raises(ValidationError) as info:
        Request(messages=(Message.text(Role.USER, "go"), first, answer, first, answer))
    assert "tool call id 'call_0' is used by more than one tool call in the history" in str(
        info.value)
    twice = Message(role=Role.ASSISTANT, blocks=(ToolUse(id="x", name="t"),
                                                 ToolUse(id="x", name="t")))
    with pytest.raises(ValidationError, match="'x' is used by more than one"):
        Request(messages=(twice,))
    assert repeated_call_ids([first.model_dump(mode="json"), first]) == ["call_0"]


def test_call_ids_keep_a_new_id_and_mint_for_an_empty_or_used_one() -> None:
    ids = CallIds.of([Message(role=Role.ASSISTANT, blocks=(ToolUse(id="a", name="t"),))])
    assert ids.take("b") == "b"
    minted = [ids.take("a"), ids.take(""), ids.take(None), ids.take("b")]
    assert all(FRESH.fullmatch(m) for m in minted) and len(set(minted)) == 4
    assert FRESH.fullmatch(fresh_call_id()) and fresh_call_id() != fresh_call_id()


def test_call_ids_mint_for_an_id_no_provider_takes_back_and_keep_a_valid_one() -> None:
    ids = CallIds()
    good = ["toolu_01A-b_9", "a", "x" * MAX_CALL_ID_CHARS, "call_0"]
    assert [ids.take(g) for g in good] == good
    for bad in BAD_IDS:
        assert not replayable_call_id(bad)
        assert FRESH.fullmatch(ids.take(bad))
    assert FRESH.fullmatch(ids.take(42))  # not a string at all


BAD_IDS = ["call_\ufffd", "x" * 900_000, "x" * (MAX_CALL_ID_CHARS + 1), "call.1", "a:b",
           "id with spaces", "toolu_\n"]
"""Ids a hostile probe saw replayed as sent: U+FFFD (a surrogate once replaced), 500-900 KB,
punctuation. Anthropic takes ``^[a-zA-Z0-9_-]+$`` back; OpenAI's ids are short."""


# -- adapters: ids a server leaves out, repeats or gets wrong -------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_id_no_provider_would_take_back_is_replaced_and_a_valid_one_kept(
        serve: Any, provider: str, mode: str) -> None:
    """The ids of ``BAD_IDS`` from a server get fresh ones, so the next request carries only
    ids every provider accepts (it carried the 900 KB one, and U+FFFD to Anthropic)."""
    good = "toolu_01Ok-_9" if provider == "anthropic" else "call_Ok-_9"
    srv = serve(wire(provider, calls(good, *BAD_IDS[:4]), mode))
    model = adapter(provider, srv.url)
    got = await reply_of(model, mode)
    kept, *minted = got.message.tool_uses()
    assert kept.id == good
    assert all(FRESH.fullmatch(u.id) for u in minted) and len({u.id for u in minted}) == 4
    assert [u.input for u in got.message.tool_uses()] == [{"n": n} for n in range(5)]
    answers = Message(role=Role.USER, blocks=tuple(
        ToolResult(tool_use_id=u.id, content="ok") for u in got.message.tool_uses()))
    body = json.loads(model.encode(ask([got.message, answers]), stream=True))
    sent = re.findall(r'"(?:id|tool_use_id|tool_call_id)": "([^"]*)"', json.dumps(body))
    assert len(sent) == 10 and all(replayable_call_id(i) for i in sent), sent


@pytest.mark.parametrize("mode", MODES)
async def test_openai_mints_unique_ids_where_the_server_sends_none(serve: Any, mode: str) -> None:
    """A compatible server that sends no ids: every call of every reply gets its own (the
    adapter named them call_0, call_1... in every reply, so replies collided)."""
    srv = serve(wire("openai", calls("", ""), mode, drop_ids=True))
    model = adapter("openai", srv.url)
    first, second = await reply_of(model, mode), await reply_of(model, mode)
    ids = [u.id for r in (first, second) for u in r.message.tool_uses()]
    assert len(set(ids)) == 4 and all(FRESH.fullmatch(i) for i in ids), ids
    assert [u.input for u in first.message.tool_uses()] == [{"n": 0}, {"n": 1}]
    Request(messages=(Message.text(Role.USER, "go"), first.message, second.message))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_id_repeated_within_a_reply_is_replaced_for_the_later_call(
        serve: Any, provider: str, mode: str) -> None:
    same = "toolu_01same" if provider == "anthropic" else "call_same"
    srv = serve(wire(provider, calls(same, same, "other"), mode))
    got = await reply_of(adapter(provider, srv.url), mode)
    a, b, c = got.message.tool_uses()
    assert a.id == same and c.id == "other" and FRESH.fullmatch(b.id)
    assert [u.input for u in (a, b, c)] == [{"n": 0}, {"n": 1}, {"n": 2}]


# -- the step engine: a reply whose ids collide with the history ---------------------------


async def run(model: ScriptedModel, history: Sequence[Message]) -> list[Message]:
    seen: list[Request] = []

    def build(h: Sequence[Message], step: int) -> Request:
        request = Request(messages=tuple(h), tools=(TOOL,))  # refuses a reused id
        seen.append(request)
        return request

    async def execute(use: ToolUse) -> str:
        return f"done {use.input['n']}"

    outcome = await run_steps(model, build, execute=execute, history=history)
    assert outcome.status is StepsStatus.COMPLETED, outcome.error
    return [*history, *outcome.messages]


async def test_a_reply_reusing_an_id_of_the_history_gets_a_fresh_one(
        caplog: pytest.LogCaptureFixture) -> None:
    """A scripted model started again on an old conversation numbers its calls call_1_1...
    again; so do some servers. The reply's call gets a fresh id, its result follows it, and
    every later request is valid."""
    old = [Message.text(Role.USER, "go"),
           Message(role=Role.ASSISTANT, blocks=(ToolUse(id="call_1_1", name="t",
                                                        input={"n": 0}),)),
           Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_1_1", content="x"),))]
    model = ScriptedModel([Reply(tool_calls=[call("t", {"n": 1})]), "Done."])
    history = await run(model, old)
    new = history[3].tool_uses()[0]
    assert FRESH.fullmatch(new.id) and new.input == {"n": 1}
    (result,) = history[4].blocks
    assert isinstance(result, ToolResult) and (result.tool_use_id, result.content) == (
        new.id, "done 1")
    assert repeated_call_ids(history) == []
    assert "tool call ids already used" in caplog.text


async def test_a_reply_with_one_id_twice_gets_two_and_each_its_result() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("t", {"n": 1}, id="dup"),
                                             call("t", {"n": 2}, id="dup")]), "Done."])
    history = await run(model, [Message.text(Role.USER, "go")])
    first, second = history[1].tool_uses()
    assert first.id == "dup" and FRESH.fullmatch(second.id)
    assert [(r.tool_use_id, r.content) for r in history[2].blocks] == [
        ("dup", "done 1"), (second.id, "done 2")]


async def test_an_id_less_server_across_steps_gives_a_valid_history(serve: Any) -> None:
    """End to end: two tool rounds against a server that sends no ids, then an answer; the
    second request carries both rounds and must be valid (it was refused for call_0
    twice)."""
    replies = iter([wire("openai", calls(""), "stream", drop_ids=True)] * 2 + [
        wire("openai", Response(message=Message(role=Role.ASSISTANT,
                                                blocks=(TextBlock(text="ok"),)),
                                stop_reason=StopReason.END_TURN), "stream")])
    srv = serve(lambda rec, ex: next(replies)(rec, ex))

    def build(h: Sequence[Message], step: int) -> Request:
        return Request(messages=tuple(h), tools=(TOOL,))

    async def execute(use: ToolUse) -> str:
        return "done"

    outcome = await run_steps(adapter("openai", srv.url), build, execute=execute,
                              history=[Message.text(Role.USER, "go")])
    assert outcome.status is StepsStatus.COMPLETED, outcome.error
    sent = [[c["id"] for m in r.body["messages"] for c in m.get("tool_calls") or ()]
            for r in srv.requests]
    assert len(sent[2]) == 2 and len(set(sent[2])) == 2


async def test_the_step_engine_replaces_an_id_no_provider_takes_back_for_any_model(
        caplog: pytest.LogCaptureFixture) -> None:
    """A scripted model (any model) replying with ``BAD_IDS``: each call gets a fresh id
    before the reply is appended, its result follows it, a valid id is kept."""
    model = ScriptedModel([Reply(tool_calls=[call("t", {"n": n}, id=i) for n, i in
                                             enumerate(["keep_me", *BAD_IDS])]), "Done."])
    history = await run(model, [Message.text(Role.USER, "go")])
    kept, *minted = history[1].tool_uses()
    assert kept.id == "keep_me" and all(FRESH.fullmatch(u.id) for u in minted)
    assert [(r.tool_use_id, r.content) for r in history[2].blocks] == [
        (u.id, f"done {n}") for n, u in enumerate(history[1].tool_uses())]
    assert "no provider would take back" in caplog.text
    assert len(caplog.text) < 5_000  # the 900 KB id is quoted in part


def test_a_stored_history_with_ids_no_provider_takes_back_is_mended() -> None:
    """A history stored before the rule (a server's 900 KB id, U+FFFD): each such call gets
    a fresh id and its result follows it, so the dialog's next request replays."""
    old = [Message.text(Role.USER, "go"),
           Message(role=Role.ASSISTANT, blocks=tuple(ToolUse(id=i, name="t")
                                                     for i in ["fine", *BAD_IDS[:3]])),
           Message(role=Role.USER, blocks=tuple(
               ToolResult(tool_use_id=i, content=f"r{n}")
               for n, i in enumerate(["fine", *BAD_IDS[:3]])))]
    fixed = with_unique_call_ids(old)
    ids = [u.id for u in fixed[1].tool_uses()]
    assert ids[0] == "fine" and all(FRESH.fullmatch(i) for i in ids[1:])
    assert [(r.tool_use_id, r.content) for r in fixed[2].blocks] == [
        (i, f"r{n}") for n, i in enumerate(ids)]
    assert with_unique_call_ids(fixed) == fixed and fixed[0] is old[0]


def test_a_stored_history_that_reused_ids_is_made_valid_with_each_result_following_its_call(
        ) -> None:
    """What the OpenAI adapter stored before: call_0 in every reply. Each call gets an id of
    its own and the results that answered it follow it; then Request takes the history."""
    def asked(*names: str) -> Message:
        return Message(role=Role.ASSISTANT, blocks=tuple(
            ToolUse(id=f"call_{i}", name=n) for i, n in enumerate(names)))

    def answered(*contents: str) -> Message:
        return Message(role=Role.USER, blocks=tuple(
            ToolResult(tool_use_id=f"call_{i}", content=c) for i, c in enumerate(contents)))

    old = [Message.text(Role.USER, "go"), asked("a", "b"), answered("A", "B"),
           asked("c"), answered("C"), Message.text(Role.USER, "and?"), asked("d")]
    with pytest.raises(ValidationError):
        Request(messages=tuple(old))
    fixed = with_unique_call_ids(old)
    Request(messages=fixed)
    pairs = {b.tool_use_id: b.content for m in fixed for b in m.blocks
             if isinstance(b, ToolResult)}
    calls = {b.name: b.id for m in fixed for b in m.blocks if isinstance(b, ToolUse)}
    assert {n: pairs.get(i) for n, i in calls.items()} == {"a": "A", "b": "B", "c": "C",
                                                             "d": None}
    assert fixed[:3] == tuple(old[:3])  # the first use of an id keeps it
    assert unanswered_calls(fixed) == [calls["d"]]
    assert with_unique_call_ids(fixed) == fixed
