"""The six management tools (runtime/builtins/management.py) through the real Runtime: each
tool on a real cell, a handler stream and a pattern instance; each bad call an error outcome
that says what a correct call looks like; scopes never crossed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import jsonschema
import pytest
from pydantic import BaseModel

from runtime import Runtime, cell, handler, lift, pattern
from runtime.builtins.management import (
    MANAGEMENT_GUIDE,
    MANAGEMENT_TOOL_NAMES,
    MANAGEMENT_TOOLS,
    Management,
    ToolOutcome,
)
from runtime.cells.scope import Scope

pytestmark = pytest.mark.anyio


class AddItem(BaseModel):
    title: str


@handler
def add_item(event: AddItem, items):
    items.push(event.title)


@handler
def frozen(event, items):
    raise ValueError("the list is frozen")


@handler(event={"type": "object", "properties": {"target": {"asCell": True}},
                "required": ["target"]})
def remember(event, seen):
    link = event["target"].link()  # a live cell: the schema asks for one
    seen.push(link["@link"] + " " + link.get("scope", ""))


ARG_SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"},
    "config": {"type": ["object", "null"],
               "properties": {"theme": {"type": "string"}, "size": {"type": "integer"}}},
}}


@pattern(name="mgmt-todo", argument_schema=ARG_SCHEMA)
def todo(title="Todo", config=None):
    items = cell([], schema={"type": "array", "items": {"type": "string"}}, scope="user",
                 name="items")
    seen = cell([], scope="user", name="seen")
    label = lift(lambda t, xs, c: f"{t}: {len(xs)} ({(c or {}).get('theme')})")(
        title, items, config)
    return {"items": items, "seen": seen, "label": label, "add": add_item(items=items),
            "fail": frozen(items=items), "remember": remember(seen=seen)}


@pattern(name="mgmt-notes")
def notes(owner):
    secret = cell({"text": "nothing to see"}, scope="user", name="secret")
    return {"secret": secret, "owner": owner}


@pattern(name="mgmt-session-notes")
def session_notes():
    draft = cell("", scope="session", name="draft")
    return {"draft": draft}


@pattern(name="mgmt-host")
def host():
    pins = cell([], scope="user", name="pins")
    return {"pins": pins}


@asynccontextmanager
async def alice_world() -> AsyncIterator[tuple[Runtime, Any, Management]]:
    with anyio.fail_after(10):
        async with Runtime() as rt:
            inst = rt.run(todo, user="alice")
            pins = rt.run(host, user="alice").result.key("pins").resolve()
            m = Management(rt, space="default", scope=Scope.of("alice").key, pins=pins)
            yield rt, inst, m


def path(inst: Any, *steps: str | int) -> str:
    return "/" + inst.result.id + "".join(f"/{s}" for s in steps)


def ok(outcome: ToolOutcome) -> str:
    assert isinstance(outcome, ToolOutcome)
    assert not outcome.is_error, outcome.text
    return outcome.text


def err(outcome: ToolOutcome, *needles: str) -> str:
    assert isinstance(outcome, ToolOutcome)
    assert outcome.is_error, outcome.text
    for needle in needles:
        assert needle in outcome.text, (needle, outcome.text)
    return outcome.text


# ---------------------------------------------------------------------------- declarations


def test_the_six_tools_are_declared_with_valid_schemas():
    assert MANAGEMENT_TOOL_NAMES == ("read", "invoke", "schema", "pin", "unpin",
                                     "updateArgument")
    for tool in MANAGEMENT_TOOLS:
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        assert "path" in tool.input_schema["required"]
        assert tool.description
    schema = MANAGEMENT_TOOLS[0].input_schema
    v = jsonschema.Draft202012Validator(schema)
    assert v.is_valid({"path": "/abc/items"})
    assert v.is_valid({"path": {"@link": "/abc/items"}})
    assert not v.is_valid({"path": 3})
    assert "@link" in MANAGEMENT_TOOLS[0].input_schema["properties"]["path"]["description"]
    assert "/<id>/<path>" in MANAGEMENT_GUIDE


def test_an_outcome_becomes_the_ports_tool_result():
    result = ToolOutcome("nope", True).as_tool_result("call-1")
    assert (result.tool_use_id, result.content, result.is_error) == ("call-1", "nope", True)


# ---------------------------------------------------------------------------- read


async def test_read_returns_the_value_with_links_followed():
    async with alice_world() as (_rt, inst, m):
        inst.result.key("items").set(["milk", "eggs"])
        assert json.loads(ok(await m.call("read", {"path": path(inst, "items")}))) == [
            "milk", "eggs"]
        assert json.loads(ok(await m.call("read", {"path": path(inst, "items", 1)}))) == "eggs"
        whole = json.loads(ok(await m.call("read", {"path": path(inst)})))
        assert whole["items"] == ["milk", "eggs"]
        assert whole["label"] == "Todo: 2 (None)"
        assert whole["add"] == {"$stream": whole["add"]["$stream"]}
        assert whole["add"]["$stream"].startswith("/")  # a path invoke takes
        # the three ways of writing a path
        for p in ({"@link": path(inst, "items")}, json.dumps({"@link": path(inst, "items")}),
                  {"@link": path(inst, "items"), "scope": Scope.of("alice").key}):
            assert json.loads(ok(await m.call("read", {"path": p}))) == ["milk", "eggs"]


async def test_read_truncates_a_huge_value_and_says_how_to_see_more():
    async with alice_world() as (_rt, inst, m):
        inst.result.key("items").set([f"item number {i}" for i in range(5000)])
        text = ok(await m.call("read", {"path": path(inst, "items")}))
        assert len(text) <= m.read_limit
        assert "truncated" in text and "5000 items" in text and "narrower path" in text
        assert text.startswith('["item number 0"')


async def test_read_of_a_stream_says_use_invoke():
    async with alice_world() as (_rt, inst, m):
        err(await m.call("read", {"path": path(inst, "add")}), "is a stream", "invoke")


async def test_read_of_a_missing_key_names_what_is_there():
    async with alice_world() as (_rt, inst, m):
        err(await m.call("read", {"path": path(inst, "itemz")}), "Nothing at", "items",
            "label", '{"path": "/')
        inst.result.key("items").set(["a"])
        err(await m.call("read", {"path": path(inst, "items", 3)}), "list of 1 items")
        err(await m.call("read", {"path": path(inst, "label", "x")}), "not an object")


@pytest.mark.parametrize("bad", [
    None, 3, "", "items", "abc/items", "/", "//x", [], {"link": "/abc"}, {"@link": 5},
    {"@link": "/abc", "extra": 1}, "{not json", '{"@link": 3}',
])
async def test_read_of_a_malformed_path_tells_the_model_the_form(bad):
    async with alice_world() as (_rt, _inst, m):
        text = err(await m.call("read", {"path": bad}))
        assert '{"path": "/<id>/<path>"}' in text


async def test_read_of_an_unknown_document_or_no_path_is_an_error():
    async with alice_world() as (_rt, _inst, m):
        err(await m.call("read", {"path": "/no-such-document/items"}), "no document")
        err(await m.call("read", {}), "`path` is missing", '{"path": "/')


async def test_read_of_another_users_cell_is_refused():
    async with alice_world() as (rt, inst, m):
        bob = rt.run(notes, {"owner": "bob"}, user="bob")
        bob.result.key("secret").set({"text": "bob's password"})
        secret = bob.result.key("secret").resolve()
        for p in (f"/{secret.id}", f"/{bob.result.id}/secret",
                  {"@link": f"/{secret.id}", "scope": secret.scope},
                  {"@link": f"/{bob.result.id}", "scope": Scope.of("bob").key}):
            for tool in ("read", "schema", "invoke", "pin", "updateArgument"):
                text = err(await m.call(tool, {"path": p, "name": "x", "updates": {"a": 1}}))
                assert "password" not in text and "nothing to see" not in text
        # the same pattern run for both: a bare path reaches alice's own copy, never bob's
        bob_todo = rt.run(todo, user="bob")
        bob_todo.result.key("items").set(["bob's item"])
        inst.result.key("items").set(["alice's item"])
        assert bob_todo.result.id == inst.result.id
        assert json.loads(ok(await m.call("read", {"path": path(inst, "items")}))) == [
            "alice's item"]


async def test_read_of_another_sessions_cell_is_refused():
    with anyio.fail_after(10):
        async with Runtime() as rt:
            mine = rt.run(session_notes, user="alice", session="s1")
            other = rt.run(session_notes, user="alice", session="s2")
            other.result.key("draft").set("s2's draft")
            mine.result.key("draft").set("s1's draft")
            pins = rt.run(host, user="alice").result.key("pins").resolve()
            m = Management(rt, scope=Scope.of("alice", "s1").key, pins=pins)
            assert json.loads(ok(await m.call("read", {"path": path(mine, "draft")}))) == (
                "s1's draft")
            err(await m.call("read", {"path": {"@link": path(other, "draft"),
                                               "scope": Scope.of("alice", "s2").key}}),
                "cannot be reached")
            # a dialog of alice's user scope cannot see a session at all
            m_user = Management(rt, scope=Scope.of("alice").key, pins=pins)
            text = err(await m_user.call("read", {"path": path(mine, "draft")}), "no document")
            assert "s1's draft" not in text and "s2's draft" not in text


async def test_another_space_is_never_reached():
    with anyio.fail_after(10):
        async with Runtime() as rt:
            elsewhere = rt.run(todo, space="other", user="alice")
            elsewhere.result.key("items").set(["other space"])
            pins = rt.run(host, user="alice").result.key("pins").resolve()
            m = Management(rt, space="default", scope=Scope.of("alice").key, pins=pins)
            err(await m.call("read", {"path": path(elsewhere, "items")}), "no document")


# ---------------------------------------------------------------------------- invoke


async def test_invoke_runs_the_handler_and_confirms():
    async with alice_world() as (_rt, inst, m):
        text = ok(await m.call("invoke", {"path": path(inst, "add"),
                                          "args": {"title": "eggs"}}))
        assert "add_item" in text
        assert inst.result.key("items").get() == ["eggs"]
        # through the stream's own document too
        stream_path = json.loads(ok(await m.call("read", {"path": path(inst)})))["add"]
        ok(await m.call("invoke", {"path": stream_path["$stream"], "args": {"title": "jam"}}))
        assert inst.result.key("items").get() == ["eggs", "jam"]


async def test_invoke_with_a_bad_event_says_what_the_stream_takes():
    async with alice_world() as (_rt, inst, m):
        err(await m.call("invoke", {"path": path(inst, "add"), "args": {"title": 5}}),
            "failed", "title")
        err(await m.call("invoke", {"path": path(inst, "add")}), "title")  # args: {}
        assert inst.result.key("items").get() == []


async def test_invoke_returns_the_handlers_error_and_nothing_is_kept():
    async with alice_world() as (_rt, inst, m):
        err(await m.call("invoke", {"path": path(inst, "fail"), "args": {}}),
            "the list is frozen", "nothing it did was kept")


async def test_invoke_of_a_cell_that_is_not_a_stream_is_an_error():
    async with alice_world() as (_rt, inst, m):
        err(await m.call("invoke", {"path": path(inst, "items"), "args": {}}),
            "is not a stream", "updateArgument", '{"path": "/<id>/<stream>"')
        err(await m.call("invoke", {"path": path(inst), "args": {}}), "is not a stream")


async def test_invoke_of_a_stopped_instances_stream_is_an_error():
    async with alice_world() as (rt, inst, m):
        add = path(inst, "add")
        stream_doc = json.loads(ok(await m.call("read", {"path": path(inst)})))["add"]["$stream"]
        rt.stop(inst)
        err(await m.call("invoke", {"path": stream_doc, "args": {"title": "x"}}),
            "not running")
        assert isinstance(await m.call("invoke", {"path": add, "args": {"title": "x"}}),
                          ToolOutcome)


async def test_links_in_invoke_args_never_reach_another_scope():
    async with alice_world() as (rt, inst, m):
        bob = rt.run(notes, {"owner": "bob"}, user="bob")
        secret = bob.result.key("secret").resolve()
        bob_link = {"@link": f"/{secret.id}", "scope": secret.scope}
        # where the schema asks for no link: refused before anything is sent
        err(await m.call("invoke", {"path": path(inst, "add"),
                                    "args": {"title": {"@link": path(inst, "items")}}}),
            "links are accepted only where the schema asks")
        # where it asks for one: only to what alice's dialog may reach
        err(await m.call("invoke", {"path": path(inst, "remember"),
                                    "args": {"target": bob_link}}), "cannot be reached")
        err(await m.call("invoke", {"path": path(inst, "remember"),
                                    "args": {"target": f"/{secret.id}"}}), "no document")
        assert inst.result.key("seen").get() == []
        # a path to alice's own cell is accepted, its scope made explicit
        items = inst.result.key("items").resolve()
        ok(await m.call("invoke", {"path": path(inst, "remember"),
                                   "args": {"target": f"/{items.id}"}}))
        ok(await m.call("invoke", {"path": path(inst, "remember"),
                                   "args": {"target": {"@link": f"/{items.id}"}}}))
        assert inst.result.key("seen").get() == [f"/{items.id} {items.scope}"] * 2


# ---------------------------------------------------------------------------- schema


async def test_schema_of_a_cell_a_stream_and_a_result():
    async with alice_world() as (_rt, inst, m):
        assert json.loads(ok(await m.call("schema", {"path": path(inst, "items")}))) == {
            "type": "array", "items": {"type": "string"}}
        assert json.loads(ok(await m.call("schema", {"path": path(inst, "items", 0)}))) == {
            "type": "string"}
        event = json.loads(ok(await m.call("schema", {"path": path(inst, "add")})))
        assert event["properties"]["title"]["type"] == "string"
        whole = json.loads(ok(await m.call("schema", {"path": path(inst)})))
        assert whole["type"] == "object"
        assert whole["properties"]["items"] == {"type": "array", "items": {"type": "string"}}
        assert whole["properties"]["label"] == {"type": "string"}  # inferred from the value
        assert whole["properties"]["add"]["asStream"] is True
        assert "title" in whole["properties"]["add"]["event"]["properties"]
        # the argument: its declared schema
        arg = json.loads(ok(await m.call("schema", {"path": f"/{inst.argument.id}"})))
        assert arg == ARG_SCHEMA


async def test_schema_of_a_missing_path_is_an_error():
    async with alice_world() as (_rt, inst, m):
        err(await m.call("schema", {"path": path(inst, "nope")}), "Nothing at",
            '{"path": "/<id>/<path>"}')


# ---------------------------------------------------------------------------- pins


async def test_pin_and_unpin():
    async with alice_world() as (_rt, inst, m):
        items = path(inst, "items")
        assert "Pinned" in ok(await m.call("pin", {"path": items, "name": "todo items"}))
        assert m.pins.get() == [{"path": items, "name": "todo items"}]
        assert m.pinned() == [{"path": items, "name": "todo items"}]
        # twice, in any spelling of the same cell: "Already pinned", nothing added
        for p in (items, {"@link": items}):
            assert "Already pinned" in ok(await m.call("pin", {"path": p, "name": "again"}))
        cell_itself = "/" + inst.result.key("items").resolve().id
        assert "Already pinned" in ok(await m.call("pin", {"path": cell_itself, "name": "x"}))
        assert len(m.pins.get()) == 1
        ok(await m.call("pin", {"path": path(inst, "label"), "name": "label"}))
        assert [p["name"] for p in m.pins.get()] == ["todo items", "label"]
        # unpin: by any spelling; an unknown path is "Not found", listing the pins
        assert "Unpinned" in ok(await m.call("unpin", {"path": {"@link": items}}))
        assert m.pins.get() == [{"path": path(inst, "label"), "name": "label"}]
        err(await m.call("unpin", {"path": items}), "Not found", "label")
        err(await m.call("unpin", {"path": "/never-pinned"}), "Not found")
        ok(await m.call("unpin", {"path": path(inst, "label")}))
        assert m.pins.get() == []


async def test_a_stale_pin_can_still_be_unpinned():
    async with alice_world() as (_rt, _inst, m):
        m.pins.set([{"path": "/gone-document/x", "name": "old"}])
        assert "unavailable" in m.available_cells()
        ok(await m.call("unpin", {"path": "/gone-document/x"}))
        assert m.pins.get() == []


async def test_bad_pin_calls_are_errors():
    async with alice_world() as (_rt, inst, m):
        items = path(inst, "items")
        err(await m.call("pin", {"path": items}), "name", '"name": "a short name"')
        err(await m.call("pin", {"path": items, "name": "  "}), "name")
        err(await m.call("pin", {"path": items, "name": "n" * 500}), "characters")
        err(await m.call("pin", {"path": path(inst, "nope"), "name": "x"}), "Nothing at")
        err(await m.call("pin", {"path": "items", "name": "x"}), "not a path")
        err(await m.call("unpin", {"path": 7}), "not a path")
        assert m.pins.get() == []


async def test_available_cells_lists_context_then_pins_with_paths_values_and_schemas():
    async with alice_world() as (_rt, inst, m):
        assert m.available_cells() == ""
        inst.result.key("items").set(["milk"])
        ok(await m.call("pin", {"path": path(inst, "label"), "name": "the label"}))
        ok(await m.call("pin", {"path": path(inst, "add"), "name": "adder"}))
        text = m.available_cells({"items": inst.result.key("items").resolve()},
                                 value_limit=200)
        assert text.startswith("# Available Cells\n## items\n")
        items = inst.result.key("items").resolve()
        assert f'path: "/{items.id}"' in text
        assert 'value: ["milk"]' in text and '"items": {"type": "string"}' in text
        assert "## the label" in text and f'path: "{path(inst, "label")}"' in text
        assert 'value: "Todo: 1 (None)"' in text
        assert "## adder" in text and "a stream: send it events with invoke" in text
        assert text.index("## items") < text.index("## the label") < text.index("## adder")
        inst.result.key("items").set(["x" * 100] * 100)
        assert "truncated" in m.available_cells({"items": items}, value_limit=200)


# ---------------------------------------------------------------------------- updateArgument


async def test_update_argument_merges_and_the_instance_recomputes():
    async with alice_world() as (_rt, inst, m):
        text = ok(await m.call("updateArgument", {"path": path(inst),
                                                  "updates": {"title": "Groceries"}}))
        assert "Groceries" in text
        assert inst.argument.get() == {"title": "Groceries", "config": None}
        assert inst.result.key("label").get() == "Groceries: 0 (None)"
        # dotted keys: a missing (null) parent is created...
        ok(await m.call("updateArgument", {"path": path(inst),
                                           "updates": {"config.theme": "dark"}}))
        assert inst.argument.get()["config"] == {"theme": "dark"}
        # ...and an existing one keeps its other fields; the argument's own path works too
        ok(await m.call("updateArgument", {"path": f"/{inst.argument.id}",
                                           "updates": {"config.size": 3}}))
        ok(await m.call("updateArgument", {"path": path(inst, "label"),
                                           "updates": {"config.theme": "light"}}))
        assert inst.argument.get() == {"title": "Groceries",
                                       "config": {"theme": "light", "size": 3}}
        assert inst.result.key("label").get() == "Groceries: 0 (light)"


async def test_bad_update_argument_calls_change_nothing():
    async with alice_world() as (_rt, inst, m):
        before = inst.argument.get()
        items = "/" + inst.result.key("items").resolve().id
        err(await m.call("updateArgument", {"path": items, "updates": {"title": "x"}}),
            "not the result or the argument of a running pattern", '"updates"')
        for updates in (None, {}, [1], "title=x"):
            err(await m.call("updateArgument", {"path": path(inst), "updates": updates}),
                "`updates` must be a non-empty object")
        err(await m.call("updateArgument", {"path": path(inst), "updates": {"colour": 1}}),
            "no argument 'colour'", "config", "title")
        err(await m.call("updateArgument", {"path": path(inst), "updates": {"config..x": 1}}),
            "dotted path")
        # a schema violation anywhere: nothing of the call is written
        err(await m.call("updateArgument", {"path": path(inst), "updates": {
            "config.theme": "dark", "title": 5}}), "changed nothing", "schema")
        err(await m.call("updateArgument", {"path": path(inst), "updates": {
            "title.deeper": "x"}}), "changed nothing", "no field 'deeper'")
        # a link the schema does not ask for
        err(await m.call("updateArgument", {"path": path(inst), "updates": {
            "title": {"@link": path(inst, "label")}}}), "links are accepted only")
        assert inst.argument.get() == before


async def test_update_argument_of_a_stopped_instance_is_an_error():
    async with alice_world() as (rt, inst, m):
        rt.stop(inst)
        err(await m.call("updateArgument", {"path": f"/{inst.argument.id}",
                                            "updates": {"title": "x"}}), "running pattern")


# ---------------------------------------------------------------------------- every bad call


async def test_unknown_tools_and_arguments_that_are_not_objects():
    async with alice_world() as (_rt, _inst, m):
        err(await m.call("write", {"path": "/x"}), "Unknown management tool", "read")
        err(await m.call(None, {}), "Unknown")  # type: ignore[arg-type]
        err(await m.call("read", ["/x"]), "takes an object", '{"path": "/')  # type: ignore[arg-type]


WEIRD: list[Any] = [None, 0, -1, 10**5000, 1.5, True, "", "/", "/\ud800", "/a/~2", "\x00",
                    [], {}, {"@link": "/" + "x" * 10_000}, {"@link": "/a", "scope": 3},
                    {"@link": "/a", "scope": "not a scope"}, {"@link": "/a", "scope": "user:"},
                    ["/a"], {"nested": {"@link": "/a"}}]


async def test_no_call_raises_whatever_the_arguments():
    async with alice_world() as (_rt, inst, m):
        targets = [*WEIRD, path(inst), path(inst, "add"), path(inst, "items")]
        for name in MANAGEMENT_TOOL_NAMES:
            for p in targets:
                for extra in WEIRD[:8]:
                    outcome = await m.call(name, {"path": p, "args": extra, "name": extra,
                                                  "updates": extra})
                    assert isinstance(outcome, ToolOutcome)
                    assert isinstance(outcome.text, str) and outcome.text
