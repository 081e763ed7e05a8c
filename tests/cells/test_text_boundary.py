"""Text at the cell graph's JSON boundary (issue 14, defect 1): a string holding a lone UTF-16
surrogate, as a value or as an object key, is refused wherever text enters from users or code
(cell writes, events sent or fed, pattern arguments, initial values, path steps), with an
error naming where; nothing is written. Any text UTF-8 can encode is accepted unchanged."""

from __future__ import annotations

import pytest
import reactivex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import NotJSONError, Runtime, cell, handler, pattern

pytestmark = pytest.mark.anyio

LONE = "\ud800"
SURROGATE = "lone UTF-16 surrogate"


@handler
def add(event, items):
    items.push(event["title"])


@handler
def put(event, box):
    box.set(event)


@pattern
def board(title="t"):
    items = cell([], name="items")
    box = cell({"a": 1}, name="box")
    return {"items": items, "box": box, "add": add(items=items), "put": put(box=box)}


async def _state(inst):
    return inst.result.key("items").get(), inst.result.key("box").get()


async def test_cell_set_push_and_update_refuse_a_surrogate_and_change_nothing():
    async with Runtime() as rt:
        inst = rt.run(board)
        items, box = inst.result.key("items"), inst.result.key("box")
        items.push("ok")
        before = await _state(inst)
        with pytest.raises(NotJSONError, match=SURROGATE) as e:
            box.set("x" + LONE)
        assert "U+D800 at character 1" in str(e.value)
        with pytest.raises(NotJSONError, match=SURROGATE):
            items.push("fine", "bad" + LONE)  # one bad item: none of them lands
        with pytest.raises(NotJSONError, match=SURROGATE):
            box.update({"b": LONE})
        assert await _state(inst) == before


async def test_a_key_holding_a_surrogate_is_refused():
    async with Runtime() as rt:
        inst = rt.run(board)
        box = inst.result.key("box")
        with pytest.raises(NotJSONError, match=f"a key of .*{SURROGATE}"):
            box.set({"ok": 1, "k" + LONE: 2})
        with pytest.raises(NotJSONError, match=SURROGATE):
            box.update({"\udc00": 1})
        with pytest.raises(NotJSONError, match="path step"):
            box.key("x" + LONE).set(1)  # a path step becomes a key when written
        assert box.get() == {"a": 1}


async def test_a_deep_value_names_the_place():
    async with Runtime() as rt:
        inst = rt.run(board)
        box = inst.result.key("box")
        deep: object = "end" + LONE
        where = ""
        for i in range(40):
            deep, where = ({"k": [deep]}, "/k/0" + where) if i % 2 else ([deep], "/0" + where)
        with pytest.raises(NotJSONError, match=SURROGATE) as e:
            box.set({"outer": {"list": [1, {"deep": deep}]}})
        assert f"/outer/list/1/deep{where} holds a lone" in str(e.value)
        assert box.get() == {"a": 1}


async def test_events_sent_with_a_surrogate_are_refused_before_the_handler_runs():
    async with Runtime() as rt:
        inst = rt.run(board)
        with pytest.raises(NotJSONError, match=f"event for put.*{SURROGATE}"):
            await rt.send(inst.stream("put"), {"note": LONE})
        with pytest.raises(NotJSONError, match=SURROGATE):
            await inst.send("add", {"title": "a" + LONE})
        with pytest.raises(NotJSONError, match=SURROGATE):
            inst.stream("add").send({LONE: "key"})  # queued sends are checked when sent
        await rt.settled()
        assert await _state(inst) == ([], {"a": 1})


async def test_a_fed_item_with_a_surrogate_is_reported_and_the_feed_goes_on():
    async with Runtime() as rt:
        inst = rt.run(board)
        source = reactivex.from_iterable([{"title": "a"}, {"title": LONE}, {"title": "b"}])
        feed = inst.stream("add").feed(source)
        await feed.wait()
        await rt.settled()
        assert inst.result.key("items").get() == ["a", "b"]
        [(where, error)] = rt.errors
        assert "feed into" in where and isinstance(error, NotJSONError)
        assert SURROGATE in str(error)


async def test_pattern_arguments_and_initial_values_with_a_surrogate_are_refused():
    @pattern
    def seeded():
        return {"seed": cell("\udfff", name="seed")}

    async with Runtime() as rt:
        with pytest.raises(NotJSONError, match=f"pattern arguments.*{SURROGATE}"):
            rt.run(board, {"title": LONE})
        with pytest.raises(NotJSONError, match=f"initial value.*{SURROGATE}"):
            rt.run(seeded)
        with pytest.raises(NotJSONError, match=SURROGATE):
            rt.run(board, {"title": "t"}, cause={"c": LONE})
        inst = rt.run(board, {"title": "t"})
        assert inst.argument.get() == {"title": "t"}


async def test_a_surrogate_inside_a_pydantic_value_is_refused():
    from pydantic import BaseModel

    class Note(BaseModel):
        text: str

    async with Runtime() as rt:
        box = rt.run(board).result.key("box")
        with pytest.raises(NotJSONError, match=SURROGATE):
            box.set(Note(text=LONE))
        assert box.get() == {"a": 1}


_HYP = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@_HYP
@given(text=st.text(max_size=30), key=st.text(max_size=10))
async def test_any_text_that_encodes_as_utf8_is_accepted(text, key):
    async with Runtime() as rt:
        box = rt.run(board).result.key("box")
        box.set({key: [text], "t": text})
        assert box.get() == {key: [text], "t": text}
        await rt.send(rt.run(board).stream("put"), {"e": text, key: 1})
        assert box.get() == {"e": text, key: 1}


@_HYP
@given(head=st.text(max_size=10), tail=st.text(max_size=10),
       lone=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))
async def test_any_lone_surrogate_is_refused(head, tail, lone):
    async with Runtime() as rt:
        box = rt.run(board).result.key("box")
        with pytest.raises(NotJSONError, match=SURROGATE):
            box.set([head + lone + tail])
        with pytest.raises(NotJSONError, match=SURROGATE):
            box.set({head + lone + tail: 1})
        assert box.get() == {"a": 1}
