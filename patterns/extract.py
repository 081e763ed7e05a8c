"""Structured extraction: text in, a validated object out, through ``presentResult``.

What it shows: a dialog used as a function. ``result_schema`` (here derived from the
pydantic model ``Contact``) makes the dialog advertise one tool, ``presentResult``, whose
input schema is that schema; ``builtin_tools=False`` drops the management tools, so it is
the *only* tool the model sees. The dialog checks the call's arguments against the schema
(a call that does not fit gets an error result naming what is wrong, and the model may try
again) and stores the last valid one in ``result``, in the same commit as the tool's result
message. The model then ends the turn with a short text reply.

Run it (offline here; pass a real model to ``Runtime(model=...)``)::

    import anyio
    from runtime import Runtime
    from runtime.llm import Reply, ScriptedModel, call
    from patterns.extract import extract

    async def main():
        model = ScriptedModel([
            Reply(tool_calls=[call("presentResult", {"name": "Ada Lovelace",
                                                     "email": "ada@example.org"})]),
            "Done."])
        async with Runtime(model=model) as rt:
            inst = rt.run(extract, session="s1")
            await inst.send("send", "Write to Ada Lovelace at ada@example.org")
            await rt.settled()
            print(inst.result.key("result").get())
            # {'name': 'Ada Lovelace', 'email': 'ada@example.org'}

    anyio.run(main)

``contact`` is the same result parsed into a ``Contact`` (as a dict with every field, or
None before the first result). Each session extracts on its own (``session=`` is needed).
Outputs: ``result``, ``contact``, ``messages``, ``send``, ``pending``, ``error``.

To extract something else, copy the pattern and swap the model: the schema, and so the
tool, follow it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from runtime import cell, lift, llm_dialog, pattern

__all__ = ["RESULT_SCHEMA", "SYSTEM", "Contact", "extract"]


class Contact(BaseModel):
    """A person's contact details, as the text gives them."""

    name: str = Field(description="The person's full name")
    email: str | None = Field(None, description="An email address, if the text gives one")
    phone: str | None = Field(None, description="A phone number as written, if given")


RESULT_SCHEMA = Contact.model_json_schema()

SYSTEM = (
    "Extract the contact details from the user's text. Call presentResult once with what "
    "the text says; leave out any field it does not give, never guess. Then reply 'Done.'"
)


def _parse(result: Any) -> dict[str, Any] | None:
    return None if result is None else Contact.model_validate(result).model_dump()


@pattern(name="bundled.extract")
def extract():
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages, system=SYSTEM, builtin_tools=False,
                      result_schema=RESULT_SCHEMA, name="extract")
    return {
        "result": chat.result,
        "contact": lift(_parse)(chat.result),
        "messages": messages,
        "send": chat.add_message,
        "pending": chat.pending,
        "error": chat.error,
    }
