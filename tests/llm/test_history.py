"""Rules about a history, written once in the port (``runtime/llm/history.py``) and read the
same way from ``Message``s and from their JSON."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runtime.llm import Message, Role, TextBlock, ToolResult, ToolUse, unanswered_calls


def assistant(*ids: str) -> Message:
    return Message(role=Role.ASSISTANT, blocks=(TextBlock(text="calling"),
                                                *(ToolUse(id=i, name="t") for i in ids)))


def results(*ids: str) -> Message:
    return Message(role=Role.USER, blocks=tuple(ToolResult(tool_use_id=i, content="ok")
                                                for i in ids))


def as_json(history: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json") for m in history]


def test_the_calls_of_the_last_assistant_message_without_a_later_result_in_call_order() -> None:
    history = [Message.text(Role.USER, "go"), assistant("a", "b", "c"), results("b")]
    assert unanswered_calls(history) == ["a", "c"]
    assert unanswered_calls(as_json(history)) == ["a", "c"]
    mixed = [history[0], as_json(history)[1], history[2]]  # a caller may hold both forms
    assert unanswered_calls(mixed) == ["a", "c"]


def test_only_the_last_assistant_message_counts() -> None:
    history = [assistant("old"), Message.text(Role.USER, "never mind"), assistant("new")]
    assert unanswered_calls(history) == ["new"]
    assert unanswered_calls([*history, results("new")]) == []
    assert unanswered_calls([]) == [] and unanswered_calls([Message.text(Role.USER, "hi")]) == []


def test_results_in_several_later_messages_all_count() -> None:
    history = [assistant("a", "b"), results("a"), Message.text(Role.USER, "and"), results("b")]
    assert unanswered_calls(history) == [] == unanswered_calls(as_json(history))


ids = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            out.append(assistant(*draw(st.lists(ids, max_size=3, unique=True))))
        else:
            out.append(results(*draw(st.lists(ids, max_size=3))))
    return out


@given(histories())
def test_messages_and_their_json_agree_with_a_direct_oracle(history: list[Message]) -> None:
    last = max((i for i, m in enumerate(history) if m.role is Role.ASSISTANT), default=None)
    if last is None:
        want: list[str] = []
    else:
        answered = {b.tool_use_id for m in history[last + 1:] for b in m.blocks
                    if isinstance(b, ToolResult)}
        want = [c.id for c in history[last].tool_uses() if c.id not in answered]
    assert unanswered_calls(history) == want == unanswered_calls(as_json(history))
