"""JSON values addressed by paths: reading, copy-on-write updates, pointers and links.

Values held by the runtime are never mutated in place; a write builds a new root that shares
untouched branches with the old one, so a snapshot stays valid while a transaction works.
"""

from __future__ import annotations

from typing import Any

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
    return type(value) is dict and type(value.get(LINK)) is str


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


def assign(root: Any, path: Path, value: Any) -> Any:
    """A new root equal to ``root`` with ``value`` at ``path`` (parents must exist;
    a list index equal to the length appends)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if type(root) is dict:
        new = dict(root)
        key = str(head)
        if rest and key not in root:
            raise KeyError(head)
        new[key] = assign(root.get(key), rest, value) if rest else value
        return new
    if type(root) is list:
        i = int(head)
        if not 0 <= i <= len(root) or (rest and i == len(root)):
            raise IndexError(head)
        new = list(root)
        child = assign(root[i], rest, value) if rest else value
        if i == len(root):
            new.append(child)
        else:
            new[i] = child
        return new
    raise TypeError(head)


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (fast path for scalars)."""
    t = type(value)
    if t is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if t is list:
        return [copy_json(v) for v in value]
    return value


JSON_SCALARS = (str, int, float, bool, type(None))
_INF = float("inf")


def check_json(value: Any, where: str = "value") -> Any:
    """Copy ``value`` as plain JSON (tuples become lists), or raise naming the bad part."""
    t = type(value)
    if t in JSON_SCALARS:
        if t is float and (value != value or value in (_INF, -_INF)):
            raise TypeError(f"{where} is {'NaN' if value != value else value}, which JSON "
                            "cannot hold")
        return value
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise TypeError(f"{where} has a non-string key {k!r}; JSON object keys are strings")
            out[k] = check_json(v, f"{where}/{escape(k)}")
        return out
    if t is list or t is tuple:
        return [check_json(v, f"{where}/{i}") for i, v in enumerate(value)]
    raise TypeError(
        f"{where} is a {t.__name__}, which is not JSON; use dict, list, str, int, float, "
        "bool or None (convert pydantic models with .model_dump())"
    )
