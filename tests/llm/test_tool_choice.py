"""``Request.tool_choice`` end to end through the port: the value and its checks, the
scripted model, the step engine's rule, and each adapter's wire form against its loopback
fake (whose request checks are the official SDK's types)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pydantic
import pytest

from runtime.llm import (
    LLMError,
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
    ToolChoice,
    ToolChoiceScope,
    ToolUse,
    Usage,
    assemble,
    call,
    run_steps,
)
from runtime.llm.events import Stop, ToolCallEnd, ToolCallStart
from runtime.llm.providers.anthropic import AnthropicModel
from runtime.llm.providers.openai import OpenAIModel

from .fake_anthropic import FakeAnthropic, check_request
from .fake_openai import FakeOpenAI, validate_request

pytestmark = pytest.mark.anyio

WEATHER = Tool(name="get_weather", input_schema={
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
CLOCK = Tool(name="get_time", input_schema={"type": "object"})
TOOLS = (WEATHER, CLOCK)
HI = (Message.text(Role.USER, "Weather in Paris?"),)


def ask(choice: Any, tools: tuple[Tool, ...] = TOOLS, **kw: Any) -> Request:
    return Request(messages=HI, tools=tools, tool_choice=choice, max_tokens=64, **kw)


def answer(*blocks: Any, stop: StopReason = StopReason.END_TURN) -> Response:
    content = tuple(TextBlock(text=b) if isinstance(b, str) else b for b in blocks)
    return Response(message=Message(role=Role.ASSISTANT, blocks=content), stop_reason=stop,
                    usage=Usage(input_tokens=9, output_tokens=3))


PARIS = ToolUse(id="toolu_1", name="get_weather", input={"city": "Paris"})
CALLED = answer(PARIS, stop=StopReason.TOOL_USE)


def refusal(make: Any) -> str:
    with pytest.raises(pydantic.ValidationError) as info:
        make()
    return str(info.value)


# -- the value --------------------------------------------------------------------------


def test_a_string_is_a_mode_or_a_tool_name_and_json_round_trips() -> None:
    assert ask("required").tool_choice == ToolChoice(mode="required")
    assert ask("none").tool_choice.mode == "none"
    assert ask("get_time").tool_choice == ToolChoice.tool("get_time")
    assert Request(messages=HI).tool_choice == ToolChoice()  # auto by default
    named = ask(ToolChoice.tool("get_weather"))
    assert Request.model_validate_json(named.model_dump_json()) == named
    assert named.model_dump(mode="json")["tool_choice"] == {"mode": "tool",
                                                            "name": "get_weather"}
    auto_tool = Tool(name="auto")  # a tool called like a mode is named explicitly
    assert ask(ToolChoice.tool("auto"), tools=(auto_tool,)).tool_choice.name == "auto"
    assert ask("auto", tools=(auto_tool,)).tool_choice.mode == "auto"
    assert [ToolChoice(mode=m).forces for m in ("auto", "none", "required")] == [
        False, False, True]
    assert ToolChoice.tool("x").forces


def test_a_choice_the_request_cannot_honour_is_refused_naming_the_tools() -> None:
    text = refusal(lambda: ask("get_wether"))
    assert "tool_choice names the tool 'get_wether', which is not one of the request's " \
           "tools ('get_weather', 'get_time')" in text
    assert "'auto', 'required' or 'none'" in text
    assert "offers no tools" in refusal(lambda: ask("required", tools=()))
    assert "offers no tools" in refusal(lambda: ask("get_weather", tools=()))
    assert ask("none", tools=()).tool_choice.mode == "none"  # harmless: sent as nothing
    assert "takes no tool name" in refusal(lambda: ToolChoice(mode="required", name="x"))
    assert "needs the name" in refusal(lambda: ToolChoice(mode="tool"))
    assert "needs the name" in refusal(lambda: ask(""))
    refusal(lambda: ToolChoice(mode="any"))  # not one of the port's modes
    refusal(lambda: Request(messages=HI, tool_choice=3))


def test_hostile_names_are_refused_or_quoted_in_part() -> None:
    huge = "w" * 1_000_000
    text = refusal(lambda: ask(huge))
    assert "1,000,000 characters, past the 256 a tool call's name may have" in text
    assert len(text) < 2_000
    long = "n" * 250  # within the cap, not offered: quoted in part
    text = refusal(lambda: ask(long))
    assert "[... 250 characters]" in text and "n" * 65 not in text.split("input_value")[0]
    assert "lone UTF-16 surrogate" in refusal(lambda: ask("get_\ud800weather"))
    many = tuple(Tool(name=f"tool_{i}") for i in range(30))
    text = refusal(lambda: ask("missing", tools=many))
    assert "'tool_19' and 10 more" in text and "'tool_20'" not in text.split("input_value")[0]


def test_honoured_by_says_how_a_reply_breaks_the_choice() -> None:
    called = CALLED.message
    text = answer("Sunny.").message
    clock = Message(role=Role.ASSISTANT, blocks=(ToolUse(id="c", name="get_time"),))
    assert ToolChoice().honoured_by(called) is None
    assert "'get_weather'" in (ToolChoice(mode="none").honoured_by(called) or "")
    assert ToolChoice(mode="none").honoured_by(text) is None
    assert "calls no tool" in (ToolChoice(mode="required").honoured_by(text) or "")
    assert ToolChoice(mode="required").honoured_by(clock) is None
    assert ToolChoice.tool("get_weather").honoured_by(called) is None
    assert "'get_time'" in (ToolChoice.tool("get_weather").honoured_by(clock) or "")


# -- ScriptedModel ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "stream"])
async def test_scripted_model_records_the_choice_and_refuses_a_reply_that_breaks_it(
        mode: str) -> None:
    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {"city": "Paris"})]),
                           "I will not call anything.", answer("Nor will I.")])

    async def play(request: Request) -> Response:
        if mode == "generate":
            return await model.generate(request)
        return await assemble(model.stream(request))

    await play(ask("get_weather"))
    for _ in range(2):
        with pytest.raises(LLMError) as info:
            await play(ask("required"))
        assert "contradicts the request's tool_choice: it calls no tool although " \
               "tool_choice 'required' forces a call" in str(info.value)
        assert "check_tool_choice=False" in str(info.value)
    assert [r.tool_choice for r in model.requests] == [
        ToolChoice.tool("get_weather"), ToolChoice(mode="required"),
        ToolChoice(mode="required")]
    model.assert_complete()


async def test_scripted_model_can_play_a_model_that_ignores_the_choice() -> None:
    lax = ScriptedModel([Reply(tool_calls=[call("get_time")])], check_tool_choice=False)
    got = await lax.generate(ask("none"))
    assert got.message.tool_uses()[0].name == "get_time"
    verbatim = ScriptedModel([[ToolCallStart(index=0, id="c1", name="get_time"),
                               ToolCallEnd(index=0), Stop(stop_reason=StopReason.TOOL_USE)]])
    got = await assemble(verbatim.stream(ask("none")))  # events are played as they are
    assert got.message.tool_uses()[0].name == "get_time"


# -- the step engine --------------------------------------------------------------------


async def weather(use: ToolUse) -> str:
    return "sunny"


@pytest.mark.parametrize("choice", ["required", "get_weather"])
async def test_a_forced_choice_goes_with_the_prompt_and_results_go_with_auto(
        choice: str) -> None:
    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {"city": "Paris"})]),
                           "Sunny in Paris."])
    outcome = await run_steps(model, lambda history, step: ask(choice).model_copy(
        update={"messages": tuple(history)}), execute=weather, history=HI)
    assert outcome.status is StepsStatus.COMPLETED and outcome.steps == 2
    assert model.requests[0].tool_choice == ask(choice).tool_choice
    assert model.requests[1].tool_choice == ToolChoice()  # auto: the model may answer


async def test_one_step_at_a_time_the_step_sending_results_is_auto_too() -> None:
    """The rule reads the history, so a caller that runs one step per call (max_steps=1)
    cannot loop forever under a forced choice either."""
    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {"city": "Paris"})]),
                           "Sunny in Paris."])
    history = list(HI)
    for _ in range(2):
        outcome = await run_steps(model, lambda history, step: ask("required").model_copy(
            update={"messages": tuple(history)}), execute=weather, history=history,
            max_steps=1)
        history += outcome.messages
    assert outcome.status is StepsStatus.COMPLETED
    assert [r.tool_choice.mode for r in model.requests] == ["required", "auto"]


async def test_every_step_keeps_the_choice_and_ends_at_max_steps() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("get_weather", {"city": c})])
                           for c in ("Oslo", "Rome", "Lima")])
    outcome = await run_steps(model, lambda history, step: ask("required").model_copy(
        update={"messages": tuple(history)}), execute=weather, history=HI, max_steps=3,
        tool_choice_scope=ToolChoiceScope.EVERY_STEP)
    assert outcome.status is StepsStatus.MAX_STEPS
    assert [r.tool_choice.mode for r in model.requests] == ["required"] * 3


async def test_none_and_auto_are_sent_as_built_and_a_bad_scope_is_refused() -> None:
    lax = ScriptedModel([Reply(tool_calls=[call("get_time")]), "Done."],
                        check_tool_choice=False)
    outcome = await run_steps(lax, lambda history, step: ask("none").model_copy(
        update={"messages": tuple(history)}), execute=weather, history=HI)
    assert outcome.status is StepsStatus.COMPLETED
    assert [r.tool_choice.mode for r in lax.requests] == ["none", "none"]
    with pytest.raises(ValueError, match="tool_choice_scope must be one of"):
        await run_steps(lax, lambda h, s: ask("none"), execute=weather,
                        tool_choice_scope="second_step")


# -- the adapters on the wire -------------------------------------------------------------


@pytest.fixture
def openai_fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as f:
        yield f


@pytest.fixture
def anthropic_fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def openai(fake: FakeOpenAI) -> OpenAIModel:
    return OpenAIModel("gpt-test", api_key="sk-test", base_url=fake.base_url,
                       retry=RetryPolicy(max_attempts=1))


def anthropic(fake: FakeAnthropic, model: str = "claude-sonnet-4-5") -> AnthropicModel:
    return AnthropicModel(model, api_key="sk-ant-test", base_url=fake.url,
                          retry=RetryPolicy(max_attempts=1))


OPENAI_WIRE = [  # (port choice, the reply the API could send, the wire's tool_choice)
    ("auto", answer("Sunny."), None),
    ("required", CALLED, "required"),
    ("none", answer("Sunny, I think."), "none"),
    ("get_weather", CALLED, {"type": "function", "function": {"name": "get_weather"}}),
]
ANTHROPIC_WIRE = [
    ("auto", answer("Sunny."), None),
    ("required", CALLED, {"type": "any"}),
    ("none", answer("Sunny, I think."), {"type": "none"}),
    ("get_weather", CALLED, {"type": "tool", "name": "get_weather"}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("choice", "reply", "wire"), OPENAI_WIRE)
async def test_openai_sends_the_choice_as_the_sdk_types_it(
        openai_fake: FakeOpenAI, choice: str, reply: Response, wire: Any, stream: bool) -> None:
    openai_fake.script(reply)
    model = openai(openai_fake)
    request = ask(choice)
    got = await (assemble(model.stream(request)) if stream else model.generate(request))
    assert got.message == reply.message
    [sent] = openai_fake.requests
    assert sent.body.get("tool_choice") == wire
    assert validate_request(sent.body).get("tool_choice") == wire  # the SDK's params
    if wire is not None:  # a per-call field: after the cacheable tools and messages
        assert sent.raw.index(b'"tool_choice"') > sent.raw.index(b'"messages"')


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("choice", "reply", "wire"), ANTHROPIC_WIRE)
async def test_anthropic_sends_the_choice_as_the_sdk_types_it(
        anthropic_fake: FakeAnthropic, choice: str, reply: Response, wire: Any,
        stream: bool) -> None:
    anthropic_fake.script(reply)
    model = anthropic(anthropic_fake)
    request = ask(choice)
    got = await (assemble(model.stream(request)) if stream else model.generate(request))
    assert got.message == reply.message
    [sent] = anthropic_fake.requests
    assert sent.body.get("tool_choice") == wire
    check_request(sent.body)  # the SDK's params, ToolChoiceParam included
    if wire is not None:
        assert sent.raw.index(b'"tool_choice"') > sent.raw.index(b'"messages"')


async def test_no_tools_no_choice_on_either_wire(openai_fake: FakeOpenAI,
                                                 anthropic_fake: FakeAnthropic) -> None:
    openai_fake.script(answer("Hi."))
    anthropic_fake.script(answer("Hi."))
    await openai(openai_fake).generate(ask("none", tools=()))
    await anthropic(anthropic_fake).generate(ask("none", tools=()))
    assert "tool_choice" not in openai_fake.requests[0].body
    assert "tool_choice" not in anthropic_fake.requests[0].body


@pytest.mark.parametrize("choice", ["required", "get_weather"])
async def test_anthropic_refuses_a_forced_call_with_thinking_before_sending(
        anthropic_fake: FakeAnthropic, choice: str) -> None:
    for model in ("claude-sonnet-4-5", "claude-opus-4-6"):  # budget and adaptive thinking
        with pytest.raises(LLMError) as info:
            await anthropic(anthropic_fake, model).generate(ask(choice, reasoning_effort="low"))
        assert "forces a call" in str(info.value) and "reasoning_effort='low'" in str(info.value)
    assert anthropic_fake.requests == []
    anthropic_fake.script(answer("Sunny."))  # none and auto go with thinking
    await anthropic(anthropic_fake).generate(ask("none", reasoning_effort="low"))
    assert anthropic_fake.requests[0].body["thinking"]["type"] == "enabled"
    assert anthropic_fake.requests[0].body["tool_choice"] == {"type": "none"}


def raw_body(tools: list[dict[str, Any]], choice: Any, **extra: Any) -> dict[str, Any]:
    return {"tools": tools, "tool_choice": choice, **extra}


async def test_the_fakes_answer_400_where_the_apis_do(openai_fake: FakeOpenAI,
                                                      anthropic_fake: FakeAnthropic) -> None:
    """Requests the port never builds, sent by hand: the fakes hold them to the API."""
    oa_tool = {"type": "function", "function": {"name": "get_weather",
                                                "parameters": {"type": "object"}}}
    an_tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    user = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    async with httpx.AsyncClient() as client:
        for tools, choice in (([], "required"), ([oa_tool], {
                "type": "function", "function": {"name": "get_time"}})):
            r = await client.post(f"{openai_fake.base_url}/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}],
                **({"tools": tools} if tools else {}), "tool_choice": choice})
            assert r.status_code == 400
        headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
        for body in ({"tool_choice": {"type": "any"}},
                     raw_body([an_tool], {"type": "tool", "name": "get_time"}),
                     raw_body([an_tool], {"type": "any"},
                              thinking={"type": "enabled", "budget_tokens": 1024})):
            r = await client.post(f"{anthropic_fake.url}/v1/messages", headers=headers, json={
                "model": "m", "max_tokens": 2000, "messages": [user], **body})
            assert r.status_code == 400, body
    assert "not in tools" in openai_fake.rejected[1]
    assert "Thinking may not be enabled" in r.json()["error"]["message"]
    with pytest.raises(pydantic.ValidationError):  # not what the SDK types
        validate_request({"model": "m", "messages": [], "tool_choice": "any"})
    with pytest.raises(AssertionError, match="tool_choice"):
        check_request({"model": "m", "max_tokens": 1, "messages": [],
                       "tool_choice": {"type": "required"}})


async def test_the_fakes_refuse_to_play_a_reply_that_breaks_the_choice(
        openai_fake: FakeOpenAI, anthropic_fake: FakeAnthropic) -> None:
    openai_fake.script(answer("No call."))
    anthropic_fake.script(CALLED)
    with pytest.raises(LLMError) as info:
        await openai(openai_fake).generate(ask("required"))
    assert "calls no tool under tool_choice required" in str(info.value)
    with pytest.raises(LLMError) as info:
        await anthropic(anthropic_fake).generate(ask("none"))
    assert "calls 'get_weather' under tool_choice none" in str(info.value)
    assert len(anthropic_fake.failures) == 1
    anthropic_fake.failures.clear()  # expected here: it would fail the test on exit


async def test_a_dialog_of_steps_over_the_wire_relaxes_the_choice(
        openai_fake: FakeOpenAI) -> None:
    """The engine's rule, as the provider sees it: forced, then auto (nothing sent)."""
    openai_fake.script(CALLED, answer("Sunny in Paris."))
    outcome = await run_steps(openai(openai_fake), lambda history, step: ask(
        "get_weather").model_copy(update={"messages": tuple(history)}), execute=weather,
        history=HI)
    assert outcome.status is StepsStatus.COMPLETED
    assert [r.body.get("tool_choice") for r in openai_fake.requests] == [
        {"type": "function", "function": {"name": "get_weather"}}, None]
    assert json.loads(openai_fake.requests[1].raw)["messages"][-1]["role"] == "tool"

