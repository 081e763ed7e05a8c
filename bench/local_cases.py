"""The phrasings the local model is measured on (``bench/local_model.py``, issue 15).

Written before any method was tried and not tuned to one prompt: ordinary ways of asking
the bundled todo agent (``patterns/todo_agent.py``) for each of its tools, and plain
questions that need no tool. A case names the call it expects and every title that counts
as right (compared case-insensitively, trimmed, without a final period).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ADDS", "CHANGES", "LIST", "QUESTIONS", "ToolCase"]

LIST = [
    {"title": "milk", "done": False},
    {"title": "call mum", "done": False},
    {"title": "water the plants", "done": False},
    {"title": "pay rent", "done": True},
]
"""The list the agent holds when each case is asked (``removeItem`` and ``markDone`` name
items on it)."""


@dataclass(frozen=True)
class ToolCase:
    text: str
    tool: str
    titles: tuple[str, ...]
    done: bool | None = None  # markDone's flag, when the case implies one


ADDS = [
    ToolCase("add eggs", "addItem", ("eggs",)),
    ToolCase("Put 'buy bread' on my list.", "addItem", ("buy bread",)),
    ToolCase("remind me to book the dentist", "addItem",
             ("book the dentist", "book dentist", "book a dentist appointment")),
    ToolCase("Add cheese to the list please", "addItem", ("cheese",)),
    ToolCase("I need to renew my passport, can you add that?", "addItem",
             ("renew my passport", "renew passport", "renew the passport")),
    ToolCase("new item: fix the bike", "addItem", ("fix the bike", "fix bike")),
    ToolCase("Could you add 'send the invoice'?", "addItem", ("send the invoice",)),
    ToolCase("add apples", "addItem", ("apples",)),
    ToolCase("Don't let me forget to email Sam. Add it.", "addItem",
             ("email sam", "email Sam")),
    ToolCase("please add clean the kitchen", "addItem",
             ("clean the kitchen", "clean kitchen")),
]
"""Ten plain requests to add something (the issue's target: at least 8 right)."""

CHANGES = [
    ToolCase("remove milk", "removeItem", ("milk",)),
    ToolCase("Take 'call mum' off my list.", "removeItem", ("call mum",)),
    ToolCase("delete water the plants", "removeItem", ("water the plants",)),
    ToolCase("I don't need milk anymore, remove it", "removeItem", ("milk",)),
    ToolCase("Drop 'pay rent' from the list", "removeItem", ("pay rent",)),
    ToolCase("mark milk as done", "markDone", ("milk",), True),
    ToolCase("I called mum. Mark it done.", "markDone", ("call mum",), True),
    ToolCase("done: water the plants", "markDone", ("water the plants",), True),
    ToolCase("Tick off 'milk'", "markDone", ("milk",), True),
    ToolCase("Reopen 'pay rent', it is not done", "markDone", ("pay rent",), False),
]
"""Ten requests for the other two tools, on the items of ``LIST``."""

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Tell me a short joke.",
    "What is 7 times 8?",
    "Who wrote Romeo and Juliet?",
    "Hi! How are you today?",
    "What colour is the sky on a clear day?",
    "Can you explain what a todo list is for?",
    "What is the boiling point of water in Celsius?",
    "Give me one tip for sleeping better.",
    "What is on my list right now?",
    "How many items are still open?",
    "What day comes after Monday?",
    "Translate 'thank you' into Spanish.",
    "Why do leaves turn red in autumn?",
    "What is the largest ocean on Earth?",
    "Thanks, that's all for now.",
    "Which planet is closest to the Sun?",
    "Write a haiku about rain.",
    "What can you do for me?",
]
"""Twenty plain questions: none needs a tool (the first ten are the issue's "plain questions
asked of the same agent"; all twenty are checked for degenerate replies)."""
