"""Schemas: JSON Schema, or a pydantic model / Python type converted with pydantic."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jsonschema
from pydantic import TypeAdapter

from ..errors import SchemaError
from .ids import canonical
from .jsonpath import pointer

SchemaLike = dict[str, Any] | type | Any


def to_json_schema(schema: SchemaLike | None) -> dict[str, Any] | None:
    """Normalise a schema argument: None, a JSON Schema dict, or a type pydantic understands."""
    if schema is None or isinstance(schema, dict):
        if isinstance(schema, dict):
            jsonschema.validators.validator_for(schema).check_schema(schema)
        return schema
    try:
        return TypeAdapter(schema).json_schema()
    except Exception as e:  # pydantic raises several error types for unsupported types
        raise TypeError(
            f"cannot derive a JSON Schema from {schema!r}: {e}. "
            "Pass a JSON Schema dict, a pydantic model or a plain Python type"
        ) from None


@lru_cache(maxsize=1024)
def _validator(text: str) -> jsonschema.protocols.Validator:
    import json

    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def validate(value: Any, schema: dict[str, Any] | None, where: str) -> None:
    """Raise ``SchemaError`` naming the path inside ``value`` and the rule that failed;
    ``where`` completes "invalid ...", e.g. ``"write to todo.items (/ab12)"``."""
    if schema is None:
        return
    error = jsonschema.exceptions.best_match(_validator(canonical(schema)).iter_errors(value))
    if error is None:
        return
    path = pointer(tuple(error.absolute_path))
    detail = error.message  # it quotes the bad value: keep it short (values may be large)
    if len(detail) > 160:
        detail = detail[:157] + "..."
    raise SchemaError(
        f"invalid {where}: at {path or '/'} {detail} (schema rule {error.validator!r})",
        path=path,
        rule=str(error.validator),
    )


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
