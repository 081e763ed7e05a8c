"""What every ``rt.run`` of a pattern does again is done once and shared: a handler's
parameters, a scope's key, a dialog's advertised tools; and the quick copy of written JSON
still finds every link (it hands them to the pass that records where they are)."""

from __future__ import annotations

import pytest

from runtime import Runtime, cell, handler, pattern
from runtime.cells.jsonpath import check_json
from runtime.cells.scope import Scope
from runtime.errors import BindingError, NotJSONError


def test_links_are_found_by_the_pass_that_records_paths() -> None:
    link = {"@link": "/abc/x"}
    links: list = []
    out = check_json({"a": [1, {"b": link}], "c": "text"}, links=links)
    assert out == {"a": [1, {"b": link}], "c": "text"}
    assert out["a"][1]["b"] is not link  # a copy
    assert links == [("a", 1, "b")]
    links = []
    assert check_json({"@link": "/x", "more": 1}, links=links) == {"@link": "/x", "more": 1}
    assert links == []  # an object with "@link" beside other keys is data


@pytest.mark.parametrize("bad, words", [
    ({"a": [float("nan")]}, "NaN"),
    ({"a": {"b": "\ud800"}}, "surrogate"),
    ({1: "x"}, "non-string key"),
    ({"a": object()}, "not JSON"),
])
def test_the_quick_copy_refuses_what_the_slow_one_names(bad: object, words: str) -> None:
    with pytest.raises(NotJSONError, match=words):
        check_json(bad, "value", links=[])


def test_deep_values_are_refused_on_the_quick_path_too() -> None:
    deep: object = "x"
    for _ in range(150):
        deep = {"k": deep}
    with pytest.raises(NotJSONError, match="nests deeper"):
        check_json(deep, "value", links=[])


def test_scope_keys_are_made_once_and_still_distinct() -> None:
    a, b = Scope.of("u:1", "s"), Scope.of("u", "1:s")
    assert a.key != b.key and a.key is Scope.of("u:1", "s").key
    assert Scope.parse(a.key) == a


def test_a_bound_method_handler_sees_its_own_state_parameters() -> None:
    class Box:
        def __init__(self) -> None:
            self.seen: list = []

        def on(self, event, items):
            items.push(event)
            self.seen.append(event)

    boxes = [Box(), Box()]

    @pattern(name="boxes")
    def boxed():
        items = cell([], name="items")
        return {"items": items, "a": handler(boxes[0].on)(items=items),
                "b": handler(boxes[1].on)(items=items)}

    async def main() -> None:
        async with Runtime(store="memory") as rt:
            inst = rt.run(boxed)
            await inst.send("a", "one")
            await inst.send("b", "two")
            await rt.settled()
            assert inst.result.key("items").get() == ["one", "two"]

    import anyio

    anyio.run(main)
    assert boxes[0].seen == ["one"] and boxes[1].seen == ["two"]


def test_equal_tools_are_one_shared_tool() -> None:
    from runtime.builtins.dialog_tools import build_catalog

    @handler
    def add(event: dict, items):
        items.push(event)

    made = []

    @pattern(name="tools")
    def tools():
        items = cell([], name="items")
        made.append(build_catalog({"add": {"description": "Add.", "handler": add(items=items)}},
                                  False, None))
        return {"items": items}

    async def main() -> None:
        async with Runtime(store="memory") as rt:
            rt.run(tools, session="1")
            rt.run(tools, session="2")

    import anyio

    anyio.run(main)
    assert made[0]["add"].tool is made[1]["add"].tool
    assert made[0]["add"].stream is not made[1]["add"].stream


def test_a_tool_schema_changed_in_place_is_advertised_as_it_is_now() -> None:
    # the schema's text is remembered by the object, with a copy to tell it is unchanged:
    # an edit between two instances (1 for true included) is a new tool, not the old one
    from runtime.builtins.dialog_tools import _tool

    schema = {"type": "object", "properties": {"n": {"type": "integer"}},
              "additionalProperties": True}
    first = _tool("count", "Count.", schema)
    assert _tool("count", "Count.", schema) is first
    schema["properties"]["n"]["type"] = "string"
    second = _tool("count", "Count.", schema)
    assert second.input_schema["properties"]["n"]["type"] == "string"
    schema["additionalProperties"] = 1
    third = _tool("count", "Count.", schema)
    assert third is not second and third.input_schema["additionalProperties"] == 1


def test_a_dict_subclass_tool_schema_changed_from_one_to_true_is_advertised_anew() -> None:
    from collections import OrderedDict

    from runtime.builtins.dialog_tools import _tool

    schema = OrderedDict(type="object", properties={"n": {"const": 1}})
    assert _tool("pick", "Pick.", schema).input_schema["properties"]["n"]["const"] == 1
    schema["properties"]["n"]["const"] = True
    assert _tool("pick", "Pick.", schema).input_schema["properties"]["n"]["const"] is True


def test_schemas_made_afresh_every_run_do_not_pile_up() -> None:
    # a literal schema in a pattern is a new dict each run: the objects remembered stay few
    from runtime.builtins import dialog_tools
    from runtime.cells import schema as schema_module
    from runtime.cells.schema import to_json_schema

    small = {f"p{i}": {"type": "string"} for i in range(5)}
    for _ in range(300):
        fresh = {"type": "object", "properties": {k: dict(v) for k, v in small.items()}}
        to_json_schema(fresh)
        dialog_tools._tool("t", "T.", fresh)
    assert 0 < len(schema_module._CHECKED_BY_ID) <= schema_module._CHECKED_BY_ID.size
    assert 0 < len(dialog_tools._SCHEMA_TEXT) <= dialog_tools._SCHEMA_TEXT.size
    # a large schema is not held by its object at all (its copy would cost as much again)
    big = {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "x" * 200} for i in range(50)}}
    to_json_schema(big)
    dialog_tools._tool("t", "T.", big)
    assert big not in schema_module._CHECKED_BY_ID
    assert big not in dialog_tools._SCHEMA_TEXT


def test_a_handler_taking_keyword_state_binds_any_cell() -> None:
    @handler
    def put(event, **state):
        state["a"].set(event)

    @handler
    def only(**event):  # the event's own parameter: no state may be bound
        pass

    @pattern(name="kw")
    def kw():
        a = cell(0, name="a")
        return {"a": a, "put": put(a=a)}

    @pattern(name="kw-refused")
    def refused():
        return {"only": only(a=cell(0, name="a"))}

    async def main() -> None:
        async with Runtime(store="memory") as rt:
            inst = rt.run(kw)
            await inst.send("put", 5)
            await rt.settled()
            assert inst.result.key("a").get() == 5
            with pytest.raises(BindingError, match="has no parameter 'a'"):
                rt.run(refused)

    import anyio

    anyio.run(main)


def test_a_declared_document_owns_its_copy_of_the_initial_value() -> None:
    # the document keeps check_json's copy uncopied (declare(owned=True)): what the pattern
    # passed stays the caller's, and a shared store keeps its own copy of what was created
    from runtime.storage import MemoryStore

    start = {"tags": ["a"]}
    store = MemoryStore()

    @pattern(name="owned")
    def owned():
        return {"box": cell(start, name="box")}

    async def main() -> None:
        async with Runtime(store=store) as rt:
            box = rt.run(owned, session="1").result.key("box")
            start["tags"].append("changed by the caller")
            assert box.get() == {"tags": ["a"]}
            box.key("tags").push("b")
            assert box.get() == {"tags": ["a", "b"]}
            stored = store.load(box.resolve().doc_key)
            assert stored is not None and stored.value == {"tags": ["a", "b"]}
            stored.value["tags"].clear()
            assert box.get() == {"tags": ["a", "b"]}

    import anyio

    anyio.run(main)
