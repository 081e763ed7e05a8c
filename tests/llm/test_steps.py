"""The step engine (``runtime.llm.steps``): tool rounds, checked arguments, error results, the
step bound, model faults, what the sink hears, and cancellation that leaves a valid history."""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime.llm import (
    TOOL_CANCELLED,
    Fault,
    LLMError,
    Message,
    Model,
    OpaqueBlock,
    OpaqueDone,
    Pause,
    Reply,
    Request,
    Response,
    Role,
    ScriptedModel,
    StepSink,
    StepsOutcome,
    StepsStatus,
    Stop,
    StopReason,
    StreamEvent,
    TextBlock,
    TextDelta,
    Tool,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolError,
    ToolResult,
    ToolUse,
    Usage,
    run_steps,
    with_retry,
)
from runtime.llm.limits import MAX_TOOL_NAME_CHARS
from runtime.llm.providers import anthropic as anthropic_wire
from runtime.llm.providers import openai as openai_wire
from runtime.llm.scripted import call

from . import fake_anthropic, fake_openai
from .harness import Backend, Sleeps, policy

pytestmark = pytest.mark.anyio

WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
CLOCK = Tool(name="get_time", input_schema={"type": "object",
                                             "properties": {"city": {"type": "string"}}})
QUESTION = Message.text(Role.USER, "Weather in Paris?")


# -- helpers --------------------------------------------------------------------------------


@dataclass
class Builder:
    """A ``build_request`` that records what it was given and what it returned."""

    tools: Sequence[Tool] = (WEATHER, CLOCK)
    seen: list[tuple[tuple[Message, ...], int]] = field(default_factory=list)
    built: list[Request] = field(default_factory=list)

    def __call__(self, history: Sequence[Message], step: int) -> Request:
        self.seen.append((tuple(history), step))
        request = Request(system="Be brief.", messages=tuple(history), tools=tuple(self.tools))
        self.built.append(request)
        return request


@dataclass
class Recorder:
    """Every sink event in order; sync and async callbacks mixed on purpose."""

    events: list[tuple[str, Any]] = field(default_factory=list)

    def sink(self) -> StepSink:
        return StepSink(on_step=self.step, on_text=self.text, on_usage=self.usage,
                        on_message=self.message, on_end=self.end)

    async def step(self, n: int) -> None:
        self.events.append(("step", n))

    def text(self, delta: str) -> None:
        self.events.append(("text", delta))

    def usage(self, usage: Usage) -> None:
        self.events.append(("usage", usage))

    async def message(self, message: Message) -> None:
        await anyio.lowlevel.checkpoint()  # a real commit awaits: must work under cancellation
        self.events.append(("message", message))

    def end(self, outcome: StepsOutcome) -> None:
        self.events.append(("end", outcome))

    def of(self, kind: str) -> list[Any]:
        return [v for k, v in self.events if k == kind]

    @property
    def messages(self) -> list[Message]:
        return self.of("message")


@dataclass
class Tools:
    """An executor: canned outputs by tool name, recording each call it starts."""

    outputs: dict[str, Any] = field(default_factory=lambda: {"get_weather": "sunny, 21C"})
    started: list[ToolUse] = field(default_factory=list)

    async def __call__(self, use: ToolUse) -> Any:
        self.started.append(use)
        output = self.outputs[use.name]
        if isinstance(output, BaseException):
            raise output
        return output


def results_of(message: Message) -> list[ToolResult]:
    assert message.role is Role.USER
    assert all(isinstance(b, ToolResult) for b in message.blocks)
    return list(message.blocks)  # type: ignore[arg-type]


async def steps(model: Model, *, tools: Any = None, builder: Builder | None = None,
                recorder: Recorder | None = None, history: Sequence[Message] = (QUESTION,),
                **kw: Any) -> StepsOutcome:
    return await run_steps(model, builder or Builder(), execute=tools or Tools(),
                           history=history, sink=(recorder or Recorder()).sink(), **kw)


def assistant(*blocks: Any) -> Message:
    return Message(role=Role.ASSISTANT, blocks=blocks)


# -- tool rounds ----------------------------------------------------------------------------


async def test_one_tool_round_is_call_result_then_answer() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Paris"}),
                           "Sunny in Paris."])
    rec = Recorder()
    outcome = await steps(model, recorder=rec)

    use = ToolUse(id="call_1_1", name="get_weather", input={"city": "Paris"})
    want = (
        assistant(use),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_1_1",
                                                   content="sunny, 21C"),)),
        Message.text(Role.ASSISTANT, "Sunny in Paris."),
    )
    assert outcome.status is StepsStatus.COMPLETED
    assert outcome.messages == want and outcome.final == want[-1]
    assert outcome.steps == 2 and outcome.error is None
    assert outcome.response is not None and outcome.response.stop_reason is StopReason.END_TURN
    assert tuple(rec.messages) == want
    assert model.requests[1].messages == (QUESTION, *want[:2])
    assert rec.of("end") == [outcome]
    model.assert_complete()


async def test_two_calls_run_in_order_one_at_a_time_into_one_results_message() -> None:
    order: list[str] = []

    async def execute(use: ToolUse) -> str:
        order.append(f"start {use.input['city']}")
        await anyio.lowlevel.checkpoint()
        order.append(f"end {use.input['city']}")
        return f"{use.name} {use.input['city']}"

    model = ScriptedModel([
        Reply(text="Checking both.", tool_calls=[call("get_weather", {"city": "Oslo"}),
                                                 call("get_time", {"city": "Rome"})]),
        "Cold in Oslo, noon in Rome.",
    ])
    rec = Recorder()
    outcome = await steps(model, tools=execute, recorder=rec)

    assert order == ["start Oslo", "end Oslo", "start Rome", "end Rome"]
    reply, results, final = outcome.messages
    assert [type(b) for b in reply.blocks] == [TextBlock, ToolUse, ToolUse]
    assert [(r.tool_use_id, r.content, r.is_error) for r in results_of(results)] == [
        ("call_1_1", "get_weather Oslo", False),
        ("call_1_2", "get_time Rome", False),
    ]
    assert final.text_content() == "Cold in Oslo, noon in Rome."
    assert len(rec.messages) == 3


async def test_calls_are_checked_against_the_tools_of_the_request_that_produced_them() -> None:
    class Shrinking(Builder):
        def __call__(self, history: Sequence[Message], step: int) -> Request:
            self.tools = (WEATHER, CLOCK) if step == 1 else (CLOCK,)
            return super().__call__(history, step)

    model = ScriptedModel([
        ScriptedModel.tool_call("get_weather", {"city": "Oslo"}),
        ScriptedModel.tool_call("get_weather", {"city": "Rome"}),  # no longer advertised
        "done",
    ])
    tools = Tools()
    outcome = await steps(model, tools=tools, builder=Shrinking())
    first, second = results_of(outcome.messages[1])[0], results_of(outcome.messages[3])[0]
    assert not first.is_error
    assert second.is_error and "There is no tool 'get_weather'" in second.content
    assert [u.input["city"] for u in tools.started] == ["Oslo"]


async def test_a_schema_changed_between_steps_is_the_one_checked() -> None:
    town = Tool(name="get_weather", input_schema={"type": "object", "required": ["town"]})

    class Renaming(Builder):
        def __call__(self, history: Sequence[Message], step: int) -> Request:
            self.tools = (WEATHER,) if step == 1 else (town,)
            return super().__call__(history, step)

    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"})] * 2
                          + ["done"])
    outcome = await steps(model, builder=Renaming())
    first, second = results_of(outcome.messages[1])[0], results_of(outcome.messages[3])[0]
    assert not first.is_error
    assert second.is_error and "'town' is a required property" in second.content


# -- error results: the loop goes on --------------------------------------------------------


async def test_an_unknown_tool_is_an_error_result_naming_the_tools() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_wether", {"city": "Paris"}), "Sorry."])
    tools = Tools()
    outcome = await steps(model, tools=tools)
    (result,) = results_of(outcome.messages[1])
    assert result.is_error and result.tool_use_id == "call_1_1"
    assert "There is no tool 'get_wether'" in result.content
    assert "'get_weather', 'get_time'" in result.content
    assert tools.started == [] and outcome.status is StepsStatus.COMPLETED


async def test_without_tools_a_call_is_told_there_are_none() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("anything"), "OK."])
    outcome = await steps(model, builder=Builder(tools=()))
    (result,) = results_of(outcome.messages[1])
    assert result.is_error and "no tools are available" in result.content


@pytest.mark.parametrize(("arguments", "where"), [
    ({}, "'city' is a required property"),
    ({"city": 75001}, "at /city, 75001 is not of type 'string'"),
    ({"city": "Paris", "units": "C"}, "Additional properties are not allowed"),
])
async def test_invalid_arguments_are_an_error_result_quoting_the_schema(
    arguments: dict[str, Any], where: str
) -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", arguments), "Sorry."])
    tools = Tools()
    outcome = await steps(model, tools=tools)
    (result,) = results_of(outcome.messages[1])
    assert result.is_error and result.content.startswith("Invalid arguments for tool")
    assert where in result.content
    assert json.dumps(WEATHER.input_schema, separators=(",", ":")) in result.content
    assert tools.started == []
    assert outcome.status is StepsStatus.COMPLETED and len(outcome.messages) == 3


async def test_model_input_in_an_error_result_is_quoted_in_part() -> None:
    """The longest tool name a reply may hold, a 1 MB argument key: the error results that
    quote them cost the next request a few hundred characters of each, not a megabyte (a
    longer name fails the reply: the next test)."""
    huge = "n" * MAX_TOOL_NAME_CHARS
    tally = Tool(name="tally", input_schema={"type": "object",
                                             "additionalProperties": {"type": "integer"}})
    model = ScriptedModel([
        Reply(tool_calls=[call(huge, {"city": "Paris"}), call("tally", {"k" * 10**6: "x"}),
                          call("get_weather", {"city": "Paris", "u" * 10**6: 1})]),
        "Sorry."])
    tools = Tools()
    outcome = await steps(model, tools=tools, builder=Builder(tools=(WEATHER, tally)))
    unknown, bad_key, extra = results_of(outcome.messages[1])
    assert unknown.is_error and unknown.content.startswith("There is no tool 'nnnn")
    assert f"{MAX_TOOL_NAME_CHARS} characters in all" in unknown.content
    assert "'tally'" in unknown.content
    assert len(unknown.content) < 500
    assert bad_key.is_error and "Invalid arguments for tool 'tally': at /kkkk" in bad_key.content
    assert extra.is_error and "Additional properties are not allowed" in extra.content
    for result in (bad_key, extra):  # the schema hint is capped as before, the rest is small
        assert len(result.content) < 5_000, len(result.content)
    assert tools.started == []


async def test_a_tool_name_past_the_cap_fails_the_reply_terminal_for_any_model() -> None:
    """A scripted model calling tools by 900 KB names (a hostile provider's probe stored 40
    of them and replayed them in a 144 MB request): the assembler every model's reply passes
    fails the reply as the first such call starts; nothing is appended, no tool runs."""
    model = ScriptedModel([Reply(tool_calls=[call("n" * 900_000, {"city": "Paris"})
                                             for _ in range(40)])])
    tools = Tools()
    outcome = await steps(model, tools=tools)
    assert outcome.status is StepsStatus.ERROR and outcome.messages == ()
    error = outcome.error
    assert error is not None and error.fault is Fault.TERMINAL
    assert "tool name cap" in error.message and "900,000 characters" in error.message
    assert len(error.message) < 500 and tools.started == []
    # one character under the cap is an ordinary (unknown) call
    model = ScriptedModel([Reply(tool_calls=[call("n" * MAX_TOOL_NAME_CHARS)]), "Sorry."])
    assert (await steps(model, tools=tools)).status is StepsStatus.COMPLETED


async def test_arguments_nested_too_deeply_are_a_terminal_malformed_reply() -> None:
    """200,000 levels of ``[`` in a call's arguments: ``json.loads`` raises
    ``RecursionError``, which used to leave the assembler (and so the step engine) raw."""
    deep = "[" * 200_000 + "]" * 200_000
    events = [ToolCallStart(index=0, id="call_a", name="get_weather"),
              ToolCallDelta(index=0, arguments='{"city": ' + deep + "}"),
              ToolCallEnd(index=0), Stop(stop_reason=StopReason.TOOL_USE)]
    outcome = await steps(ScriptedModel([events]), tools=Tools())
    assert outcome.status is StepsStatus.ERROR and outcome.messages == ()
    error = outcome.error
    assert error is not None and error.fault is Fault.TERMINAL
    assert "nest too deeply" in error.message and "tool call 1" in error.message
    with pytest.raises(LLMError, match="nest too deeply"):  # and for any model's generate
        await ScriptedModel([events]).generate(Request())


async def test_an_executor_that_raises_is_an_error_result_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ScriptedModel([
        Reply(tool_calls=[call("get_weather", {"city": "Atlantis"}),
                          call("get_time", {"city": "Rome"})]),
        "Only Rome.",
    ])
    tools = Tools({"get_weather": KeyError("Atlantis"), "get_time": "noon"})
    with caplog.at_level(logging.WARNING, logger="celldialog.llm.steps"):
        outcome = await steps(model, tools=tools)
    failed, fine = results_of(outcome.messages[1])
    assert failed.is_error
    assert failed.content.startswith("Tool 'get_weather' failed: KeyError: 'Atlantis'.")
    assert "matching this JSON Schema" in failed.content
    assert (fine.content, fine.is_error) == ("noon", False)  # the next call still ran
    assert outcome.status is StepsStatus.COMPLETED
    (record,) = caplog.records
    assert "get_weather" in record.getMessage() and record.exc_info is not None


async def test_a_tool_error_is_quoted_verbatim() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "x"}), "Hm."])
    outcome = await steps(model, tools=Tools({"get_weather": ToolError("Already pinned")}))
    (result,) = results_of(outcome.messages[1])
    assert (result.content, result.is_error) == ("Already pinned", True)


async def test_an_unusable_schema_is_an_error_result_and_the_tool_never_runs() -> None:
    broken = Tool(name="broken", input_schema={"type": "object", "properties": "nope"})
    model = ScriptedModel([ScriptedModel.tool_call("broken"), "Hm."])
    tools = Tools({"broken": "ran"})
    outcome = await steps(model, tools=tools, builder=Builder(tools=(broken,)))
    (result,) = results_of(outcome.messages[1])
    assert result.is_error and "input schema is unusable" in result.content
    assert tools.started == []


@pytest.mark.parametrize(("output", "content", "is_error"), [
    ({"temp": 21, "sky": "clear"}, '{"temp":21,"sky":"clear"}', False),
    (None, "null", False),
    ([1.5, "é"], '[1.5,"é"]', False),
    (ToolResult(tool_use_id="whatever", content="partly", is_error=True), "partly", True),
])
async def test_tool_outputs_become_result_text(output: Any, content: str, is_error: bool) -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"}), "ok"])
    outcome = await steps(model, tools=Tools({"get_weather": output}))
    (result,) = results_of(outcome.messages[1])
    assert (result.tool_use_id, result.content, result.is_error) == ("call_1_1", content, is_error)


async def test_an_output_that_is_not_json_is_an_error_result() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"}), "ok"])
    outcome = await steps(model, tools=Tools({"get_weather": object()}))
    (result,) = results_of(outcome.messages[1])
    assert result.is_error and "cannot be sent to the model (object)" in result.content


# -- how a run ends -------------------------------------------------------------------------


async def test_max_steps_ends_after_that_many_calls_with_their_results_appended() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": c})
                           for c in ("Oslo", "Rome", "Lima")])
    rec = Recorder()
    outcome = await steps(model, recorder=rec, max_steps=2)
    assert outcome.status is StepsStatus.MAX_STEPS and outcome.steps == 2
    assert outcome.error is None and outcome.final is None
    assert [m.role for m in outcome.messages] == [Role.ASSISTANT, Role.USER] * 2
    assert results_of(outcome.messages[-1])[0].tool_use_id == "call_2_1"
    assert model.remaining == 1 and rec.of("end") == [outcome]


async def test_max_steps_below_one_is_refused() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_steps must be a positive integer"):
            await steps(ScriptedModel(["never"]), max_steps=bad)


@pytest.mark.parametrize("empty", [
    Reply(text=""),
    Reply(text="  \n"),
    Reply(text="", stop_reason=StopReason.REFUSAL),
    [OpaqueDone(index=0, block=OpaqueBlock(provider="anthropic",  # reasoning, nothing said
                                           raw='{"type":"redacted_thinking","data":"x"}')),
     Stop(stop_reason=StopReason.END_TURN)],
])
async def test_an_empty_reply_is_an_error_and_is_not_appended(empty: Any) -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"}), empty])
    rec = Recorder()
    outcome = await steps(model, recorder=rec)
    assert outcome.status is StepsStatus.ERROR and outcome.steps == 2
    assert outcome.error is not None and outcome.error.fault is Fault.TERMINAL
    assert "empty reply" in outcome.error.message
    assert len(outcome.messages) == 2 and rec.messages == list(outcome.messages)
    assert outcome.response is not None and outcome.response.message.tool_uses() == []


async def test_a_terminal_model_fault_is_returned_not_raised() -> None:
    fault = LLMError("invalid x-api-key", fault=Fault.TERMINAL, provider="scripted", status=401)
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"}), fault])
    rec = Recorder()
    outcome = await steps(model, recorder=rec)
    assert outcome.status is StepsStatus.ERROR and outcome.error is fault
    assert outcome.steps == 2 and len(outcome.messages) == 2  # the first round stays
    assert rec.of("end") == [outcome]


async def test_transient_faults_are_retried_by_the_port_first() -> None:
    busy = LLMError("overloaded", fault=Fault.TRANSIENT, provider="scripted", status=529)
    sleeps = Sleeps()
    healed = await steps(with_retry(ScriptedModel([busy, "Hello."]), policy(sleeps)))
    assert healed.status is StepsStatus.COMPLETED and len(sleeps.waits) == 1

    down = await steps(with_retry(ScriptedModel([busy] * 3), policy(sleeps)))
    assert down.status is StepsStatus.ERROR and down.error is busy
    assert busy.attempts == 3 and down.messages == ()


async def test_a_malformed_stream_is_a_model_error() -> None:
    broken = [ToolCallStart(index=0, id="c1", name="get_weather"),
              ToolCallDelta(index=0, arguments='{"city": "Os'),
              Stop(stop_reason=StopReason.TOOL_USE)]
    tools = Tools()
    outcome = await steps(ScriptedModel([broken]), tools=tools)
    assert outcome.status is StepsStatus.ERROR and outcome.messages == ()
    assert outcome.error is not None and "not JSON" in outcome.error.message
    assert tools.started == []


async def test_bugs_propagate_with_the_history_still_valid() -> None:
    class Failing(Builder):
        def __call__(self, history: Sequence[Message], step: int) -> Request:
            if step == 2:
                raise RuntimeError("prompt template broke")
            return super().__call__(history, step)

    rec = Recorder()
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"})])
    with pytest.raises(RuntimeError, match="prompt template broke"):
        await steps(model, builder=Failing(), recorder=rec)
    assert [m.role for m in rec.messages] == [Role.ASSISTANT, Role.USER]
    assert rec.of("end") == []

    with pytest.raises(TypeError, match=r"build_request must return a runtime\.llm Request"):
        await run_steps(ScriptedModel(["x"]), lambda h, s: {"messages": h},  # type: ignore
                        execute=Tools())


# -- what the sink and build_request see ----------------------------------------------------


async def test_build_request_is_called_before_every_call_with_the_grown_history() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"}),
                           ScriptedModel.tool_call("get_time", {"city": "Rome"}),
                           "Done."])
    builder = Builder()
    outcome = await steps(model, builder=builder, tools=Tools({"get_weather": "cold",
                                                               "get_time": "noon"}))
    assert [(len(h), s) for h, s in builder.seen] == [(1, 1), (3, 2), (5, 3)]
    for history, _ in builder.seen:
        assert history == (QUESTION, *outcome.messages)[: len(history)]
    # the engine sends exactly what build_request returned: the prefix stays byte-identical
    assert all(sent is built for sent, built in zip(model.requests, builder.built, strict=True))


async def test_usage_is_reported_per_call_and_summed() -> None:
    u1 = Usage(input_tokens=100, output_tokens=10, cache_write_tokens=90)
    u2 = Usage(input_tokens=130, output_tokens=5, cache_read_tokens=90)
    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {"city": "Oslo"})], usage=u1),
                           Reply(text="Cold.", usage=u2)])
    rec = Recorder()
    outcome = await steps(model, recorder=rec)
    assert rec.of("usage") == [u1, u2]
    assert outcome.usage == u1 + u2 == Usage(input_tokens=230, output_tokens=15,
                                             cache_read_tokens=90, cache_write_tokens=90)


async def test_the_sink_hears_everything_in_order() -> None:
    model = ScriptedModel([Reply(text="Let me check.", tool_calls=[call("get_weather",
                                                                       {"city": "Oslo"})]),
                           "It is cold in Oslo."])
    rec = Recorder()
    outcome = await steps(model, recorder=rec)
    kinds = [k for k, _ in rec.events]
    compact = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert compact == ["step", "text", "usage", "message", "step", "text", "usage",
                       "message", "end"]
    assert kinds.count("message") == 3  # reply, results, final answer
    texts = rec.of("text")
    assert len(texts) > 2  # forwarded delta by delta, not once assembled
    assert "".join(texts) == "Let me check.It is cold in Oslo."
    assert rec.of("step") == [1, 2] and rec.of("end") == [outcome]


async def test_a_run_needs_no_sink() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"}), "Cold."])
    outcome = await run_steps(model, Builder(), execute=Tools(), history=[QUESTION])
    assert outcome.final == Message.text(Role.ASSISTANT, "Cold.")


# -- cancellation ---------------------------------------------------------------------------


class Watched:
    """A model whose streams record when they are closed."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.closed = 0
        self.name, self.provider = inner.name, inner.provider

    async def generate(self, request: Request) -> Response:
        raise AssertionError("the step engine streams")

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        try:
            async for event in self.inner.stream(request):
                yield event
        finally:
            self.closed += 1


async def test_cancelling_a_call_held_open_stops_it_and_appends_nothing() -> None:
    held = [TextDelta(index=0, text="Let me"), Pause(3600), TextDelta(index=0, text=" think."),
            Stop(stop_reason=StopReason.END_TURN)]
    model = Watched(ScriptedModel([held]))
    rec = Recorder()
    streaming = anyio.Event()

    def on_text(delta: str) -> None:
        rec.text(delta)
        streaming.set()

    async with anyio.create_task_group() as tg:
        async def run() -> None:
            await run_steps(model, Builder(), execute=Tools(), history=[QUESTION],
                            sink=StepSink(on_text=on_text, on_message=rec.message,
                                          on_end=rec.end))
            raise AssertionError("run_steps returned after its scope was cancelled")

        tg.start_soon(run)
        await streaming.wait()  # the first delta arrived while the call is still open
        tg.cancel_scope.cancel()
    assert rec.of("text") == ["Let me"]
    assert rec.messages == [] and rec.of("end") == []
    assert model.closed == 1  # the stream was closed, not left to the garbage collector


async def run_cancelled_in_first_tool(execute_first: Any) -> tuple[Recorder, ScriptedModel,
                                                                    list[str]]:
    """Two calls in one reply; the scope is cancelled while the first runs."""
    model = ScriptedModel([
        Reply(text="Both.", tool_calls=[call("get_weather", {"city": "Oslo"}),
                                        call("get_time", {"city": "Rome"})]),
        "never asked for",
    ])
    rec = Recorder()
    running = anyio.Event()
    ran: list[str] = []

    async def execute(use: ToolUse) -> Any:
        ran.append(use.name)
        if use.name == "get_weather":
            running.set()
            return await execute_first()
        return "noon"

    async with anyio.create_task_group() as tg:
        async def run() -> None:
            await run_steps(model, Builder(), execute=execute, history=[QUESTION],
                            sink=rec.sink())

        tg.start_soon(run)
        await running.wait()
        tg.cancel_scope.cancel()
    return rec, model, ran


async def test_cancelling_during_the_first_of_two_tools_answers_both() -> None:
    saw_cancel: list[bool] = []

    async def hold() -> str:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            saw_cancel.append(True)
            raise
        return "unreachable"

    rec, model, ran = await run_cancelled_in_first_tool(hold)
    assert saw_cancel == [True]  # the tool in flight was cancelled
    assert ran == ["get_weather"]  # the second never started
    reply, results = rec.messages  # delivered through an awaiting sink, under cancellation
    assert [u.id for u in reply.tool_uses()] == ["call_1_1", "call_1_2"]
    assert [(r.tool_use_id, r.content, r.is_error) for r in results_of(results)] == [
        ("call_1_1", TOOL_CANCELLED, True),
        ("call_1_2", TOOL_CANCELLED, True),
    ]
    assert len(model.requests) == 1 and rec.of("end") == []
    assert_valid_for_both_providers([QUESTION, *rec.messages])


async def test_a_tool_that_swallows_cancellation_keeps_its_result_but_nothing_follows() -> None:
    async def stubborn() -> str:
        with anyio.CancelScope(shield=True):
            await anyio.lowlevel.checkpoint()
        return "finished anyway"

    rec, model, ran = await run_cancelled_in_first_tool(stubborn)
    assert ran == ["get_weather"]
    _, results = rec.messages
    assert [(r.content, r.is_error) for r in results_of(results)] == [
        ("finished anyway", False), (TOOL_CANCELLED, True)]
    assert len(model.requests) == 1  # no further model call once cancelled


async def test_cancelled_while_the_results_are_reported_no_further_call_starts() -> None:
    model = ScriptedModel([ScriptedModel.tool_call("get_weather", {"city": "Oslo"}),
                           "never asked for"])
    rec = Recorder()
    reporting, resume = anyio.Event(), anyio.Event()

    async def on_message(message: Message) -> None:
        if message.role is Role.USER:  # the results: cancelled while this commit runs
            reporting.set()
            await resume.wait()
        await rec.message(message)

    sink = StepSink(on_step=rec.step, on_message=on_message, on_end=rec.end)
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            await run_steps(model, Builder(), execute=Tools(), history=[QUESTION], sink=sink)

        tg.start_soon(run)
        await reporting.wait()
        tg.cancel_scope.cancel()
        resume.set()
    assert [m.role for m in rec.messages] == [Role.ASSISTANT, Role.USER]  # delivered whole
    assert rec.of("step") == [1] and len(model.requests) == 1 and rec.of("end") == []


async def test_a_cancelled_history_is_accepted_by_every_backend(backend: Backend) -> None:
    """The history left by a cancelled run goes on, over each adapter and its fake server,
    which validates every request against the provider SDK's types."""
    rec, _, _ = await run_cancelled_in_first_tool(anyio.sleep_forever)
    history = [QUESTION, *rec.messages, Message.text(Role.USER, "Try Oslo again.")]
    use = ToolUse(id="toolu_2", name="get_weather", input={"city": "Oslo"})
    backend.script(
        Response(message=assistant(TextBlock(text="Retrying."), use),
                 stop_reason=StopReason.TOOL_USE),
        Response(message=Message.text(Role.ASSISTANT, "Cold in Oslo."),
                 stop_reason=StopReason.END_TURN),
    )
    rec2 = Recorder()
    outcome = await run_steps(backend.model(retry=policy(Sleeps())), Builder(),
                              execute=Tools({"get_weather": "cold"}), history=history,
                              sink=rec2.sink())
    assert outcome.status is StepsStatus.COMPLETED, outcome.error
    assert outcome.messages[0].tool_uses() == [use]
    assert results_of(outcome.messages[1]) == [ToolResult(tool_use_id="toolu_2", content="cold")]
    assert outcome.final == Message.text(Role.ASSISTANT, "Cold in Oslo.")
    assert "".join(rec2.of("text")) == "Retrying.Cold in Oslo."
    assert len(backend.sent()) == 2
    assert_valid_for_both_providers([*history, *outcome.messages])


# -- the history on the wire ----------------------------------------------------------------


def assert_valid_for_both_providers(history: Sequence[Message]) -> None:
    """Encode ``history`` with each adapter's request builder, validate the body against the
    provider SDK's request types (as the fake servers do), and check what those types cannot:
    every tool call is answered, at once, by its id."""
    request = Request(system="Be brief.", messages=tuple(history), tools=(WEATHER, CLOCK))

    body = json.loads(anthropic_wire.encode_request(request, model="claude-sonnet-4-5",
                                                    max_tokens=1024, stream=True))
    fake_anthropic.check_request(body)
    wire = body["messages"]
    for i, message in enumerate(wire):
        calls = [b["id"] for b in message["content"] if b["type"] == "tool_use"]
        answered = [b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result"]
        if message["role"] == "user" and answered:
            before = [b["id"] for b in wire[i - 1]["content"] if b["type"] == "tool_use"]
            assert sorted(answered) == sorted(before), (i, answered, before)
            assert all(b["type"] == "tool_result" for b in message["content"][: len(answered)])
        if calls:
            assert i + 1 < len(wire) and wire[i + 1]["role"] == "user", "a call left unanswered"

    body = json.loads(openai_wire.encode_request("gpt-4.1", request, stream=True))
    fake_openai.validate_request(body)
    wire = body["messages"]
    for i, message in enumerate(wire):
        calls = [c["id"] for c in message.get("tool_calls") or ()]
        answers = wire[i + 1 : i + 1 + len(calls)]
        assert [m["role"] for m in answers] == ["tool"] * len(calls), "a call left unanswered"
        assert sorted(m["tool_call_id"] for m in answers) == sorted(calls)
        if message["role"] == "tool":
            j = i
            while wire[j]["role"] == "tool":
                j -= 1
            assert message["tool_call_id"] in [c["id"] for c in wire[j]["tool_calls"]]


# -- the port stays a leaf ------------------------------------------------------------------


def test_the_step_engine_imports_nothing_of_cells_or_storage() -> None:
    source = Path(__file__).resolve().parents[2] / "runtime" / "llm" / "steps.py"
    imported: list[str] = []
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
    forbidden = ("runtime.cells", "runtime.storage", "runtime.builtins", "..cells",
                 "..storage", "..builtins")
    assert not [m for m in imported if m.startswith(forbidden)], imported


# -- a caller's quick check of the arguments ------------------------------------------------


@pytest.mark.anyio
async def test_a_caller_check_that_says_yes_skips_the_engines() -> None:
    """``arguments_ok`` True: the engine trusts it (the arguments lack the required "city",
    so the engine alone would refuse them); False: the engine checks as it always does."""
    said: list[dict] = []

    def yes(tool, args):
        said.append(args)
        return True

    tools = Tools()
    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {})]), "ok"])
    await steps(model, tools=tools, arguments_ok=yes)
    assert said == [{}] and [u.input for u in tools.started] == [{}]

    tools, recorder = Tools(), Recorder()
    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {})]), "ok"])
    await steps(model, tools=tools, recorder=recorder, arguments_ok=lambda tool, args: False)
    assert tools.started == []  # the engine refused the call
    result = results_of(recorder.messages[1])[0]
    assert result.is_error and "city" in result.content


def test_the_dialogs_quick_check_is_strict_and_only_says_yes_to_valid_arguments() -> None:
    from runtime.builtins.llm_dialog import _fits
    from runtime.llm import Tool

    tool = Tool(name="n", input_schema={"type": "object", "required": ["n"],
                                        "properties": {"n": {"type": "integer"}}})
    assert _fits(tool, {"n": 3})
    assert not _fits(tool, {"n": "3"}) and not _fits(tool, {})
    assert not _fits(tool, {"n": 3.0})  # the engine's own check decides (JSON Schema: valid)
    deep: dict = {"n": 1}
    for _ in range(5000):
        deep = {"n": 1, "x": deep}
    assert _fits(tool, deep) in (True, False)  # too deep to say is not an error


@pytest.mark.anyio
async def test_on_response_hears_each_complete_reply_before_it_is_appended() -> None:
    heard: list = []

    def on_response(response) -> None:
        heard.append(("response", response.stop_reason.value))

    async def on_message(message) -> None:
        heard.append(("message", message.role.value))

    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {"city": "Oslo"})]), "ok"])
    await run_steps(model, Builder(), execute=Tools(), history=(QUESTION,),
                    sink=StepSink(on_response=on_response, on_message=on_message))
    assert heard == [("response", "tool_use"), ("message", "assistant"), ("message", "user"),
                     ("response", "end_turn"), ("message", "assistant")]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_arguments_holding_what_json_has_not_are_a_malformed_reply(number: str) -> None:
    """Python's reader takes these; kept in a history, one would make every later request
    invalid JSON. The assembler refuses them, and never quotes the provider's tool name."""
    events = [ToolCallStart(index=0, id="call_a", name="get_weather"),
              ToolCallDelta(index=0, arguments='{"city": ' + number + "}"),
              ToolCallEnd(index=0), Stop(stop_reason=StopReason.TOOL_USE)]
    outcome = await steps(ScriptedModel([events]), tools=Tools())
    error = outcome.error
    assert outcome.status is StepsStatus.ERROR and outcome.messages == ()
    assert error is not None and "not JSON" in error.message
    assert "get_weather" not in error.message and "tool call 1" in error.message
