"""A fast, conservative JSON Schema check for the common subset of keywords.

``jsonschema`` is the authority on validity and writes the error messages, but it costs tens
of microseconds for even a tiny object (it builds a validator per subschema it descends
into), which would dominate a handler event. Most schemas in patterns use a small subset:
``type``, ``properties``, ``required``, ``items``, ``enum``, bounds, ``anyOf``... For those we
compile the schema once into nested Python closures.

The compiled check is *sound for acceptance*: when it says a value is valid, jsonschema (with
our strict types) says so too. When it says invalid, or when the schema uses anything
outside the subset (``compile_check`` returns None), jsonschema decides and explains. A
property test holds the two against each other.

(``fastjsonschema`` would be the library for this, but it treats ``2.0`` as an integer and
knows no draft after 7; the subset here is small enough to own.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from .equality import same

Check = Callable[[Any], bool]

__all__ = ["compile_check"]

_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "readOnly", "writeOnly",
    "deprecated", "format", "$schema", "$defs", "definitions", "asCell",
})
_DRAFTS_OK = (None, "https://json-schema.org/draft/2020-12/schema",
              "https://json-schema.org/draft/2019-09/schema",
              "http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-07/schema",
              "http://json-schema.org/draft-06/schema#", "http://json-schema.org/draft-06/schema")

_TYPES: dict[str, Check] = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


class _Unsupported(Exception):
    pass


def compile_check(schema: Any, root: Any = None) -> Check | None:
    """A predicate that accepts only values the schema accepts, or None when the schema
    uses a keyword outside the subset (then only jsonschema can tell). ``root`` is the
    document's whole schema when ``schema`` is part of it (its ``$ref``s resolve there)."""
    root = schema if root is None else root
    if isinstance(root, dict) and root.get("$schema") not in _DRAFTS_OK:
        return None
    try:
        return _Compiler(root).compile(schema, 0)
    except (_Unsupported, re.error, TypeError, ValueError, KeyError):
        return None


def _every(checks: list[Check]) -> Check:
    """All of ``checks`` (a loop, not ``all()`` over a generator: every check of every write
    passes here)."""
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda v: a(v) and b(v)

    def check(v: Any) -> bool:
        for c in checks:
            if not c(v):
                return False
        return True

    return check


def _some(checks: list[Check]) -> Check:
    """Any of ``checks``."""
    if len(checks) == 1:
        return checks[0]

    def check(v: Any) -> bool:
        for c in checks:
            if c(v):
                return True
        return False

    return check


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.refs: dict[str, Check] = {}

    def compile(self, schema: Any, depth: int) -> Check:
        if depth > 64:
            raise _Unsupported
        if schema is True or schema == {}:
            return _always
        if schema is False:
            return _never
        if not isinstance(schema, dict):
            raise _Unsupported
        checks: list[Check] = []
        for key, arg in schema.items():
            if key in _ANNOTATIONS:
                continue
            make = getattr(self, "k_" + key.replace("$", "_"), None)
            if make is None:
                raise _Unsupported
            checks.append(make(arg, schema, depth))
        checks = [c for c in checks if c is not _always]
        if not checks:
            return _always
        return _every(checks)

    # -- keywords: each returns a check of the value for that keyword alone ------------

    def k_type(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        names = [arg] if isinstance(arg, str) else list(arg)
        tests = [_TYPES[n] for n in names]
        return _some(tests)

    def k_properties(self, arg: dict[str, Any], _: dict[str, Any], depth: int) -> Check:
        props = [(k, self.compile(s, depth + 1)) for k, s in arg.items()]
        props = [(k, c) for k, c in props if c is not _always]

        def check(v: Any) -> bool:
            if type(v) is not dict:
                return True
            for k, c in props:
                if k in v and not c(v[k]):
                    return False
            return True

        return check

    def k_required(self, arg: list[str], _: dict[str, Any], __: int) -> Check:
        names = frozenset(arg)
        if len(names) == 1:
            (name,) = names
            return lambda v: type(v) is not dict or name in v
        return lambda v: type(v) is not dict or v.keys() >= names

    def k_additionalProperties(self, arg: Any, schema: dict[str, Any], depth: int) -> Check:
        if "patternProperties" in schema:
            raise _Unsupported
        known = set(schema.get("properties", {}))
        extra = self.compile(arg, depth + 1)
        if extra is _always:
            return _always
        def check(v: Any) -> bool:
            if type(v) is dict:
                for k, x in v.items():
                    if k not in known and not extra(x):
                        return False
            return True

        return check

    def k_items(self, arg: Any, schema: dict[str, Any], depth: int) -> Check:
        if not isinstance(arg, dict | bool) or "prefixItems" in schema:
            raise _Unsupported
        item = self.compile(arg, depth + 1)
        if item is _always:
            return _always
        def check(v: Any) -> bool:
            if type(v) is list:
                for x in v:
                    if not item(x):
                        return False
            return True

        return check

    def k_enum(self, arg: list[Any], _: dict[str, Any], __: int) -> Check:
        options = list(arg)
        return lambda v: any(same(v, o) for o in options)

    def k_const(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return lambda v: same(v, arg)

    def _bound(self, arg: Any, test: Callable[[Any, Any], bool]) -> Check:
        if type(arg) not in (int, float):
            raise _Unsupported
        return lambda v: (type(v) is not int and type(v) is not float) or test(v, arg)

    def k_minimum(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._bound(arg, lambda v, b: v >= b)

    def k_maximum(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._bound(arg, lambda v, b: v <= b)

    def k_exclusiveMinimum(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._bound(arg, lambda v, b: v > b)

    def k_exclusiveMaximum(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._bound(arg, lambda v, b: v < b)

    def _length(self, arg: Any, kind: type, test: Callable[[int, int], bool]) -> Check:
        if type(arg) is not int:
            raise _Unsupported
        return lambda v: type(v) is not kind or test(len(v), arg)

    def k_minLength(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._length(arg, str, lambda n, b: n >= b)

    def k_maxLength(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._length(arg, str, lambda n, b: n <= b)

    def k_minItems(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._length(arg, list, lambda n, b: n >= b)

    def k_maxItems(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._length(arg, list, lambda n, b: n <= b)

    def k_minProperties(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._length(arg, dict, lambda n, b: n >= b)

    def k_maxProperties(self, arg: Any, _: dict[str, Any], __: int) -> Check:
        return self._length(arg, dict, lambda n, b: n <= b)

    def k_pattern(self, arg: str, _: dict[str, Any], __: int) -> Check:
        search = re.compile(arg).search
        return lambda v: type(v) is not str or search(v) is not None

    def k_anyOf(self, arg: list[Any], _: dict[str, Any], depth: int) -> Check:
        return _some([self.compile(s, depth + 1) for s in arg])

    def k_allOf(self, arg: list[Any], _: dict[str, Any], depth: int) -> Check:
        return _every([self.compile(s, depth + 1) for s in arg])

    def k_oneOf(self, arg: list[Any], _: dict[str, Any], depth: int) -> Check:
        options = [self.compile(s, depth + 1) for s in arg]
        # sound only for acceptance: one option surely holds, and the others surely do not
        # (a fast False may be a jsonschema True), so with several options give up
        if len(options) != 1:
            raise _Unsupported
        return options[0]

    def k__ref(self, arg: str, schema: dict[str, Any], depth: int) -> Check:
        if not isinstance(arg, str) or not arg.startswith("#/"):
            raise _Unsupported
        hit = self.refs.get(arg)
        if hit is not None:
            return hit
        target: Any = self.root
        for token in arg[2:].split("/"):
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            target = target[token] if isinstance(target, dict) else target[int(token)]
        slot: list[Check] = []
        self.refs[arg] = lambda v: slot[0](v)  # recursive schemas refer back to themselves
        slot.append(self.compile(target, depth + 1))
        return self.refs[arg]


def _always(_: Any) -> bool:
    return True


def _never(_: Any) -> bool:
    return False
