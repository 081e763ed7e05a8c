"""JSON as the wire has it: what Python's reader takes beyond the standard is refused.

``json.loads`` accepts ``NaN``, ``Infinity`` and ``-Infinity``, and reads a number too large
for a float (``1e999``) as infinity. None of them is JSON: a value holding one, kept in a
history, would be sent back as text no provider parses, and every later request of the
conversation would fail. So everything decoded from a provider (a body, an event, a tool
call's arguments) goes through this one decoder, which raises ``ValueError`` for them.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["decode"]


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} does not fit a float")
    return value


# One decoder, built once: json.loads with an argument builds a new one at every call.
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def decode(text: str) -> Any:
    """``text`` decoded; ``ValueError`` for what is not JSON (the non-standard constants and
    numbers past a float's range included), ``RecursionError`` for nesting too deep."""
    return _DECODER.decode(text)
