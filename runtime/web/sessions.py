"""Each user's list of sessions, kept in the runtime's own store.

The server names sessions (``identity.new_id``) and keeps, per user, the list it made: a
session id in a URL is served only if it is on the requesting user's list, so a guessed or
another user's id is a 404, and nobody makes instances by inventing ids. The list is a
pattern like any other (``sessions_index``, one instance per user), so it persists where the
conversations do and survives a restart with them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..cells import Cell, cell, handler, pattern

__all__ = ["SESSION_LIST", "TITLE_CHARS", "NewSession", "sessions_index", "title_of"]

TITLE_CHARS = 60

SESSION_LIST = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["id", "title", "created"],
        "properties": {"id": {"type": "string"}, "title": {"type": "string"},
                       "created": {"type": "number"}},
    },
}
"""The list's schema: newest first."""


class NewSession(BaseModel):
    id: str = Field(pattern=r"^[A-Za-z0-9_-]{16,64}$")
    created: float


class Title(BaseModel):
    id: str
    title: str = Field(max_length=TITLE_CHARS)


@handler
def add_session(event: NewSession, sessions: Cell) -> None:
    """Put a new session first (an id already listed is left where it is)."""
    current = sessions.get()
    if not any(s["id"] == event.id for s in current):
        sessions.set([{"id": event.id, "title": "", "created": event.created}, *current])


@handler
def name_session(event: Title, sessions: Cell) -> None:
    """Give a session its title, once (its first message names it)."""
    current = sessions.get()
    for index, s in enumerate(current):
        if s["id"] == event.id and not s["title"]:
            sessions.key(index).key("title").set(event.title)


@pattern(name="celldialog.web.sessions")
def sessions_index() -> dict[str, Any]:
    sessions = cell([], schema=SESSION_LIST, scope="user", name="sessions")
    return {"sessions": sessions, "add": add_session(sessions=sessions),
            "name": name_session(sessions=sessions)}


def title_of(event: Any) -> str:
    """A session's title from the first message sent in it: its text, on one line, cut."""
    if isinstance(event, dict):  # a user message: its text blocks
        blocks = event.get("blocks")
        event = " ".join(b.get("text", "") for b in blocks if isinstance(b, dict)) if \
            isinstance(blocks, list) else event.get("text", "")
    text = " ".join(str(event).split()) if isinstance(event, str) else ""
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
