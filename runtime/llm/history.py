"""Rules about a conversation's history, each written once for every room that keeps one.

A history is a sequence of messages, held either as port ``Message``s (the step engine, the
conversation object) or as their JSON (``Message.model_dump(mode="json")``: what the dialog
keeps in a cell). The rules that judge a history (``unanswered_calls``,
``repeated_call_ids``) read both forms, so the dialog and the conversation object cannot come
to disagree about what, say, an unanswered call is.

Tool call ids: a history never holds one twice (``Request`` refuses one that does), as the id
is what pairs a call with its result, and every id it holds is one every provider takes back
(``replayable_call_id``: 1 to 64 of ``A-Z a-z 0-9 _ -``; Anthropic refuses any other
character in a ``tool_use`` id, OpenAI's are short). ``CallIds`` is how ids are given out
where a server sends none, repeats one or sends one no provider would take back (a
900 KB id, one holding U+FFFD or punctuation: the adapters) and where a reply's ids collide
with the history or break the rule (the step engine, for any model);
``with_unique_call_ids`` mends a history stored before the rules.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .types import Message, Role, ToolResult, ToolUse

__all__ = ["MAX_CALL_ID_CHARS", "CallIds", "fresh_call_id", "repeated_call_ids",
           "replayable_call_id", "unanswered_calls", "with_unique_call_ids"]

MAX_CALL_ID_CHARS = 64
"""The longest tool call id a history keeps as it came (module doc)."""
_REPLAYABLE = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_CALL_ID_CHARS}}}").fullmatch

HistoryItem = Message | Mapping[str, Any]
"""A message of a history: a ``Message`` or its JSON form (``model_dump(mode="json")``)."""


def unanswered_calls(history: Sequence[HistoryItem]) -> list[str]:
    """The ids of the tool calls of the last assistant message that no later message
    answers, in call order: what must be answered before the history can go to a model
    again (every provider refuses a call without its result)."""
    for i in range(len(history) - 1, -1, -1):
        if _role(history[i]) == Role.ASSISTANT.value:
            answered = {cid for later in history[i + 1:] for cid in _result_ids(later)}
            return [cid for cid in _call_ids(history[i]) if cid not in answered]
    return []


def repeated_call_ids(history: Sequence[HistoryItem]) -> list[str]:
    """The tool call ids used by more than one call in ``history``, in the order their
    second use appears: empty for a valid history (``Request`` refuses any other)."""
    seen: set[str] = set()
    repeated: list[str] = []
    for message in history:
        for cid in _call_ids(message):
            if cid in seen:
                repeated.append(cid)
            seen.add(cid)
    return repeated


def replayable_call_id(cid: object) -> bool:
    """Whether ``cid`` is a tool call id every provider takes back as it is: a string of 1 to
    ``MAX_CALL_ID_CHARS`` ASCII letters, digits, ``_`` and ``-`` (module doc)."""
    return type(cid) is str and _REPLAYABLE(cid) is not None


def fresh_call_id() -> str:
    """A tool call id no other call has: ``call_`` and 32 random hex digits (uuid4)."""
    return f"call_{uuid.uuid4().hex}"


class CallIds:
    """The tool call ids in use in one history (or one reply), each given out once.

    ``take(wanted)`` keeps ``wanted`` if it is new and replayable, and mints a
    ``fresh_call_id()`` if it is empty, already in use or not ``replayable_call_id`` (not a
    string, too long, a character a provider refuses): what an adapter does with the ids a
    server sends (some send none, some repeat them, a hostile one sends anything) and what
    the step engine does with a reply's ids, so a history never holds one id twice, nor one
    a provider would refuse."""

    __slots__ = ("_used",)

    def __init__(self, used: Iterable[str] = ()) -> None:
        self._used = set(used)

    def take(self, wanted: object) -> str:
        """``wanted`` if it is a new, replayable id, else a fresh one; either way now in
        use."""
        if type(wanted) is not str or _REPLAYABLE(wanted) is None or wanted in self._used:
            wanted = fresh_call_id()
        self._used.add(wanted)
        return wanted

    @classmethod
    def of(cls, history: Sequence[HistoryItem]) -> CallIds:
        """The ids already used by the calls of ``history``."""
        return cls(cid for message in history for cid in _call_ids(message))


def with_unique_call_ids(history: Sequence[Message]) -> tuple[Message, ...]:
    """``history`` with every reused tool call id, and every id that is not
    ``replayable_call_id``, replaced by a fresh one, and the results that answer each such
    call pointed at its new id: a history stored before the rules (an adapter once named
    every reply's calls ``call_0``..., and kept whatever id a server sent) made valid again,
    so ``Request`` and every provider take it. A result belongs to the call of the same id in
    the last assistant message before it (in call order, if that message repeated the id).
    The history itself when nothing needs a new id."""
    ids_used = [cid for message in history for cid in _call_ids(message)]
    if len(ids_used) == len(set(ids_used)) and all(replayable_call_id(c) for c in ids_used):
        return tuple(history)
    ids = CallIds()
    renamed: dict[str, list[str]] = {}  # the last assistant message's old id -> new ids
    out: list[Message] = []
    for message in history:
        blocks = list(message.blocks)
        if message.role is Role.ASSISTANT:
            renamed = {}
            for i, b in enumerate(blocks):
                if isinstance(b, ToolUse):
                    new = ids.take(b.id)
                    renamed.setdefault(b.id, []).append(new)
                    if new != b.id:
                        blocks[i] = b.model_copy(update={"id": new})
        else:
            for i, b in enumerate(blocks):
                if isinstance(b, ToolResult) and renamed.get(b.tool_use_id):
                    new = renamed[b.tool_use_id].pop(0)
                    if new != b.tool_use_id:
                        blocks[i] = b.model_copy(update={"tool_use_id": new})
        out.append(message if blocks == list(message.blocks) else
                   message.model_copy(update={"blocks": tuple(blocks)}))
    return tuple(out)


def _role(message: HistoryItem) -> Any:
    if isinstance(message, Message):
        return message.role.value
    role = message.get("role")
    return role.value if isinstance(role, Role) else role


def _blocks(message: HistoryItem) -> Iterator[Any]:
    blocks = message.blocks if isinstance(message, Message) else message.get("blocks") or ()
    return iter(blocks)


def _call_ids(message: HistoryItem) -> Iterator[str]:
    for b in _blocks(message):
        if isinstance(b, ToolUse):
            yield b.id
        elif isinstance(b, Mapping) and b.get("kind") == "tool_use":
            yield b.get("id")


def _result_ids(message: HistoryItem) -> Iterator[str]:
    for b in _blocks(message):
        if isinstance(b, ToolResult):
            yield b.tool_use_id
        elif isinstance(b, Mapping) and b.get("kind") == "tool_result":
            yield b.get("tool_use_id")
