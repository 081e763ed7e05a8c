"""Cause-derived ids: the same graph node in a restarted process names the same document."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical(value: Any) -> str:
    """Stable JSON text: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def derive(*parts: Any) -> str:
    """A short, stable id from a description of where a document comes from."""
    return hashlib.sha256(canonical(list(parts)).encode()).hexdigest()[:24]
