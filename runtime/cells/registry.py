"""What runs where: the running instances of one runtime, indexed by the documents they own.

The builtins (a dialog's management tools) are handed a document key by a model and must
find what lives there: the instance whose result or argument it is, the live stream whose
document it is, the pattern a pattern's result offers at a place. ``Runtime.run`` adds an
instance here once its graph is built and ``Runtime.stop`` removes it, so each question is
one dictionary lookup (no scan of instances or builders), and nothing answers for an
instance that stopped.

**Pattern references are capabilities, located, not named.** A pattern placed in a result
(``return {"make": other}``) is stored as the data ``{"$pattern": <key>}``; anyone can write
that shape (a handler, a model through a JSON tool). What makes it runnable is where it is:
``pattern_at(key, path)`` answers only for a place where a running instance's output put a
pattern, and only while the value there still names it. The same shape anywhere else is data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CellError
from ..storage import DocKey
from .equality import same
from .jsonpath import MISSING, step

if TYPE_CHECKING:
    from .cell import Stream
    from .documents import Documents
    from .pattern import Pattern
    from .runtime import Instance

__all__ = ["PATTERN_REF", "Registry"]

PATTERN_REF = "$pattern"
"""How a pattern in an instance's result is stored: ``{"$pattern": <its key>}``."""

class Registry:
    """The running instances by identity, and three indexes over them (see the module
    docstring), kept together so they cannot disagree."""

    def __init__(self, docs: Documents) -> None:
        self._docs = docs
        self._by_ident: dict[tuple[Any, ...], Instance] = {}
        self._owners: dict[DocKey, Instance] = {}  # result and argument documents
        # live streams by document, in the order they were bound: a builtin node's state is
        # filed under the narrowest scope of its inputs, so two instances (two users' runs of
        # one pattern over shared cells) may bind streams on one document
        self._streams: dict[DocKey, list[Stream]] = {}
        self._placed: dict[DocKey, dict[tuple[str, ...], Pattern]] = {}  # by result document
        self._removed = 0  # instances removed since the indexes were last copied (remove())
        # parked instances (Runtime.park): by identity, by the documents that are nothing
        # without them running, and by the scope of their own documents
        self._parked: dict[tuple[Any, ...], Instance] = {}
        self._parked_keys: dict[DocKey, Instance] = {}
        # (an insertion-ordered dict per scope: a removal is O(1) however many share it)
        self._parked_in: dict[tuple[str, str], dict[Instance, None]] = {}
        self._unparked = 0  # since the parked indexes were last copied

    def __len__(self) -> int:
        return len(self._by_ident)

    def __iter__(self) -> Iterator[Instance]:
        return iter(list(self._by_ident.values()))

    def running(self, ident: tuple[Any, ...]) -> Instance | None:
        return self._by_ident.get(ident)

    def add(self, inst: Instance, streams: Sequence[Stream],
            placed: dict[tuple[str, ...], Pattern]) -> None:
        """Index ``inst``: its result and argument, its ``streams`` (every stream its graph
        bound, builtin nodes' included), and the patterns its output ``placed`` in its result
        (by path there)."""
        self._by_ident[inst.ident] = inst
        self._owners[inst.result.doc_key] = inst
        self._owners[inst.argument.doc_key] = inst
        for stream in streams:
            self._streams.setdefault(stream.key, []).append(stream)
        if placed:
            self._placed[inst.result.doc_key] = dict(placed)

    def remove(self, inst: Instance, streams: Sequence[Stream]) -> None:
        """Forget ``inst`` and everything indexed for it."""
        if self._by_ident.get(inst.ident) is inst:
            del self._by_ident[inst.ident]
        for key in (inst.result.doc_key, inst.argument.doc_key):
            if self._owners.get(key) is inst:
                del self._owners[key]
        for stream in streams:
            bound = self._streams.get(stream.key)
            if bound is None:
                continue
            bound[:] = [s for s in bound if s is not stream]
            if not bound:
                del self._streams[stream.key]
        self._placed.pop(inst.result.doc_key, None)
        self._removed += 1
        if self._removed > max(256, len(self._by_ident)):
            # a dict never shrinks: once more instances have gone than are left (parked
            # sessions of a server), indexes sized for what is left (amortised)
            self._removed = 0
            self._by_ident = dict(self._by_ident)
            self._owners = dict(self._owners)
            self._streams = dict(self._streams)
            self._placed = dict(self._placed)

    # -- parked instances ----------------------------------------------------------------

    def park(self, inst: Instance, keys: tuple[DocKey, ...],
             scopes: tuple[tuple[str, str], ...]) -> None:
        """File ``inst`` (already removed) as parked: found by its identity, by ``keys``
        (the documents that are nothing without it running: its result, argument, streams
        and computations) and by the (space, scope)s its stored documents are in."""
        self._parked[inst.ident] = inst
        owners = self._parked_keys
        for key in keys:
            owners[key] = inst
        inst._parked_keys = keys
        inst._parked_scopes = scopes
        for where in scopes:
            self._parked_in.setdefault(where, {})[inst] = None

    def unpark(self, inst: Instance) -> None:
        if self._parked.get(inst.ident) is inst:
            del self._parked[inst.ident]
        owners = self._parked_keys
        for key in inst._parked_keys:
            if owners.get(key) is inst:
                del owners[key]
        inst._parked_keys = ()
        for where in inst._parked_scopes:
            parked = self._parked_in.get(where)
            if parked is not None:
                parked.pop(inst, None)
                if not parked:
                    del self._parked_in[where]
        inst._parked_scopes = ()
        self._unparked += 1
        if self._unparked > max(256, len(self._parked)):  # a dict never shrinks (remove())
            self._unparked = 0
            self._parked = dict(self._parked)
            self._parked_keys = dict(self._parked_keys)
            self._parked_in = dict(self._parked_in)

    def parked(self, ident: tuple[Any, ...]) -> Instance | None:
        return self._parked.get(ident)

    def all_parked(self) -> list[Instance]:
        return list(self._parked.values())

    def parked_owner(self, key: DocKey) -> Instance | None:
        """The parked instance ``key`` is the result, argument, stream or computation of."""
        return self._parked_keys.get(key)

    def parked_in(self, space: str, scope: str) -> list[Instance]:
        """The parked instances with stored documents in ``scope`` of ``space``."""
        parked = self._parked_in.get((space, scope))
        return list(parked) if parked else []

    @property
    def any_parked(self) -> bool:
        return bool(self._parked)

    # -- the lookups ---------------------------------------------------------------------

    def instance_of(self, key: DocKey) -> Instance | None:
        return self._owners.get(key)

    def stream_at(self, key: DocKey) -> Stream | None:
        for stream in self._streams.get(key, ()):
            if not stream.stopped:
                return stream
        return None

    def pattern_at(self, key: DocKey, path: Sequence[str | int]) -> Pattern | None:
        # a path read from a link is all strings; one built in code may hold list indexes
        pattern = self._placed.get(key, {}).get(tuple(str(t) for t in path))
        if pattern is None:
            return None
        try:
            value = self._docs.value(key)
        except CellError:  # the document cannot be read: nothing is offered there
            return None
        for token in path:
            value = step(value, token)
            if value is MISSING:
                return None
        return pattern if same(value, {PATTERN_REF: pattern.key}) else None
