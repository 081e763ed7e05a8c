"""``Cell``: a typed pointer into a document; ``Stream``: where a handler's events go."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._text import describe_surrogate, has_surrogate
from ..errors import LinkError, NotJSONError, PathError, UsageError, WriteInComputationError
from ..storage import DocKey
from . import signals
from .documents import Documents, Transaction, TxState, _missing, _open_tx
from .equality import same
from .jsonpath import (
    MISSING,
    Path,
    check_json,
    copy_json,
    copy_plain,
    is_link,
    own_json,
    pointer,
)
from .links import check_written, make_link, parse_link
from .schema import subschema

if TYPE_CHECKING:
    from reactivex import Observable
    from reactivex.abc import SchedulerBase

    from .pattern import Handler
    from .runtime import Instance
    from .rx import Feed
    from .scheduler import Scheduler


class writing:
    """The calling task's open transaction, or a new one, committed when the block ends
    without an exception and aborted when it raises. Nested in an open one, it joins it,
    and a block that raises takes back what it did.

    A class rather than a ``@contextmanager`` generator: every cell write passes here."""

    __slots__ = ("_docs", "_nested", "_point", "_token", "_tx")

    def __init__(self, docs: Documents) -> None:
        self._docs = docs

    def __enter__(self) -> Transaction:
        if signals.in_computation():  # even under untracked() or peek()
            who = signals.current_subscriber()
            what = f"{who!r}" if who is not None else "a computation (inside untracked())"
            raise WriteInComputationError(
                f"{what} tried to write a cell; computations must be pure: write from a "
                "handler instead"
            )
        docs = self._docs
        tx = _open_tx(docs)
        if tx is not None:
            self._tx, self._nested = tx, True
            # tx.savepoint(), written out: taken before every nested write
            self._point = (len(tx.journal), len(tx.created), len(tx.outbox),
                           len(tx.after_commit))
            return tx
        docs.check_open("writing a cell")
        tx = self._tx = Transaction(docs)
        self._nested = False
        self._token = tx.bind()
        return tx

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: Any) -> None:
        tx = self._tx
        if self._nested:
            if kind is not None and tx.state is TxState.OPEN:
                tx.rollback_to(self._point)
            return
        tx.unbind(self._token)
        if kind is not None:
            tx.abort()
            return
        tx.commit()


class Cell:
    """Holds no data: ``(space, id, path, schema, scope)`` into the runtime's documents.

    ``get()`` reads (inside a computation the read is a dependency); ``set``, ``update``,
    ``push`` write (inside a handler they join its transaction, elsewhere each commits on
    its own). Reads and writes follow links.
    """

    __slots__ = ("_docs", "_key", "path", "schema")

    def __init__(self, docs: Documents, key: DocKey, path: Path = (),
                 schema: dict[str, Any] | None = None) -> None:
        self._docs = docs
        self._key = key
        self.path = path
        self.schema = schema

    @property
    def space(self) -> str:
        return self._key.space

    @property
    def id(self) -> str:
        return self._key.id

    @property
    def scope(self) -> str:
        """The scope key of the document the cell points into (``""`` when shared)."""
        return self._key.scope

    @property
    def doc_key(self) -> DocKey:
        """The document the cell points into, before any link on its path is followed
        (``resolve().doc_key`` is where the value really is). Not ``key``: ``key(...)``
        is the cell one level down."""
        return self._key

    def key(self, *tokens: str | int) -> Cell:
        """The cell one or more levels down: ``todo.key("items", 0)`` (object keys are
        strings, list indexes non-negative ints)."""
        for t in tokens:
            if type(t) is not str and (type(t) is not int or t < 0):
                raise PathError(
                    f"{self!r}.key({t!r}): a path step is an object key (str) or a list index "
                    f"(int >= 0), not {type(t).__name__} {t!r}"
                )
            if type(t) is str and not t.isascii() and has_surrogate(t):
                # a step becomes an object key when written: the JSON boundary's rule
                raise NotJSONError(describe_surrogate(t, f"the path step {t!r} of {self!r}"))
        return Cell(self._docs, self._key, self.path + tokens, subschema(self.schema, tokens))

    def __getitem__(self, token: str | int) -> Cell:
        return self.key(token)

    # -- reading ---------------------------------------------------------------------

    def get(self, default: Any = MISSING) -> Any:
        """The value, with nested links replaced by their values (a copy: mutating it
        changes nothing). A missing path raises ``PathError`` unless ``default`` is given."""
        try:
            if not self.path:
                value = self._docs.value(self._key)
                t = type(value)
                if t is not dict and t is not list:
                    return value  # a scalar at a document's root: nothing to follow or copy
                if not is_link(value):  # a document's root, not a link: nothing to resolve
                    return self._docs.materialize(value, self._key)
            key, _, value = self._docs.resolve(self._key, self.path)
        except PathError:
            if default is not MISSING:
                return default
            raise
        if value is MISSING:
            if default is not MISSING:
                return default
            raise PathError(self._missing_message())
        return self._docs.materialize(value, key)

    def raw(self, *, copy: bool = True) -> Any:
        """The value with nested links left as links (what the document holds). With
        ``copy=False`` it is the runtime's own value, not a copy: for code that only reads,
        on a hot path (a builtin's bookkeeping, every step). Never change it."""
        if not self.path:  # a document's root: a link there is followed, else it is the value
            value = self._docs.value(self._key)
            if type(value) is not dict or not is_link(value):
                return copy_json(value) if copy else value
        _, _, value = self._docs.resolve(self._key, self.path)
        if value is MISSING:
            raise PathError(self._missing_message())
        return copy_json(value) if copy else value

    def resolve(self) -> Cell:
        """The cell that really holds the value, after following links."""
        key, path, _ = self._docs.resolve(self._key, self.path)
        return Cell(self._docs, key, path, self.schema)

    def _missing_message(self) -> str:
        parent = Cell(self._docs, self._key, self.path[:-1])
        try:
            value = parent.raw()
        except PathError as e:
            return str(e)
        return _missing(self._key, self.path, value)

    # -- writing ---------------------------------------------------------------------

    def set(self, value: Any) -> None:
        """Replace the value here. Links on the way are followed; a link exactly here is
        replaced, not written through (in a read-only document, like an instance's result,
        its links are aliases and the write lands on their target). A ``Cell`` as the
        value (or inside it) is stored as a link to that cell."""
        with writing(self._docs) as tx:
            key, path, _ = self._write_target()
            value = self._accept(value, lambda: f"value for {self!r}", key, path)
            tx.write(key, path, value)

    def update(self, values: dict[str, Any]) -> None:
        """Merge ``values`` into the object here, key by key."""
        if not isinstance(values, dict):
            raise UsageError(
                f"update() takes a dict of keys to set, got {type(values).__name__}")
        with writing(self._docs) as tx:
            key, path, current = self._container_target("update")
            values = self._accept(values, lambda: f"update for {self!r}", key, path)
            if current is MISSING or current is None:
                tx.write(key, path, values)
                return
            if not isinstance(current, dict):
                raise UsageError(
                    f"update() needs an object at {self!r}, found {type(current).__name__}; "
                    "use set() to replace it"
                )
            for k, v in values.items():
                tx.write(key, (*path, k), v)

    def push(self, *items: Any, owned: bool = False) -> None:
        """Append to the list here.

        ``owned``: each item is data from outside made fresh for this call and held by
        nothing else (``model_dump(mode="json")`` of a model's reply): it is checked and
        stored as it is, in one pass and without the copy a push makes, and each
        link-shaped object in it is stored as its JSON text, never followed
        (``own_json``). The item may be changed in place; do not use it afterwards."""
        with writing(self._docs) as tx:
            key, path, current = self._container_target("push")
            if current is MISSING or current is None:
                tx.write(key, path, own_json(list(items), lambda: f"items pushed to {self!r}",
                                             depth=len(path)) if owned else self._accept(
                    list(items), lambda: f"items pushed to {self!r}", key, path))
                return
            if not isinstance(current, list):
                raise UsageError(
                    f"push() needs a list at {self!r}, found {type(current).__name__}"
                )
            n = len(current)
            if owned:
                owns = [own_json(item, lambda: f"item pushed to {self!r}", depth=len(path) + 1)
                        for item in items]  # all checked before any is written
                for offset, item in enumerate(owns):
                    tx.write(key, (*path, n + offset), item)
                return
            if len(items) == 1:  # the usual push
                at = (*path, n)
                tx.write(key, at, self._accept(items[0], lambda: f"item pushed to {self!r}",
                                               key, at))
                return
            accepted = [self._accept(item, lambda: f"item pushed to {self!r}", key,
                                     (*path, n + i)) for i, item in enumerate(items)]
            for offset, item in enumerate(accepted):
                tx.write(key, (*path, n + offset), item)

    def _container_target(self, op: str) -> tuple[DocKey, Path, Any]:
        """Where ``update``/``push`` work: as for ``set``, and what is there must not be a
        link (a write never passes through a link it lands on)."""
        key, path, current = self._write_target()
        if type(current) is dict and is_link(current):
            raise UsageError(
                f"{op}() at {self!r}: the value here is a link to another cell; write that "
                f"cell with .resolve().{op}(...), or replace the link with set()"
            )
        return key, path, current

    def _write_target(self) -> tuple[DocKey, Path, Any]:
        """Where a write of this cell lands (see ``set``)."""
        docs = self._docs
        if not self.path:  # a document's root: nothing to follow on the way
            key, path, value = self._key, (), docs.value(self._key)
        else:
            key, path, value = docs.resolve(self._key, self.path, follow_last=False)
        for _ in range(64):
            if type(value) is not dict or not (is_link(value) and docs.doc(key).readonly):
                return key, path, value
            key, path = parse_link(value, key)
            key, path, value = docs.resolve(key, path, follow_last=False)
        raise LinkError(f"link cycle while writing {self!r}")

    def _accept(self, value: Any, where: Callable[[], str], key: DocKey, path: Path) -> Any:
        """``value`` as plain JSON to write at ``path`` of ``key`` (see ``accept_json``)."""
        plain = copy_plain(value, len(path))  # the common case, before any lookup
        if plain is not MISSING:
            return plain
        return _accept_linked(self._docs, value, where, key, path, self._docs.doc(key).schema)

    def refresh(self) -> None:
        """Read this cell's document again from the store now, not waiting for the change
        feed: for a decision that must not rest on a copy another process may have moved
        ahead a moment ago (is this session still listed? is that turn still running?)."""
        self._docs.refresh([self.resolve().doc_key])

    # -- observing -------------------------------------------------------------------

    def sink(self, callback: Callable[[Any], Any]) -> Callable[[], None]:
        """Call ``callback(value)`` now and after every commit that changes the value.
        Returns the unsubscribe function."""
        docs = self._docs
        subscribing = True
        last: Any = MISSING

        def run() -> None:
            nonlocal subscribing, last
            try:
                value = self.get(None)
            except PathError:
                value = None
            except Exception as e:  # the computation it observes failed
                if subscribing:
                    raise  # the caller of sink() hears of it
                docs.report(e, f"sink on {self!r}")  # after a commit: the commit stands
                return
            finally:
                subscribing = False
            if last is not MISSING and same(value, last):
                return  # the document changed, not the value here
            last = value
            with signals.untracked():
                try:
                    callback(copy_json(value))  # its own copy: mutating it misses nothing
                except Exception as e:  # an observer's bug must not undo a commit
                    docs.report(e, f"sink on {self!r}")

        effect = signals.Effect(run, f"sink {self!r}")
        if docs.effects is not None:  # made while an instance is built: one of its own
            docs.effects.append(effect)
        return effect.dispose

    def observe(self) -> Observable[Any]:
        """The cell's values as a ReactiveX ``Observable``: the current value on subscribe,
        then each committed change (see ``docs/reactivex.md``)."""
        from .rx import observe

        return observe(self)

    def __json__(self) -> dict[str, Any]:
        """A Cell inside a value written to another cell is stored as its link."""
        return self.link()

    def link(self) -> dict[str, Any]:
        """The JSON link to the cell that holds this value: ``{"@link": "/<id>/<path>"}``
        (links along the way are followed, so the link stays valid if they change)."""
        if not self.path:
            # nothing along the way: don't read the document (a computed would run)
            return make_link(self._key, ())
        try:
            key, path, _ = self._docs.resolve(self._key, self.path, follow_last=False)
        except PathError:
            key, path = self._key, self.path
        return make_link(key, path)

    def __repr__(self) -> str:
        key = self._key
        scope = f" [{key.scope}]" if key.scope else ""
        return f"Cell(/{key.id}{pointer(self.path) if self.path else ''}{scope})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Cell) and other._docs is self._docs
                and other._key == self._key and other.path == self.path)

    def __hash__(self) -> int:
        return hash((self._key, self.path))

    def __bool__(self) -> bool:
        raise UsageError(
            f"the truth value of {self!r} is not known while building the graph: "
            "read it with .get() inside lift/computed"
        )


def accept_json(docs: Documents, value: Any, where: Callable[[], str], key: DocKey,
                path: Path, schema: dict[str, Any] | None) -> Any:
    """``value`` as plain JSON to sit at ``path`` of document ``key`` (whose schema is
    ``schema``), its links admitted by the one policy (``links.check_written``: links in
    the data only where the schema asks for one, every link followable and not into
    itself)."""
    plain = copy_plain(value, len(path))  # the common case: plain data, no link in it
    if plain is not MISSING:
        return plain
    return _accept_linked(docs, value, where, key, path, schema)


def _accept_linked(docs: Documents, value: Any, where: Callable[[], str], key: DocKey,
                   path: Path, schema: dict[str, Any] | None) -> Any:
    """``accept_json`` past its quick copy: links or made values in ``value``, or not JSON
    (then it raises, naming where)."""
    links: list[Path] = []
    made: list[Path] = []
    value = check_json(value, where, depth=len(path), links=links, made=made)
    if links or made:
        check_written(docs, value, where, key, path, schema, links, made)
    return value


STREAM_MARKER: dict[str, Any] = {"$stream": True}
"""What a stream's own document holds (read-only): the mark that the document is a stream,
whose events go to a handler, not a value. Compare with it; never mutate it."""


class Stream:
    """A handler bound to its state. ``send(event)`` queues the event; the handler runs once
    per event, in FIFO order, in its own transaction."""

    __slots__ = ("_key", "_scheduler", "bindings", "handler", "name", "owner", "stopped")

    def __init__(self, scheduler: Scheduler, key: DocKey, handler: Handler,
                 bindings: dict[str, Any], name: str) -> None:
        self._scheduler = scheduler
        self._key = key
        self.handler = handler
        self.bindings = bindings
        self.name = name
        self.owner: Instance | None = None  # the instance whose pattern bound it
        self.stopped = False

    @property
    def id(self) -> str:
        return self._key.id

    @property
    def key(self) -> DocKey:
        """The stream's document (what ``Runtime.stream_at`` finds it by)."""
        return self._key

    @property
    def scope(self) -> str:
        """The scope key of the stream's document: where links in its events resolve, and
        what they may reach."""
        return self._key.scope

    def send(self, event: Any) -> None:
        """Queue ``event`` (processed at the next ``await rt.idle()`` / ``send`` / turn)."""
        self._scheduler.enqueue(self, event)

    def feed(self, source: Observable[Any], *,
             scheduler: SchedulerBase | None = None) -> Feed:
        """Send each item of a ReactiveX ``Observable`` here as an event; returns the
        subscription (dispose it to stop, ``await feed.wait()`` for its end). The runtime
        runs the events soon after they arrive. See ``docs/reactivex.md``."""
        from .rx import feed

        return feed(source, self, scheduler=scheduler)

    def link(self) -> dict[str, Any]:
        return make_link(self._key, ())

    def __json__(self) -> dict[str, Any]:
        return self.link()

    @property
    def event_schema(self) -> dict[str, Any] | None:
        return self.handler.event_schema

    def __repr__(self) -> str:
        return f"Stream({self.name} /{self.id})"
