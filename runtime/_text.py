"""Text that can be encoded: the one rule for lone UTF-16 surrogates, shared by every room.

A Python ``str`` may hold a lone surrogate (``"\\ud800"``): JSON from a browser can carry one
as an escape, and ``json.loads`` keeps it. Such a string is not Unicode text: it cannot be
encoded as UTF-8, so a request that carries it fails for every provider, and every later
request of the same history fails with it. The decision (``docs/runtime.md``):

- where text enters from a user or from code (a cell write, an event, a user message), a
  lone surrogate is **refused** with an error naming where it is (``find_surrogate``);
- where text arrives from a provider (a reply, a tool call's arguments) or must leave in a
  request anyway, it is **replaced** by U+FFFD (``scrub``), so a reply still lands and a
  request always encodes.

This module imports nothing of the project, so the cell graph and the LLM port both use it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REPLACEMENT", "describe_surrogate", "find_surrogate", "has_surrogate", "scrub",
           "scrub_text"]

REPLACEMENT = "\ufffd"


def has_surrogate(text: str) -> bool:
    """Does ``text`` hold a code point UTF-8 cannot encode (a lone surrogate)? ASCII text,
    the common case, is answered without encoding anything."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_surrogate(text: str) -> int:
    """The index of the first lone surrogate in ``text``, or -1."""
    if not has_surrogate(text):
        return -1
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            return i
    return -1  # pragma: no cover - has_surrogate found one


def describe_surrogate(text: str, where: str) -> str:
    """The error message for a string holding a lone surrogate (what, where, how to fix)."""
    i = find_surrogate(text)
    return (f"{where} holds a lone UTF-16 surrogate (U+{ord(text[i]):04X} at character {i}), "
            "which is not Unicode text and cannot be encoded as UTF-8; send valid text "
            "(a surrogate must be part of a pair)")


def scrub_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (the same string when none)."""
    if text.isascii() or not has_surrogate(text):
        return text
    return "".join(REPLACEMENT if "\ud800" <= ch <= "\udfff" else ch for ch in text)


def scrub(value: Any) -> Any:
    """A JSON value with every string (keys too) passed through ``scrub_text``; the value
    itself when nothing needed replacing."""
    t = type(value)
    if t is str:
        return value if value.isascii() else scrub_text(value)
    if t is dict:
        out = {scrub_text(k) if type(k) is str else k: scrub(v) for k, v in value.items()}
        return value if all(a is b for a, b in zip(value.values(), out.values(), strict=False)
                            ) and list(value) == list(out) else out
    if t is list:
        items = [scrub(v) for v in value]
        return value if all(a is b for a, b in zip(value, items, strict=True)) else items
    return value
