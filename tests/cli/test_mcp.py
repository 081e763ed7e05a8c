"""``celldialog mcp``: listed and called by the official SDK's stdio client."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from .harness import celldialog

pytestmark = pytest.mark.anyio


async def test_a_patterns_handlers_are_tools_an_mcp_client_can_call(
        env: dict[str, str], workdir: Path) -> None:
    db = workdir / "todo.db"
    params = StdioServerParameters(command=celldialog(),
                                   args=["mcp", "todo", "--user", "u", "--store", str(db)],
                                   env=env, cwd=workdir)
    with (workdir / "stderr.txt").open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert sorted(tools) == ["add", "clear_done", "toggle"]
            assert tools["add"].input_schema["required"] == ["title"]
            assert tools["add"].description.startswith("Append an open item.")

            added = await session.call_tool("add", {"title": "milk"})
            assert not added.is_error
            assert added.structured_content == {
                "title": "Todo", "items": [{"title": "milk", "done": False}], "open": 1,
                "label": "Todo: 1 open of 1"}
            toggled = await session.call_tool("toggle", {"index": 0})
            assert toggled.structured_content["open"] == 0

            refused = await session.call_tool("add", {"name": "eggs"})
            assert refused.is_error
            assert "'title' is a required property" in refused.content[0].text
    assert "Traceback" not in (workdir / "stderr.txt").read_text()

    # the server ran in a Runtime on the store: the calls' writes are there
    from runtime import Runtime
    from runtime.cli.loading import load_pattern

    async with Runtime(store=f"sqlite:///{db}") as rt:
        inst = rt.run(load_pattern("todo"), user="u")
        assert inst.result.key("items").get() == [{"title": "milk", "done": True}]


async def test_a_handler_taking_a_string_is_wrapped(env: dict[str, str],
                                                    workdir: Path) -> None:
    params = StdioServerParameters(
        command=celldialog(), args=["mcp", "chatbot", "--user", "u", "--session", "s"],
        env=env, cwd=workdir)
    with (workdir / "stderr.txt").open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            # send and cancel take any event: not tools; set_notes takes a string
            assert sorted(tools) == ["set_notes"]
            assert tools["set_notes"].input_schema == {
                "type": "object", "properties": {"event": {"type": "string"}},
                "required": ["event"]}
            done = await session.call_tool("set_notes", {"event": "Call me Ada."})
            assert not done.is_error
            assert done.structured_content["notes"] == "Call me Ada."
            assert done.structured_content["messages"] == []
