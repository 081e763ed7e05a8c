"""Builtin nodes: graph nodes whose work is asynchronous (an LLM turn, a one-shot generation).

A builtin is a function called inside a ``@pattern``, like ``cell`` or ``lift``. It makes a
``BuiltinNode`` for itself and uses it to declare what it needs:

- ``node.state(name, initial, schema)``: its own stored cells. Their ids derive from the
  node's cause (the instance, the builtin's kind and name), so a restarted process finds
  them; their scope is the **narrowest scope of the inputs** the node was given, so a dialog
  over a per-session ``messages`` cell keeps per-session state.
- ``node.record(name, fields, schema)``: several stored cells kept as the fields of one
  document (``record.key(field)`` each): an instance declares each of its documents at every
  ``rt.run``, so state written together by the same writers is cheaper as one.
- ``node.stream(name, fn, event=schema)``: streams its users send events to; ``fn(event)``
  runs as a handler, once per event, in its own transaction.
- ``node.spawn(work, *args)``, called from such a handler: async work that starts only after
  the handler's commit, is owned by the instance (``rt.stop`` cancels it) and is waited for
  by ``rt.settled()``. It returns the work's cancel scope.
- ``node.on_stop(fn)``: teardown when the instance stops (dispose an effect, forget a turn).

The cell graph knows nothing of what builtins do: ``runtime/builtins/`` holds the ones that
join it to the LLM port. ``docs/builtins.md`` shows how to write one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import anyio

from ..errors import NotJSONError, PatternError, SchemaError
from ..storage import DocKey
from .cell import Cell, Stream
from .ids import derive
from .jsonpath import LINK, check_json
from .pattern import Builder, Handler, _current
from .runtime import current_instance, current_runtime
from .schema import SchemaLike, subschema, to_json_schema, validate
from .scope import SHARED, Scope

__all__ = ["BuiltinNode", "Record"]

log = logging.getLogger("celldialog")


class BuiltinNode:
    """One builtin's place in the graph being built (see the module docstring)."""

    def __init__(self, kind: str, inputs: Iterable[Any] = (), *, name: str | None = None
                 ) -> None:
        b = _current(f"{kind}()")
        self._b: Builder = b
        self.kind = kind
        n = b.counters.get(f"builtin:{kind}", 0)
        b.counters[f"builtin:{kind}"] = n + 1
        self.name = name if name is not None else f"{kind}#{n}"
        if ("builtin", self.name) in b.names:
            raise PatternError(f"pattern {b.name} has two {kind} nodes named {self.name!r}")
        b.names.add(("builtin", self.name))
        self.cause = derive(b.cause_id, "builtin", kind, self.name)
        self.scope = _narrowest(x for x in inputs if isinstance(x, Cell | Stream))
        self.space = b.space
        self.label = f"{b.name}.{self.name}"  # for logs and errors: "<pattern>.<node>"
        self._scope_key = self.scope.key
        self._streams = 0

    def state(self, name: str, initial: Any, schema: SchemaLike | None = None) -> Cell:
        """A stored cell of this node, created with ``initial`` the first time."""
        js = to_json_schema(schema)
        key = DocKey(self.space, self._scope_key, derive(self.cause, "state", name))
        label = f"{self.label}.{name}"
        self._b.docs.declare(key, check_json(initial, lambda: f"initial value of {label}"),
                             js, label=label, owned=True)
        return Cell(self._b.docs, key, (), js)

    def record(self, name: str, fields: Mapping[str, Any], schema: SchemaLike | None = None,
               *, earlier: bool = False) -> Record:
        """A stored document of this node holding ``fields`` (name -> initial value):
        ``record[name]`` is each field's cell, ``record.cell`` the whole. ``schema`` is the
        object's (a JSON Schema the caller makes once: its ``properties`` constrain the
        fields, and a write of one field is checked against its own).

        One document costs one declare instead of one per field, but it is also one unit of
        conflict: a transaction that read any field conflicts with a commit to any other.
        Keep together only fields that the same writers write (a turn's bookkeeping); keep
        apart what others write at any time (a counter a user's events bump).

        Fields may be added in a later version: a stored record that lacks some gets them,
        at their initial values, when its instance is next run (written on condition of the
        version read; on what another process wrote meanwhile, if it did).

        ``earlier``: the fields were once stored as ``state(field)`` documents of this node.
        When the record is created (the store has none), what the store holds there is read
        into it, so an instance stored by that layout keeps its state."""
        label = f"{self.label}.{name}"
        if not fields:
            raise PatternError(f"{label}: a record needs at least one field")
        for f in fields:
            if type(f) is not str or not f or f == LINK:
                raise PatternError(
                    f"{label}: field {f!r} cannot name a field of a record: use a non-empty "
                    f"string other than {LINK!r} (a link's key)")
        schema = to_json_schema(schema)
        key = DocKey(self.space, self._scope_key, derive(self.cause, "record", name))
        initial = check_json(fields if type(fields) is dict else dict(fields),
                             lambda: f"initial value of {label}")  # a copy: owned
        seed = (lambda: self._earlier(initial, schema, label)) if earlier else None
        docs = self._b.docs
        docs.declare(key, initial, schema, label=label, owned=True, seed=seed,
                     fill=lambda stored: _filled(stored, initial))
        # each field's schema: its ``properties`` entry when that is all there is (the
        # usual record), else what ``subschema`` finds
        props = schema.get("properties") if schema is not None else None
        simple = schema is None or (type(props) is dict and "additionalProperties" not in schema)
        return Record(Cell(docs, key, (), schema), {
            f: Cell(docs, key, (f,), (props.get(f) if props is not None else None) if simple
                    else subschema(schema, (f,)))
            for f in initial})

    def _earlier(self, fields: dict[str, Any], schema: dict[str, Any] | None,
                 label: str) -> dict[str, Any]:
        """``fields`` with what an earlier layout stored as ``state(field)`` documents (one
        read of the store for all; none from a store made for this runtime, which holds
        nothing older than it). A stored value the record's schema refuses there, or one
        nested too deep to sit one level down in it, is left behind with a warning: the
        record starts from its initial value there."""
        docs = self._b.docs
        if docs.sole_writer:
            return fields
        names = {DocKey(self.space, self._scope_key, derive(self.cause, "state", f)): f
                 for f in fields}
        store = docs.store
        load_many = getattr(store, "load_many", None)
        if load_many is not None:
            found = load_many(list(names))
        else:
            found = {k: s for k in names if (s := store.load(k)) is not None}
        if not found:
            return fields
        value = dict(fields)
        for k, stored in found.items():
            field = names[k]
            where = f"stored {label}.{field} (/{k.id})"
            try:
                # one level deeper than it was stored, and checked by the record's whole
                # schema (a field's own may be a $ref, or a rule of the object's)
                kept = check_json(stored.value, where, depth=1)
                validate({**value, field: kept}, schema, where)
            except (NotJSONError, SchemaError) as e:
                log.warning("%s: the value stored by an earlier version is not kept: %s",
                            label, e)
                continue
            value[field] = kept
        return value

    def scratch(self, name: str, initial: Any) -> Cell:
        """A cell whose writes last only for the transaction that makes them: never stored
        or committed, so no other transaction sees them. For handing a value from one part
        of a commit to another (a handler's answer to the step running it).

        Its committed value is always ``initial`` and each transaction sees only its own
        writes, so every node of this kind shares one per space and name (nothing per
        instance to keep): ``initial`` must be the same for all of them."""
        key = DocKey(self.space, "", derive("scratch", self.kind, name))
        label = f"{self.kind}.{name}"
        self._b.docs.scratch(key, check_json(initial, f"initial value of {label}"), label)
        return Cell(self._b.docs, key, ())

    def stream(self, name: str, fn: Callable[[Any], Any], *,
               event: SchemaLike | None = None) -> Stream:
        """A stream whose events run ``fn(event)`` as a handler, in a transaction."""
        h = Handler(fn, to_json_schema(event) if event is not None else None, wraps=False)
        key = DocKey(self.space, self._scope_key, derive(self.cause, "stream", name))
        return h.bind_in(self._b, key, {}, f"{self.label}.{name}")

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when the instance stops."""
        self._b.on_stop.append(fn)

    @staticmethod
    def spawn(work: Callable[..., Awaitable[Any]], *args: Any, name: str = "builtin"
              ) -> anyio.CancelScope:
        """From one of this node's handlers: start ``work(*args)`` once the handler commits,
        owned by the instance."""
        return current_runtime().spawn(work, *args, owner=current_instance(), name=name)


def _filled(stored: Any, fields: dict[str, Any]) -> dict[str, Any] | None:
    """A stored record with the fields it lacks at their initial values (a newer version
    of its builtin added them), or None when it lacks none. A record whose stored value
    is not an object (written over by hand) is left as it is."""
    if type(stored) is not dict or all(f in stored for f in fields):
        return None
    return {**fields, **stored}


class Record(Mapping[str, Cell]):
    """A builtin's record (``BuiltinNode.record``): a cell for each of its fields, by name,
    and ``cell``, the whole document (one read for several fields)."""

    __slots__ = ("_fields", "cell")

    def __init__(self, cell: Cell, fields: dict[str, Cell]) -> None:
        self.cell = cell
        self._fields = fields

    def __getitem__(self, name: str) -> Cell:
        return self._fields[name]

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Record({self.cell!r}: {', '.join(self._fields)})"


def _narrowest(inputs: Iterable[Cell | Stream]) -> Scope:
    scope = SHARED
    for x in inputs:
        scope = scope.narrowest(Scope.parse(x.scope))
    return scope
