"""``Runtime``: owns the documents, the event queue, the async work and the instances.

Its lifecycle is one state (NEW, OPEN inside ``async with``, CLOSED after); a closed runtime
refuses writes and new instances with ``ClosedError``. A handler reaches the runtime and
instance it runs for with ``current_runtime()`` / ``current_instance()``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from enum import Enum
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._text import describe_surrogate, has_surrogate
from ..errors import (
    ClosedError,
    NotJSONError,
    PatternError,
    StoreClosedError,
    StoreConfigError,
    StreamError,
)
from ..storage import DocKey, Store, can_watch, open_store
from ..storage.mirror import MirrorStore
from . import signals
from .cell import Cell, Stream, accept_json, writing
from .collector import FreezePolicy
from .documents import Change, Documents, Transaction, current_transaction
from .ids import canonical, derive
from .jsonpath import MISSING, check_json
from .lease import DEFAULT_TTL, ProcessLease
from .pattern import Builder, Pattern, _builder
from .registry import PATTERN_REF, Registry
from .scheduler import MAX_CHAIN, Scheduler, running_stream
from .scope import Scope
from .timers import Timer, Timers

__all__ = ["PATTERN_REF", "Instance", "Runtime", "current_instance", "current_runtime"]

# An awaited send yields to other tasks when this many seconds have passed since the last
# one that did (0: every send yields); every send is a cancellation point. See Runtime.send.
SEND_YIELD_EVERY = 0.001


def current_instance() -> Instance:
    """The instance whose handler is running in this task (``PatternError`` outside a
    handler). With it a handler can start async work it owns:
    ``current_runtime().spawn(work, owner=current_instance())``."""
    stream = running_stream()
    if stream is None or stream.owner is None:
        raise PatternError(
            "current_instance() is only known while a handler runs (call it inside the "
            "handler, not in work it started: pass what that work needs as arguments)"
        )
    return stream.owner


def current_runtime() -> Runtime:
    """The runtime whose handler is running in this task (``PatternError`` outside one)."""
    return current_instance().runtime


class _State(Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class Instance:
    """A running pattern: its ``result`` and ``argument`` cells and its streams.

    A parked instance (``Runtime.park``) holds no graph and none of its documents in
    memory; using it (``send``, ``stream``, ``streams``, a read of its result, ``rt.run``
    of it) brings it back first, as the same object."""

    def __init__(self, rt: Runtime, pattern: Pattern, ident: tuple[Any, ...],
                 args: dict[str, Any], space: str, scope: Scope, cause: str) -> None:
        self.runtime = rt
        self.pattern = pattern
        self.space = space
        self.scope = scope
        self.user = scope.user
        self.session = scope.session
        self.cause = cause
        # what rt.run finds it by: (pattern key, cause id, space, scope key)
        self.ident = ident
        self._args = args  # what its build binds again when it comes back from parking
        self.result: Cell
        self.argument: Cell
        self._streams: dict[str, Stream] = {}
        self._builder: Builder | None = None
        self._stored: tuple[DocKey, ...] = ()  # the stored documents its build declared
        self._effects: tuple[Any, ...] = ()  # the sinks its build made (its own readers)
        self._parked_keys: tuple[DocKey, ...] = ()  # while parked: what brings it back
        self._parked_derived: tuple[DocKey, ...] = ()  # ... of which its computations
        self._parked_scopes: tuple[tuple[str, str], ...] = ()  # where its documents are
        self._scopes: list[anyio.CancelScope] = []
        self.stopped = False
        self.parked = False

    @property
    def streams(self) -> dict[str, Stream]:
        """Its streams by dotted name in the result."""
        if self.parked:
            self.runtime._revive(self)
        return self._streams

    def stream(self, name: str) -> Stream:
        """The stream at ``name`` in the result (``"add"`` or a dotted path)."""
        stream = self.streams.get(name)
        if stream is None and self.stopped and not self._streams:  # stopped while parked
            raise StreamError(f"{self!r} is stopped: rt.run its pattern again to use it")
        if stream is None:
            known = ", ".join(sorted(self._streams)) or "none"
            raise StreamError(
                f"pattern {self.pattern.name} has no stream {name!r}; its streams: {known}"
            )
        return stream

    async def send(self, name: str, event: Any) -> None:
        """Send ``event`` to the stream ``name`` and run it (and anything queued before it).
        Raises the handler's error if it failed; the failed handler committed nothing."""
        await self.runtime.send(self.stream(name), event)

    def __repr__(self) -> str:
        who = "".join(f" {k}={v}" for k, v in (("user", self.user), ("session", self.session))
                      if v)
        state = " parked" if self.parked else " stopped" if self.stopped else ""
        return f"Instance({self.pattern.name} space={self.space}{who}{state})"


class Runtime:
    """The cell graph runtime. ``async with Runtime(store="sqlite:///app.db") as rt``.

    ``store`` is ``"memory"`` (default), ``"sqlite:///path"`` or a ``Store``. ``clock``
    (seconds, like ``time.time``) is what turns read, so tests can own time.
    ``max_event_chain`` is how many events in a causal chain count as a cycle. ``model``
    is the model builtins like ``llm_dialog`` use when they name none.

    ``lease`` is this process's ``ProcessLease`` in the store (``lease_ttl`` seconds,
    default ``lease.DEFAULT_TTL``): the turns a builtin runs here are owned under its holder
    id, and other processes take one over only once that lease has expired. Its keeper runs
    in the runtime's task group for the runtime's life (``settled()`` does not wait for it),
    and the lease is released when the runtime closes.

    ``follow`` (default True): follow the store's change feed (``runtime.storage.feed``),
    so commits by other processes on the same database reach this runtime's cells within
    the feed's latency (PostgreSQL: a notification; SQLite: a poll, 50 ms by default), not
    only when a commit here conflicts with them.

    ``freeze_gc`` (default False): keep the garbage collector's cost per step flat with
    thousands of live instances (``runtime.cells.collector``). Process-wide: for an
    application that owns its process, as ``celldialog serve`` does.
    """

    _yield_at = 0.0  # time.monotonic() from which the next awaited send yields (send())

    def __init__(self, store: str | Store = "memory", *,
                 clock: Callable[[], float] = time.time,
                 max_event_chain: int = MAX_CHAIN, model: Any = None,
                 lease_ttl: float | None = None, follow: bool = True,
                 freeze_gc: bool = False) -> None:
        # a memory store made here from "memory" has no writer but this runtime: nothing
        # to follow (and its own commits would only wake the follower for nothing), and
        # no values to keep twice (MirrorStore: versions there, values in the kernel)
        private = isinstance(store, str) and store == "memory"
        self.store = MirrorStore() if private else open_store(store)
        self.follow = follow and not private
        self.clock = clock
        self.model = model  # the default model of builtins (a name or a runtime.llm Model)
        self.lease = ProcessLease(self.store, DEFAULT_TTL if lease_ttl is None else lease_ttl)
        self.docs = Documents(self.store)
        self.docs.sole_writer = private
        if private:  # its own, made above: a MirrorStore passed in belongs to another
            assert isinstance(self.store, MirrorStore)
            self.store.attach(self.docs.committed_copy)
        self._changed: anyio.Event | None = None  # made by a waiter, set by the next poke
        self._work: anyio.Event | None = None  # the pump's, while it waits for events
        self.scheduler = Scheduler(self.docs, wake=self._poke, max_chain=max_event_chain)
        self.scheduler.current_stream = self._current_stream
        self._running = Registry(self.docs)  # the instances, indexed by their documents
        self.docs.on_missing = self._wake_doc
        self._tg: TaskGroup | None = None
        self._state = _State.NEW
        self._inflight = 0
        self._timers = Timers(self.docs.report)
        self._timing = False  # the timers' task runs (started with the first timer)
        self.collector = FreezePolicy(lambda: len(self._running)) if freeze_gc else None

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        if self._state is not _State.NEW:
            raise ClosedError(f"a Runtime is entered once; this one is {self._state.value}")
        self._state = _State.OPEN
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._pump, name="celldialog event pump")
        # not spawn(): the keeper runs as long as the runtime, so it is no work to wait for
        await self._tg.start(self._keep_lease, name="celldialog lease keeper")
        if self.follow and can_watch(self.store):
            await self._tg.start(self._follow, name="celldialog change feed")
        if self.collector is not None:
            self.collector.open()  # closed with the runtime (the finally of __aexit__)
        return self

    async def _follow(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                      ) -> None:
        """Follow the store's change feed for the runtime's life: what other processes
        (or runtimes on the same store) commit reaches the documents loaded here, so their
        computeds recompute and their sinks fire (``Documents.catch_up``). Every feed's
        first batch is a recheck of every version held, so nothing committed before it
        connects is missed. A failure is reported and the feed opened again; one that
        cannot work here (``StoreConfigError``) is reported once and left off. It never
        ends the runtime."""
        assert can_watch(self.store)
        started = False
        while True:
            try:
                async with self.store.watch() as feed:
                    if not started:
                        started = True
                        task_status.started()
                    async for batch in feed:
                        self.docs.catch_up(batch)
                        self._poke()
                return  # the store closed
            except StoreClosedError:
                if not started:
                    task_status.started()
                return
            except StoreConfigError as e:  # it cannot follow here (said once): go without
                self.docs.report(e, "following the store's change feed")
                if not started:
                    task_status.started()
                return
            except Exception as e:
                self.docs.report(e, "following the store's change feed")
                if not started:
                    started = True
                    task_status.started()
                await anyio.sleep(1.0)  # a backoff before opening it again

    async def _keep_lease(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                          ) -> None:
        """The lease's keeper, started before ``__aenter__`` returns (``started()`` does not
        yield, so ``keep()`` has begun when the body runs) and cancelled at exit."""
        task_status.started()
        await self.lease.keep()

    async def _pump(self) -> None:
        """Run events queued from outside a handler (another task, a timer, an Rx feed)
        soon after they arrive, so nothing waits for someone to call ``idle()``."""
        while True:
            if not self.scheduler.queue:
                work = self._work = anyio.Event()
                await work.wait()
            await anyio.lowlevel.checkpoint()  # the sender goes on first; then we drain
            self.scheduler.drain()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        if et is None:
            self.scheduler.drain()  # a clean exit runs what was queued: nothing is lost
        for inst in [*self._running, *self._running.all_parked()]:
            self.stop(inst)
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                # our tasks never raise (spawn reports their errors), so the body's own
                # exception is the only one: let it propagate as is, not in a group
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
            return None
        finally:
            self._state = _State.CLOSED
            self.docs.closed = True
            try:
                self.lease.close()  # released while the store is open: others recover at once
            finally:
                try:
                    self.store.close()
                finally:  # the collector's thresholds go back whatever the store did
                    if self.collector is not None:
                        self.collector.close()

    @property
    def errors(self) -> list[tuple[str, BaseException]]:
        """Errors with no caller to raise to (failed queued events, failing sinks), as
        ``(where, error)``: the newest 1,000 (each is also logged on "celldialog")."""
        return list(self.docs.errors)

    def on_commit(self, listener: Callable[[list[Change]], None]) -> Callable[[], None]:
        """Call ``listener(changes)`` after every commit; returns the unsubscribe."""
        self.docs.listeners.append(listener)
        return lambda: self.docs.listeners.remove(listener)

    # -- instances -------------------------------------------------------------------

    def run(self, pattern: Pattern, args: dict[str, Any] | None = None, *,
            space: str = "default", user: str | None = None, session: str | None = None,
            cause: Any = None) -> Instance:
        """Instantiate ``pattern`` (or return the running instance with the same identity).

        The instance's documents are named by ``cause`` (default: the pattern and its
        arguments), so re-running after a restart finds the same documents. ``user`` and
        ``session`` are opaque non-empty strings; no two distinct pairs share documents.
        """
        self.docs.check_open(f"rt.run({getattr(pattern, 'name', pattern)!r})")
        if not isinstance(pattern, Pattern):
            raise PatternError(f"rt.run() takes a @pattern, got {pattern!r}")
        if not isinstance(space, str) or not space:
            raise PatternError(f"space must be a non-empty string, got {space!r}")
        if has_surrogate(space):
            raise PatternError(describe_surrogate(space, "space"))
        scope = Scope.of(user, session)
        if args is not None and not isinstance(args, dict):
            raise PatternError(f"pattern arguments must be a dict, got {type(args).__name__}")
        args = {**check_json(pattern.defaults(), "pattern defaults"), **(args or {})}
        # links in the arguments are checked as any write's: only where the argument schema
        # asks for one, and only to what the instance's scope may reach
        args = accept_json(self.docs, args, lambda: "pattern arguments",
                           DocKey(space, scope.key, ""), (), pattern.argument_schema)
        if cause is not None:
            cause = check_json(cause, "cause")
        if cause is None:  # a pattern without arguments (the usual case) skips the encoder
            cause = canonical(args) if args else "{}"
        cause_id = derive("instance", pattern.key, cause)
        ident = (pattern.key, cause_id, space, scope.key)
        running = self._running.running(ident)
        if running is not None:
            return running
        parked = self._running.parked(ident)
        if parked is not None:
            self._revive(parked)
            return parked
        inst = Instance(self, pattern, ident, args, space, scope, cause_id)
        self._build(inst)
        return inst

    def _build(self, inst: Instance, *, keep_result: bool = False) -> None:
        """Run ``inst``'s pattern: declare its documents (one store commit), bind its
        streams, index it as running. Its first run, or its return from parking.
        ``keep_result``: the result stays as stored (brought back inside a computation,
        which may not write; only plain values its build computed could differ)."""
        pattern, space, scope, docs = inst.pattern, inst.space, inst.scope, self.docs
        stored: list[DocKey] = []
        effects: list[Any] = []
        # what it declares (and holds), and the sinks it makes
        outer, docs.recording = docs.recording, stored
        outer_effects, docs.effects = docs.effects, effects
        builder: Builder | None = None
        try:
            with docs.declaring():  # the instance's documents: one store commit
                builder = Builder(docs, self.scheduler, pattern.name, space, scope, inst.cause)
                arg_key = DocKey(space, scope.key, derive(inst.cause, "argument"))
                # the arguments initialise the argument cell; after that it is state (edits
                # made through inst.argument survive a restart), checked against its schema
                argument = Cell(docs, arg_key, (), pattern.argument_schema)
                params = pattern.bind_arguments(argument, inst._args)
                docs.declare(arg_key, inst._args, pattern.argument_schema,
                             f"{pattern.name} argument")
                token = _builder.set(builder)
                try:
                    output = pattern.fn(**params)
                finally:
                    _builder.reset(token)
                streams: dict[str, Stream] = {}
                placed: dict[tuple[str, ...], Pattern] = {}
                value = _to_document(output, (), streams, placed)
                res_key = DocKey(space, scope.key, derive(inst.cause, "result"))
                docs.declare(
                    res_key, value, None, f"{pattern.name} result", overwrite=not keep_result,
                    readonly="an instance's result is written by the runtime; write the cells "
                    "it names (a write through one of its links lands on the cell)",
                    owned=True,  # made by _to_document for this call
                )
        except BaseException:
            self._release(stored)  # it never ran: it holds nothing
            if builder is not None:  # and nothing of what it made so far runs on
                self._unbuild(builder, effects, inst)
            raise
        finally:
            docs.recording, docs.effects = outer, outer_effects
        inst.result = Cell(docs, res_key)
        inst.argument = argument
        inst._streams = streams
        inst._builder = builder
        inst._stored = tuple(stored)
        inst._effects = tuple(effects)
        for stream in builder.streams:
            stream.owner = inst
        self._running.add(inst, builder.streams, placed)
        if self.collector is not None:
            self.collector.started()

    def _unbuild(self, builder: Builder, effects: Sequence[Any], inst: Instance) -> None:
        """What a build made goes: streams closed, computations forgotten, teardown hooks
        run, and ``effects`` (the sinks of a build that failed half-way, whose builtins
        never registered their teardown) disposed."""
        for stream in builder.streams:
            stream.stopped = True
        for key in builder.derived:
            self.docs.forget(key)
        for hook in builder.on_stop:
            try:
                hook()
            except Exception as e:  # one node's teardown must not stop the others'
                self.docs.report(e, f"stopping {inst!r}")
        for effect in effects:
            effect.dispose()

    def _release(self, keys: Sequence[DocKey]) -> None:
        """An instance that declared ``keys`` no longer runs: each holds one fewer."""
        docs = self.docs._docs
        for key in keys:
            doc = docs.get(key)
            if doc is not None:
                self.docs.release(doc)

    def stop(self, instance: Instance) -> None:
        """Tear an instance down: cancel its async work, close its streams, drop its
        computations. Its stored documents stay (a later run finds them)."""
        if instance.stopped:
            return
        instance.stopped = True
        if instance.parked:  # only filed as parked (and any work started for it since)
            instance.parked = False
            self._running.unpark(instance)
            for scope in instance._scopes:
                scope.cancel()
            return
        self._teardown(instance)

    def _teardown(self, instance: Instance) -> None:
        for scope in instance._scopes:
            scope.cancel()
        builder = instance._builder
        assert builder is not None
        self._unbuild(builder, (), instance)
        self._running.remove(instance, builder.streams)
        self._release(instance._stored)

    # -- parking ---------------------------------------------------------------------

    def park(self, instance: Instance) -> bool:
        """Take an idle instance out of memory until it is used again; True if it is
        parked (or was already), False if it is busy now (try again later).

        Busy is: async work of its own in flight (a dialog's turn), events queued for its
        streams, or a commit under way. Parking stops it as ``stop`` does (a builtin keeps
        nothing in memory across parking that its documents do not hold) and takes its
        stored documents in its own scope out of memory where nothing else holds them; the
        store keeps them (``Runtime(store="memory")`` keeps them packed). Whatever needs it
        running brings it back first, as the same ``Instance``: ``send``, ``stream``,
        ``streams``, a read of its result or computations, a write to any of its
        documents, ``rt.run`` of it, a stream of it reached through a link or held from
        before, work spawned for it (the full list: docs/runtime.md). Coming back runs its
        pattern again on its stored state, as after a restart, in about the time of
        ``rt.run``.

        For a server holding many sessions, most of them idle: ``park_idle()``."""
        if instance.runtime is not self:
            raise PatternError(f"{instance!r} belongs to another runtime")
        if instance.parked:
            return True
        if instance.stopped:
            raise StreamError(f"{instance!r} is stopped: a stopped instance cannot be parked "
                              "(rt.run it again to use it)")
        self._check_running("park()")
        if current_transaction() is not None:
            raise StreamError("park() inside an open transaction (a handler's, or "
                              "`with rt.transaction()`): park after it commits")
        # a commit under way (a listener or a sink calling this): work its handler started
        # would start only after it, owned by an instance torn down meanwhile
        if self.docs.committing or self.scheduler.current is not None:
            return False
        if instance._scopes or any(ev.stream.owner is instance for ev in self.scheduler.queue):
            return False
        builder = instance._builder
        assert builder is not None
        # its computations must be read by its own only: another's reader would go stale
        derived = [d.node for k in builder.derived if (d := self.docs._docs.get(k)) is not None]
        own = {*derived, *instance._effects}
        if any(sub not in own for node in derived for sub in node.subs):
            return False
        keys = (instance.result.doc_key, instance.argument.doc_key, *builder.derived,
                *(s.key for s in builder.streams))
        self._teardown(instance)
        space, scope = instance.space, instance.scope.key
        stored = instance._stored
        self.docs.drop(k for k in stored if k.scope == scope and k.space == space)
        loaded = self.docs._docs
        for key in stored:  # left in memory (read live, or wider than its scope) and
            doc = loaded.get(key)  # declared by nothing running: a write brings it back
            if doc is not None and not doc.holders and not doc.derived:
                doc.declared = False
        scopes = tuple({(k.space, k.scope) for k in stored} | {(space, scope)})
        instance.parked = True
        instance._builder = None
        instance._streams = {}
        instance._stored = instance._effects = ()
        instance._parked_derived = tuple(builder.derived)
        self._running.park(instance, keys, scopes)
        return True

    def park_idle(self) -> int:
        """Park every running instance that is idle (``park``); returns how many were."""
        return sum(1 for inst in self._running if self.park(inst))

    def _revive(self, instance: Instance, *, keep_result: bool = False) -> None:
        """Bring a parked instance back: its pattern runs again on its stored state."""
        self._running.unpark(instance)
        instance.parked = False
        instance._parked_derived = ()
        try:
            self._build(instance, keep_result=keep_result)
        except BaseException:
            instance.stopped = True  # its documents stay stored; rt.run tries it anew
            raise

    def _wake(self, key: DocKey) -> bool:
        """Bring back the parked instance ``key`` is the result, argument, stream or
        computation of; True if there was one."""
        if not self._running.any_parked or self.docs.closed:
            return False
        inst = self._running.parked_owner(key)
        if inst is None:
            return False
        inside = signals.in_computation()
        if inside and key not in inst._parked_derived:
            # a stored document is read as stored from inside a computation; only one of
            # the parked instance's computations has nothing to read without it
            return False
        with signals.untracked():  # a computation's read does not own the build
            self._revive(inst, keep_result=inside)  # (a computation may not write)
        return True

    def _wake_doc(self, key: DocKey, write: bool) -> None:
        """``Documents.on_missing``: ``key`` is not loaded (or, ``write``, is about to be
        written and nothing running declares it). Its owner comes back; for a write to a
        stored document, whose owner is not indexed, those parked in its scope come back
        one by one until one declares it (errors of those it was not are reported: the
        write's own says the rest)."""
        if self._wake(key) or not write or not self._running.any_parked or self.docs.closed:
            return
        for inst in self._running.parked_in(key.space, key.scope):
            if not inst.parked:
                continue
            try:
                with signals.untracked():
                    self._revive(inst)
            except Exception as e:
                self.docs.report(e, f"bringing back {inst!r} for a write to /{key.id}")
            doc = self.docs._docs.get(key)
            if doc is not None and doc.declared:  # its owner is back: the rest stay parked
                return

    def _current_stream(self, stream: Stream) -> Stream | None:
        """For the scheduler: the live stream that stands for ``stream``, a stream of an
        instance that was parked (and is brought back here) since it was handed out."""
        owner = stream.owner
        if owner is None or owner.stopped:
            return None
        if owner.parked:
            self._revive(owner)
        builder = owner._builder
        return next((s for s in builder.streams if s.key == stream.key), None) \
            if builder is not None else None

    # -- waiting ---------------------------------------------------------------------

    async def idle(self) -> None:
        """Return when no graph work is runnable (every queued event has run)."""
        self.scheduler.drain()
        await anyio.lowlevel.checkpoint()

    async def settled(self) -> None:
        """Return when no graph work is runnable and no async work (LLM turns, tool runs)
        is in flight."""
        if current_transaction() is not None:
            raise StreamError(
                "settled() inside an open transaction would wait for events that cannot run "
                "until it commits: call it after the `with rt.transaction()` block"
            )
        while True:
            self.scheduler.drain()
            if not self._inflight and not self.scheduler.queue:
                await anyio.lowlevel.checkpoint()
                if not self._inflight and not self.scheduler.queue:
                    return
                continue
            changed = self._changed
            if changed is None:
                changed = self._changed = anyio.Event()
            await changed.wait()

    def _poke(self) -> None:
        """Events were queued (the pump drains them) or something else changed."""
        self._poke_settled()
        work, self._work = self._work, None
        if work is not None:
            work.set()

    def _poke_settled(self) -> None:
        """What ``settled()`` waits for changed (work in flight ended): the pump, whose
        events arrive through ``_poke``, sleeps on."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Call ``fn()`` (synchronous) ``delay`` seconds from now (the event loop's clock,
        not ``clock``) in the runtime's one timer task, unless the ``Timer`` returned is
        cancelled first. For work that may be wanted a moment later and usually is not (a
        timer is a heap entry, not a task): it is not work ``settled()`` waits for, so
        whoever starts one cancels it once it is not wanted. An error it raises is
        reported in ``errors``."""
        self._check_running("call_later()")
        if not self._timing:
            if self._tg is None:  # the runtime is closing: its tasks are being cancelled
                raise ClosedError("call_later() while the runtime closes")
            self._timing = True
            # in a context of its own: a task copies its starter's context variables, and
            # the first timer may be set inside a handler (its transaction, its stream)
            contextvars.Context().run(self._tg.start_soon, self._timers.run,
                                      name="celldialog timers")
        return self._timers.call_later(delay, fn)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any,
              owner: Instance | None = None, name: str = "task") -> anyio.CancelScope:
        """Start async work that ``settled()`` waits for; stopping ``owner`` cancels it.
        Errors are reported in ``rt.errors``, never lost."""
        self._check_running("spawn()")
        scope = anyio.CancelScope()
        tx = self.docs.tx
        if tx is not None:
            # started by a handler: it starts only if (and once) the handler commits
            tx.after_commit.append(lambda: self._start(fn, args, owner, name, scope))
            return scope
        self._start(fn, args, owner, name, scope)
        return scope

    def _start(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
               owner: Instance | None, name: str, scope: anyio.CancelScope) -> None:
        self._check_running("spawn()")
        assert self._tg is not None
        if owner is not None:
            if owner.stopped:
                return
            if owner.parked:  # work for it: it is in use again
                self._revive(owner)
            owner._scopes.append(scope)
        self._inflight += 1

        async def tracked() -> None:
            try:
                with scope:
                    await fn(*args)
            except Exception as e:
                self.docs.report(e, name)
            finally:
                self._inflight -= 1
                if owner is not None and scope in owner._scopes:
                    owner._scopes.remove(scope)
                self._poke_settled()

        self._tg.start_soon(tracked, name=name)

    async def send(self, stream: Stream, event: Any) -> None:
        """Send ``event`` to ``stream`` and run it (and anything queued before it), in this
        task; raises the handler's error if it failed (then it committed nothing).

        A cancellation point every time (a cancelled sender's event has run, and the
        sender gets the cancellation, as at any checkpoint after the work). It yields to
        other tasks only once ``SEND_YIELD_EVERY`` seconds have passed since the last send
        that yielded: a turn of the event loop costs about as much as a small handler's
        whole event, and a task sending in a loop still leaves the loop to others at least
        that often (plus one handler's run)."""
        if current_transaction() is not None:
            raise StreamError(
                f"await rt.send({stream.name!r}, ...) inside an open transaction would run the "
                "handler in the middle of it: send after the `with rt.transaction()` block"
            )
        ev = self.scheduler.run_now(stream, event)
        now = time.monotonic()
        if now >= self._yield_at:
            self._yield_at = now + SEND_YIELD_EVERY
            await anyio.lowlevel.checkpoint()
        else:
            await anyio.lowlevel.checkpoint_if_cancelled()
        if ev.error is not None:
            raise ev.error

    def _check_running(self, what: str) -> None:
        if self._state is not _State.OPEN:
            if self._state is _State.CLOSED:
                raise ClosedError(f"{what} after the runtime closed")
            raise ClosedError(f"{what} needs a running runtime: use `async with Runtime()`")

    # -- what runs where (for builtins; see runtime/cells/registry.py) ----------------

    def instance_of(self, key: DocKey) -> Instance | None:
        """The running instance whose result or argument document is ``key``, or None (an
        instance that stopped owns nothing). Other documents an instance declares (its
        cells, a builtin node's state) may be shared by several instances, so they name no
        single owner."""
        inst = self._running.instance_of(key)
        if inst is None and self._wake(key):
            inst = self._running.instance_of(key)
        return inst

    def stream_at(self, key: DocKey) -> Stream | None:
        """The live stream whose document is ``key`` (a pattern's or a builtin node's), or
        None when none is (its instance stopped, or it never ran in this process)."""
        stream = self._running.stream_at(key)
        if stream is None and self._wake(key):
            stream = self._running.stream_at(key)
        return stream

    def pattern_at(self, key: DocKey, path: Sequence[str | int]) -> Pattern | None:
        """The pattern a running instance's output placed at ``path`` of its result document
        ``key``, while the value there still names it; None anywhere else. A pattern
        reference is a capability found by *where* it is: the same ``{"$pattern": ...}``
        shape written by a handler or a model is data, and runs nothing. ``path`` is the
        place itself, links already followed (as ``Documents.resolve`` returns it)."""
        pattern = self._running.pattern_at(key, path)
        if pattern is None and self._wake(key):
            pattern = self._running.pattern_at(key, path)
        return pattern

    def deliver(self, stream: Stream, event: Any) -> None:
        """Run ``stream``'s handler on ``event`` now, inside this task's open transaction
        (``begin()`` or ``transaction()``), as one part of a larger atomic change; see
        ``Scheduler.deliver``. Builtins use it to commit a tool call with its effects."""
        self._check_running("deliver()")
        self.scheduler.deliver(stream, event)

    def begin(self) -> Transaction:
        """A new transaction, not yet bound to any block: write in it with
        ``with tx.bound():`` (in the task that began it), then ``tx.commit()`` or
        ``tx.abort()``. For work that spans several callbacks (a builtin's step) and must
        land in one commit; ``transaction()`` is the everyday form."""
        self._check_running("begin()")
        self.docs.check_open("begin()")
        return Transaction(self.docs)

    def transaction(self) -> AbstractContextManager[Any]:
        """``with rt.transaction():`` groups writes made outside handlers (by async work, a
        turn) into one atomic commit: all of them, or none if the block raises."""
        return writing(self.docs)

    def __repr__(self) -> str:
        return f"Runtime({self.store!r}, {len(self._running)} instances)"


def _to_document(value: Any, path: tuple[str, ...], streams: dict[str, Stream],
                 placed: dict[tuple[str, ...], Pattern]) -> Any:
    """A pattern's output as a document: cells become links, streams links to their
    stream documents (and are collected by dotted name), patterns ``{"$pattern": key}``
    (collected in ``placed`` by their path, the capability ``Runtime.pattern_at`` checks)."""
    if isinstance(value, Cell):
        return value.link()
    if isinstance(value, Stream):
        streams[".".join(path)] = value
        return value.link()
    if isinstance(value, Pattern):
        placed[path] = value
        return {PATTERN_REF: value.key}
    if isinstance(value, dict):
        for k in value:
            if type(k) is str and not k.isascii() and has_surrogate(k):
                raise NotJSONError(describe_surrogate(k, f"a key of pattern output at /"
                                                         f"{'/'.join(path)}"))
        return {str(k): _to_document(v, (*path, str(k)), streams, placed)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_document(v, (*path, str(i)), streams, placed)
                for i, v in enumerate(value)]
    if value is MISSING:
        return None
    return check_json(value, f"pattern output at /{'/'.join(path)}")

