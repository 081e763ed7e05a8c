"""Declaring graphs: ``@pattern``, ``cell``, ``lift``, ``computed`` and ``@handler``.

A pattern function runs once per instance to build its graph. While it runs, a ``Builder``
(held in a context variable) gives every node a cause-derived id: the same pattern run with
the same cause in a restarted process names the same documents.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from pydantic import BaseModel

from ..errors import BindingError, PatternError
from ..storage import DocKey
from .cell import STREAM_MARKER, Cell, Stream
from .ids import derive
from .jsonpath import check_json
from .schema import SchemaLike, to_json_schema
from .scope import Scope

if TYPE_CHECKING:
    from .documents import Documents
    from .scheduler import Scheduler

ScopeName = Literal["space", "user", "session"]
F = TypeVar("F", bound=Callable[..., Any])

_builder: ContextVar[Builder | None] = ContextVar("celldialog_builder", default=None)


def _current(what: str) -> Builder:
    b = _builder.get()
    if b is None:
        raise PatternError(
            f"{what} builds a graph node, so it must be called inside a @pattern function "
            "(which rt.run(...) executes)"
        )
    return b


class Builder:
    """Collects one instance's nodes while its pattern function runs. It holds what the
    builders need (the documents, the event queue, the instance's identity), not the
    runtime."""

    def __init__(self, docs: Documents, scheduler: Scheduler, name: str, space: str,
                 scope: Scope, cause_id: str) -> None:
        self.docs = docs
        self.scheduler = scheduler
        self.name = name
        self.space = space
        self.scope = scope  # the instance's own scope (the narrowest of user / session)
        self.cause_id = cause_id
        self.counters: dict[str, int] = {}
        self.names: set[tuple[str, str]] = set()
        self.derived: list[DocKey] = []
        self.streams: list[Stream] = []
        self.on_stop: list[Callable[[], None]] = []  # builtin nodes' teardown

    def scope_key(self, scope: ScopeName) -> str:
        if scope == "space":
            return ""
        if scope == "user":
            if self.scope.user is None:
                raise PatternError("a user-scoped cell needs rt.run(..., user=...)")
            return Scope(self.scope.user).key
        if scope == "session":
            if self.scope.session is None:
                raise PatternError("a session-scoped cell needs rt.run(..., session=...)")
            return self.scope.key
        raise PatternError(f"unknown scope {scope!r}: use 'space', 'user' or 'session'")

    def key(self, kind: str, name: str | None, scope: str) -> DocKey:
        if name is None:
            n = self.counters.get(kind, 0)
            self.counters[kind] = n + 1
            name = f"#{n}"
        elif (kind, name) in self.names:
            raise PatternError(
                f"pattern {self.name} declares two nodes named {name!r}; names give documents "
                "their identity, so each must be unique within the pattern"
            )
        self.names.add((kind, name))
        return DocKey(self.space, scope, derive(self.cause_id, kind, name))

    def label(self, kind: str, name: str | None) -> str:
        """A readable name for errors: ``todo.items`` or ``todo.cell#0``."""
        return f"{self.name}.{name}" if name else f"{self.name}.{kind}#{self.counters[kind] - 1}"


# ---------------------------------------------------------------------------- builders


def cell(value: Any = None, schema: SchemaLike | None = None, *, scope: ScopeName = "space",
         name: str | None = None) -> Cell:
    """A stored cell of this pattern instance, created with ``value`` the first time.

    ``scope`` makes one copy per space (shared), per user or per session; ``name`` gives
    the document a stable identity even if the pattern's code is reordered.
    """
    b = _current("cell()")
    js = to_json_schema(schema)
    key = b.key("cell", name, b.scope_key(scope))
    label = b.label("cell", name)
    initial = check_json(value, f"initial value of {label}")
    b.docs.declare(key, initial, js, label=label, owned=True)
    return Cell(b.docs, key, (), js)


def computed(fn: Callable[[], Any], *, name: str | None = None) -> Cell:
    """A cell whose value is ``fn()``, recomputed when a cell it read changes. It runs only
    when something live (a sink, an effect) needs it, and at most once per commit."""
    return _derived(fn, name, "computed()")


def _derived(fn: Callable[[], Any], name: str | None, what: str) -> Cell:
    b = _current(what)
    key = b.key("derived", name, b.scope.key)
    b.docs.derive(key, fn, b.label("derived", name or getattr(fn, "__name__", None)))
    b.derived.append(key)
    return Cell(b.docs, key)


def lift(fn: Callable[..., Any]) -> Callable[..., Cell]:
    """Turn a pure function of values into a node factory: ``lift(len)(items)`` is a cell
    holding ``len(items.get())``. Cell arguments are read, other arguments passed as is."""

    @functools.wraps(fn)
    def node(*args: Any, **kwargs: Any) -> Cell:
        def run() -> Any:
            a = [x.get() if isinstance(x, Cell) else x for x in args]
            k = {n: x.get() if isinstance(x, Cell) else x for n, x in kwargs.items()}
            return fn(*a, **k)

        run.__name__ = getattr(fn, "__name__", "lift")
        return _derived(run, None, f"lift({run.__name__})(...)")

    return node


_Shape = tuple[tuple[inspect.Parameter, ...], bool, bool]
"""A function's parameters, whether it is ``async``, whether it takes ``**kwargs``."""


def _read_shape(fn: Callable[..., Any], skip: int) -> _Shape:
    is_async = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
    params = tuple(inspect.signature(fn).parameters.values())[skip:]
    return params, is_async, any(p.kind is p.VAR_KEYWORD for p in params)


_function_shape = functools.lru_cache(maxsize=1024)(_read_shape)


def _shape(fn: Callable[..., Any]) -> _Shape:
    """``fn``'s shape, read once per function: a builtin binds a method of each of its
    instances (``inspect.signature`` costs more than the rest of the binding)."""
    func = getattr(fn, "__func__", None)
    if func is not None and getattr(fn, "__self__", None) is not None:
        return _function_shape(func, 1)  # a bound method: without self
    try:
        return _function_shape(fn, 0)
    except TypeError:  # unhashable callable
        return _read_shape(fn, 0)


class Handler:
    """A function ``fn(event, **state)``; calling it with the state binds it to a Stream."""

    def __init__(self, fn: Callable[..., Any], event_schema: dict[str, Any] | None,
                 event_model: type[BaseModel] | None = None, *, wraps: bool = True) -> None:
        params, is_async, varkw = _shape(fn)
        if is_async:
            raise PatternError(
                f"handler {fn.__name__} is `async def`, but handlers run synchronously inside "
                "their transaction (an await there would never run). Make it a plain `def` "
                "and start async work from it with current_runtime().spawn(work, "
                "owner=current_instance()): it starts once the handler commits"
            )
        self.fn = fn
        self.name = fn.__name__
        self.event_schema = event_schema
        self.event_model = event_model  # events arrive as this model when it is set
        if not params:
            raise PatternError(f"handler {self.name} must take the event as its first parameter")
        self._state = params[1:]
        self._varkw = varkw and bool(self._state)  # **kwargs, not the event's own
        if wraps:  # a decorated function keeps its name and docs (not a builtin's stream)
            functools.update_wrapper(self, fn)

    def __call__(self, **bindings: Any) -> Stream:
        b = _current(f"binding handler {self.name}")
        names = {p.name for p in self._state if p.kind is not p.VAR_KEYWORD}
        for name, value in bindings.items():
            if name not in names and not self._varkw:
                raise BindingError(
                    f"handler {self.name} has no parameter {name!r}; "
                    f"it takes {sorted(names) or 'no state'}"
                )
            if not isinstance(value, Cell | Stream):
                raise BindingError(
                    f"handler {self.name}: {name}= must be a Cell or Stream, got "
                    f"{type(value).__name__} {value!r}. Handlers write state, so bind them "
                    "to cells; wrap a constant with cell(value)"
                )
        missing = [
            p.name for p in self._state
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            and p.default is p.empty and p.name not in bindings
        ]
        if missing:
            raise BindingError(f"handler {self.name} is missing bindings for {missing}")
        return self.bind_in(b, b.key("stream", None, b.scope.key), bindings, self.name)

    def bind_in(self, b: Builder, key: DocKey, bindings: dict[str, Any], name: str) -> Stream:
        """The stream of this handler at ``key`` (a pattern's, or a builtin node's)."""
        b.docs.declare(key, dict(STREAM_MARKER), None, label=name, overwrite=True, owned=True,
                       readonly="it is a stream: send events to it instead")
        stream = Stream(b.scheduler, key, self, dict(bindings), name)
        b.streams.append(stream)
        return stream

    def __repr__(self) -> str:
        return f"handler({self.name})"


@overload
def handler(fn: F, /) -> Handler: ...
@overload
def handler(*, event: SchemaLike | None = None) -> Callable[[F], Handler]: ...


def handler(fn: Callable[..., Any] | None = None, /, *, event: SchemaLike | None = None
            ) -> Handler | Callable[[Callable[..., Any]], Handler]:
    """``@handler`` or ``@handler(event=Schema)``: a function ``(event, **state)`` run once
    per event in its own transaction. Its reads are not subscriptions. Bind it inside a
    pattern with ``h(state=cell)`` to get the ``Stream`` events are sent to."""

    def wrap(f: Callable[..., Any]) -> Handler:
        schema = event if event is not None else _event_annotation(f)
        model = schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None
        return Handler(f, to_json_schema(schema) if schema is not None else None, model)

    return wrap(fn) if fn is not None else wrap


def _event_annotation(f: Callable[..., Any]) -> Any:
    """The first parameter's annotation (resolving string annotations), if it is a type."""
    params = list(inspect.signature(f).parameters.values())
    if not params:
        return None
    try:
        ann = typing.get_type_hints(f).get(params[0].name)
    except Exception:  # unresolvable forward reference: no schema, not an error
        return None
    if ann is None or ann is Any:
        return None
    return ann


class Pattern:
    """A graph recipe; ``rt.run(p, args)`` instantiates it."""

    def __init__(self, fn: Callable[..., Any], argument_schema: dict[str, Any] | None,
                 name: str | None = None) -> None:
        self.fn = fn
        self.name = fn.__name__
        # the identity its documents derive from: stable across restarts, and the same
        # whether its module runs as a script or is imported (see _module_name)
        self.key = name if name is not None else f"{_module_name(fn)}.{fn.__qualname__}"
        self.signature = inspect.signature(fn)
        if argument_schema is None:
            # at least: the arguments are an object with the required ones present, so a
            # bad write to inst.argument is refused instead of breaking the instance
            params = self.signature.parameters.values()
            required = [p.name for p in params if p.default is p.empty
                        and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
            argument_schema = {"type": "object", "required": required} if required else {
                "type": "object"}
        self.argument_schema = argument_schema
        # what every rt.run asks of the signature, read once
        params = tuple(self.signature.parameters.values())
        self._names = frozenset(p.name for p in params
                                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
        self._varkw = any(p.kind is p.VAR_KEYWORD for p in params)
        self._required = tuple(p.name for p in params
                               if p.name in self._names and p.default is p.empty)
        self._defaults = {p.name: p.default for p in params if p.default is not p.empty}
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise PatternError(
            f"pattern {self.name} is not called directly: use rt.run({self.name}, args)"
        )

    def bind_arguments(self, argument: Cell, args: dict[str, Any]) -> dict[str, Cell]:
        names, has_varkw = self._names, self._varkw
        unknown = [k for k in args if k not in names]
        if unknown and not has_varkw:
            raise PatternError(
                f"pattern {self.name} got unknown arguments {unknown}; it takes {sorted(names)}"
            )
        missing = [name for name in self._required if name not in args]
        if missing:
            raise PatternError(f"pattern {self.name} is missing arguments {missing}")
        bound = {n: argument.key(n) for n in names}
        if has_varkw:
            bound.update({k: argument.key(k) for k in unknown})
        return bound

    def defaults(self) -> dict[str, Any]:
        return dict(self._defaults)

    def __repr__(self) -> str:
        return f"pattern({self.name})"


@overload
def pattern(fn: F, /) -> Pattern: ...
@overload
def pattern(*, argument_schema: SchemaLike | None = None, name: str | None = None
            ) -> Callable[[F], Pattern]: ...


def pattern(fn: Callable[..., Any] | None = None, /, *,
            argument_schema: SchemaLike | None = None, name: str | None = None
            ) -> Pattern | Callable[[Callable[..., Any]], Pattern]:
    """``@pattern``: a function that builds a graph from its arguments (cells, not values)
    and returns its outputs (cells, streams, plain JSON, nested in dicts and lists).

    ``name`` fixes the pattern's identity (its documents derive from it); by default it is
    ``<module>.<function>``, so moving or renaming the function starts fresh documents."""
    if name is not None and (not isinstance(name, str) or not name):
        raise PatternError(f"@pattern(name=...) must be a non-empty string, got {name!r}")

    def wrap(f: Callable[..., Any]) -> Pattern:
        return Pattern(f, to_json_schema(argument_schema), name)

    return wrap(fn) if fn is not None else wrap


def _module_name(fn: Callable[..., Any]) -> str:
    """``fn``'s module as an import would name it: a module run as a script is
    ``__main__``, which would give its patterns a different identity from the same module
    imported; use the name ``python -m`` ran it under, or the file's name."""
    module = fn.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name)
    file = getattr(main, "__file__", None)
    return PurePath(file).stem if file else module
