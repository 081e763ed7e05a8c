"""What both loopback fakes use to hold their wire format to the official SDK types.

Validation is pydantic's strict mode (no coercion: ``"1"`` is not an int, an unknown literal
is an error) plus two things strict mode alone misses: the SDK response models allow unknown
fields (``extra="allow"``, so they survive API additions), which would let a misspelt or
invented field through, so ``no_extras`` walks the validated tree and refuses any; and the
SDK request params validate ``Iterable`` fields lazily, so ``drain`` iterates them for every
item to be checked.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from typing import Any

import pydantic


class WireDrift(AssertionError):
    """Something on the wire does not match the official SDK's types."""


def no_extras(value: Any, path: str = "$") -> None:
    """Refuse any field the SDK models do not declare, anywhere in ``value``."""
    if isinstance(value, pydantic.BaseModel):
        if extra := value.__pydantic_extra__:
            raise WireDrift(f"{path}: fields unknown to the SDK: {sorted(extra)}")
        for name in type(value).model_fields:
            no_extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            no_extras(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            no_extras(item, f"{path}.{key}")


def drain(value: Any) -> Any:
    """``value`` with every lazily validated iterable turned into a list (so validated)."""
    if isinstance(value, dict):
        return {k: drain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [drain(v) for v in value]
    return value


def pieces(text: str, size: int) -> list[str]:
    """``text`` cut into ``size``-character deltas, as a tokenizer would stream it, so a
    client must concatenate (one empty piece for empty text)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def tool_choice_problem(mode: str, name: str | None, offered: list[str]) -> str | None:
    """What the API answers 400 for in a request's tool choice (``mode``: ``auto``,
    ``required``, ``none`` or ``tool``, already read from the wire), or None: a choice
    without tools, or a named tool the request does not offer."""
    if not offered:
        return "tool_choice may only be specified while providing tools"
    if mode == "tool" and name not in offered:
        return f"tool_choice names the tool {name!r}, which is not in tools"
    return None


def contradiction(mode: str, name: str | None, called: list[str]) -> str | None:
    """How a scripted reply calling ``called`` breaks the request's tool choice, or None.
    The API never sends such a reply, so a fake refuses to play it: the test is wrong."""
    if mode == "none" and called:
        return f"the reply calls {called[0]!r} under tool_choice none"
    if mode in ("required", "tool") and not called:
        return f"the reply calls no tool under tool_choice {mode}"
    if mode == "tool" and any(c != name for c in called):
        return f"the reply calls another tool than {name!r}"
    return None


def by_wire_names(model: type[pydantic.BaseModel], data: Any, what: str, *,
                  proto_names: bool = False) -> Any:
    """``data`` (JSON as it goes over the wire) validated against an SDK model the way the
    wire spells it, for SDKs whose models take both spellings (``google-genai``: camelCase
    aliases and snake_case names): strictly, every key a field's wire name (its alias; with
    ``proto_names``, its Python name too, which Google's JSON parsers take in a request:
    proto3's JSON mapping accepts both) and every enum one the SDK declares, spelt exactly as
    it spells it (``wire_spelling``)."""
    try:
        value = model.model_validate_json(json.dumps(data), strict=True, by_alias=True,
                                          by_name=proto_names)
    except pydantic.ValidationError as e:
        raise WireDrift(f"{what} does not match the SDK: {e}") from None
    wire_spelling(value, data, what, proto_names=proto_names)
    no_extras(value, what)
    return value


def wire_spelling(value: Any, raw: Any, path: str = "$", *, proto_names: bool = False) -> None:
    """Refuse, anywhere in the validated ``value`` (``raw`` is the JSON it came from), a key
    that is not its field's wire name (``by_wire_names``), and an enum value the SDK does not
    declare or spells otherwise. In JSON mode pydantic silently drops a key spelt as the
    field's Python name when only aliases are asked for, and ``google-genai``'s enums take
    any case and any unknown value (with a mere warning): a misspelt field or an invented
    finish reason would pass."""
    if isinstance(value, enum.Enum):
        if value.name not in type(value).__members__ or raw != value.value:
            raise WireDrift(f"{path}: {raw!r} is not a {type(value).__name__} the SDK declares")
    elif isinstance(value, pydantic.BaseModel) and isinstance(raw, dict):
        spellings = {name: (field.alias or name, name) if proto_names else (field.alias or name,)
                     for name, field in type(value).model_fields.items()}
        if unknown := set(raw) - {key for keys in spellings.values() for key in keys}:
            raise WireDrift(f"{path}: fields unknown to the SDK (by their wire names): "
                            f"{sorted(unknown)}")
        for name, keys in spellings.items():
            for key in keys:
                if key in raw:
                    wire_spelling(getattr(value, name), raw[key], f"{path}.{key}",
                                  proto_names=proto_names)
    elif isinstance(value, list) and isinstance(raw, list):
        for i, (item, wire) in enumerate(zip(value, raw, strict=False)):
            wire_spelling(item, wire, f"{path}[{i}]", proto_names=proto_names)
    elif isinstance(value, dict) and isinstance(raw, dict):
        for key, item in value.items():
            if key in raw:
                wire_spelling(item, raw[key], f"{path}.{key}", proto_names=proto_names)
