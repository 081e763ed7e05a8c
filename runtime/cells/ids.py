"""Cause-derived ids: the same graph node in a restarted process names the same document."""

from __future__ import annotations

import json
from hashlib import sha256 as _sha256
from typing import Any

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(value: Any) -> str:
    """Stable JSON text: sorted keys, no whitespace (what ``json.dumps`` with those options
    writes; one encoder made once, as ``dumps`` would make one per call)."""
    return _CANONICAL.encode(value)


def derive(*parts: Any) -> str:
    """A short, stable id from a description of where a document comes from."""
    try:
        flat = "".join(parts)  # the usual parts: text alone (a TypeError for anything else)
    except TypeError:
        flat = None
    if flat is not None and parts and flat.isascii() and flat.isprintable() \
            and '"' not in flat and "\\" not in flat:
        # nothing to escape in any part: the encoder's text, joined in one go (an
        # instance started derives about twenty ids)
        text = '["' + '","'.join(parts) + '"]'
    else:
        text = _simple_canonical(parts)
        if text is None:
            text = canonical(list(parts))
    return _sha256(text.encode()).hexdigest()[:24]


def _simple_canonical(parts: tuple[Any, ...]) -> str | None:
    """``canonical(list(parts))`` for the usual parts (printable ASCII text with nothing to
    escape, ints, None) without the encoder: about twenty ids per instance started. None
    for anything else. The ids name stored documents, so the text must be the encoder's
    to the byte (tests/cells/test_ids.py holds them to it)."""
    out = []
    for p in parts:
        t = type(p)
        if t is str:
            if not (p.isascii() and p.isprintable()) or '"' in p or "\\" in p:
                return None
            out.append(f'"{p}"')
        elif t is int:
            out.append(str(p))
        elif p is None:
            out.append("null")
        else:
            return None
    return f"[{','.join(out)}]"
