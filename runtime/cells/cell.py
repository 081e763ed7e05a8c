"""``Cell``: a typed pointer into a document; ``Stream``: where a handler's events go."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import CellError, PathError, WriteInComputationError
from ..storage import DocKey
from . import signals
from .documents import Documents, Transaction, _missing, make_link
from .jsonpath import MISSING, Path, check_json, copy_json, pointer
from .schema import subschema

if TYPE_CHECKING:
    from .pattern import Handler
    from .scheduler import Scheduler


@contextmanager
def writing(docs: Documents) -> Iterator[Transaction]:
    """The open transaction (inside a handler), or a new one committed on exit."""
    if signals.in_computation():  # even under untracked() or peek()
        who = signals.current_subscriber()
        what = f"{who!r}" if who is not None else "a computation (inside untracked())"
        raise WriteInComputationError(
            f"{what} tried to write a cell; computations must be pure: write from a handler "
            "instead"
        )
    if docs.tx is not None:
        yield docs.tx
        return
    tx = Transaction(docs)
    docs.tx = tx
    try:
        yield tx
    finally:
        docs.tx = None
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
        return self._key.scope

    def key(self, *tokens: str | int) -> Cell:
        """The cell one or more levels down: ``todo.key("items", 0)``."""
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

    def raw(self) -> Any:
        """The value with nested links left as links (what the document holds)."""
        _, _, value = self._docs.resolve(self._key, self.path)
        if value is MISSING:
            raise PathError(self._missing_message())
        return copy_json(value)

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
        return _missing(self._docs, self._key, self.path, value)

    # -- writing ---------------------------------------------------------------------

    def set(self, value: Any) -> None:
        """Replace the value (writing through a link writes its target)."""
        value = check_json(value, f"value for {self!r}")
        with writing(self._docs) as tx:
            key, path, _ = self._docs.resolve(self._key, self.path)
            tx.write(key, path, value)

    def update(self, values: dict[str, Any]) -> None:
        """Merge ``values`` into the object here, key by key."""
        if not isinstance(values, dict):
            raise TypeError(f"update() takes a dict of keys to set, got {type(values).__name__}")
        values = check_json(values, f"update for {self!r}")
        with writing(self._docs) as tx:
            key, path, current = self._docs.resolve(self._key, self.path)
            if current is MISSING or current is None:
                tx.write(key, path, values)
                return
            if not isinstance(current, dict):
                raise CellError(
                    f"update() needs an object at {self!r}, found {type(current).__name__}; "
                    "use set() to replace it"
                )
            for k, v in values.items():
                tx.write(key, (*path, k), v)

    def push(self, *items: Any) -> None:
        """Append to the list here."""
        items_json = [check_json(i, f"item pushed to {self!r}") for i in items]
        with writing(self._docs) as tx:
            key, path, current = self._docs.resolve(self._key, self.path)
            if current is MISSING or current is None:
                tx.write(key, path, items_json)
                return
            if not isinstance(current, list):
                raise CellError(
                    f"push() needs a list at {self!r}, found {type(current).__name__}"
                )
            n = len(current)
            for offset, item in enumerate(items_json):
                tx.write(key, (*path, n + offset), item)

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
            if last is not MISSING and type(value) is type(last) and value == last:
                return  # the document changed, not the value here
            last = value
            with signals.untracked():
                try:
                    callback(value)
                except Exception as e:  # an observer's bug must not undo a commit
                    docs.report(e, f"sink on {self!r}")

        effect = signals.Effect(run, f"sink {self!r}")
        return effect.dispose

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
        scope = f" [{self.scope}]" if self.scope else ""
        return f"Cell(/{self.id}{pointer(self.path)}{scope})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Cell) and other._docs is self._docs
                and other._key == self._key and other.path == self.path)

    def __hash__(self) -> int:
        return hash((self._key, self.path))

    def __bool__(self) -> bool:
        raise TypeError(
            f"the truth value of {self!r} is not known while building the graph: "
            "read it with .get() inside lift/computed"
        )


class Stream:
    """A handler bound to its state. ``send(event)`` queues the event; the handler runs once
    per event, in FIFO order, in its own transaction."""

    __slots__ = ("_key", "_scheduler", "bindings", "handler", "name", "stopped")

    def __init__(self, scheduler: Scheduler, key: DocKey, handler: Handler,
                 bindings: dict[str, Any], name: str) -> None:
        self._scheduler = scheduler
        self._key = key
        self.handler = handler
        self.bindings = bindings
        self.name = name
        self.stopped = False

    @property
    def id(self) -> str:
        return self._key.id

    def send(self, event: Any) -> None:
        """Queue ``event`` (processed at the next ``await rt.idle()`` / ``send`` / turn)."""
        self._scheduler.enqueue(self, event)

    def link(self) -> dict[str, Any]:
        return make_link(self._key, ())

    @property
    def event_schema(self) -> dict[str, Any] | None:
        return self.handler.event_schema

    def __repr__(self) -> str:
        return f"Stream({self.name} /{self.id})"
