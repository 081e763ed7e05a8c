"""What of a pattern's result is a dialog, and what is the pattern's own state.

A pattern exposes its ``llm_dialog`` by returning the dialog's parts under conventional
names (the bundled chatbot and todo agent do): ``send`` (or ``add_message``) and
``messages`` make a chat; ``cancel`` (or ``cancel_generation``), ``pending``, ``partial``,
``error``, ``stop_reason`` and ``dropped`` are used when present. Every other cell of the
result is the pattern's ``state`` (a todo agent's ``items``), which a front end shows
beside the chat. One rule for every front end: the terminal chat and the web page both
read a result through ``dialog_surface``.

Only the result's top-level names are read; a name that holds streams is an input, not
state (a dialog nested one level down, ``{"chat": {...}}``, is not found as a chat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cells import Cell, Instance

__all__ = ["CHAT_PARTS", "DIALOG_OUTPUTS", "DialogSurface", "dialog_surface"]

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
"""A chat part -> the result names that play it, the first found wins (streams for ``send``
and ``cancel``, cells for the rest)."""

STREAM_PARTS = frozenset({"send", "cancel"})

DIALOG_OUTPUTS = frozenset({"usage", "result", "turn", "flattened_tools", "tools"})
"""The dialog's other outputs a pattern may return: never the pattern's state."""


@dataclass(frozen=True)
class DialogSurface:
    """``parts``: chat part -> result name (all None when the result has no chat);
    ``cells``: every cell of the result by name, links followed; ``state``: the names of
    the pattern's own cells; ``streams``: the result's streams (dotted names)."""

    parts: dict[str, str | None]
    cells: dict[str, Cell]
    state: tuple[str, ...]
    streams: tuple[str, ...]

    @property
    def is_chat(self) -> bool:
        return self.parts["send"] is not None

    def cell(self, part: str) -> Cell | None:
        """The cell playing ``part`` (``"messages"``...), or None."""
        name = self.parts.get(part)
        return self.cells.get(name) if name is not None else None


def dialog_surface(inst: Instance) -> DialogSurface:
    """Read ``inst``'s result by the conventions above."""
    raw = inst.result.raw()
    streams = tuple(sorted(inst.streams))
    tops = {name.split(".")[0] for name in streams}
    if isinstance(raw, dict):
        cells = {k: inst.result.key(k).resolve() for k in raw if k not in tops}
    else:  # a pattern returning one value: it is the state
        cells = {"value": inst.result}
    parts: dict[str, str | None] = {
        part: next((n for n in names if n in (tops if part in STREAM_PARTS else cells)), None)
        for part, names in CHAT_PARTS.items()}
    if parts["send"] is None or parts["messages"] is None:
        parts = dict.fromkeys(CHAT_PARTS)  # no dialog: only state
    played = {n for n in parts.values() if n is not None}
    state = tuple(k for k in cells if k not in played and k not in DIALOG_OUTPUTS)
    return DialogSurface(parts, cells, state, streams)
