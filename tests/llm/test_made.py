"""``types.made``: the step engine's values built from parts the port validated already
(a reply's message and response, a step's results) are the values the constructors make:
equal, dumped alike, copied and compared alike, and refused nowhere later."""

from __future__ import annotations

import copy
import pickle

import pytest

from runtime.llm import (
    Message,
    OpaqueBlock,
    Response,
    Role,
    StopReason,
    TextBlock,
    ToolResult,
    ToolUse,
    Usage,
)
from runtime.llm.events import Assembler, response_events
from runtime.llm.types import made

BLOCKS = (
    TextBlock(text="héllo"),
    ToolUse(id="c1", name="add_item", input={"title": "x", "n": [1, 2.5, None]}),
    OpaqueBlock(provider="anthropic", raw='{"type": "thinking"}'),
)


@pytest.mark.parametrize("role,blocks", [
    (Role.ASSISTANT, BLOCKS),
    (Role.USER, (ToolResult(tool_use_id="c1", content="added", is_error=False),
                 ToolResult(tool_use_id="c2", content="failed", is_error=True))),
    (Role.ASSISTANT, ()),
])
def test_a_made_message_is_the_constructed_one(role: Role, blocks: tuple) -> None:
    mine, theirs = made(Message, role=role, blocks=blocks), Message(role=role, blocks=blocks)
    assert mine == theirs and theirs == mine
    assert mine.model_dump() == theirs.model_dump()
    assert mine.model_dump_json() == theirs.model_dump_json()
    assert mine.model_fields_set == theirs.model_fields_set
    assert Message.model_validate(mine.model_dump(mode="json")) == theirs
    assert copy.deepcopy(mine) == theirs and pickle.loads(pickle.dumps(mine)) == theirs
    assert mine.model_copy(update={"role": Role.USER}).role is Role.USER
    with pytest.raises(Exception, match="frozen"):
        mine.role = Role.USER  # type: ignore[misc]


def test_a_made_response_is_the_constructed_one() -> None:
    message = Message(role=Role.ASSISTANT, blocks=BLOCKS)
    usage = Usage(input_tokens=3, output_tokens=4)
    mine = made(Response, message=message, stop_reason=StopReason.TOOL_USE, usage=usage,
                model="m")
    theirs = Response(message=message, stop_reason=StopReason.TOOL_USE, usage=usage, model="m")
    assert mine == theirs
    assert mine.model_dump_json() == theirs.model_dump_json()
    assert hash(mine.stop_reason) == hash(theirs.stop_reason)


def test_the_assembler_gives_back_the_response_its_events_describe() -> None:
    """Assembled with ``made``: equal to the response the events were made from."""
    for response in (
        Response(message=Message(role=Role.ASSISTANT, blocks=BLOCKS),
                 stop_reason=StopReason.TOOL_USE, usage=Usage(input_tokens=1), model="m"),
        Response(message=Message.text(Role.ASSISTANT, "done"), stop_reason=StopReason.END_TURN),
    ):
        asm = Assembler("test")
        for event in response_events(response):
            asm.feed(event)
        assert asm.response() == response
        assert asm.response().model_dump_json() == response.model_dump_json()


def _assembled(*events: object) -> Response:
    asm = Assembler("test")
    for event in events:
        asm.feed(event)  # type: ignore[arg-type]
    return asm.response()


@pytest.mark.parametrize("arguments,expected", [
    ('{"title": "x", "n": [1, 2.5, null, true], "o": {"k": {}}}',
     {"title": "x", "n": [1, 2.5, None, True], "o": {"k": {}}}),
    ('{"t": "h\\u00e9llo \\u2028 \\u0000"}', {"t": "héllo \u2028 \x00"}),
    ('{"t": "a\\ud800b", "\\udfff": 1}', {"t": "a\ufffdb", "\ufffd": 1}),  # scrubbed
    ('  ', {}),
])
def test_the_assembler_makes_the_blocks_the_constructors_make(arguments: str,
                                                              expected: dict) -> None:
    """The reply's text and call blocks are made, not validated again: each is the block the
    constructor makes of the same (decoded, scrubbed) parts, and passes it again."""
    from runtime.llm.events import Stop, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
    response = _assembled(
        TextDelta(index=0, text="é\ud800"),
        ToolCallStart(index=1, id="c\udc00", name="add\ud800item"),
        ToolCallDelta(index=1, arguments=arguments),
        ToolCallEnd(index=1),
        Stop(stop_reason=StopReason.TOOL_USE))
    text, use = response.message.blocks
    assert type(text) is TextBlock and type(use) is ToolUse
    assert text == TextBlock(text="é\ufffd")
    assert use == ToolUse(id="c\ufffd", name="add\ufffditem", input=expected)
    for mine in (text, use):
        again = type(mine).model_validate(mine.model_dump(mode="json"))
        assert again == mine and mine == again
        assert mine.model_dump_json() == again.model_dump_json()
        assert pickle.loads(pickle.dumps(mine)) == mine and copy.deepcopy(mine) == mine
        with pytest.raises(Exception, match="frozen"):
            mine.kind = "x"  # type: ignore[misc]
    assert Message.model_validate(response.message.model_dump()) == response.message
