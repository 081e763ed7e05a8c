"""JSON values addressed by paths: reading, copy-on-write updates, pointers and links.

Values held by the runtime are never mutated in place; a write builds a new root that shares
untouched branches with the old one, so a snapshot stays valid while a transaction works.
"""

from __future__ import annotations

import json as _json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from .._text import describe_surrogate, has_surrogate
from ..errors import NotJSONError
from ..storage.patch import copy_value as copy_json  # noqa: F401  (one deep copy, shared)

Path = tuple[str | int, ...]

LINK = "@link"


class Missing:
    """The absence of a value (distinct from JSON null)."""

    _instance: Missing | None = None

    def __new__(cls) -> Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = Missing()


def escape(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def pointer(path: Path) -> str:
    """``("a", 0)`` -> ``"/a/0"`` (RFC 6901)."""
    return "".join("/" + escape(t) for t in path)


def parse_pointer(text: str) -> Path:
    if text == "":
        return ()
    if not text.startswith("/"):
        raise ValueError(f"JSON pointer {text!r} must start with '/'")
    return tuple(unescape(t) for t in text[1:].split("/"))


def is_link(value: Any) -> bool:
    """A link is exactly ``{"@link": "<pointer>"}`` or that plus ``"scope"``. An object that
    has an ``"@link"`` key beside other keys is plain data."""
    if type(value) is not dict or type(value.get(LINK)) is not str:
        return False
    n = len(value)
    return n == 1 or (n == 2 and type(value.get("scope")) is str)


def step(value: Any, token: str | int) -> Any:
    """One level down, or MISSING. List indexes may be ints or digit strings."""
    if type(value) is dict:
        return value.get(str(token), MISSING)
    if type(value) is list:
        try:
            i = int(token)
        except (TypeError, ValueError):
            return MISSING
        return value[i] if 0 <= i < len(value) else MISSING
    return MISSING


def assign_in_place(root: Any, path: Path, value: Any) -> Any:
    """Put ``value`` at ``path`` inside ``root`` itself (the caller owns ``root``; parents
    exist, checked when the write was accepted). Returns the root (``value`` for ``()``)."""
    if not path:
        return value
    parent = root
    for token in path[:-1]:
        parent = parent[token if type(parent) is dict else int(token)]
    last = path[-1]
    if type(parent) is dict:
        parent[str(last)] = value
    else:
        i = int(last)
        if i == len(parent):
            parent.append(value)
        else:
            parent[i] = value
    return root


JSON_SCALARS = (str, int, float, bool, type(None))
_INF = float("inf")
_MAX_INT = 10**4000  # beyond this Python will not turn an int into text (JSON)

MAX_NESTING = 100
"""How deep a document may nest (objects and lists inside each other). Deeper values are
refused when written, with a clear error, instead of failing later in a recursive step
(serialising, validating, copying) after part of the work is done. A value that contains
itself is caught by the same bound."""


def check_json(value: Any, where: str | Callable[[], str] = "value", *, depth: int = 0,
               links: list[Path] | None = None, made: list[Path] | None = None) -> Any:
    """Copy ``value`` as plain JSON (tuples become lists), or raise ``NotJSONError`` naming
    the bad part. ``depth`` is how deep the value will sit in its document. Objects with a
    ``__json__()`` method (a ``Cell`` gives its link) and pydantic models are converted.
    Links found in the data itself are collected into ``links`` (their paths) when given,
    so the caller can refuse those the schema does not ask for; links made by code (from a
    ``Cell``) into ``made``.

    This is where text enters the cell graph (writes, events, pattern arguments, initial
    values), so a string holding a lone UTF-16 surrogate, as a value or as an object key, is
    refused here (``runtime/_text.py``): it cannot be encoded, and stored in a shared cell it
    would break every request that later carries it.

    The copy runs without building any message text; only when it fails does a second,
    slower pass find where, for the error."""
    try:
        if links is None and made is None:
            return _check(value, depth, None, (), None, None)
        # the common case first: no link in the data, nothing made by code. Only when the
        # quick copy meets one is the value walked again keeping every place's path
        return _plain(value, depth)
    except _HasLinks:
        try:
            return _check(value, depth, links, (), None, made)
        except _Bad:
            pass
    except _Bad:
        pass
    # raises NotJSONError naming the place
    _check(value, depth, None, (), where() if callable(where) else where, None)
    raise AssertionError("unreachable")  # pragma: no cover


def copy_plain(value: Any, depth: int = 0) -> Any:
    """``value`` copied, when it is plain JSON holding no link and nothing to convert (a
    ``Cell``, a pydantic model): the common case of a write, in one quick pass. Otherwise
    ``MISSING``: ``check_json`` then says what is wrong or where the links are."""
    try:
        return _plain(value, depth)
    except (_HasLinks, _Bad):
        return MISSING


def own_json(value: Any, where: str | Callable[[], str] = "value", *, depth: int = 0) -> Any:
    """A fresh value from outside (made for this call and held by nothing else, as
    ``model_dump(mode="json")`` makes one) made fit to store as it is, in place, in one
    pass: each link-shaped object in it becomes its JSON text (data a model or a user sent
    never becomes a link, which would alias other documents on read), and anything
    ``check_json`` refuses raises ``NotJSONError`` naming it. What it returns can be written
    with ``Cell.push(..., owned=True)``: no second copy.

    ``depth`` is how deep the value will sit in its document. A link-shaped root comes back
    as its text; anything else comes back as the same object."""
    try:
        return _own(value, depth)
    except _Bad:
        pass
    # the slow pass: raises NotJSONError naming the place, or makes a plain copy of what
    # the quick one does not take as it is (a model, a tuple), whose links it then makes
    # inert. (The value may be half-changed by now: links as text only.)
    return _own(_check(value, depth, None, (), where() if callable(where) else where, None),
                depth)


def _own(value: Any, depth: int) -> Any:
    """``own_json``'s pass: ``_plain``'s checks, changing only link-shaped objects."""
    t = type(value)
    if t is str:
        if not value.isascii() and has_surrogate(value):
            raise _Bad
        return value
    if t is dict:
        if LINK in value and is_link(value):
            return _json.dumps(value, sort_keys=True)
        if depth >= MAX_NESTING:
            raise _Bad
        d = depth + 1
        for k, v in value.items():
            if type(k) is not str or (not k.isascii() and has_surrogate(k)):
                raise _Bad
            tv = type(v)
            if not ((tv is str and v.isascii()) or tv is bool or tv is type(None)
                    or (tv is int and -_MAX_INT < v < _MAX_INT)):
                owned = _own(v, d)
                if owned is not v:
                    value[k] = owned  # a key already there: the dict does not grow
        if LINK in value and is_link(value):  # link-shaped only now: "@link" held a link
            return _json.dumps(value, sort_keys=True)
        return value
    if t is list:
        if depth >= MAX_NESTING:
            raise _Bad
        d = depth + 1
        for i, v in enumerate(value):
            owned = _own(v, d)
            if owned is not v:
                value[i] = owned
        return value
    if t in JSON_SCALARS:
        return _check(value, depth, None, ())
    raise _Bad  # a tuple, a model, anything made by code: the slow pass converts it


class _Bad(Exception):
    """The fast pass found something that is not JSON (the slow pass says where)."""


class _HasLinks(Exception):
    """The quick copy met a link or a value made by code: the pass that records paths runs."""


def _plain(value: Any, depth: int) -> Any:
    """``_check`` without recording paths: raises ``_HasLinks`` at the first link-shaped
    object or ``__json__``/pydantic value, ``_Bad`` at anything not JSON."""
    t = type(value)
    if t is str:
        if not value.isascii() and has_surrogate(value):
            raise _Bad
        return value
    if t is dict:
        if depth >= MAX_NESTING:
            raise _Bad
        d = depth + 1
        out = {}
        for k, v in value.items():
            if type(k) is not str or (not k.isascii() and has_surrogate(k)):
                raise _Bad
            tv = type(v)
            out[k] = v if (tv is str and v.isascii()) or tv is bool or tv is type(None) \
                or (tv is int and -_MAX_INT < v < _MAX_INT) else _plain(v, d)
        if LINK in out and is_link(out):
            raise _HasLinks
        return out
    if t is list or t is tuple:
        if depth >= MAX_NESTING:
            raise _Bad
        d = depth + 1
        return [_plain(v, d) for v in value]
    if t in JSON_SCALARS:
        return _check(value, depth, None, ())
    if getattr(value, "__json__", None) is not None or isinstance(value, BaseModel):
        raise _HasLinks
    raise _Bad


def _check(value: Any, depth: int, links: list[Path] | None, at: Path,
           where: str | None = None, made: list[Path] | None = None) -> Any:
    t = type(value)
    if t is str:
        # ASCII (nearly every string) is answered by isascii() alone, without a call
        if not value.isascii() and has_surrogate(value):
            if where is None:
                raise _Bad
            raise NotJSONError(describe_surrogate(value, where))
        return value
    if t in JSON_SCALARS:
        if t is float and (value != value or value in (_INF, -_INF)):
            if where is None:
                raise _Bad
            raise NotJSONError(f"{where} is {'NaN' if value != value else value}, which JSON "
                               "cannot hold")
        if t is int and not -_MAX_INT < value < _MAX_INT:
            if where is None:
                raise _Bad
            raise NotJSONError(f"{where} is an integer of more than 4,000 digits; store it "
                               "as a string")
        return value
    if depth >= MAX_NESTING:
        if where is None:
            raise _Bad
        raise NotJSONError(
            f"{where if len(where) < 80 else where[:77] + '...'} nests deeper than "
            f"{MAX_NESTING} levels (or contains itself); "
            "flatten it, or store the deep part as a JSON string"
        )
    d = depth + 1
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                if where is None:
                    raise _Bad
                raise NotJSONError(
                    f"{where} has a non-string key {k!r}; JSON object keys are strings")
            if not k.isascii() and has_surrogate(k):
                if where is None:
                    raise _Bad
                raise NotJSONError(describe_surrogate(k, f"a key of {where}"))
            out[k] = _check(v, d, links, (*at, k) if links is not None else at,
                            None if where is None else f"{where}/{escape(k)}", made)
        if links is not None and is_link(out):
            links.append(at)
        return out
    if t is list or t is tuple:
        if links is None and where is None:
            return [_check(v, d, None, at) for v in value]
        return [_check(v, d, links, (*at, i) if links is not None else at,
                       None if where is None else f"{where}/{i}", made)
                for i, v in enumerate(value)]
    convert = getattr(value, "__json__", None)
    if convert is not None and not isinstance(value, type):
        if made is not None:
            made.append(at)
        return _check(convert(), depth, None, at, where)  # made by code, not outside data
    if isinstance(value, BaseModel):
        return _check(value.model_dump(mode="json"), depth, links, at, where, made)
    if where is None:
        raise _Bad
    raise NotJSONError(
        f"{where} is a {t.__name__}, which is not JSON; use dict, list, str, int, float, "
        "bool or None (or a pydantic model)"
    )
