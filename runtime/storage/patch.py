"""Patches and copies, shared by every backend so they all agree on what a patch means.

A patch is a sequence of ``(path, value)`` assignments (see ``Write``). Applying one checks
every step: a backend that stores the patch instead of the whole value must refuse a path
that does not exist *before* it persists anything, or a later load would fail instead.
``undo`` lets a backend that patches its own copy in place roll a failed commit back in
O(changed), instead of copying the whole document up front.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ..errors import ConflictError, StorageError
from .base import DocKey

__all__ = ["MISSING", "apply_patch", "conflict", "copy_value", "describe"]

MISSING: Any = object()
"""The root of a document that does not exist yet (a patch at ``expect=0``)."""

_NEW = ("the document does not exist yet: a patch to a new document (expect=0) starts by "
        "assigning the empty path, the whole value,")
_SCALARS = (str, int, float, bool, type(None))


def copy_value(value: Any) -> Any:
    """A deep copy of a JSON value (fast path for dict/list/scalars, deepcopy otherwise)."""
    t = type(value)
    if t is dict:
        return {k: copy_value(v) for k, v in value.items()}
    if t is list:
        return [copy_value(v) for v in value]
    if t in _SCALARS:
        return value
    return copy.deepcopy(value)


def describe(key: DocKey) -> str:
    scope = f", scope {key.scope!r}" if key.scope else ""
    return f"document {key.id!r} (space {key.space!r}{scope})"


def conflict(key: DocKey, have: int, expect: int) -> ConflictError:
    """The one wording every backend uses: who changed what, and how to retry."""
    if expect == 0:
        what = (f"it already exists at version {have}, "
                f"the write expected {expect} (create if absent)")
    elif have == 0:
        what = f"it is at version {have} (it does not exist), the write expected {expect}"
    else:
        what = f"it is at version {have}, the write expected {expect}"
    return ConflictError(
        f"{describe(key)} was changed by another writer: {what}; nothing was committed. "
        f"Re-read it (load) and apply your change again to version {have}."
    )


def _where(path: tuple[Any, ...], upto: int) -> str:
    return "/" + "/".join(str(p) for p in path[:upto]) if upto else "/"


def apply_patch(
    key: DocKey,
    root: Any,
    patch: Any,
    undo: list[Callable[[], None]] | None = None,
    *,
    copy_values: bool = True,
) -> Any:
    """Apply ``patch`` to ``root`` in place (``MISSING`` for a new document); return the
    new root. Raises ``StorageError`` naming the first path that cannot be assigned; the
    steps already taken are then in ``undo`` (call them in reverse to restore ``root``)."""
    if isinstance(patch, (str, bytes, dict)) or not hasattr(patch, "__iter__"):
        raise StorageError(
            f"patch for {describe(key)} must be a sequence of (path, value) pairs, "
            f"got {type(patch).__name__}"
        )
    for step in patch:
        try:
            path, value = step
        except (TypeError, ValueError):
            raise StorageError(
                f"patch for {describe(key)}: each step is a (path, value) pair, got {step!r}"
            ) from None
        if not isinstance(path, (tuple, list)):
            raise StorageError(
                f"patch for {describe(key)}: a path is a tuple of keys and indexes, "
                f"got {path!r}"
            )
        if copy_values:
            value = copy_value(value)
        if not path:
            root = value
            continue
        parent = root
        for depth, part in enumerate(path[:-1]):
            parent = _step(key, parent, part, path, depth)
        _assign(key, parent, path[-1], value, path, undo)
    if root is MISSING:
        raise StorageError(
            f"patch for {describe(key)} leaves no document: a patch to a new document "
            f"(expect=0) must start by assigning the empty path (the whole value)"
        )
    return root


def _bad(key: DocKey, path: tuple[Any, ...], depth: int, why: str) -> StorageError:
    return StorageError(
        f"patch for {describe(key)}: path {_where(path, len(path))} does not exist "
        f"({why} at {_where(path, depth)}); nothing was committed"
    )


def _step(key: DocKey, node: Any, part: Any, path: tuple[Any, ...], depth: int) -> Any:
    if node is MISSING:
        raise _bad(key, path, depth, _NEW)
    if type(node) is dict:
        if type(part) is str and part in node:
            return node[part]
        raise _bad(key, path, depth, f"no key {part!r}")
    if type(node) is list:
        if type(part) is int and 0 <= part < len(node):
            return node[part]
        raise _bad(key, path, depth, f"no index {part!r} in a list of {len(node)}")
    raise _bad(key, path, depth, f"{type(node).__name__} has no children")


def _assign(key: DocKey, node: Any, part: Any, value: Any, path: tuple[Any, ...],
            undo: list[Callable[[], None]] | None) -> None:
    depth = len(path) - 1
    if node is MISSING:
        raise _bad(key, path, depth, _NEW)
    if type(node) is dict:
        if type(part) is not str:
            raise _bad(key, path, depth, f"an object's keys are strings, not {part!r}")
        if undo is not None:
            if part in node:
                old = node[part]
                undo.append(lambda: node.__setitem__(part, old))
            else:
                undo.append(lambda: node.pop(part))
        node[part] = value
    elif type(node) is list:
        n = len(node)
        if type(part) is not int or not 0 <= part <= n:
            raise _bad(key, path, depth, f"no index {part!r} in a list of {n}")
        if part == n:
            node.append(value)
            if undo is not None:
                undo.append(node.pop)
        else:
            if undo is not None:
                old = node[part]
                undo.append(lambda: node.__setitem__(part, old))
            node[part] = value
    else:
        raise _bad(key, path, depth, f"{type(node).__name__} has no children")
