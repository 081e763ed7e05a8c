"""ScriptedModel: every step kind, recording, exhaustion, delays, concurrency, with_retry."""

from __future__ import annotations

import time

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.llm import (
    Fault,
    LLMError,
    Message,
    Model,
    OpaqueBlock,
    Request,
    Response,
    RetryPolicy,
    Role,
    Stop,
    StopReason,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolUse,
    Usage,
    UsageUpdate,
    assemble,
)
from runtime.llm.retrying_model import RetryingModel, with_retry
from runtime.llm.scripted import Pause, Reply, ScriptedModel, call, delayed

pytestmark = pytest.mark.anyio


def ask(text: str = "hi") -> Request:
    return Request(messages=(Message.text(Role.USER, text),))


async def collect(model: Model, request: Request | None = None) -> list:
    return [e async for e in model.stream(request or ask())]


async def test_a_string_is_a_text_reply() -> None:
    model = ScriptedModel(["Hello!"], name="m1")
    r = await model.generate(ask())
    assert r.message == Message.text(Role.ASSISTANT, "Hello!")
    assert (r.stop_reason, r.usage, r.model) == (StopReason.END_TURN, Usage(), "m1")
    assert isinstance(model, Model) and (model.name, model.provider) == ("m1", "scripted")


async def test_tool_call_helper_assigns_deterministic_ids() -> None:
    model = ScriptedModel([
        "first",
        ScriptedModel.tool_call("search", {"q": "cats"}),
        ScriptedModel.tool_call("search", {"q": "dogs"}, id="mine"),
    ])
    await model.generate(ask())
    second = await model.generate(ask())
    third = await model.generate(ask())
    assert second.stop_reason is StopReason.TOOL_USE
    assert second.message.blocks == (ToolUse(id="call_2_1", name="search", input={"q": "cats"}),)
    assert third.message.tool_uses()[0].id == "mine"


async def test_reply_with_text_parallel_calls_usage_and_stop_reason() -> None:
    usage = Usage(input_tokens=10, output_tokens=4, cache_read_tokens=6)
    model = ScriptedModel([
        Reply(text="Both:", tool_calls=[call("a", {"x": 1}), call("b")], usage=usage),
        Reply(text="cut", stop_reason=StopReason.MAX_TOKENS),
    ])
    r = await model.generate(ask())
    assert r.message.text_content() == "Both:"
    assert [(c.id, c.name, c.input) for c in r.message.tool_uses()] == [
        ("call_1_1", "a", {"x": 1}), ("call_1_2", "b", {})]
    assert (r.stop_reason, r.usage) == (StopReason.TOOL_USE, usage)
    assert (await model.generate(ask())).stop_reason is StopReason.MAX_TOKENS


async def test_a_response_is_returned_verbatim_and_streamed_equal() -> None:
    resp = Response(
        message=Message(role=Role.ASSISTANT, blocks=(
            OpaqueBlock(provider="anthropic", raw='{"type":"thinking"}'),
            TextBlock(text="Let me look that up for you."),
            ToolUse(id="t", name="f", input={"deep": {"list": [1, "two", None]}}),
        )),
        stop_reason=StopReason.TOOL_USE,
        usage=Usage(input_tokens=3, output_tokens=2),
        model="x",
    )
    model = ScriptedModel([resp, resp])
    assert await model.generate(ask()) is resp
    events = await collect(model)
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    args = [e.arguments for e in events if isinstance(e, ToolCallDelta)]
    assert len(texts) == 3 and "".join(texts) == "Let me look that up for you."
    assert len(args) == 2  # split, as real streams are
    assert isinstance(events[-1], Stop)

    async def replay():
        for e in events:
            yield e

    assert await assemble(replay()) == resp


async def test_an_exception_step_is_raised_by_generate_and_stream() -> None:
    boom = LLMError("overloaded", fault=Fault.TRANSIENT, provider="scripted", status=529)
    model = ScriptedModel([boom, ValueError("bad")])
    with pytest.raises(LLMError) as info:
        await model.generate(ask())
    assert info.value is boom
    with pytest.raises(ValueError, match="bad"):
        await collect(model)


async def test_an_event_sequence_is_streamed_verbatim_and_assembled_for_generate() -> None:
    events = [
        TextDelta(index=0, text="Hel"),
        TextDelta(index=0, text="lo"),
        ToolCallStart(index=1, id="c", name="f"),
        ToolCallDelta(index=1, arguments='{"a"'),
        ToolCallDelta(index=1, arguments=": 1}"),
        ToolCallEnd(index=1),
        UsageUpdate(usage=Usage(input_tokens=5, output_tokens=1)),
        Stop(stop_reason=StopReason.TOOL_USE, model="m"),
    ]
    model = ScriptedModel([events, events])
    assert await collect(model) == events
    r = await model.generate(ask())
    assert r.message.blocks == (TextBlock(text="Hello"), ToolUse(id="c", name="f", input={"a": 1}))
    assert (r.stop_reason, r.usage.input_tokens, r.model) == (StopReason.TOOL_USE, 5, "m")


async def test_a_stream_can_fail_midway() -> None:
    drop = LLMError("connection dropped", fault=Fault.TRANSIENT, provider="scripted")
    step = [TextDelta(index=0, text="par"), drop]
    model = ScriptedModel([step, step])
    seen = []
    with pytest.raises(LLMError):
        async for e in model.stream(ask()):
            seen.append(e)
    assert seen == [TextDelta(index=0, text="par")]
    with pytest.raises(LLMError):  # generate never returns a partial response
        await model.generate(ask())


async def test_a_stream_without_stop_is_incoherent_for_generate() -> None:
    model = ScriptedModel([[TextDelta(index=0, text="no stop")]])
    with pytest.raises(LLMError, match="without a stop"):
        await model.generate(ask())


async def test_every_request_is_recorded_even_past_the_end() -> None:
    model = ScriptedModel(["one"])
    await model.generate(ask("a"))
    with pytest.raises(LLMError) as info:
        await model.generate(ask("b"))
    assert info.value.fault is Fault.TERMINAL
    assert "script exhausted after 1 calls" in str(info.value)
    with pytest.raises(LLMError, match="exhausted"):
        await collect(model, ask("c"))
    assert [r.messages[0].text_content() for r in model.requests] == ["a", "b", "c"]


async def test_assert_complete_names_the_unused_steps() -> None:
    model = ScriptedModel(["a", "b", "c"])
    with pytest.raises(AssertionError, match="3 scripted steps unused"):
        model.assert_complete()
    await model.generate(ask())
    await model.generate(ask())
    with pytest.raises(AssertionError, match="1 scripted step unused"):
        model.assert_complete()
    await model.generate(ask())
    model.assert_complete()
    assert "used=3" in repr(model)


async def test_add_appends_steps() -> None:
    model = ScriptedModel()
    model.add("x", "y")
    assert model.remaining == 2
    assert (await model.generate(ask())).message.text_content() == "x"
    assert (await model.generate(ask())).message.text_content() == "y"


async def test_a_delay_is_waited_and_cancellable() -> None:
    model = ScriptedModel([delayed(0.05, "late"), delayed(3600, "never"),
                           [TextDelta(index=0, text="a"), Pause(3600), Stop(
                               stop_reason=StopReason.END_TURN)]])
    started = time.monotonic()
    assert (await model.generate(ask())).message.text_content() == "late"
    assert time.monotonic() - started >= 0.05

    started = time.monotonic()
    with anyio.move_on_after(0.05) as scope:
        await model.generate(ask())
    assert scope.cancelled_caught and time.monotonic() - started < 2

    seen = []
    with anyio.move_on_after(0.05) as scope:
        async for e in model.stream(ask()):
            seen.append(e)
    assert scope.cancelled_caught and seen == [TextDelta(index=0, text="a")]
    model.assert_complete()


async def test_concurrent_calls_take_distinct_steps() -> None:
    n = 20
    model = ScriptedModel([delayed(0.001 * (n - i), f"r{i}") for i in range(n)])
    got: list[str] = []

    async def one() -> None:
        got.append((await model.generate(ask())).message.text_content())

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    assert sorted(got) == sorted(f"r{i}" for i in range(n))
    assert len(model.requests) == n
    model.assert_complete()


# -- with_retry ------------------------------------------------------------------------


def no_wait(waits: list[float]) -> RetryPolicy:
    async def sleep(s: float) -> None:
        waits.append(s)

    return RetryPolicy(max_attempts=3, sleep=sleep, clock=lambda: 0.0)


def transient(retry_after: float | None = None) -> LLMError:
    return LLMError("busy", fault=Fault.TRANSIENT, provider="scripted", status=503,
                    retry_after=retry_after)


async def test_with_retry_retries_transient_faults() -> None:
    waits: list[float] = []
    inner = ScriptedModel([transient(1.5), "ok", transient(), "streamed"])
    model = with_retry(inner, no_wait(waits))
    assert isinstance(model, RetryingModel) and isinstance(model, Model)
    assert (model.name, model.provider) == (inner.name, inner.provider)
    assert (await model.generate(ask())).message.text_content() == "ok"
    assert (await assemble(model.stream(ask()))).message.text_content() == "streamed"
    assert waits[0] == 1.5 and len(waits) == 2 and len(inner.requests) == 4


async def test_with_retry_gives_up_on_terminal_and_after_max_attempts() -> None:
    waits: list[float] = []
    terminal = LLMError("bad", fault=Fault.TERMINAL, provider="scripted", status=400)
    inner = ScriptedModel([terminal, transient(), transient(), transient()])
    model = with_retry(inner, no_wait(waits))
    with pytest.raises(LLMError) as info:
        await model.generate(ask())
    assert info.value is terminal and len(inner.requests) == 1
    with pytest.raises(LLMError) as info:
        await model.generate(ask())
    assert info.value.status == 503 and len(inner.requests) == 4 and len(waits) == 2


async def test_with_retry_never_replays_a_stream_that_delivered_output() -> None:
    inner = ScriptedModel([[TextDelta(index=0, text="partial"), transient()], "unused"])
    model = with_retry(inner, no_wait([]))
    with pytest.raises(LLMError):
        await assemble(model.stream(ask()))
    assert len(inner.requests) == 1 and inner.remaining == 1


# -- property: stream and generate agree on any reply ----------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=8,
)
blocks = st.one_of(
    st.builds(TextBlock, text=st.text(max_size=40)),
    st.builds(ToolUse, id=st.text(min_size=1, max_size=6), name=st.text(min_size=1, max_size=8),
              input=st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
)
responses = st.builds(
    Response,
    message=st.builds(Message, role=st.just(Role.ASSISTANT),
                      blocks=st.lists(blocks, max_size=4).map(tuple)),
    stop_reason=st.sampled_from(StopReason),
    usage=st.builds(Usage, input_tokens=st.integers(0, 10**6),
                    output_tokens=st.integers(0, 10**5)),
)


@settings(deadline=None)
@given(responses)
def test_stream_assembles_to_generate_for_any_response(resp: Response) -> None:
    async def check() -> None:
        model = ScriptedModel([resp, resp])
        assert await model.generate(ask()) == resp
        assert await assemble(model.stream(ask())) == resp

    anyio.run(check)
