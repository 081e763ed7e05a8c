"""Schemas: JSON Schema, or a pydantic model / Python type converted with pydantic.

A schema is compiled once (``compile_schema``) and validates two ways:

- ``validate``: a whole value, when a document is created or replaced;
- ``check_write``: one write at a path, looking only at what the write changed. The walk
  goes down the schema along the path through the keywords that a write *inside* a
  container cannot break (``properties``, ``items``, ``type``, ``required``...), then
  validates the written value against the schema it lands in. At a level whose schema says
  something about the container as a whole that the write could break (``maxItems``,
  ``uniqueItems``, ``enum``, ``anyOf``, a non-local ``$ref``...) it validates that whole
  container instead. So appending to a 100,000-item list checks the new item, not the list.

Types are strict, as JSON is: ``2.0`` is a number but not an ``integer``, ``true`` neither.
Error text is built only when a value fails.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import jsonschema
from pydantic import TypeAdapter

from ..errors import SchemaError
from .by_object import TextByObject
from .fastcheck import Check, compile_check
from .jsonpath import Path, parse_pointer, pointer

SchemaLike = dict[str, Any] | type | Any
Where = str | Callable[[], str]

__all__ = ["CompiledSchema", "SchemaLike", "asks_for_link", "compile_schema", "subschema",
           "to_json_schema", "validate"]

# Keywords that a write strictly inside a container cannot make fail (it replaces or adds a
# child; it never removes one or changes the container's type), or that only annotate.
_INSIDE_SAFE = frozenset({
    "type", "properties", "items", "additionalProperties", "required", "minItems",
    "minProperties", "title", "description", "default", "examples", "$comment", "$schema",
    "$id", "$defs", "definitions", "readOnly", "writeOnly", "deprecated", "asCell",
})
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "readOnly", "writeOnly", "deprecated"})


def to_json_schema(schema: SchemaLike | None) -> dict[str, Any] | None:
    """Normalise a schema argument: None, a JSON Schema dict, or a type pydantic understands.
    An invalid JSON Schema raises ``SchemaError`` naming the problem.

    Both are remembered (bounded): a pattern's schemas are constants its every instance
    passes again, and checking a dict against the metaschema or generating a type's schema
    costs far more than running the instance. A type's schema is one shared dict: treat
    it as read-only."""
    if schema is None:
        return None
    if isinstance(schema, dict):
        if _CHECKED_BY_ID.get(schema) is not None:
            return schema  # the object checked last time, unchanged since (no text made)
        key = _canonical(schema)  # by content: a dict changed since it was checked is new
        if key is None or key not in _CHECKED:
            _check_schema(schema)
            if key is not None:
                _remember(_CHECKED, key, True)
        else:
            _CHECKED.move_to_end(key)
        if key is not None:
            _CHECKED_BY_ID.put(schema, key)
        return schema
    if isinstance(schema, bool):
        raise SchemaError(f"a schema must be a JSON Schema dict or a type, got {schema!r}")
    try:
        made = _BY_TYPE.get(schema)
    except TypeError:  # an unhashable annotation: made every time
        return _type_schema(schema)
    if made is None:
        made = _type_schema(schema)
        _remember(_BY_TYPE, schema, made)
    else:
        _BY_TYPE.move_to_end(schema)
    return made


def _check_schema(schema: dict[str, Any]) -> None:
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = pointer(tuple(e.absolute_path)) or "/"
        raise SchemaError(
            f"invalid JSON Schema: at {where} {_short(e.message)}; see "
            "https://json-schema.org/understanding-json-schema/",
            path=where, rule=str(e.validator),
        ) from None


def _type_schema(schema: Any) -> dict[str, Any]:
    try:
        return TypeAdapter(schema).json_schema()
    except Exception as e:  # pydantic raises several error types for unsupported types
        raise SchemaError(
            f"cannot derive a JSON Schema from {schema!r}: {_short(str(e))}. "
            "Pass a JSON Schema dict, a pydantic model or a plain Python type"
        ) from None


def _canonical(schema: dict[str, Any]) -> str | None:
    """The schema's content as one string (a cache key), None if it is not plain JSON."""
    try:
        return json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHED_SCHEMAS:
        cache.popitem(last=False)


def _strict(cls: Any) -> Any:
    checker = cls.TYPE_CHECKER.redefine_many({
        "integer": lambda _, v: type(v) is int,
        "number": lambda _, v: type(v) is int or type(v) is float,
    })
    return jsonschema.validators.extend(cls, type_checker=checker)


_STRICT: dict[Any, Any] = {}


class CompiledSchema:
    """One schema, its validator and the validators of its subschemas, made once."""

    __slots__ = ("_fast", "_subs", "schema", "validator")

    def __init__(self, schema: dict[str, Any]) -> None:
        base = jsonschema.validators.validator_for(schema)
        cls = _STRICT.get(base)
        if cls is None:
            cls = _STRICT[base] = _strict(base)
        self.schema = schema
        self.validator = cls(schema)
        self._subs: dict[int, tuple[Any, Any]] = {}
        self._fast: dict[int, tuple[Any, Check | None]] = {}

    def _fast_check(self, sub: Any) -> Check | None:
        hit = self._fast.get(id(sub))
        if hit is None or hit[0] is not sub:
            hit = self._fast[id(sub)] = (sub, compile_check(sub) if sub is self.schema
                                         else _sub_check(self.schema, sub))
        return hit[1]

    def _for(self, sub: Any) -> Any:
        if sub is self.schema:
            return self.validator
        hit = self._subs.get(id(sub))
        if hit is None or hit[0] is not sub:
            # evolve keeps the root's resolver: a $ref inside the subschema still resolves
            hit = self._subs[id(sub)] = (sub, self.validator.evolve(schema=sub))
        return hit[1]

    def validate(self, value: Any, where: Where, sub: Any = None, at: Path = ()) -> None:
        """Raise ``SchemaError`` if ``value`` (sitting at ``at`` in its document) fails the
        schema (or the subschema ``sub`` of it)."""
        sub = self.schema if sub is None else sub
        fast = self._fast_check(sub)
        if fast is not None:
            try:
                if fast(value):
                    return  # surely valid; only a failure needs jsonschema (and its words)
            except RecursionError:
                pass
        validator = self._for(sub)
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        except RecursionError:
            raise SchemaError(
                f"invalid {_text(where)}: at {pointer(at) or '/'} the value nests too deeply "
                "to validate against its schema", path=pointer(at), rule="depth",
            ) from None
        if error is None:
            return
        path = pointer(at + tuple(error.absolute_path))
        raise SchemaError(
            f"invalid {_text(where)}: at {path or '/'} {_short(error.message)} "
            f"(schema rule {error.validator!r})",
            path=path,
            rule=str(error.validator),
        )

    def check_write(self, path: Path, value: Any, post: Callable[[Path], Any],
                    where: Where) -> None:
        """Validate a write of ``value`` at ``path``: the value against the schema it lands
        in, and any container above it whose schema the write could break (whole, read
        through ``post(prefix)``, which gives the value there after the write)."""
        schema: Any = self.schema
        for i, token in enumerate(path):
            schema = self._deref(schema)
            if schema is None:
                return  # unconstrained from here down
            if schema is False or not isinstance(schema, dict):
                break  # let the validator explain
            if not _INSIDE_SAFE.issuperset(schema):
                self.validate(post(path[:i]), where, schema, path[:i])
                return
            child = _child(schema, token)
            if child is _WHOLE:
                self.validate(post(path[:i]), where, schema, path[:i])
                return
            schema = child
        else:
            schema = self._deref(schema)
            if schema is None:
                return
        self.validate(value, where, schema, path)

    def _deref(self, schema: Any) -> Any:
        """Follow local ``$ref``s that stand alone (annotations aside); None: no constraint."""
        for _ in range(32):
            if schema is True or schema == {}:
                return None
            if not isinstance(schema, dict) or "$ref" not in schema:
                return schema
            if not _ANNOTATIONS.issuperset(k for k in schema if k != "$ref"):
                return schema  # $ref with siblings: validated as a whole where it is
            ref = schema["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                return schema
            try:
                target: Any = self.schema
                for t in parse_pointer(unquote(ref[1:])):
                    target = target[t] if isinstance(target, dict) else target[int(t)]
            except (KeyError, IndexError, ValueError, TypeError):
                return schema
            schema = target
        return schema


_WHOLE: Any = object()
_OBJECT_WORDS = frozenset({"properties", "additionalProperties", "required", "minProperties"})


def _sub_check(root: dict[str, Any], sub: Any) -> Check | None:
    """The fast check of a subschema; its ``$ref``s resolve against the root schema."""
    return compile_check(sub, root)


def _child(schema: dict[str, Any], token: str | int) -> Any:
    """The schema a child lands in, ``None`` for none, ``_WHOLE`` when only validating the
    container as a whole can tell (a key ``additionalProperties: false`` forbids)."""
    items = schema.get("items")
    if items is not None and not _OBJECT_WORDS.isdisjoint(schema):
        return _WHOLE  # says things of objects and of arrays: only the container tells
    props = schema.get("properties")
    if isinstance(props, dict) and str(token) in props:
        return props[str(token)]
    if items is not None and (type(token) is int or str(token).isdigit()):
        if isinstance(items, dict | bool):
            return items if items is not True else None
        return _WHOLE
    extra = schema.get("additionalProperties")
    if extra is False:
        return _WHOLE
    if isinstance(extra, dict):
        return extra
    return None


CACHED_SCHEMAS = 1024  # entries of each cache below (the least recently used go first)
# by the schema object (the hot path: an identity check), holding it so its id stays its
_BY_ID: OrderedDict[int, tuple[dict[str, Any], CompiledSchema]] = OrderedDict()
# by content: every instance of a pattern makes its schemas afresh, equal; they share one
_BY_CONTENT: OrderedDict[str, CompiledSchema] = OrderedDict()
# to_json_schema: the dicts found valid (by content) and the schemas made from types
_CHECKED: OrderedDict[str, bool] = OrderedDict()
# and the dict objects found valid (a pattern passes the same constant every instance)
_CHECKED_BY_ID = TextByObject()
_BY_TYPE: OrderedDict[Any, dict[str, Any]] = OrderedDict()


def compile_schema(schema: dict[str, Any]) -> CompiledSchema:
    """The compiled form of ``schema``: one per distinct schema (by content, so the equal
    schema dicts each instance of a pattern makes share it), found by the object's
    identity first. Both caches are bounded, so nothing of an instance stays behind."""
    hit = _BY_ID.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    try:
        key: str | None = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # not plain JSON: compiled for this object alone
        key = None
    compiled = _BY_CONTENT.get(key) if key is not None else None
    if compiled is None:
        compiled = CompiledSchema(schema)
        if key is not None:
            _BY_CONTENT[key] = compiled
            while len(_BY_CONTENT) > CACHED_SCHEMAS:
                _BY_CONTENT.popitem(last=False)
    else:
        _BY_CONTENT.move_to_end(key)  # type: ignore[arg-type]
    _BY_ID[id(schema)] = (schema, compiled)
    while len(_BY_ID) > CACHED_SCHEMAS:
        _BY_ID.popitem(last=False)
    return compiled


def validate(value: Any, schema: dict[str, Any] | None, where: Where) -> None:
    """Raise ``SchemaError`` naming the path inside ``value`` and the rule that failed;
    ``where`` completes "invalid ...", e.g. ``"write to todo.items (/ab12)"`` (a callable
    is called only when there is an error to describe)."""
    if schema is not None:
        compile_schema(schema).validate(value, where)


def subschema(schema: dict[str, Any] | None, path: tuple[Any, ...]) -> dict[str, Any] | None:
    """The schema of a sub-path, following ``properties`` / ``items`` (no $ref resolution)."""
    for token in path:
        if not schema:
            return None
        props = schema.get("properties")
        if isinstance(props, dict) and str(token) in props:
            schema = props[str(token)]
        elif isinstance(schema.get("items"), dict):
            schema = schema["items"]
        elif isinstance(schema.get("additionalProperties"), dict):
            schema = schema["additionalProperties"]
        else:
            return None
    return schema


def asks_for_link(schema: Any) -> bool:
    """Whether a schema asks for a link to a cell (``{"asCell": true}``), the only place
    links arriving in data from outside are honoured."""
    return isinstance(schema, dict) and schema.get("asCell") is True


def _text(where: Where) -> str:
    return where() if callable(where) else where


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
