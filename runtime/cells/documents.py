"""Documents and transactions: the state the cells point into.

A document is a JSON value under a ``DocKey``. Stored documents live in a kernel ``Signal``
(and in the store); derived documents are the outputs of computations and live in a kernel
``Computed`` (never stored: they are recomputed). Reads inside a computation go through the
kernel, so they are tracked; writes go through a ``Transaction`` and reach the kernel only
when it commits, all at once.

Transactions belong to the task that opened them (a ``ContextVar``): concurrent tasks never
share one. A transaction records each write as ``(path, value)`` against the version of the
document it first touched. A commit checks each write against the schema where it lands
(not the whole document), writes the store (the same patches: the store's cost is what
changed), and only then changes the kernel's copy, in place. Everything that can fail is
done before the store writes; nothing after it raises. A commit whose documents another
task or process committed in between fails with ``ConflictError`` and changes nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import marshal
from asyncio.events import _get_running_loop
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import (
    CellError,
    ClosedError,
    ConflictError,
    LinkError,
    PathError,
    ReadOnlyError,
    SchemaError,
    StorageError,
)
from ..storage import DocKey, Store, Write, can_watch
from . import signals
from .equality import same
from .jsonpath import (
    LINK,
    MISSING,
    Path,
    assign_in_place,
    copy_json,
    is_link,
    pointer,
    step,
)
from .links import check_assembled, make_link, parse_link
from .schema import CompiledSchema, compile_schema

if TYPE_CHECKING:
    from .cell import Stream

__all__ = ["Change", "Doc", "Documents", "Transaction", "current_transaction", "make_link",
           "parse_link"]

MAX_LINK_HOPS = 64
MAX_ERRORS = 1000
log = logging.getLogger("celldialog")

FILL_RETRIES = 3  # a fill (``Documents.declare``) written again on what another process wrote

_tx: ContextVar[Transaction | None] = ContextVar("celldialog_transaction", default=None)


_current_subscriber = signals.current_subscriber  # asked on every read


def current_transaction() -> Transaction | None:
    """The transaction open in this task, if any. A task started inside another task's
    transaction inherits the context variable, not the transaction: it has none."""
    tx = _tx.get()
    if tx is None or (t := tx.task) is None or t is _tasks_get(_get_running_loop()) \
            or (type(t) is int and t == _other_task_id()):
        return tx
    return None


def _open_tx(docs: Documents) -> Transaction | None:
    """``Documents.tx`` in one call (every cell write asks): ``current_transaction()``'s
    owner test, written out."""
    tx = _tx.get()
    if tx is None or tx.docs is not docs:
        return None
    if (t := tx.task) is None or t is _tasks_get(_get_running_loop()) \
            or (type(t) is int and t == _other_task_id()):
        return tx
    return None


# The running task, asked on every read inside a transaction: asyncio's, looked up where
# asyncio keeps it (two C calls, no Python frame; ``current_task()`` is Python code on
# 3.11), else None. Another backend's task is known by anyio's id (``_task_key``).
def _asyncio_current_task(loop: asyncio.AbstractEventLoop | None) -> asyncio.Task[Any] | None:
    return asyncio.current_task(loop) if loop is not None else None


_current_tasks = getattr(asyncio.tasks, "_current_tasks", None)
# a Python that no longer keeps them in a dict (or keeps the dict but not its tasks there:
# _task_key finds that out) asks asyncio.current_task instead
_tasks_get: Callable[[asyncio.AbstractEventLoop | None], asyncio.Task[Any] | None] = (
    _current_tasks.get if isinstance(_current_tasks, dict) else _asyncio_current_task)


def _task_key() -> object | None:
    """The running task, as a transaction remembers its owner: asyncio's task object, or
    anyio's id of a task of another backend, or None in plain synchronous code."""
    global _tasks_get
    loop = _get_running_loop()
    task = _tasks_get(loop)
    if task is None and loop is not None:
        task = asyncio.current_task(loop)
        if task is not None:  # asyncio keeps its tasks elsewhere now: ask it every time
            _tasks_get = _asyncio_current_task
    return task if task is not None else _other_task_id()


def _other_task_id() -> int | None:
    """Not in an asyncio task: anyio's id of the task (another backend), or None."""
    try:
        return anyio.get_current_task().id
    except Exception:  # no event loop: plain synchronous code
        return None


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
    __slots__ = ("_compiled", "_compiled_for", "declared", "derived", "holders", "key", "label",
                 "node", "readonly", "schema", "scratch", "version")

    def __init__(self, key: DocKey, node: Any, schema: dict[str, Any] | None, label: str,
                 derived: bool, version: int = 0, readonly: str | None = None) -> None:
        self.key = key
        self.node = node
        self.schema = schema
        self._compiled: CompiledSchema | None = None
        self._compiled_for: Any = None  # the schema object it was compiled for
        self.label = label
        self.derived = derived
        self.version = version
        self.readonly = readonly  # why users may not write it (an instance's result...)
        self.declared = derived  # declared by a running instance: its schema is known
        self.scratch = False  # writes last one transaction: never committed (scratch())
        self.holders = 0  # running instances that declared it (Documents.recording)

    @property
    def compiled(self) -> CompiledSchema | None:
        if self.schema is None:
            return None
        c = self._compiled
        if c is None or self._compiled_for is not self.schema:  # shared by equal schemas
            c = self._compiled = compile_schema(self.schema)
            self._compiled_for = self.schema
        return c

    def describe(self) -> str:
        scope = f" [{self.key.scope}]" if self.key.scope else ""
        return f"{self.label or 'document'} (/{self.key.id}{scope})"


class Documents:
    """The documents of one runtime, loaded on demand from its store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # declaring(): the writes kept for one commit, by key (write, doc, value before)
        self._batch: dict[DocKey, tuple[Write, Doc, Any]] | None = None
        # ... and the fills among them (``declare(fill=...)``), applied again on a conflict
        self._fills: dict[DocKey, Callable[[Any], Any]] = {}
        # the store is this runtime's alone (a MemoryStore made for it): no other writer,
        # so what is loaded here is what is stored
        self.sole_writer = False
        # the store tells versions apart from values (a change feed's ``versions()``)
        self.watchable = can_watch(store)
        # sole writer: stored values no Doc holds (computed since, or let go by drop())
        self._let_go: dict[DocKey, Any] = {}
        # while an instance is built: the keys it declares (each declare also counts the
        # document's holders); see Runtime.run and drop()
        self.recording: list[DocKey] | None = None
        # ... and the effects (sinks) made meanwhile: the instance's own (Runtime.park)
        self.effects: list[Any] | None = None
        # asked before a document that is not loaded is read from the store, and before a
        # write to one no running instance declares: a parked instance that owns it comes
        # back first (Runtime.park). With write=True, the owner is looked for wider.
        self.on_missing: Callable[[DocKey, bool], None] | None = None
        self._dropped = 0  # documents dropped since _docs was last copied (drop())
        self._docs: dict[DocKey, Doc] = {}
        self.listeners: list[Callable[[list[Change]], None]] = []
        self.errors: deque[tuple[str, BaseException]] = deque(maxlen=MAX_ERRORS)
        self.closed = False
        self.notify_queue: deque[list[Change]] = deque()  # commits not yet told to listeners
        self.applying = 0  # commits applying to the kernel now (nested when a sink writes)
        self.committing = 0  # commits under way, their after_commit hooks included
        # documents the store could not read, and at which version (reported once each)
        self._unreadable: dict[DocKey, int] = {}

    def notify(self) -> None:
        """Tell listeners of the queued commits, oldest first."""
        while self.notify_queue:
            records = self.notify_queue.popleft()
            for listener in list(self.listeners):
                try:
                    listener(records)
                except Exception as e:  # the commit stands; an observer's bug is reported
                    self.report(e, f"on_commit listener {listener!r}")

    def report(self, error: BaseException, where: str) -> None:
        """Record an error that has no caller to raise to (a sink, a queued event). The
        newest ``MAX_ERRORS`` are kept; every one is logged."""
        self.errors.append((where, error))
        log.error("%s failed: %s", where, error, exc_info=error)

    def check_open(self, what: str) -> None:
        if self.closed:
            raise ClosedError(
                f"{what} after the runtime closed: its store is closed and nothing more can "
                "be committed; open a new `async with Runtime(...)`"
            )

    @property
    def tx(self) -> Transaction | None:
        """The transaction open in the calling task on these documents, if any."""
        return _open_tx(self)

    # -- declaring -------------------------------------------------------------------

    def declare(self, key: DocKey, initial: Any, schema: dict[str, Any] | None = None,
                label: str = "", overwrite: bool = False, readonly: str | None = None,
                owned: bool = False, seed: Callable[[], Any] | None = None,
                fill: Callable[[Any], Any] | None = None) -> Doc:
        """The stored document at ``key``: loaded if the store has it, else created with
        ``initial`` (validated, then written to the store at once so a restart finds it).

        Creating is conditional (create-if-absent): when another process creates it first,
        its committed value wins and is loaded. ``overwrite`` replaces what is stored
        (structure the runtime derives from code: results, stream markers). While an
        instance is built (``recording``), the key is recorded and the document counts one
        more holder. ``owned``: ``initial`` is plain JSON made for this call, which nothing
        else holds or changes (``check_json``'s copy): the document keeps it, uncopied.
        ``seed``: called only when the document is created (the store has none), for the
        value to create it with instead of ``initial`` (plain JSON, owned like ``initial``):
        where a builtin reads what an earlier layout stored elsewhere. ``fill``: called with
        the stored value when the document is loaded; what it returns (plain JSON, owned),
        unless None, replaces it, written on condition that it is still the version loaded
        (fields a newer version of the code adds to a record)."""
        doc = self._declare(key, initial, schema, label, overwrite, readonly, owned, seed,
                            fill)
        recording = self.recording
        if recording is not None:
            recording.append(key)
            doc.holders += 1
        return doc

    def _declare(self, key: DocKey, initial: Any, schema: dict[str, Any] | None,
                 label: str, overwrite: bool, readonly: str | None, owned: bool,
                 seed: Callable[[], Any] | None = None,
                 fill: Callable[[Any], Any] | None = None) -> Doc:
        if self.closed:
            self.check_open(f"declaring {label or 'a document'}")  # raises
        doc = self._docs.get(key)
        if doc is not None and (doc.derived or doc.scratch):
            raise CellError(f"{doc.describe()} is "
                            f"{'computed' if doc.derived else 'scratch'} and cannot be declared "
                            "as stored")
        if doc is None:
            stored = self.store.load(key)
            if stored is not None:
                doc = Doc(key, signals.Signal(stored.value, label), schema, label, False,
                          stored.version, readonly)
                self._held(key, doc)
        if doc is not None:
            if schema is not None:
                doc.schema = schema
            doc.readonly = readonly
            doc.declared = True
            if fill is not None and not overwrite:
                filled = fill(doc.node.peek())
                if filled is not None:
                    return self._fill(doc, filled, fill, label, readonly, initial)
            if not overwrite or same(doc.node.peek(), initial):
                return doc
        elif seed is not None:
            initial = seed()
        if schema is not None:
            compile_schema(schema).validate(
                initial, lambda: f"initial value of {label or 'document'} (/{key.id})")
        if self._batch is not None:  # inside declaring(): stored with the others at its end
            return self._declare_later(key, initial, schema, label, readonly, doc, owned)
        try:
            # create-if-absent (expect 0) unless replacing what the runtime derives from code
            versions = self.store.commit([Write(key, initial, None if doc is not None else 0)])
        except ConflictError:
            # another process created it between our load and our write: theirs stands
            stored = self.store.load(key)
            if stored is None:
                raise
            doc = Doc(key, signals.Signal(stored.value, label), schema, label, False,
                      stored.version, readonly)
            doc.declared = True
            self._held(key, doc)
            return doc
        if doc is None:
            doc = Doc(key, signals.Signal(initial if owned else copy_json(initial), label),
                      schema, label, False, readonly=readonly)
            doc.declared = True
            self._docs[key] = doc
        else:
            doc.node.set(initial if owned else copy_json(initial))
        doc.version = versions[key]
        return doc

    def _fill(self, doc: Doc, value: Any, fill: Callable[[Any], Any], label: str,
              readonly: str | None, initial: Any) -> Doc:
        """``declare``'s ``fill``: ``value`` replaces the loaded one, on condition that the
        store still holds the version loaded; if another process wrote it meanwhile, theirs
        is filled in the same way (``_theirs``). What is filled in comes from ``initial``,
        checked against the schema (the stored rest is not checked again, as a load is
        not)."""
        if doc.schema is not None:
            compile_schema(doc.schema).validate(
                initial, lambda: f"initial value of {label or 'document'} (/{doc.key.id})")
        if self._batch is not None:
            self._fills[doc.key] = fill
            return self._declare_later(doc.key, value, doc.schema, label, readonly, doc, True,
                                       doc.version)
        try:
            doc.version = self.store.commit([Write(doc.key, value, doc.version)])[doc.key]
        except ConflictError:  # another process wrote it since it was loaded
            self._theirs(doc, fill)
            return doc
        doc.node.set(value)
        return doc

    def _theirs(self, doc: Doc, fill: Callable[[Any], Any] | None) -> None:
        """After a conditional write of ``doc`` conflicted: what the store holds now stands,
        with ``fill``'s fields filled in (on condition again, a few times at most)."""
        key = doc.key
        for _ in range(FILL_RETRIES):
            stored = self.store.load(key)
            if stored is None:
                raise ConflictError(f"{doc.describe()} was removed while it was declared")
            filled = fill(stored.value) if fill is not None else None
            if filled is None:
                break
            try:
                doc.version = self.store.commit([Write(key, filled, stored.version)])[key]
            except ConflictError:
                continue
            doc.node.set(filled)
            return
        doc.node.set(stored.value)
        doc.version = stored.version

    @contextmanager
    def declaring(self) -> Iterator[None]:
        """Declare the block's documents in one store commit, at its end (or before any
        transaction commits inside it), not one each: a pattern instance declares a dozen
        or more, and on a file or a server each commit is a round trip. Nested blocks join
        the outer one. What the block declared is stored even if it raises, as it would
        have been one by one."""
        if self._batch is not None:
            yield
            return
        self._batch = {}
        try:
            yield
        finally:
            try:
                self.flush_declared()
            finally:
                self._batch = None

    def _declare_later(self, key: DocKey, initial: Any, schema: dict[str, Any] | None,
                       label: str, readonly: str | None, doc: Doc | None, owned: bool,
                       version: int | None = None) -> Doc:
        """``declare``'s write, kept for ``flush_declared``; the document is usable now (an
        owned ``initial`` is shared with the write: stores never keep nor change what they
        are handed, and the runtime changes its copy in place only after the flush)."""
        assert self._batch is not None
        mine = initial if owned else copy_json(initial)
        if doc is None:
            doc = Doc(key, signals.Signal(mine, label), schema, label, False,
                      readonly=readonly)
            doc.declared = True
            self._docs[key] = doc
            before: Any = MISSING  # made here: dropped again if it cannot be stored
        else:
            before = doc.node.peek()
            doc.node.set(mine)
        earlier = self._batch.get(key)
        if earlier is not None:  # declared twice in one block: one write, the first's base
            before, expect = earlier[2], earlier[0].expect
        elif version is not None:  # a replacement on condition (``_fill``)
            expect = version
        else:
            expect = None if before is not MISSING else 0
        self._batch[key] = (Write(key, initial, expect), doc, before)
        return doc

    def flush_declared(self) -> None:
        """Store what ``declaring()`` has kept so far: one commit for all. If another
        process created one of them meanwhile, each is stored on its own instead, and
        theirs stands where it exists. If the store fails, the documents made in the block
        are dropped again (and replaced ones restored): nothing is left that only this
        process believes."""
        batch = self._batch
        if not batch:
            return
        pending = list(batch.values())
        batch.clear()
        try:
            self._flush(pending)
        finally:
            self._fills.clear()

    def _flush(self, pending: list[tuple[Write, Doc, Any]]) -> None:
        try:
            try:
                versions = self.store.commit([w for w, _, _ in pending])
            except ConflictError:
                for w, doc, _ in pending:
                    self._store_one(w, doc)
                return
        except BaseException:
            for w, doc, before in pending:
                if before is MISSING:
                    self._docs.pop(w.key, None)
                else:
                    doc.node.set(before)
            raise
        for w, doc, _ in pending:
            doc.version = versions[w.key]

    def _store_one(self, write: Write, doc: Doc) -> None:
        try:
            doc.version = self.store.commit([write])[write.key]
        except ConflictError:  # another process created (or, for a fill, wrote) it first
            if self.store.load(write.key) is None:
                raise
            self._theirs(doc, self._fills.get(write.key))

    def scratch(self, key: DocKey, initial: Any, label: str = "") -> Doc:
        """A document whose writes last only for the transaction that makes them: never
        stored, never committed, so no other transaction (and no observer) sees them. For
        handing a value between parts of one commit. ``initial`` (plain JSON) is what every
        transaction starts from."""
        doc = self._docs.get(key)
        if doc is not None:
            if not doc.scratch:
                raise CellError(f"{doc.describe()} is stored and cannot be made scratch")
            return doc
        doc = Doc(key, signals.Signal(copy_json(initial), label), None, label, False)
        doc.scratch = doc.declared = True
        self._docs[key] = doc
        return doc

    def derive(self, key: DocKey, fn: Callable[[], Any], label: str = "") -> Doc:
        old = self._docs.get(key)
        if self.sole_writer and old is not None and not old.derived and not old.scratch:
            # a stored document now computed: the store keeps no value of its own (mirror).
            # Kept even at version 0: a declaring() block gives it its version at its end
            self._let_go[key] = old.node.peek()
        doc = Doc(key, signals.Computed(fn, label), None, label, True)
        self._docs[key] = doc
        return doc

    def committed_copy(self, key: DocKey) -> Any:
        """A copy of the committed value of a stored document: what a ``MirrorStore``
        (``sole_writer``) hands out, as it keeps versions only."""
        doc = self._docs.get(key)
        if doc is None or doc.derived:
            kept = self._let_go[key]
            return marshal.loads(kept) if type(kept) is bytes else copy_json(kept)
        return copy_json(doc.node.peek())

    def reload(self, keys: list[DocKey]) -> None:
        """Catch up with the store (after a conflict: another writer changed these)."""
        with signals.batch():
            for key in keys:
                doc = self._docs.get(key)
                stored = self.store.load(key)
                if doc is not None and stored is not None and not doc.derived:
                    doc.version = stored.version
                    doc.node.set(stored.value)

    def catch_up(self, changed: Mapping[DocKey, int] | None) -> int:
        """Take what other writers committed (a change feed's batch: ``{key: version}``,
        or None to compare every version held) into the documents loaded here: those
        behind are fetched in one read and set in one kernel batch, so computeds recompute
        once and sinks fire once. Documents not loaded are left to load when read. It runs
        between other tasks' steps: a transaction that read one of them before conflicts
        at its commit, as it would had the other writer been a task here.

        A document the store cannot read (damaged, or a read that failed) is left as it
        was and reported once per version (it is tried again whenever the feed names it);
        the others still catch up. Returns how many were updated."""
        if self.closed:
            return 0
        docs = self._docs
        if changed is None:
            changed = self.store.versions(  # type: ignore[attr-defined]
                [k for k, d in docs.items() if not d.derived])
        stale = [k for k, v in changed.items()
                 if (d := docs.get(k)) is not None and not d.derived and d.version < v]
        if not stale:
            return 0
        try:
            fresh = self.store.load_many(stale)  # type: ignore[attr-defined]
        except StorageError:
            fresh = self._load_each(stale, changed)
        return self.take(fresh)

    def _load_each(self, keys: list[DocKey], changed: Mapping[DocKey, int]) -> dict[DocKey, Any]:
        """One read per key, after a batch read failed: one damaged document must not keep
        the rest of the batch from catching up."""
        fresh: dict[DocKey, Any] = {}
        for key in keys:
            try:
                stored = self.store.load(key)
            except StorageError as e:
                if self._unreadable.get(key) != changed[key]:  # once per version
                    self._unreadable[key] = changed[key]
                    self.report(e, f"reading {key.id!r} after another writer's commit")
                continue
            if stored is not None:
                fresh[key] = stored
        return fresh

    def refresh(self, keys: list[DocKey]) -> int:
        """Read ``keys`` again from the store now, not waiting for the change feed (a
        decision that must not rest on a copy another process may have moved ahead).
        Nothing to read when this runtime is the store's only writer (``sole_writer``)."""
        if self.sole_writer:
            return 0
        docs, store = self._docs, self.store
        held = [k for k in keys if (d := docs.get(k)) is not None and not d.derived]
        if self.watchable:  # versions first (cheap), then only what moved
            versions = store.versions(held)  # type: ignore[attr-defined]
            held = [k for k in held if versions.get(k, 0) > docs[k].version]
            if not held:
                return 0
        fresh: dict[DocKey, Any] = {}
        for key in held:
            stored = store.load(key)
            if stored is not None and stored.version > docs[key].version:
                fresh[key] = stored
        return self.take(fresh) if fresh else 0

    def take(self, fresh: Mapping[DocKey, Any]) -> int:
        """Set the loaded documents that are behind ``fresh`` (``Stored`` values, read from
        the store), in one kernel batch; listeners run after, as after a commit."""
        docs = self._docs
        n = 0
        self.applying += 1
        try:
            with signals.batch():
                for key, stored in fresh.items():
                    doc = docs.get(key)
                    if doc is not None and not doc.derived and doc.version < stored.version:
                        doc.version = stored.version
                        doc.node.set(stored.value)
                        n += 1
        except Exception as e:  # an effect failed: the other writer's commit stands
            self.report(e, "effects after another writer's commit")
        finally:
            self.applying -= 1
        if not self.applying:
            self.notify()
        return n

    def forget(self, key: DocKey) -> None:
        self._docs.pop(key, None)

    def release(self, doc: Doc) -> None:
        """One instance that declared ``doc`` no longer runs (stopped or parked)."""
        if doc.holders > 0:
            doc.holders -= 1

    def drop(self, keys: Iterable[DocKey]) -> int:
        """Take stored documents out of memory (their store keeps them; a read loads them
        again): those of ``keys`` that are loaded, that no running instance declares and
        that nothing live reads (no subscriber in the kernel). On a store whose values are
        this runtime's (``sole_writer``), the value stays here, packed (``_pack``): the
        store has none of its own. Returns how many went."""
        docs = self._docs
        n = 0
        for key in keys:
            doc = docs.get(key)
            if doc is None or doc.derived or doc.scratch or doc.holders or doc.node.subs:
                continue
            if self.sole_writer:
                self._let_go[key] = _pack(doc.node.peek())
            del docs[key]
            n += 1
        self._dropped += n
        if self._dropped > max(1024, len(docs)):
            # a dict never shrinks: once more have gone than are left, a copy sized for
            # what is left (amortised: each drop pays for one copied entry at most)
            self._docs = dict(docs)
            self._dropped = 0
        return n

    def _held(self, key: DocKey, doc: Doc) -> None:
        """``doc``, just loaded from the store, is the document at ``key`` from now on: a
        value kept for the store while no Doc held it is held by the Doc now."""
        self._docs[key] = doc
        if self._let_go:
            self._let_go.pop(key, None)

    def doc(self, key: DocKey) -> Doc:
        doc = self._docs.get(key)
        if doc is not None:
            return doc
        if self.on_missing is not None:
            self.on_missing(key, False)  # a parked instance that owns it comes back
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
        self._held(key, doc)
        return doc

    # -- reading ---------------------------------------------------------------------

    def value(self, key: DocKey) -> Any:
        """The document's value: the open transaction's version for the task that owns
        it, the committed one (tracked by the kernel) for everyone else."""
        tx = _tx.get()
        # the owner test of current_transaction(), written out: every read passes here
        if tx is not None and tx.docs is self and _current_subscriber() is None \
                and ((t := tx.task) is None or t is _tasks_get(_get_running_loop())
                     or (type(t) is int and t == _other_task_id())):
            pending = tx.pending.get(key)
            if pending is None:
                # the version this transaction's view of the document is based on: a commit
                # after another task's commit to it is a conflict, not a lost update
                doc = self._docs.get(key) or self.doc(key)
                if not doc.derived:
                    tx.pending[key] = _Pending(doc.version)
                    tx.created.append(key)
                return doc.node.get()
            if pending.ops:
                return tx.view(key, pending)
        return (self._docs.get(key) or self.doc(key)).node.get()

    def resolve(self, key: DocKey, path: Path, *, follow_last: bool = True
                ) -> tuple[DocKey, Path, Any]:
        """Follow links along ``path``: the document and path that really hold the value,
        and the value (MISSING if the last step does not exist). With ``follow_last``
        false, a link exactly at ``path`` is returned as the value, not followed."""
        value = self.value(key)
        i = 0
        hops = 0
        while True:
            if type(value) is dict and is_link(value) and (i < len(path) or follow_last):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise LinkError(f"link cycle while reading /{key.id}{pointer(path)}")
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
                raise PathError(_missing(key, path[: i + 1], value))
            value = nxt
            i += 1

    def materialize(self, value: Any, key: DocKey,
                    target: Callable[[DocKey, Path, Any], Any] | None = None) -> Any:
        """A plain copy of ``value`` with nested links replaced by what they point at.

        A target reached by several links is materialized once and shared in the copy, so
        links fanning out level after level cost what the distinct targets cost, not 2**n.
        A link that cannot be followed (malformed, refused, cyclic, missing) reads as None:
        one bad link never makes a document unreadable. ``target(key, path, value)``, when
        given, may stand in for what a link reaches (return MISSING to follow it as usual):
        the management tools show a stream this way."""
        memo: dict[tuple[DocKey, Path], Any] = {}
        return self._materialize(value, key, memo, set(), 0, target)

    def _materialize(self, value: Any, key: DocKey, memo: dict[Any, Any],
                     active: set[Any], depth: int,
                     target_hook: Callable[[DocKey, Path, Any], Any] | None = None) -> Any:
        t = type(value)
        if t is dict:
            if is_link(value):
                try:
                    target, path = parse_link(value, key)
                    mark = (target, path)
                    if mark in memo:
                        return memo[mark]
                    if mark in active or depth > MAX_LINK_HOPS * 4:
                        return None  # a cycle of links
                    tkey, tpath, v = self.resolve(target, path)
                except PathError:
                    return None
                if v is MISSING:
                    return None  # a link to a key that does not exist (yet) reads as null
                out = MISSING if target_hook is None else target_hook(tkey, tpath, v)
                if out is MISSING:
                    active.add(mark)
                    out = self._materialize(v, tkey, memo, active, depth + 1, target_hook)
                    active.discard(mark)
                memo[mark] = out
                return out
            return {k: self._materialize(v, key, memo, active, depth + 1, target_hook)
                    for k, v in value.items()}
        if t is list:
            return [self._materialize(v, key, memo, active, depth + 1, target_hook)
                    for v in value]
        return value


def _pack(value: Any) -> Any:
    """A value kept while no Doc holds it (``Documents.drop``): a container as ``marshal``
    bytes (a third of the objects' size, nothing for the cyclic collector to walk; a JSON
    value is never bytes, so bytes say "packed"); scalars and empty containers as they are
    (smaller, or shared). Only values this runtime made go in: ``marshal`` never reads
    bytes from outside. Version 2: no back-references, so two equal parts of a value never
    come back as one object."""
    return marshal.dumps(value, 2) if type(value) in (dict, list) and value else value


def _missing(key: DocKey, path: Path, parent: Any) -> str:
    where = f"/{key.id}{pointer(path)}"
    if type(parent) is dict:
        names = sorted(parent)
        keys = ", ".join(names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
        return f"nothing at {where}: the object there has keys [{keys or 'none'}]"
    if type(parent) is list:
        return f"nothing at {where}: the list there has {len(parent)} items"
    return f"nothing at {where}: the value above it is {type(parent).__name__}, not a container"


# ---------------------------------------------------------------------------- transactions


class TxState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


class _Pending:
    """One document's writes in a transaction: the version they are based on, the writes
    as ``(path, value)``, and (only once something reads the document after writing it)
    a working copy with them applied, whose copied containers the transaction owns."""

    __slots__ = ("base", "befores", "ops", "owned", "root")

    def __init__(self, base: int) -> None:
        self.base = base
        self.ops: list[tuple[Path, Any]] = []
        self.befores: list[Any] = []
        self.root: Any = MISSING
        # copies made for the working copy, by id; holding them keeps their ids unique
        self.owned: dict[int, Any] = {}


class Transaction:
    """Buffered writes of one task: reads see the committed state plus these writes;
    ``commit`` applies all of them atomically (check, store, then the kernel in one batch)
    or none. States: OPEN, then COMMITTED or ABORTED."""

    def __init__(self, docs: Documents, *, synchronous: bool = False) -> None:
        self.docs = docs
        # the task that opened it: only that task sees it. A synchronous transaction (a
        # handler's: it cannot await, so no other task runs while it is open) needs no check
        self.task = None if synchronous else _task_key()
        self.state = TxState.OPEN
        self.pending: dict[DocKey, _Pending] = {}
        # in order: the documents written (one entry per write) and those first read or
        # written (a savepoint is three lengths; rolling back undoes what came after)
        self.journal: list[DocKey] = []
        self.created: list[DocKey] = []
        self.outbox: list[tuple[Stream, Any]] = []
        self.after_commit: list[Callable[[], None]] = []  # e.g. async work a handler started

    def __repr__(self) -> str:
        return f"<Transaction {self.state.value}, {len(self.pending)} documents>"

    @contextmanager
    def bound(self) -> Iterator[Transaction]:
        """Make this the calling task's transaction for the block."""
        token = _tx.set(self)
        try:
            yield self
        finally:
            _tx.reset(token)

    def bind(self) -> Any:
        """``bound()`` without the block: make this the calling task's transaction; the
        token returned goes to ``unbind``."""
        return _tx.set(self)

    @staticmethod
    def unbind(token: Any) -> None:
        _tx.reset(token)

    def savepoint(self) -> tuple[int, int, int, int]:
        """Where the transaction is now, for ``rollback_to`` (a nested block that raises).
        Four lengths: taken before every nested write, so it costs nothing to take."""
        return len(self.journal), len(self.created), len(self.outbox), len(self.after_commit)

    def rollback_to(self, point: tuple[int, int, int, int]) -> None:
        """Undo every write, first read, send and hook recorded since ``point``."""
        n_ops, n_created, n_out, n_hooks = point
        for key in self.created[n_created:]:  # first seen since: forgotten altogether
            self.pending.pop(key, None)
        del self.created[n_created:]
        undone: dict[DocKey, int] = {}
        for key in self.journal[n_ops:]:
            undone[key] = undone.get(key, 0) + 1
        del self.journal[n_ops:]
        for key, n in undone.items():
            pending = self.pending.get(key)
            if pending is not None:
                del pending.ops[-n:]
                del pending.befores[-n:]
                pending.root, pending.owned = MISSING, {}  # rebuilt from the ops when read
        del self.outbox[n_out:]
        del self.after_commit[n_hooks:]

    def _doc_for_write(self, key: DocKey) -> Doc:
        docs = self.docs
        doc = docs._docs.get(key) or docs.doc(key)  # loaded: no call (every write asks)
        if not doc.declared and not doc.derived and self.docs.on_missing is not None:
            self.docs.on_missing(key, True)  # a parked instance that declares it comes back
            doc = self.docs.doc(key)
        if doc.derived:
            raise ReadOnlyError(
                f"cannot write to {doc.describe()}: it is computed from other cells; "
                "write to the cells it reads instead"
            )
        if doc.readonly:
            raise ReadOnlyError(f"cannot write to {doc.describe()}: {doc.readonly}")
        if not doc.declared:
            raise ReadOnlyError(
                f"cannot write to {doc.describe()}: no running instance declares it, so its "
                "schema is not known here; run the pattern that owns it first"
            )
        return doc

    def view(self, key: DocKey, pending: _Pending) -> Any:
        """The document as this transaction sees it (its writes applied to a copy)."""
        if pending.root is MISSING:
            docs = self.docs
            root = (docs._docs.get(key) or docs.doc(key)).node.peek()
            for path, value in pending.ops:
                root = _assign_owned(root, path, value, pending.owned)
            pending.root = root
        return pending.root

    def write(self, key: DocKey, path: Path, value: Any) -> None:
        """Record a write of ``value`` (plain JSON the caller no longer holds) at ``path``."""
        if self.state is not TxState.OPEN:
            raise CellError(f"the transaction is {self.state.value}: it takes no more writes")
        doc = self._doc_for_write(key)
        pending = self.pending.get(key)
        if pending is None:
            pending = self.pending[key] = _Pending(doc.version)
            self.created.append(key)
        root = self.view(key, pending) if pending.ops else doc.node.peek()
        # walk to the parent, turning list steps into ints (a link's path is all strings)
        parent = root
        steps: list[str | int] = []
        for i, t in enumerate(path):
            t = _index(parent, t)
            if t is None:
                raise PathError(
                    f"cannot write {doc.describe()}{pointer(path)}: "
                    + ("its parent does not exist (set the parent object first)"
                       if i < len(path) - 1 or type(parent) is not list else
                       f"the list there has {len(parent)} items (an index may be at most "
                       "the length, which appends)")
                )
            steps.append(t)
            if i < len(path) - 1:
                parent = step(parent, t)
                if type(parent) is not dict and type(parent) is not list:
                    raise PathError(
                        f"cannot write {doc.describe()}{pointer(path)}: its parent does not "
                        "exist (set the parent object first)"
                    )
        path = tuple(steps)
        before = step(parent, path[-1]) if path else root
        if path and type(parent) is dict and path[-1] in (LINK, "scope"):
            check_assembled(key, doc.schema, doc.describe(), path, parent, value)
        if before is not MISSING and doc.version == pending.base and same(before, value):
            return  # writing what is there changes nothing (and nobody changed it since)
        if pending.ops:
            pending.root = _assign_owned(pending.root, path, value, pending.owned)
        pending.ops.append((path, value))
        pending.befores.append(before)
        self.journal.append(key)

    def post(self, key: DocKey, prefix: Path) -> Any:
        """The value at ``prefix`` in ``key`` as this transaction would commit it."""
        pending = self.pending[key]
        value = self.view(key, pending)
        for t in prefix:
            value = step(value, t)
        return value

    def commit(self) -> list[Change]:
        """Apply every write or none, then tell listeners and run ``after_commit`` hooks
        (outside this transaction: async work they start does not inherit it)."""
        if self.state is not TxState.OPEN:
            raise CellError(f"the transaction is {self.state.value} already")
        docs = self.docs
        docs.committing += 1  # until its hooks have run (Runtime.park waits for that)
        try:
            try:
                records = self._apply() if any(p.ops for p in self.pending.values()) else []
            except BaseException:
                self.state = TxState.ABORTED
                raise
            self.state = TxState.COMMITTED
            hooks, self.after_commit = self.after_commit, []
            for hook in hooks:
                hook()
        finally:
            docs.committing -= 1
        return records

    def abort(self) -> None:
        self.state = TxState.ABORTED
        self.pending = {}
        self.after_commit = []

    def _apply(self) -> list[Change]:
        docs = self.docs
        if docs.closed:
            docs.check_open("committing")  # raises
        if docs._batch:  # declared in the same block: stored before what builds on it
            docs.flush_declared()
        written: list[tuple[DocKey, _Pending, Doc]] = []
        loaded = docs._docs
        for k, p in self.pending.items():
            doc = loaded.get(k) or docs.doc(k)
            if p.ops and not doc.declared and not doc.scratch:
                # loaded again since it was written (its instance parked meanwhile): its
                # owner comes back, so the write is checked against its schema
                doc = self._doc_for_write(k)
            if p.ops:
                if not doc.scratch and not _cancelled_out(doc, p):
                    written.append((k, p, doc))
            elif doc.version != p.base:
                raise ConflictError(
                    f"{doc.describe()} changed since this transaction read it "
                    f"(version {p.base}, now {doc.version}); nothing was "
                    "committed. Another writer (a task or process) committed to it: run the "
                    "change again on the new state"
                )
        if not written:  # every write was set back: nothing to store
            self.pending = {}
            return []
        # 1. everything that can fail, before the store: schemas, records (copies)
        for key, pending, doc in written:
            compiled = doc.compiled
            if compiled is None:
                continue
            post = functools.partial(self.post, key)  # made once per document, not per write
            where = functools.partial(_write_to, doc)
            try:
                for path, value in pending.ops:
                    compiled.check_write(path, value, post, where)
            except SchemaError as e:
                paths = dict.fromkeys(pointer(p) or "/" for p, _ in pending.ops)
                e.args = (f"{e.args[0]}; nothing was committed (wrote {', '.join(paths)})",)
                raise
        # change records (copies: the kernel changes its values in place later) only for
        # someone who listens; most commits have no listener and skip the copies
        records = [
            Change(k.space, k.id, pointer(path), None if b is MISSING else copy_json(b),
                   copy_json(v), k.scope)
            for k, pending, _ in written
            for (path, v), b in zip(pending.ops, pending.befores, strict=True)
        ] if docs.listeners else []
        # checked: every path was checked against this transaction's view when written
        writes = [Write(k, None, p.base, tuple(p.ops), True) for k, p, _ in written]
        # 2. the store: all or nothing
        try:
            versions = docs.store.commit(writes)
        except ConflictError:
            # another writer got there first (the store's message says who and how to
            # retry): catch up, so running the change again sees their value
            docs.reload([k for k, _, _ in written])
            raise
        # 3. the kernel: cannot fail from here on (paths were checked when written). The
        # listeners hear of commits in the order they were stored, also when a sink writes
        # (a commit inside this one's flush): this one is queued first, all are told after.
        self.pending = {}
        if docs.listeners:  # nobody listens: nothing to tell, in any order
            docs.notify_queue.append(records)
        docs.applying += 1
        try:
            with signals.batch():
                for key, pending, doc in written:
                    doc.version = versions[key]
                    node = doc.node
                    if pending.root is not MISSING:
                        node.set(pending.root)
                        continue
                    root = node.peek()
                    for path, value in pending.ops:
                        root = value if not path else assign_in_place(root, path, value)
                    if root is node.peek():
                        node.mutated()
                    else:
                        node.set(root)
        except Exception as e:  # an effect failed or looped: the commit stands, report it
            docs.report(e, f"effects after a commit to {written[0][2].describe()}")
        finally:
            docs.applying -= 1
        if not docs.applying and docs.notify_queue:
            docs.notify()
        return records


def _write_to(doc: Doc) -> str:
    return f"write to {doc.describe()}"


def _cancelled_out(doc: Doc, pending: _Pending) -> bool:
    """Do ``pending``'s writes leave the document as it was? Known cheaply when the last
    one replaces the whole value with what is committed (a cell set, then cleared, in one
    transaction). Then nothing is written: the document stays a read of its version."""
    path, value = pending.ops[-1]
    if path or doc.version != pending.base or not same(value, doc.node.peek()):
        return False
    pending.ops.clear()
    pending.befores.clear()
    pending.root, pending.owned = MISSING, {}
    return True


def _index(parent: Any, token: str | int) -> str | int | None:
    """The step ``token`` as written into ``parent``: a key for an object, an int index
    (at most the length: that appends) for a list; None where it cannot be written."""
    t = type(parent)
    if t is dict:
        return str(token)
    if t is list:
        if type(token) is str and token.isascii() and token.isdigit():
            token = int(token)
        if type(token) is int and 0 <= token <= len(parent):
            return token
    return None


def _assign_owned(root: Any, path: Path, value: Any, owned: dict[int, Any]) -> Any:
    """``value`` at ``path`` in a working copy: containers along the path are copied once
    (then owned by the transaction and changed in place), so the committed value they were
    copied from is never touched."""
    if not path:
        return value
    if id(root) not in owned:
        root = list(root) if type(root) is list else dict(root)
        owned[id(root)] = root
    node = root
    for token in path[:-1]:
        i: Any = token if type(node) is dict else int(token)
        child = node[i]
        if id(child) not in owned:
            child = list(child) if type(child) is list else dict(child)
            owned[id(child)] = child
            node[i] = child
        node = child
    assign_in_place(node, path[-1:], value)
    return root

