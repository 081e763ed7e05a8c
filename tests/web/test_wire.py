"""The wire format: a patch applied to what a tab holds gives exactly the new value, and a
patch carries what changed, not the whole value again."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.web.wire import apply, diff, frame, to_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False,
                                                                allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(alphabet="ab/~-0", max_size=3), inner, max_size=4),
    max_leaves=20,
)


def strict(value: Any) -> str:
    """JSON text that tells ``1`` from ``true`` and ``1.0`` (Python's ``==`` does not)."""
    return json.dumps(value, sort_keys=True)


@settings(max_examples=400, deadline=None)
@given(json_values, json_values)
def test_a_patch_turns_the_old_value_into_the_new(old: Any, new: Any) -> None:
    doc = {"cell": copy.deepcopy(old)}
    ops = diff(old, new, ("cell",))
    apply(doc, json.loads(to_json(ops)))  # through the wire, as a tab gets it
    assert strict(doc["cell"]) == strict(new)


@settings(max_examples=200, deadline=None)
@given(st.lists(json_values, max_size=5), st.lists(json_values, min_size=1, max_size=5))
def test_a_list_that_grew_by_its_end_is_sent_its_new_items_only(head: list[Any],
                                                                tail: list[Any]) -> None:
    ops = diff(head, head + tail, ("messages",))
    assert ops == [{"op": "add", "path": "/messages/-", "value": v} for v in tail]


def test_streamed_text_is_appended_never_sent_again() -> None:
    text, sent = "", []
    for piece in ["Hel", "lo, ", "Ada", "."]:
        ops = diff(text, text + piece, ("partial",))
        sent.extend(ops)
        text += piece
    assert sent == [{"op": "append", "path": "/partial", "value": p}
                    for p in ["Hel", "lo, ", "Ada", "."]]
    assert diff("Hello", "", ("partial",)) == [
        {"op": "replace", "path": "/partial", "value": ""}]


def test_json_equality_is_strict() -> None:
    """``[1]`` and ``[true]`` are equal to Python, not to JSON: the change is sent."""
    assert diff([1], [True], ("x",)) == [{"op": "replace", "path": "/x/0", "value": True}]
    assert diff({"a": 1}, {"a": 1.0}, ("x",)) == [
        {"op": "replace", "path": "/x/a", "value": 1.0}]
    assert diff([[1, 2]], [[1, 2]], ("x",)) == []


def test_keys_with_separators_are_escaped() -> None:
    ops = diff({"a/b": 1, "~": 2}, {"a/b": 3, "~": 2}, ("cells",))
    assert ops == [{"op": "replace", "path": "/cells/a~1b", "value": 3}]
    doc = {"cells": {"a/b": 1, "~": 2}}
    assert apply(doc, ops) == {"cells": {"a/b": 3, "~": 2}}


def test_a_deep_value_is_replaced_past_a_bounded_depth() -> None:
    old: Any = 0
    new: Any = 1
    for _ in range(50):
        old, new = {"k": old}, {"k": new}
    ops = diff(old, new, ("x",))
    assert len(ops) == 1 and ops[0]["path"].count("/k") <= 8


def test_frames_are_one_data_line() -> None:
    assert frame("patch", to_json(["a\nb"])) == b'event: patch\ndata: ["a\\nb"]\n\n'
    assert frame("snapshot", "{}", retry_ms=1000).startswith(b"retry: 1000\n")
    with pytest.raises(ValueError, match="newline"):
        frame("patch", "a\nb")
    with pytest.raises(ValueError):
        to_json(float("nan"))


def test_a_patch_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot apply append"):
        apply({"x": 1}, [{"op": "append", "path": "/x", "value": "a"}])


def test_a_list_edited_in_place_is_sent_what_changed() -> None:
    items = [{"title": "milk", "done": False}, {"title": "eggs", "done": False},
             {"title": "tea", "done": False}]
    ticked = [items[0], {"title": "eggs", "done": True}, items[2]]
    assert diff(items, ticked, ("items",)) == [
        {"op": "replace", "path": "/items/1/done", "value": True}]
    assert diff(items, [items[0], items[2]], ("items",)) == [
        {"op": "remove", "path": "/items/1"}]
    new = {"title": "jam", "done": False}
    assert diff(items, [items[0], new, *items[1:]], ("items",)) == [
        {"op": "add", "path": "/items/1", "value": new}]
    assert diff({"a": 1, "b": 2}, {"a": 1, "c": 3}, ("o",)) == [
        {"op": "remove", "path": "/o/b"}, {"op": "add", "path": "/o/c", "value": 3}]
    assert diff([1, 2, 3], [4, 5, 6], ("x",)) == [
        {"op": "replace", "path": "/x", "value": [4, 5, 6]}]  # nothing kept: the list
