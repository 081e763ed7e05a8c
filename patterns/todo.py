"""A todo list: the smallest complete pattern.

    from runtime import Runtime
    from patterns.todo import todo

    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "Groceries"}, user="alice")
        await inst.send("add", {"title": "milk"})
        inst.result.key("label").get()        # "Groceries: 1 open of 1"

Items live in a user-scoped cell, so each user has their own list; the handlers are the only
writers, and every derived value (``open``, ``label``) is a computation that reruns only when
what it read changed.
"""

from __future__ import annotations

from pydantic import BaseModel

from runtime import Cell, cell, computed, handler, lift, pattern


class Item(BaseModel):
    title: str
    done: bool = False


ITEMS = {"type": "array", "items": Item.model_json_schema()}


class AddEvent(BaseModel):
    title: str


class ToggleEvent(BaseModel):
    index: int


@handler
def add(event: AddEvent, items: Cell) -> None:
    """Append an open item."""
    items.push({"title": event.title, "done": False})


@handler
def toggle(event: ToggleEvent, items: Cell) -> None:
    """Flip an item between open and done."""
    item = items.key(event.index)
    item.key("done").set(not item.key("done").get())


@handler
def clear_done(event: dict, items: Cell) -> None:
    """Drop every finished item."""
    items.set([i for i in items.get() if not i["done"]])


@pattern
def todo(title: str = "Todo"):
    items = cell([], schema=ITEMS, scope="user", name="items")
    open_count = lift(lambda xs: sum(not x["done"] for x in xs))(items)
    total = lift(len)(items)
    label = computed(lambda: f"{title.get()}: {open_count.get()} open of {total.get()}")
    return {
        "title": title,
        "items": items,
        "open": open_count,
        "label": label,
        "add": add(items=items),
        "toggle": toggle(items=items),
        "clear_done": clear_done(items=items),
    }
