"""Evals of patterns with a dialog: what models get wrong with ``llm_dialog`` (the llmDialog
behaviour this project reproduces: CommonTools' llmDialog, https://github.com/commontoolsinc/labs).

- ``own-tools-over-generic``: with the six management tools on, the model should still
  use the pattern's own ``addItem`` (models tend to reach for ``read``/``invoke``/...);
- ``handler-changes-state``: the caller's list changes only through the handler tools, so
  a model that says "added" without calling one changed nothing;
- ``presents-result``: a dialog with a ``result_schema`` wants ``presentResult``, not the
  answer in prose;
- ``recovers-from-tool-error``: a tool answers with an error naming what would work; the
  model should read it and call again, not give up.
"""

from __future__ import annotations

from pydantic import BaseModel

from patterns.extract import extract
from patterns.todo_agent import todo_agent
from runtime import Cell, cell, handler, llm_dialog, pattern
from runtime.builtins.management import MANAGEMENT_TOOL_NAMES
from runtime.evals import PatternEval, PatternRun, tool_calls
from runtime.llm import ToolError


class AddItem(BaseModel):
    title: str


@handler
def add_item(event: AddItem, items: Cell) -> None:
    """Put an item on the shopping list."""
    items.push(event.title.strip())


@pattern(name="evals.shopping")
def shopping():
    """A shopping list whose dialog keeps the management tools (builtin_tools on)."""
    items = cell([], scope="user", name="items")
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages, system="You keep the user's shopping list.",
                      tools={"addItem": {"description": "Put an item on the shopping list.",
                                         "handler": add_item(items=items)}},
                      context={"items": items}, name="chat")
    return {"items": items, "messages": messages, "send": chat.add_message,
            "error": chat.error, "usage": chat.usage}


class OwnToolsOverGeneric(PatternEval):
    name = "own-tools-over-generic"
    pattern = shopping
    prompt = "Put milk on my shopping list."

    def check(self, run: PatternRun) -> None:
        generic = [c.name for c in tool_calls(run) if c.name in MANAGEMENT_TOOL_NAMES]
        assert not generic, f"used the generic management tool(s) {generic} instead of addItem"
        items = [str(x).casefold() for x in run.value("items")]
        assert items == ["milk"], f"the list should hold milk, it holds {run.value('items')}"


class HandlerChangesState(PatternEval):
    name = "handler-changes-state"
    pattern = todo_agent
    prompt = "Remind me to buy milk and to call mum."

    def check(self, run: PatternRun) -> None:
        titles = [x["title"].casefold() for x in run.value("items")]
        assert len(titles) == 2 and any("milk" in t for t in titles) and \
            any("mum" in t for t in titles), (
                f"the list should hold milk and mum (only addItem changes it), it holds "
                f"{titles}")


class PresentsResult(PatternEval):
    name = "presents-result"
    pattern = extract
    prompt = "Write to Ada Lovelace at ada@example.org, or call her on +44 20 7946 0000."

    def check(self, run: PatternRun) -> None:
        result = run.value("result")
        assert result is not None, "never called presentResult: the result is empty"
        assert result.get("name") == "Ada Lovelace", f"name: {result.get('name')!r}"
        assert result.get("email") == "ada@example.org", f"email: {result.get('email')!r}"
        assert "7946" in str(result.get("phone")), f"phone: {result.get('phone')!r}"


FREE_TIMES = ("20:00", "21:30")


class Booking(BaseModel):
    time: str


@handler
def book_table(event: Booking, bookings: Cell) -> None:
    """Book a table; a time that is taken is refused with the free times."""
    if event.time.strip() not in FREE_TIMES:
        raise ToolError(f"{event.time} is fully booked. Free times tonight: "
                        f"{', '.join(FREE_TIMES)}.")
    bookings.push(event.time.strip())


@pattern(name="evals.restaurant")
def restaurant():
    """A booking desk whose tool refuses taken times, saying which are free."""
    bookings = cell([], scope="session", name="bookings")
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages, system="You book tables at the restaurant with bookTable.",
                      tools={"bookTable": {"description": "Book a table at a time (HH:MM).",
                                           "handler": book_table(bookings=bookings)}},
                      builtin_tools=False, name="chat")
    return {"bookings": bookings, "messages": messages, "send": chat.add_message,
            "error": chat.error, "usage": chat.usage}


class RecoversFromToolError(PatternEval):
    name = "recovers-from-tool-error"
    pattern = restaurant
    prompt = ("Book me a table for 19:00 tonight. If 19:00 is taken, book the first free "
              "time after it instead.")

    def check(self, run: PatternRun) -> None:
        bookings = run.value("bookings")
        assert bookings == ["20:00"], (
            f"should have booked 20:00 (the 19:00 error lists the free times), booked "
            f"{bookings}")
