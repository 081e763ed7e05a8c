"""A todo agent: a model that edits a list the caller owns, through handler tools.

What it shows: tools that write the caller's state. ``addItem``, ``removeItem`` and
``markDone`` are ``@handler``s bound to the ``items`` cell; the dialog routes each tool call
to its handler, which runs in its own transaction like any other event. Their event models
(pydantic) are the tools' input schemas, so a call with bad arguments is answered with an
error before any handler runs; a call the handler refuses (removing an item that is not on
the list) raises ``ToolError``, which the model gets back as an error tool result with
exactly that message, and the turn goes on. The list is also the dialog's ``context``, so
the model sees it, as it is at each call, under ``# Available Cells``.

``builtin_tools=False``: the three tools are all the model can do (no generic management
tools), so what it may change is exactly what the handlers allow.

Scopes: ``items`` is per user (``scope="user"``), ``messages`` per session
(``scope="session"``): two sessions of one user edit the same list in two conversations.

Run it (offline here; pass a real model to ``Runtime(model=...)``)::

    import anyio
    from runtime import Runtime
    from runtime.llm import Reply, ScriptedModel, call
    from patterns.todo_agent import todo_agent

    async def main():
        model = ScriptedModel([Reply(tool_calls=[call("addItem", {"title": "milk"})]),
                               "Added milk."])
        async with Runtime(model=model) as rt:
            inst = rt.run(todo_agent, user="ada", session="s1")
            await inst.send("send", "remind me to buy milk")
            await rt.settled()
            print(inst.result.key("items").get())   # [{'title': 'milk', 'done': False}]

    anyio.run(main)

The same streams the model calls are outputs too, so a UI edits the list through the same
code (``await inst.send("addItem", {"title": "eggs"})``). Outputs: ``items``, ``open``
(how many are not done), ``messages``, ``pending``, ``partial``, ``error``, ``usage``,
``stop_reason`` (why the last turn's last reply stopped: ``"max_tokens"`` means cut short),
``dropped``, ``send``, ``cancel``, ``addItem``, ``removeItem``, ``markDone``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from runtime import Cell, cell, handler, lift, llm_dialog, pattern
from runtime.llm import ToolError

__all__ = ["ITEMS", "AddItem", "Item", "MarkDone", "RemoveItem", "todo_agent"]

SYSTEM = (
    "You keep the user's todo list, shown under 'items' below. Change it only with your "
    "tools: addItem, removeItem and markDone, naming items by their title. Say briefly "
    "what you changed."
)


class Item(BaseModel):
    title: str
    done: bool = False


ITEMS = {"type": "array", "items": Item.model_json_schema()}


class AddItem(BaseModel):
    title: str = Field(pattern=r"\S", description="The new item's title (not blank)")


class RemoveItem(BaseModel):
    title: str = Field(description="The title of the item to remove, as the list shows it")


class MarkDone(BaseModel):
    title: str = Field(description="The title of the item, as the list shows it")
    done: bool = Field(True, description="False reopens a finished item")


def _index(items: list[dict], title: str) -> int | None:
    """The index of the item titled ``title`` (case and surrounding spaces ignored)."""
    wanted = title.strip().casefold()
    return next((i for i, x in enumerate(items) if x["title"].strip().casefold() == wanted),
                None)


def _find(items: list[dict], title: str) -> int:
    """Like ``_index``, but a missing item is a ``ToolError`` that lists what is there."""
    index = _index(items, title)
    if index is None:
        titles = ", ".join(repr(x["title"]) for x in items) or "none: the list is empty"
        raise ToolError(f"No item titled {title!r} is on the list. Its items are: {titles}.")
    return index


@handler
def add_item(event: AddItem, items: Cell) -> None:
    """Append an open item; a title already on the list is refused."""
    if _index(items.get(), event.title) is not None:
        raise ToolError(f"{event.title!r} is already on the list: nothing added.")
    items.push({"title": event.title.strip(), "done": False})


@handler
def remove_item(event: RemoveItem, items: Cell) -> None:
    """Drop an item."""
    current = items.get()
    index = _find(current, event.title)
    items.set(current[:index] + current[index + 1:])


@handler
def mark_done(event: MarkDone, items: Cell) -> None:
    """Mark an item done (or open again with ``done: false``)."""
    index = _find(items.get(), event.title)
    items.key(index).key("done").set(event.done)


@pattern(name="bundled.todo-agent")
def todo_agent():
    items = cell([], schema=ITEMS, scope="user", name="items")
    messages = cell([], scope="session", name="messages")
    add, remove, done = add_item(items=items), remove_item(items=items), mark_done(items=items)
    chat = llm_dialog(
        messages,
        system=SYSTEM,
        tools={
            "addItem": {"description": "Add an open item to the list.", "handler": add},
            "removeItem": {"description": "Remove an item from the list.", "handler": remove},
            "markDone": {"description": "Mark an item done, or open again.", "handler": done},
        },
        context={"items": items},
        builtin_tools=False,  # these three tools are the model's whole surface
        name="chat",
    )
    return {
        "items": items,
        "open": lift(lambda xs: sum(not x["done"] for x in xs))(items),
        "messages": messages,
        "pending": chat.pending,
        "partial": chat.partial,
        "error": chat.error,
        "usage": chat.usage,
        "stop_reason": chat.stop_reason,
        "dropped": chat.dropped,
        "send": chat.add_message,
        "cancel": chat.cancel_generation,
        "addItem": add,
        "removeItem": remove,
        "markDone": done,
    }
