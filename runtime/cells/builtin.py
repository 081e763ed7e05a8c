"""Builtin nodes: graph nodes whose work is asynchronous (an LLM turn, a one-shot generation).

A builtin is a function called inside a ``@pattern``, like ``cell`` or ``lift``. It makes a
``BuiltinNode`` for itself and uses it to declare what it needs:

- ``node.state(name, initial, schema)``: its own stored cells. Their ids derive from the
  node's cause (the instance, the builtin's kind and name), so a restarted process finds
  them; their scope is the **narrowest scope of the inputs** the node was given, so a dialog
  over a per-session ``messages`` cell keeps per-session state.
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

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio

from ..errors import PatternError
from ..storage import DocKey
from .cell import Cell, Stream
from .ids import derive
from .jsonpath import check_json
from .pattern import Builder, Handler, _current
from .runtime import current_instance, current_runtime
from .schema import SchemaLike, to_json_schema
from .scope import SHARED, Scope

__all__ = ["BuiltinNode"]


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


def _narrowest(inputs: Iterable[Cell | Stream]) -> Scope:
    scope = SHARED
    for x in inputs:
        scope = scope.narrowest(Scope.parse(x.scope))
    return scope
