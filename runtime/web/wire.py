"""The wire format of the page, sans-IO: a snapshot, then patches, framed as SSE events.

A tab holds the pattern's result cells as one JSON object; the server sends it whole once per
(re)connect (``snapshot``) and after that only what changed (``patch``): a list of
operations, each ``{"op", "path", "value"}`` with ``path`` a JSON Pointer into that object.

- ``replace``: the value at ``path`` is ``value``;
- ``add``: ``value`` is inserted in the array at ``path``'s index (``-``: pushed at its end),
  or set at the object's new key;
- ``remove``: the array item or object key at ``path`` goes;
- ``append``: ``value`` is added to the end of the string at ``path``.

``diff`` finds them: a string that grew by its end is its new text (a streamed reply is a
run of ``append``s, never the text again); an array is its items added, removed or changed
between an unchanged head and tail (a history that grew is its new messages, a todo item
ticked is one ``replace``); an object is its keys removed, added and changed; anything else
is replaced. Equality is JSON's (``same``: ``1`` is not ``true``). Nothing here does I/O, so the
same functions serve the server, its tests and the benchmark.
"""

from __future__ import annotations

import json
from typing import Any

from ..cells import parse_pointer, pointer, same

__all__ = ["VERSION", "apply", "diff", "frame", "to_json"]

VERSION = 1
"""The wire format's version, sent in every snapshot (``"v"``)."""

_MAX_DEPTH = 8
"""How deep ``diff`` walks objects before it replaces the value: a bound on the work a
deep value can ask for (the cells are bounded at 100 levels; patches need not be)."""


def diff(old: Any, new: Any, path: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """The operations that turn ``old`` into ``new`` (both JSON), at ``path``."""
    ops: list[dict[str, Any]] = []
    _diff(old, new, path, ops, 0)
    return ops


def _diff(old: Any, new: Any, path: tuple[str | int, ...], ops: list[dict[str, Any]],
          depth: int) -> None:
    if type(old) is type(new):
        if isinstance(new, str):
            if new == old:
                return
            if len(new) > len(old) and new.startswith(old):
                ops.append({"op": "append", "path": pointer(path), "value": new[len(old):]})
                return
        elif isinstance(new, list):
            if _diff_list(old, new, path, ops, depth):
                return
        elif isinstance(new, dict):
            if same(new, old):
                return
            if depth < _MAX_DEPTH:
                ops.extend({"op": "remove", "path": pointer((*path, k))}
                           for k in old if k not in new)
                for key, value in new.items():
                    if key in old:
                        _diff(old[key], value, (*path, key), ops, depth + 1)
                    else:
                        ops.append({"op": "add", "path": pointer((*path, key)), "value": value})
                return
        elif new == old:
            return
    ops.append({"op": "replace", "path": pointer(path), "value": new})


def _diff_list(old: list[Any], new: list[Any], path: tuple[str | int, ...],
               ops: list[dict[str, Any]], depth: int) -> bool:
    """A list's change as the items added, removed or changed between an unchanged head
    and an unchanged tail; False when that is not smaller than the list (replace it)."""
    n, m = len(old), len(new)
    head = 0
    while head < n and head < m and same(old[head], new[head]):
        head += 1
    tail = 0
    while tail < n - head and tail < m - head and same(old[n - 1 - tail], new[m - 1 - tail]):
        tail += 1
    gone, came = n - head - tail, m - head - tail
    if not came:  # items removed (or none changed)
        ops.extend({"op": "remove", "path": pointer((*path, head))} for _ in range(gone))
        return True
    if not gone:  # items added: pushed at the end, inserted elsewhere
        at: list[str | int] = ["-"] * came if not tail else list(range(head, head + came))
        ops.extend({"op": "add", "path": pointer((*path, i)), "value": new[head + k]}
                   for k, i in enumerate(at))
        return True
    if gone == came and depth < _MAX_DEPTH and gone <= max(1, m // 2):
        for i in range(head, head + gone):  # items changed in place
            _diff(old[i], new[i], (*path, i), ops, depth + 1)
        return True
    return False


def apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` with ``ops`` applied in order, in place (what the page's script does; the
    tests and the benchmark use it as the client's side). A path that does not fit the
    document is a ``ValueError``."""
    for op in ops:
        *parents, last = parse_pointer(op["path"])
        target: Any = doc
        for token in parents:
            target = target[int(token) if isinstance(target, list) else token]
        kind = op["op"]
        if kind == "add" and last == "-" and isinstance(target, list):
            target.append(op["value"])
            continue
        key = int(last) if isinstance(target, list) else last
        if kind == "replace":
            target[key] = op["value"]
        elif kind == "add" and isinstance(target, list):
            target.insert(key, op["value"])
        elif kind == "add":
            target[key] = op["value"]
        elif kind == "remove":
            del target[key]
        elif kind == "append" and isinstance(target[key], str):
            target[key] += op["value"]
        else:
            raise ValueError(f"cannot apply {kind} at {op['path']}")
    return doc


def to_json(value: Any) -> str:
    """Compact JSON, UTF-8 kept as is; NaN and infinities refused (cells never hold them)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def frame(event: str, data: str, retry_ms: int | None = None) -> bytes:
    """One SSE event (with ``retry``: how long the browser waits before it reconnects).
    ``data`` is JSON, which has no raw newline, so it is one ``data:`` line; a stray CR or
    LF (never made by ``to_json``) is refused rather than split."""
    if "\n" in data or "\r" in data:
        raise ValueError("an SSE data line cannot hold a newline")
    retry = f"retry: {retry_ms}\n" if retry_ms is not None else ""
    return f"{retry}event: {event}\ndata: {data}\n\n".encode()
