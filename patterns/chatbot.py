"""A chatbot: one conversation per session, with the user's notes shown to the model.

What it shows: the smallest useful ``llm_dialog``. The history is a per-session
``messages`` cell the pattern owns (the dialog appends to it); a per-user ``notes`` cell is
passed as ``context``, so every model call sees its current value under
``# Available Cells`` in the system prompt (edit the notes between turns and the next call
sees the edit). It has no tools at all (``builtin_tools=False``): the model reads the notes
but cannot change them.

Run it (offline here, on a scripted model; pass ``model="claude-sonnet-4-5"`` or
``Runtime(model=...)`` with a real one)::

    import anyio
    from runtime import Runtime
    from runtime.llm import ScriptedModel
    from patterns.chatbot import chatbot

    async def main():
        async with Runtime(model=ScriptedModel(["Hello, Ada."])) as rt:
            inst = rt.run(chatbot, {"system": "You are terse."}, user="ada", session="s1")
            await inst.send("set_notes", "Call me Ada.")
            await inst.send("send", "hi")            # starts a turn
            await rt.settled()                       # ... and this waits for its end
            print(inst.result.key("messages").get()[-1]["blocks"][0]["text"])

    anyio.run(main)

It needs both ``user=`` (the notes are the user's, shared by all their sessions) and
``session=`` (the history is the session's). Outputs:

- ``messages``: the history, the LLM port's ``Message`` JSON (``{"role", "blocks"}``);
- ``notes`` and ``set_notes`` (a stream taking a string): the context the model is shown;
- ``pending`` (a turn is running), ``partial`` (text streamed so far), ``error`` (the last
  turn's error or None), ``usage`` (tokens summed over every model call), ``stop_reason``
  (why the last turn's last reply stopped: ``"max_tokens"`` means it was cut short),
  ``dropped`` (messages ignored because a turn was running);
- ``send`` (a string or a user message: starts a turn) and ``cancel`` (ends the running
  turn at once; a reply arriving later lands nowhere).

``system`` is read once, when the instance is built (``llm_dialog`` takes the prompt as a
plain string). Like every argument it is part of the instance's identity: another prompt is
another conversation, with another set of notes.
"""

from __future__ import annotations

from runtime import Cell, cell, handler, llm_dialog, pattern

__all__ = ["DEFAULT_SYSTEM", "MESSAGES", "chatbot"]

DEFAULT_SYSTEM = (
    "You are a helpful assistant. Answer briefly and plainly. The user's notes about "
    "themselves are under 'notes' below: take them into account."
)

MESSAGES = {"type": "array", "items": {"type": "object", "required": ["role", "blocks"]}}
"""The history's schema: the port's messages as JSON (the dialog writes them)."""


@handler
def set_notes(event: str, notes: Cell) -> None:
    """Replace the user's notes (shown to the model from its next call on)."""
    notes.set(event)


@pattern(name="bundled.chatbot")
def chatbot(system: str = DEFAULT_SYSTEM):
    messages = cell([], schema=MESSAGES, scope="session", name="messages")
    notes = cell("", schema={"type": "string"}, scope="user", name="notes")
    chat = llm_dialog(messages, system=system.get(), context={"notes": notes},
                      builtin_tools=False, name="chat")
    return {
        "messages": messages,
        "notes": notes,
        "set_notes": set_notes(notes=notes),
        "pending": chat.pending,
        "partial": chat.partial,
        "error": chat.error,
        "usage": chat.usage,
        "stop_reason": chat.stop_reason,
        "dropped": chat.dropped,
        "send": chat.add_message,
        "cancel": chat.cancel_generation,
    }
