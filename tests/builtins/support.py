"""What the builtins' tests share: a todo-agent pattern, a model held open, history checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from pydantic import BaseModel

from runtime import cell, handler, llm_dialog, pattern
from runtime.llm import Message, Request, ScriptedModel, StreamEvent

from ..llm.test_steps import assert_valid_for_both_providers

__all__ = ["Gate", "assert_valid_history", "history", "todo_agent"]


class AddItem(BaseModel):
    title: str


@handler
def add_item(event: AddItem, items):
    items.push(event.title)


@pattern(name="support-todo-agent")
def todo_agent():
    items = cell([], scope="user", name="items")
    messages = cell([], scope="session", name="messages")
    add = add_item(items=items)
    chat = llm_dialog(
        messages=messages,
        system="You keep the user's todo list.",
        tools={"addItem": {"description": "Add an item", "handler": add}},
        context={"items": items},
    )
    return {"items": items, "messages": messages, "pending": chat.pending, "add": add,
            "send": chat.add_message, "cancel": chat.cancel_generation, "error": chat.error,
            "dropped": chat.dropped, "partial": chat.partial, "result": chat.result}


class Gate:
    """A model whose replies wait until the test opens the gate (a reply held open)."""

    provider = "scripted"
    name = "gate"

    def __init__(self, script: list[Any]) -> None:
        self.inner = ScriptedModel(script)
        self.opened = anyio.Event()
        self.started = anyio.Event()

    @property
    def requests(self) -> list[Request]:
        return self.inner.requests

    async def generate(self, request: Request) -> Any:  # pragma: no cover - streams only
        raise NotImplementedError

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        self.started.set()
        await self.opened.wait()
        async for event in self.inner.stream(request):
            yield event


def history(inst: Any, key: str = "messages") -> list[Message]:
    return [Message.model_validate(m) for m in inst.result.key(key).get()]


def assert_valid_history(inst: Any, key: str = "messages") -> list[Message]:
    """The stored history is one every provider accepts (each call answered once, at once)."""
    messages = history(inst, key)
    assert_valid_for_both_providers(messages)
    ids = [b.id for m in messages for b in m.tool_uses()]
    assert len(ids) == len(set(ids)), f"duplicate tool call ids: {ids}"
    return messages
