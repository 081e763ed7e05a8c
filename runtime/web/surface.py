"""What of an instance's result the page shows, and in which part.

Every cell of the result is sent (its streams are inputs, not state). A result that has a
dialog's parts (``send`` or ``add_message``, ``messages``, ...) is shown as a chat; its
other cells (a todo agent's ``items``) are the pattern's ``state``, shown beside it. The
names follow the bundled patterns, the same ones ``celldialog chat`` drives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..cells import Cell, Instance

__all__ = ["CHAT_PARTS", "DIALOG_KEYS", "surface"]

CHAT_PARTS: dict[str, tuple[str, ...]] = {
    "send": ("send", "add_message"),
    "cancel": ("cancel", "cancel_generation"),
    "messages": ("messages",),
    "pending": ("pending",),
    "partial": ("partial",),
    "error": ("error",),
    "stop_reason": ("stop_reason",),
    "dropped": ("dropped",),
}
"""A chat part -> the result names that play it, first found wins (streams for ``send``
and ``cancel``, cells for the rest)."""

DIALOG_KEYS = frozenset({"usage", "result", "turn", "flattened_tools", "tools"})
"""Other dialog outputs a pattern may return: sent, but never shown as its state."""

STREAM_PARTS = frozenset({"send", "cancel"})


def surface(inst: Instance) -> tuple[dict[str, Cell], dict[str, Any]]:
    """The result's cells by name, and the snapshot's description of them: ``streams``,
    ``chat`` (part -> name, or None) and ``state`` (the names shown beside the chat)."""
    raw = inst.result.raw()
    streams = sorted(inst.streams)
    tops = {name.split(".")[0] for name in streams}
    if isinstance(raw, dict):
        cells = {k: inst.result.key(k).resolve() for k in raw if k not in tops}
    else:  # a pattern returning one value: it is the state
        cells = {"value": inst.result}
    chat: dict[str, str | None] = {
        part: next((n for n in names if n in (tops if part in STREAM_PARTS else cells)), None)
        for part, names in CHAT_PARTS.items()}
    if chat["send"] is None or chat["messages"] is None:
        chat = dict.fromkeys(CHAT_PARTS)  # no dialog: the page shows the state alone
    parts = {n for n in chat.values() if n is not None}
    state = [k for k in cells if k not in parts and k not in DIALOG_KEYS]
    return cells, {"pattern": inst.pattern.key, "streams": streams, "chat": chat,
                   "state": state}
