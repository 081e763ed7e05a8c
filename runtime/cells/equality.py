"""Strict equality for the values the graph holds: one definition for the kernel's value
gate, documents and sinks alike.

Python's ``==`` says ``[1] == [True]`` and ``1 == 1.0``; JSON says they differ, and a gate
that agreed with Python would leave the kernel showing ``[1]`` while the store holds
``[true]``. Here two values are the same when they have the same type at every level and
equal scalars.
"""

from __future__ import annotations

from typing import Any

__all__ = ["same"]


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are identical, or of one type all the way down with equal scalars."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    if t is list or t is tuple:
        return len(a) == len(b) and _same_items(a, b)
    if t is dict:
        return len(a) == len(b) and _same_items(a, b)
    return a == b


def _same_items(a: Any, b: Any) -> bool:
    """Containers of equal length: compare iteratively (deep values must not recurse). A
    pair already compared is not compared again: values that share parts (a document
    whose links fan out reads as one) cost their distinct parts, not their tree size."""
    stack: list[tuple[Any, Any]] = [(a, b)]
    seen: set[tuple[int, int]] = set()
    while stack:
        x, y = stack.pop()
        pair = (id(x), id(y))
        if pair in seen:
            continue
        seen.add(pair)
        if type(x) is dict:
            for k, v in x.items():
                if k not in y or not _same_or_deferred(v, y[k], stack):
                    return False
        else:
            for v, w in zip(x, y, strict=True):
                if not _same_or_deferred(v, w, stack):
                    return False
    return True


def _same_or_deferred(v: Any, w: Any, stack: list[tuple[Any, Any]]) -> bool:
    """Compare two children: scalars now, containers of equal length later (pushed)."""
    if v is w:
        return True
    tv = type(v)
    if tv is not type(w):
        return False
    if tv is dict or tv is list or tv is tuple:
        if len(v) != len(w):
            return False
        stack.append((v, w))
        return True
    return v == w
