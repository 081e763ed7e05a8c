"""with_tools: methods as tools, state replacement, clash prefixes, async methods, bad
arguments, except_, with_blocked_function, with_static_tools."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import anyio
import pytest
from pydantic import BaseModel

from runtime import LLM
from runtime.conversation.object_tools import method_specs
from runtime.llm import Reply, ScriptedModel, call

pytestmark = pytest.mark.anyio
LIMIT = 10


class Notes:
    """A notebook the model can write in."""

    def __init__(self, lines: tuple[str, ...] = ()):
        self.lines = lines

    def add(self, line: str) -> Notes:
        """Append a line; returns the new notebook (it replaces this one as the state)."""
        return Notes((*self.lines, line))

    def count(self) -> int:
        """How many lines there are."""
        return len(self.lines)

    def _private(self) -> None:
        raise AssertionError("never a tool")


class Todo:
    """A todo list."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, item: str) -> str:
        self.items.append(item)
        return f"added {item}"

    async def due(self, when: date, urgent: bool = False) -> str:
        """An async method: when it is due."""
        await anyio.lowlevel.checkpoint()
        return f"{when.isoformat()} urgent={urgent}"


class Point(BaseModel):
    x: int
    y: int


@dataclass
class Plane:
    """Points on a plane."""

    points: tuple[Point, ...] = ()

    def put(self, point: Point) -> Plane:
        return Plane((*self.points, point))


def results(done: LLM) -> list[tuple[str, bool]]:
    return [(b.content, b.is_error) for m in done.messages for b in m.blocks
            if b.kind == "tool_result"]


async def test_the_issues_usage_a_method_returning_its_type_replaces_the_state() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("add", {"line": "milk"})]),
                           Reply(tool_calls=[call("add", {"line": "eggs"})]),
                           Reply(tool_calls=[call("count")]), "There are 2 notes."])
    base = LLM(model=model).with_system_prompt("Be brief.").with_tools(Notes())
    with anyio.fail_after(LIMIT):
        done = await base.with_prompt("Note 'milk', then count.").loop(max_steps=8)
    assert results(done)[-1] == ("2", False)
    assert done._state.objects[0].obj.lines == ("milk", "eggs")
    assert base._state.objects[0].obj.lines == ()  # the value it came from keeps its state
    tools = {t.name: t for t in model.requests[0].tools}
    assert set(tools) == {"add", "count"}
    assert tools["add"].description.startswith("Append a line")
    assert tools["add"].input_schema["required"] == ["line"]


async def test_clashing_method_names_get_type_prefixed() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("Notes_add", {"line": "a"}),
                                             call("Todo_add", {"item": "b"})]), "ok"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Notes()).with_tools(Todo()).with_prompt(
            "x").loop()
    names = {t.name for t in model.requests[0].tools}
    assert names == {"Notes_add", "Todo_add", "count", "due"}
    assert results(done)[1] == ("added b", False)
    assert done._state.objects[0].obj.lines == ("a",)


async def test_an_async_method_with_typed_arguments() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("due", {"when": "2026-12-24",
                                                          "urgent": True})]), "ok"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Todo()).with_prompt("x").loop()
    assert results(done) == [("2026-12-24 urgent=True", False)]
    schema = {t.name: t for t in model.requests[0].tools}["due"].input_schema
    assert schema["properties"]["when"] == {"format": "date", "type": "string"}


async def test_bad_arguments_come_back_as_an_error_the_model_can_act_on() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("add", {"line": 3}), call("add", {}),
                                             call("due", {"when": "not a date"}),
                                             call("nope")]),
                           Reply(tool_calls=[call("add", {"line": "ok"})]), "fixed"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Notes()).with_tools(Todo(), except_=("add",)
                                                                  ).with_prompt("x").loop()
    (wrong_type, err1), (missing, err2), (bad_date, err3), (unknown, err4), ok = results(done)
    assert err1 and err2 and err3 and err4 and not ok[1]
    assert "3 is not of type 'string'" in wrong_type and "JSON Schema" in wrong_type
    assert "'line' is a required property" in missing
    assert "Invalid arguments for tool 'due'" in bad_date and "date" in bad_date
    assert "no tool 'nope'" in unknown
    assert done.last_reply == "fixed"


async def test_pydantic_and_dataclass_parameters_and_state() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("put", {"point": {"x": 1, "y": 2}})]), "ok"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Plane()).with_prompt("x").loop()
    assert done._state.objects[0].obj == Plane((Point(x=1, y=2),))
    assert '"points":[{"x":1,"y":2}]' in results(done)[0][0]  # the new state, as JSON


async def test_except_blocked_functions_and_rebinding_the_same_type() -> None:
    llm = LLM(model=ScriptedModel()).with_tools(Todo(), except_=("due",))
    assert "## due" not in llm.tools and "## add" in llm.tools
    blocked = llm.with_tools(Notes()).with_blocked_function("Notes", "count")
    assert "## count" not in blocked.tools and "## Notes_add" in blocked.tools
    rebound = blocked.with_tools(Notes(("x",)))
    assert len(rebound._state.objects) == 2  # the second Notes superseded the first
    with pytest.raises(Exception, match="no public method called"):
        llm.with_tools(Notes(), except_=("missing",))


async def test_a_method_that_cannot_be_a_tool_is_refused_with_the_fix() -> None:
    class Bad:
        def run(self, *args: str) -> None: ...

    with pytest.raises(TypeError, match=r"Bad.run takes \*args.*except_=\('run',\)"):
        LLM(model=ScriptedModel()).with_tools(Bad())
    assert "model_dump" not in method_specs(Point)  # pydantic's machinery is not a tool


async def test_static_tools_serve_the_same_tools_through_two() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("list_methods")]),
                           Reply(tool_calls=[call("call_method", {"method": "add",
                                                                  "arguments": {"line": "x"}}),
                                             call("call_method", {"method": "add",
                                                                  "arguments": {"line": 1}})]),
                           "ok"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Notes()).with_static_tools().with_prompt(
            "x").loop()
    assert {t.name for t in model.requests[0].tools} == {"list_methods", "call_method"}
    listing, added, bad = results(done)
    assert '"name":"add"' in listing[0] and not added[1]
    assert bad[1] and "1 is not of type 'string'" in bad[0]
    assert done._state.objects[0].obj.lines == ("x",)
