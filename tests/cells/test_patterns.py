"""The shipped patterns behave as their docs say."""

from __future__ import annotations

import pytest

from patterns.todo import todo
from runtime import Runtime, SchemaError

pytestmark = pytest.mark.anyio


async def test_todo_add_toggle_clear():
    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "Groceries"}, user="alice")
        await inst.send("add", {"title": "milk"})
        await inst.send("add", {"title": "eggs"})
        await inst.send("toggle", {"index": 0})
        assert inst.result.key("label").get() == "Groceries: 1 open of 2"
        await inst.send("clear_done", {})
        assert inst.result.key("items").get() == [{"title": "eggs", "done": False}]


async def test_todo_is_per_user_and_validates_events():
    async with Runtime() as rt:
        alice = rt.run(todo, {"title": "T"}, user="alice")
        bob = rt.run(todo, {"title": "T"}, user="bob")
        await alice.send("add", {"title": "milk"})
        assert bob.result.key("items").get() == []
        with pytest.raises(SchemaError, match="title"):
            await alice.send("add", {"name": "no title"})
        assert alice.result.key("items").get() == [{"title": "milk", "done": False}]
