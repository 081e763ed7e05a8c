"""The wire format of the page, sans-IO: a snapshot, then patches, framed as SSE events.

A tab holds the pattern's result cells as one JSON object; the server sends it whole once per
(re)connect (``snapshot``) and after that only what changed (``patch``): a list of
operations, each ``{"op", "path", "value"}`` with ``path`` a JSON Pointer into that object.

- ``replace``: the value at ``path`` is ``value``;
- ``add`` with a path ending in ``-``: ``value`` is pushed onto the array at the rest;
- ``append``: ``value`` is added to the end of the string at ``path``.

``diff`` finds them: an array that grew by its end is its new items, a string that grew by
its end is its new text (a streamed reply is a run of ``append``s, never the text again),
an object with the same keys is diffed key by key, anything else is replaced. Equality is
JSON's (``same``: ``1`` is not ``true``). Nothing here does I/O, so the
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
            n = len(old)
            if len(new) >= n and same(new[:n], old):  # grew by its end (or did not change)
                at = pointer((*path, "-"))
                ops.extend({"op": "add", "path": at, "value": item} for item in new[n:])
                return
            if len(new) == n and n and same(new[:-1], old[:-1]) and depth < _MAX_DEPTH:
                _diff(old[-1], new[-1], (*path, n - 1), ops, depth + 1)  # the last changed
                return
        elif isinstance(new, dict):
            if same(new, old):
                return
            if new.keys() == old.keys() and depth < _MAX_DEPTH:
                for key, value in new.items():
                    _diff(old[key], value, (*path, key), ops, depth + 1)
                return
        elif new == old:
            return
    ops.append({"op": "replace", "path": pointer(path), "value": new})


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
