"""Cause-derived ids: the same graph node in a restarted process names the same document."""

from __future__ import annotations

import hashlib
import json
from typing import Any

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(value: Any) -> str:
    """Stable JSON text: sorted keys, no whitespace (what ``json.dumps`` with those options
    writes; one encoder made once, as ``dumps`` would make one per call)."""
    return _CANONICAL.encode(value)


def derive(*parts: Any) -> str:
    """A short, stable id from a description of where a document comes from."""
    return hashlib.sha256(canonical(list(parts)).encode()).hexdigest()[:24]
