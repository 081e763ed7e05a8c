"""The local model's decision (``providers/_choice.py``) and how ``LocalModel`` honours
``tool_choice``. The chooser's arithmetic is checked against a scoring function written
here; the model's own behaviour under ``local`` (the default weights, greedy decoding, so
the same bytes on every run of one build)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio
import pytest

from runtime.llm import (
    Message,
    Request,
    Role,
    Sampling,
    TextBlock,
    Tool,
    ToolChoice,
    ToolResult,
    ToolUse,
)
from runtime.llm.errors import ConfigurationError
from runtime.llm.providers._choice import (
    CACHED_PRIORS,
    NULL_MESSAGES,
    Chooser,
    intent_of,
)

pytestmark = pytest.mark.anyio

ADD = Tool(name="addItem", description="Add an open item to the list.",
           input_schema={"type": "object", "properties": {"title": {"type": "string"}},
                         "required": ["title"]})
REMOVE = Tool(name="removeItem", description="Remove an item from the list.",
              input_schema={"type": "object", "properties": {"title": {"type": "string"}},
                            "required": ["title"]})


def render(system: str, user: str) -> str:
    return f"<s>{system}</s><u>{user}</u><a>"


class Scores:
    """A scoring function from tables: the channel's score of each (intent, message), and the
    action's score of each tool name after ``Action:`` (plus a bias for one name)."""

    def __init__(self, channel: dict[tuple[str, str], float], action: dict[tuple[str, str],
                 float], bias: dict[str, float] | None = None) -> None:
        self.channel, self.action, self.bias = channel, action, bias or {}
        self.calls: list[str] = []

    def __call__(self, prefix: str, continuations: Sequence[str]) -> list[float]:
        self.calls.append(prefix)
        if prefix.endswith("Action:"):
            message = prefix.split("<u>")[1].split("</u>")[0]
            return [self.action.get((c.strip(), message), 0.0) + self.bias.get(c.strip(), 0.0)
                    for c in continuations]
        [quoted] = continuations
        message = quoted.strip()[1:-1]
        intent = prefix.split("What the user wants: ")[1].split("\n")[0]
        return [self.channel.get((intent, message), -50.0)]


def test_the_channel_picks_an_answer_in_words_when_reply_explains_the_message_best() -> None:
    reply = "reply. Ask a question or chat, without changing anything."
    scores = Scores({(reply, "hi"): -3.0, (intent_of(ADD), "hi"): -9.0,
                     (intent_of(REMOVE), "hi"): -8.0}, {})
    decision = Chooser(render).decide(scores, "You keep a list.", "hi", [ADD, REMOVE])
    assert decision.tool is None and decision.scores["reply"] == -3.0
    assert not any(p.endswith("Action:") for p in scores.calls)  # no second look needed


def test_the_models_bias_for_a_name_is_calibrated_away() -> None:
    """The action term favours ``addItem`` by 6 whatever is asked (as SmolLM2 favours the
    first option): subtracting its score on content-free messages leaves the channel to
    decide, so "remove milk" goes to ``removeItem``."""
    channel = {(intent_of(ADD), "remove milk"): -10.0, (intent_of(REMOVE), "remove milk"): -8.0}
    scores = Scores(channel, {}, bias={"addItem": 6.0})
    decision = Chooser(render).decide(scores, "You keep a list.", "remove milk", [ADD, REMOVE])
    assert decision.tool == "removeItem"
    # without the calibration the bias would have won: -10 + 6 > -8 + 0
    assert -10.0 + 6.0 > -8.0
    assert math.isclose(decision.scores["removeItem"] - decision.scores["addItem"], 2.0)


def test_a_required_call_never_answers_and_one_tool_needs_no_second_look() -> None:
    scores = Scores({("reply. Ask a question or chat, without changing anything.", "hi"): 0.0},
                    {})
    chooser = Chooser(render)
    assert chooser.decide(scores, "", "hi", [ADD, REMOVE], answer=False).tool in (
        "addItem", "removeItem")
    scores.calls.clear()
    assert chooser.decide(scores, "", "hi", [ADD], answer=False).tool == "addItem"
    assert len(scores.calls) == 1  # the channel only


def test_the_prior_is_computed_once_per_prompt_and_the_cache_is_bounded() -> None:
    scores = Scores({}, {})
    chooser = Chooser(render)
    chooser.decide(scores, "system 0", "x", [ADD, REMOVE], answer=False)
    nulls = [p for p in scores.calls if p.endswith("Action:")]
    assert len(nulls) == 1 + len(NULL_MESSAGES)  # the message, then the content-free ones
    scores.calls.clear()
    chooser.decide(scores, "system 0", "y", [ADD, REMOVE], answer=False)
    assert len([p for p in scores.calls if p.endswith("Action:")]) == 1  # cached
    for n in range(1, CACHED_PRIORS + 5):
        chooser.decide(scores, f"system {n}", "x", [ADD, REMOVE], answer=False)
    assert len(chooser._priors) == CACHED_PRIORS


def test_intents_read_names_as_words_and_bound_descriptions() -> None:
    assert intent_of(ADD) == "add item. Add an open item to the list."
    long = Tool(name="get_the-weather.now", description="x " * 500)
    assert intent_of(long).startswith("get the weather now. x x")
    assert len(intent_of(long)) < 240


def test_penalties_are_checked() -> None:
    from runtime.llm.providers.local import Penalties

    for bad in ({"repeat": float("nan")}, {"repeat": 0.0}, {"dry": -1.0}, {"last_n": 0}):
        with pytest.raises(ConfigurationError, match="repeat must be"):
            Penalties(**bad)


def test_an_unknown_tool_decision_is_refused() -> None:
    pytest.importorskip("llama_cpp")
    from runtime.llm.providers.local import LocalModel

    with pytest.raises(ConfigurationError, match="tool_decision='guess'"):
        LocalModel(tool_decision="guess")  # type: ignore[arg-type]


# -- the model itself ---------------------------------------------------------------------

GREEDY = Sampling(temperature=0.0)


def _ask(text: str, **kw: object) -> Request:
    return Request(system="You keep the user's todo list.", tools=(ADD, REMOVE), max_tokens=96,
                   sampling=GREEDY, messages=(Message.text(Role.USER, text),), **kw)


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    pytest.importorskip("llama_cpp")
    from runtime.llm.providers.local import LocalModel

    return LocalModel(max_tokens=40)


@pytest.mark.local
async def test_a_plain_request_becomes_the_call_and_a_question_an_answer(model) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(120):
        call = await model.generate(_ask("add eggs"))
        answer = await model.generate(_ask("What is the capital of France?"))
    [use] = call.message.tool_uses()
    assert use.name == "addItem" and use.input["title"].casefold() == "eggs"
    assert not answer.message.tool_uses() and "Paris" in answer.message.text_content()


@pytest.mark.local
async def test_tool_choice_is_honoured(model) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(180):
        named = await model.generate(_ask("What is the capital of France?",
                                          tool_choice="removeItem"))
        none = await model.generate(_ask("add eggs", tool_choice="none"))
        required = await model.generate(_ask("Hello there!", tool_choice="required"))
    assert [u.name for u in named.message.tool_uses()] == ["removeItem"]
    assert not none.message.tool_uses() and none.message.text_content()
    assert not none.message.text_content().startswith("<")
    assert len(required.message.tool_uses()) == 1
    for choice, reply in (("removeItem", named), ("none", none), ("required", required)):
        assert ToolChoice.model_validate(choice).honoured_by(reply.message) is None


@pytest.mark.local
async def test_after_a_tool_result_the_model_reports_in_words(model) -> None:  # type: ignore[no-untyped-def]
    use = ToolUse(id="call_1", name="addItem", input={"title": "eggs"})
    request = Request(system="You keep the user's todo list.", tools=(ADD, REMOVE),
                      max_tokens=40, sampling=GREEDY, messages=(
        Message.text(Role.USER, "add eggs"),
        Message(role=Role.ASSISTANT, blocks=(use,)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="call_1", content="added"),)),
    ))
    with anyio.fail_after(120):
        got = await model.generate(request)
    assert not got.message.tool_uses()
    text = got.message.text_content()
    assert text and not text.startswith("<")
    assert isinstance(got.message.blocks[0], TextBlock)
