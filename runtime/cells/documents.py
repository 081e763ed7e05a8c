"""Documents and transactions: the state the cells point into.

A document is a JSON value under a ``DocKey``. Stored documents live in a kernel ``Signal``
(and in the store); derived documents are the outputs of computations and live in a kernel
``Computed`` (never stored: they are recomputed). Reads inside a computation go through the
kernel, so they are tracked; writes go through a ``Transaction`` and reach the kernel only
when it commits, all at once, after every changed document validated against its schema.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CellError, PathError, SchemaError
from ..storage import ConflictError, DocKey, Store, Write
from . import signals
from .jsonpath import MISSING, Path, assign, copy_json, is_link, parse_pointer, pointer, step
from .schema import validate

if TYPE_CHECKING:
    from .cell import Stream

MAX_LINK_HOPS = 64
log = logging.getLogger("celldialog")


@dataclass(frozen=True, slots=True)
class Change:
    """One change record of a commit: what was written where, and the value before it
    (None where the path did not exist)."""

    space: str
    id: str
    path: str
    before: Any
    after: Any
    scope: str = ""


class Doc:
    __slots__ = ("derived", "key", "label", "node", "schema", "version")

    def __init__(self, key: DocKey, node: Any, schema: dict[str, Any] | None, label: str,
                 derived: bool, version: int = 0) -> None:
        self.key = key
        self.node = node
        self.schema = schema
        self.label = label
        self.derived = derived
        self.version = version

    def describe(self) -> str:
        scope = f" [{self.key.scope}]" if self.key.scope else ""
        return f"{self.label or 'document'} (/{self.key.id}{scope})"


class Documents:
    """The documents of one runtime, loaded on demand from its store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._docs: dict[DocKey, Doc] = {}
        self.tx: Transaction | None = None
        # bound handlers by their stream document: what a path that ends at a stream
        # document (a builtin's "invoke this") resolves to
        self.streams: dict[DocKey, Stream] = {}
        self.listeners: list[Callable[[list[Change]], None]] = []
        self.errors: list[tuple[str, BaseException]] = []

    def report(self, error: BaseException, where: str) -> None:
        """Record an error that has no caller to raise to (a sink, a queued event)."""
        self.errors.append((where, error))
        log.error("%s failed: %s", where, error, exc_info=error)

    # -- declaring -------------------------------------------------------------------

    def declare(self, key: DocKey, initial: Any, schema: dict[str, Any] | None = None,
                label: str = "", overwrite: bool = False) -> Doc:
        """The stored document at ``key``: loaded if the store has it, else created with
        ``initial`` (validated, then written to the store at once so a restart finds it)."""
        doc = self._docs.get(key)
        if doc is None:
            stored = self.store.load(key)
            if stored is not None and not overwrite:
                doc = Doc(key, signals.Signal(stored.value, label), schema, label, False,
                          stored.version)
                self._docs[key] = doc
                return doc
        elif doc.derived:
            raise CellError(f"{doc.describe()} is computed and cannot be declared as stored")
        if doc is not None:
            if schema is not None:
                doc.schema = schema
            if not overwrite or _same_json(doc.node.peek(), initial):
                return doc
        validate(initial, schema, f"initial value of {label or 'document'} (/{key.id})")
        versions = self.store.commit([Write(key, initial)])
        if doc is None:
            doc = Doc(key, signals.Signal(initial, label), schema, label, False)
            self._docs[key] = doc
        else:
            doc.node.set(initial)
        doc.version = versions[key]
        return doc

    def derive(self, key: DocKey, fn: Callable[[], Any], label: str = "") -> Doc:
        doc = Doc(key, signals.Computed(fn, label), None, label, True)
        self._docs[key] = doc
        return doc

    def reload(self, keys: list[DocKey]) -> None:
        """Catch up with the store (after a conflict: another writer changed these)."""
        with signals.batch():
            for key in keys:
                doc = self._docs.get(key)
                stored = self.store.load(key)
                if doc is not None and stored is not None and not doc.derived:
                    doc.version = stored.version
                    doc.node.set(stored.value)

    def forget(self, key: DocKey) -> None:
        self._docs.pop(key, None)
        self.streams.pop(key, None)

    def doc(self, key: DocKey) -> Doc:
        doc = self._docs.get(key)
        if doc is not None:
            return doc
        stored = self.store.load(key)
        if stored is None:
            raise PathError(
                f"no document /{key.id} in space {key.space!r}"
                + (f" (scope {key.scope})" if key.scope else "")
                + ": it was never created, or it is computed by a pattern instance that is "
                "not running"
            )
        doc = Doc(key, signals.Signal(stored.value), None, "", False, stored.version)
        self._docs[key] = doc
        return doc

    # -- reading ---------------------------------------------------------------------

    def value(self, key: DocKey) -> Any:
        """The document's value: the open transaction's version for the handler that owns
        it, the committed one (tracked by the kernel) for everyone else."""
        tx = self.tx
        if tx is not None and signals.current_subscriber() is None:
            v = tx.writes.get(key, MISSING)
            if v is not MISSING:
                return v
        return self.doc(key).node.get()

    def resolve(self, key: DocKey, path: Path, *, follow_last: bool = True
                ) -> tuple[DocKey, Path, Any]:
        """Follow links along ``path``: the document and path that really hold the value,
        and the value (MISSING if the last step does not exist)."""
        value = self.value(key)
        i = 0
        hops = 0
        while True:
            if is_link(value) and (i < len(path) or follow_last):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise PathError(f"link cycle while reading /{key.id}{pointer(path)}")
                key, target = parse_link(value, key)
                path = target + path[i:]
                i = 0
                value = self.value(key)
                continue
            if i == len(path):
                return key, path, value
            nxt = step(value, path[i])
            if nxt is MISSING:
                if i == len(path) - 1:
                    return key, path, MISSING
                raise PathError(_missing(self, key, path[: i + 1], value))
            value = nxt
            i += 1

    def materialize(self, value: Any, key: DocKey, seen: frozenset[Any] = frozenset()) -> Any:
        """A plain copy of ``value`` with nested links replaced by what they point at."""
        t = type(value)
        if t is dict:
            if is_link(value):
                target, path = parse_link(value, key)
                mark = (target, path)
                if mark in seen:
                    return copy_json(value)  # a cycle of links: show the link itself
                tkey, _, v = self.resolve(target, path)
                if v is MISSING:
                    return None  # a link to a key that does not exist (yet) reads as null
                return self.materialize(v, tkey, seen | {mark})
            return {k: self.materialize(v, key, seen) for k, v in value.items()}
        if t is list:
            return [self.materialize(v, key, seen) for v in value]
        return value


def parse_link(link: dict[str, Any], base: DocKey) -> tuple[DocKey, Path]:
    """``{"@link": "/<id>/<path>", "scope": "user:alice"?}`` -> (document key, path).

    A link may point only into its own space, at a scope as broad or as narrow as the
    document holding it allows: shared documents link to shared ones; a user's documents
    also to that user's; a session's also to its user's and its own. So a link someone
    writes (or sends in an event) can never reach another user's or session's documents.
    """
    try:
        tokens = parse_pointer(link["@link"])
    except ValueError:
        tokens = ()
    if not tokens or not tokens[0]:
        raise PathError(f"malformed link {_short(link)}: expected {{'@link': '/<id>/<path>'}}")
    scope = link.get("scope", "")
    if not isinstance(scope, str) or scope not in reachable_scopes(base.scope):
        raise PathError(
            f"link to /{tokens[0]} refused: its scope {_short(scope)} is not reachable from "
            f"{'shared documents' if not base.scope else base.scope} (links may not cross "
            "into another user's or session's documents)"
        )
    return DocKey(base.space, scope, str(tokens[0])), tokens[1:]


def reachable_scopes(scope: str) -> tuple[str, ...]:
    """The scopes a document in ``scope`` may link to (see ``parse_link``)."""
    if scope.startswith("session:"):
        user, sep, _ = scope[len("session:"):].partition("/")
        return ("", f"user:{user}", scope) if sep else ("", scope)
    return ("", scope) if scope else ("",)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_link(key: DocKey, path: Path) -> dict[str, Any]:
    link: dict[str, Any] = {"@link": f"/{key.id}{pointer(path)}"}
    if key.scope:
        link["scope"] = key.scope
    return link


def _missing(docs: Documents, key: DocKey, path: Path, parent: Any) -> str:
    where = f"/{key.id}{pointer(path)}"
    if type(parent) is dict:
        names = sorted(parent)
        keys = ", ".join(names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
        return f"nothing at {where}: the object there has keys [{keys or 'none'}]"
    if type(parent) is list:
        return f"nothing at {where}: the list there has {len(parent)} items"
    return f"nothing at {where}: the value above it is {type(parent).__name__}, not a container"


def _same_json(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


class Transaction:
    """Buffered writes: reads see the snapshot plus these writes; ``commit`` applies all of
    them atomically (validate, store, then the kernel in one batch) or none."""

    def __init__(self, docs: Documents) -> None:
        self.docs = docs
        self.writes: dict[DocKey, Any] = {}
        self.changes: list[tuple[DocKey, Path, Any, Any]] = []
        self.outbox: list[tuple[Stream, Any]] = []
        self.after_commit: list[Callable[[], None]] = []  # e.g. async work a handler started

    def write(self, key: DocKey, path: Path, value: Any) -> None:
        doc = self.docs.doc(key)
        if doc.derived:
            raise CellError(
                f"cannot write to {doc.describe()}: it is computed from other cells; "
                "write to the cells it reads instead"
            )
        root = self.writes[key] if key in self.writes else doc.node.peek()
        before = root
        for t in path:
            before = step(before, t)
        try:
            new_root = assign(root, path, value)
        except (KeyError, IndexError, TypeError, ValueError):
            raise PathError(
                f"cannot write {doc.describe()}{pointer(path)}: its parent does not exist "
                "(set the parent object first)"
            ) from None
        self.writes[key] = new_root
        self.changes.append((key, path, before, value))

    def commit(self) -> list[Change]:
        """Apply every write or none, then tell listeners and run ``after_commit`` hooks."""
        records = self._apply() if self.writes else []
        hooks, self.after_commit = self.after_commit, []
        for hook in hooks:
            hook()
        return records

    def _apply(self) -> list[Change]:
        docs = self.docs
        for key, root in self.writes.items():
            doc = docs.doc(key)
            if doc.schema is not None:
                try:
                    validate(root, doc.schema, f"write to {doc.describe()}")
                except SchemaError as e:
                    written = dict.fromkeys(
                        pointer(p) or "/" for k, p, _, _ in self.changes if k == key
                    )
                    e.args = (f"{e.args[0]}; nothing was committed (wrote {', '.join(written)})",)
                    raise
        try:
            versions = docs.store.commit(
                [Write(k, v, docs.doc(k).version) for k, v in self.writes.items()]
            )
        except ConflictError:
            docs.reload(list(self.writes))  # another writer got there first: catch up
            raise
        with signals.batch():
            for key, root in self.writes.items():
                doc = docs.doc(key)
                doc.version = versions[key]
                doc.node.set(root)
        # copies: a listener that mutates a record must not reach the committed state
        records = [
            Change(k.space, k.id, pointer(p), None if b is MISSING else copy_json(b),
                   copy_json(a), k.scope)
            for k, p, b, a in self.changes
        ]
        self.writes = {}
        for listener in list(docs.listeners):
            try:
                listener(records)
            except Exception as e:  # the commit stands; an observer's bug is reported
                docs.report(e, f"on_commit listener {listener!r}")
        return records
