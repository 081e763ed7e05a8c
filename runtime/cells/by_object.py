"""The JSON text of dict objects seen lately: a cache key made once per object, not per use.

A pattern passes the same constant schema dicts every time it runs (a handler's event
schema, a cell's schema); writing one out as sorted JSON text to look it up by content
costs about three times what comparing it with a copy does. So the text is remembered by
the object, with a plain JSON copy of it (``json.loads`` of the text) to tell that the
object has not been changed in place since: compared with strict JSON equality, where
``1`` and ``true`` differ, and a dict subclass (whose equality is Python's) never matches
a plain copy, so it is written out every time.

Few objects, the least recently used going first (a schema written as a literal in a
pattern is a new dict every run and only churns through), and only small ones (a large one
would be held two or three times over). The cell graph's schema checks and the builtins'
advertised tools both use it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from .equality import same

__all__ = ["TextByObject"]


class TextByObject:
    """``get(obj)``: the text ``put`` for this very object, if it is unchanged since."""

    __slots__ = ("_seen", "most_chars", "size")

    def __init__(self, size: int = 64, most_chars: int = 4096) -> None:
        self.size = size
        self.most_chars = most_chars
        self._seen: OrderedDict[int, tuple[Any, str, Any]] = OrderedDict()

    def get(self, obj: Any) -> str | None:
        seen = self._seen.get(id(obj))
        if seen is None or seen[0] is not obj or not same(seen[2], obj):
            return None
        self._seen.move_to_end(id(obj))
        return seen[1]

    def put(self, obj: Any, text: str) -> None:
        """Remember ``text``, the JSON text of ``obj`` as it is now."""
        if len(text) > self.most_chars:
            return
        self._seen[id(obj)] = (obj, text, json.loads(text))
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, obj: object) -> bool:
        seen = self._seen.get(id(obj))
        return seen is not None and seen[0] is obj
