"""Where things are in the JSON text of a request: spans of object members and array items,
found by position (``json.JSONDecoder.raw_decode``) rather than by re-encoding, so the
backends can answer byte-level questions (the cacheable prefix, replayed opaque blocks) from
exactly the bytes that went over the wire."""

from __future__ import annotations

import json

Span = tuple[int, int]

_DECODER = json.JSONDecoder()


def skip(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not JSON whitespace."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def members(text: str, pos: int) -> dict[str, Span]:
    """``{key: (start, end)}`` of each member value of the JSON object at ``pos``."""
    pos = skip(text, pos)
    assert text[pos] == "{", f"no object at {pos}"
    out: dict[str, Span] = {}
    pos += 1
    while (pos := skip(text, pos)) < len(text) and text[pos] != "}":
        key, pos = _DECODER.raw_decode(text, pos)
        pos = skip(text, pos)
        assert text[pos] == ":", f"no ':' at {pos}"
        start = skip(text, pos + 1)
        _, end = _DECODER.raw_decode(text, start)
        out[key] = (start, end)
        pos = skip(text, end)
        pos += text[pos] == ","
    return out


def items(text: str, pos: int) -> list[Span]:
    """``(start, end)`` of each item of the JSON array at ``pos``."""
    pos = skip(text, pos)
    assert text[pos] == "[", f"no array at {pos}"
    out: list[Span] = []
    pos += 1
    while (pos := skip(text, pos)) < len(text) and text[pos] != "]":
        _, end = _DECODER.raw_decode(text, pos)
        out.append((pos, end))
        pos = skip(text, end)
        pos += text[pos] == ","
    return out
