"""The dialog's history as messages is kept between turns: only messages that changed (by
JSON's strict equality) or are new are validated again."""

from __future__ import annotations

import copy

import pytest

from runtime.builtins import dialog_input
from runtime.builtins.dialog_input import TypedHistory
from runtime.errors import PatternError


def _msg(role: str, text: str) -> dict:
    return {"role": role, "blocks": [{"kind": "text", "text": text}]}


def _call(cid: str, value: object) -> dict:
    return {"role": "assistant",
            "blocks": [{"kind": "tool_use", "id": cid, "name": "add", "input": {"n": value}}]}


@pytest.fixture(autouse=True)
def _keep_any(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dialog_input, "KEEP_FROM", 1)


@pytest.fixture
def validated(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    seen: list[dict] = []
    real = dialog_input._message

    def counting(raw):
        seen.append(raw)
        return real(raw)

    monkeypatch.setattr(dialog_input, "_message", counting)
    return seen


def test_only_new_messages_are_validated(validated: list[dict]) -> None:
    cache = TypedHistory()
    raw = [_msg("user", "hi"), _msg("assistant", "hello")]
    first = cache.load(copy.deepcopy(raw))
    assert [m.text_content() for m in first] == ["hi", "hello"] and len(validated) == 2
    raw.append(_msg("user", "again"))
    again = cache.load(copy.deepcopy(raw))
    assert [m.text_content() for m in again] == ["hi", "hello", "again"]
    assert len(validated) == 3  # the first two were not validated again
    assert again[0] is first[0]


def test_a_rewritten_message_is_read_again(validated: list[dict]) -> None:
    cache = TypedHistory()
    raw = [_msg("user", "add"), _call("c1", 1)]
    cache.load(copy.deepcopy(raw))
    raw[1]["blocks"][0]["input"]["n"] = True  # == 1 in Python, not in JSON
    out = cache.load(copy.deepcopy(raw))
    assert out[1].tool_uses()[0].input == {"n": True}
    raw[0] = _msg("user", "edited")
    out = cache.load(copy.deepcopy(raw))
    assert out[0].text_content() == "edited" and len(out) == 2
    assert cache.load([])== ()  # cleared


def test_garbage_is_still_refused() -> None:
    cache = TypedHistory()
    cache.load([_msg("user", "hi")])
    with pytest.raises(PatternError, match="not a message"):
        cache.load([_msg("user", "hi"), {"role": "nobody"}])
    with pytest.raises(PatternError, match="not a list"):
        cache.load({"role": "user"})
    assert [m.text_content() for m in cache.load([_msg("user", "hi")])] == ["hi"]


def test_a_short_history_is_not_kept(monkeypatch: pytest.MonkeyPatch,
                                     validated: list[dict]) -> None:
    monkeypatch.setattr(dialog_input, "KEEP_FROM", 3)
    cache = TypedHistory()
    raw = [_msg("user", "hi"), _msg("assistant", "hello")]
    cache.load(copy.deepcopy(raw))
    cache.load(copy.deepcopy(raw))
    assert len(validated) == 4  # two messages, read twice: nothing kept
    raw.append(_msg("user", "third"))
    cache.load(copy.deepcopy(raw))
    cache.load(copy.deepcopy(raw))
    assert len(validated) == 7  # three read, then kept


def test_a_cells_history_is_read_again_where_it_changed(monkeypatch: pytest.MonkeyPatch,
                                                        validated: list[dict]) -> None:
    """``load_cell`` compares the live list without copying it; a message changed in place
    (a write inside it) is read again, and a link in the history is followed."""
    import anyio

    from runtime import Runtime, cell, pattern

    monkeypatch.setattr(dialog_input, "KEEP_FROM", 2)

    @pattern(name="typed-history")
    def hist():
        return {"messages": cell([_msg("user", "one"), _msg("assistant", "two")],
                                 name="messages"),
                "other": cell(_msg("user", "linked"), name="other")}

    async def main() -> None:
        async with Runtime(store="memory") as rt:
            res = rt.run(hist).result
            messages, other = res.key("messages").resolve(), res.key("other").resolve()
            cache = TypedHistory()
            first = cache.load_cell(messages)
            assert [m.text_content() for m in first] == ["one", "two"]
            seen = len(validated)
            messages.key(1, "blocks", 0, "text").set("TWO")  # in place, inside message 1
            again = cache.load_cell(messages)
            assert [m.text_content() for m in again] == ["one", "TWO"]
            assert again[0] is first[0] and len(validated) == seen + 1
            messages.push(other)  # a link to another cell's message
            linked = cache.load_cell(messages)
            assert [m.text_content() for m in linked] == ["one", "TWO", "linked"]

    anyio.run(main)
