"""The event queue: handlers run once per event, FIFO, each in its own transaction.

Events sent while a handler runs (``stream.send`` inside it) are held with its transaction
and queued only if it commits. Each event remembers which event caused it; a causal chain
longer than ``MAX_CHAIN`` is a cycle (handlers and sinks re-triggering each other) and is
reported with the handlers involved instead of spinning forever.

Whoever drains the queue runs its events, synchronously: an awaited send (``run_now``) in
the sender's task, ``idle()``/``settled()`` in theirs, the runtime's pump for events queued
with nobody waiting. ``wake`` is called only for an event no drain under way will reach.
"""

from __future__ import annotations

import inspect
import json
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConflictError,
    CycleError,
    PatternError,
    StreamError,
    UsageError,
)
from ..storage import DocKey
from . import signals
from .documents import Documents, Transaction, TxState, current_transaction
from .jsonpath import Path, check_json, copy_json, is_link
from .links import check_event, parse_link
from .schema import asks_for_link, subschema, validate

if TYPE_CHECKING:
    from .cell import Stream

MAX_CHAIN = 1000
CONFLICT_RETRIES = 3  # reruns of a handler whose commit met another process's write


class Event:
    __slots__ = ("awaited", "depth", "error", "parent", "payload", "stream")

    def __init__(self, stream: Stream, payload: Any, parent: Event | None,
                 awaited: bool = False) -> None:
        self.stream = stream
        self.payload = payload
        self.parent = parent
        self.depth = parent.depth + 1 if parent else 0
        self.awaited = awaited  # a sender waits for it: errors go to them, not to rt.errors
        self.error: BaseException | None = None


class Scheduler:
    def __init__(self, docs: Documents, wake: Callable[[], None] = lambda: None,
                 max_chain: int = MAX_CHAIN) -> None:
        self.docs = docs
        self.max_chain = max_chain
        self.queue: deque[Event] = deque()
        self.current: Event | None = None
        self._draining = False
        self._wake = wake
        self._tx: Transaction | None = None  # the running handler's transaction
        # the live stream standing for a stopped one whose instance was parked since it was
        # handed out, or None (set by the Runtime: Runtime.park)
        self.current_stream: Callable[[Stream], Stream | None] = lambda stream: None

    def enqueue(self, stream: Stream, payload: Any) -> Event:
        if stream.stopped:
            stream = self.current_stream(stream) or stream
        payload = self._checked(stream, payload)
        tx = self._tx
        if tx is not None:
            # sent while a handler or its commit's sinks run: leaves, in the order sent, only
            # if that handler commits
            tx.outbox.append((stream, payload))
            return Event(stream, payload, self.current)
        own = current_transaction()
        if own is not None:
            # sent inside `with rt.transaction()`: leaves only if that block commits
            if not own.outbox:
                own.after_commit.append(lambda: self._release(own))
            own.outbox.append((stream, payload))
            return Event(stream, payload, self.current)
        return self._push(stream, payload, self.current)

    def run_now(self, stream: Stream, payload: Any) -> Event:
        """An awaited send from outside any transaction (``Runtime.send``): the event joins
        the queue behind what already waits there and the caller's task drains the queue,
        so it has run (after those, before this returns) with no task switch. Nothing wakes
        the pump for it: the pump would find nothing left to run. The caller checks that
        no transaction is open."""
        if stream.stopped:
            stream = self.current_stream(stream) or stream
        ev = Event(stream, self._checked(stream, payload), self.current, awaited=True)
        if ev.depth > self.max_chain:
            raise _chain_cycle(ev, self.max_chain)
        self.queue.append(ev)
        if not self._draining:
            self._drain()
        return ev

    def deliver(self, stream: Stream, payload: Any) -> None:
        """Run ``stream``'s handler on ``payload`` now, inside the calling task's open
        transaction: one part of a larger atomic change (a dialog step, whose tool call, the
        handler's writes and the tool's result commit together). The event is checked as
        ``enqueue`` checks it. A handler that raises takes back its own writes and sends (a
        savepoint) and the error propagates; the transaction goes on. Events it sends leave
        when the transaction commits. It runs ahead of events already queued (those run
        after the commit)."""
        tx = current_transaction()
        if tx is None or tx.state is not TxState.OPEN:
            raise UsageError("deliver() runs a handler inside an open transaction: open one "
                             "with rt.transaction(), or send the event with rt.send()")
        if stream.stopped:
            stream = self.current_stream(stream) or stream
        payload = self._checked(stream, payload)  # a copy of its own: no retry reuses it
        point = tx.savepoint()
        token = _running.set(stream)
        try:
            _call(stream, payload, tx, owned=True)
        except BaseException:
            if tx.state is TxState.OPEN:
                tx.rollback_to(point)
            raise
        finally:
            _running.reset(token)

    def _checked(self, stream: Stream, payload: Any) -> Any:
        """The event as plain JSON, checked against the handler's event schema (links only
        where it asks for one): the sender hears of a bad event now."""
        if stream.stopped:
            raise StreamError(f"{stream!r} belongs to a stopped instance; nothing will handle it")
        links: list[Path] = []
        payload = check_json(payload, lambda: f"event for {stream.name}", links=links)
        schema = stream.handler.event_schema
        if links:  # links from outside arrive only where the schema asks for one
            check_event(links, schema, stream.name)
        if schema is not None:  # the sender hears of a bad event now
            validate(payload, schema, lambda: f"event for {stream.name}")
        return payload

    def _release(self, tx: Transaction) -> None:
        for target, payload in tx.outbox:
            self._push(target, payload, self.current)
        tx.outbox.clear()

    def _push(self, stream: Stream, payload: Any, parent: Event | None) -> Event:
        ev = Event(stream, payload, parent)
        if ev.depth > self.max_chain:
            raise _chain_cycle(ev, self.max_chain)
        self.queue.append(ev)
        if not self._draining:  # a drain under way runs it; no need to wake anyone
            self._wake()
        return ev

    def drain(self) -> None:
        """Run queued events until the queue is empty (re-entrant calls return at once, and
        so does a call made while a transaction is open: its events wait for the commit)."""
        if self._draining or current_transaction() is not None:
            return
        self._drain()

    def _drain(self) -> None:
        self._draining = True
        queue, run = self.queue, self._run
        try:
            while queue:
                run(queue.popleft())
        finally:
            self._draining = False
            if queue:  # left by an error that escaped a handler run: the pump takes over
                self._wake()

    def _run(self, ev: Event) -> None:
        """Run one event's handler in its own transaction. If the commit finds that another
        process changed a document the handler read (``ConflictError``), the runtime has
        caught up with the store and the handler runs again on the new state: a handler is
        a function of state and event, so a rerun is what it would have done had it been
        second. After ``CONFLICT_RETRIES`` reruns the conflict is the event's error."""
        stream = ev.stream
        self.current = ev
        token = _running.set(stream)
        try:
            for attempt in range(CONFLICT_RETRIES + 1):
                try:
                    self._attempt(ev)
                    break
                except ConflictError:
                    if attempt == CONFLICT_RETRIES:
                        raise
        except Exception as e:
            ev.error = e
            if not ev.awaited:
                self.docs.report(e, f"handler {stream.name}")
        finally:
            _running.reset(token)
            self._tx = None
            self.current = None

    def _attempt(self, ev: Event) -> None:
        stream = ev.stream
        if stream.stopped:  # its instance was parked since it was queued: the live one
            stream = ev.stream = self.current_stream(stream) or stream
        tx = self._tx = Transaction(self.docs, synchronous=True)
        try:
            if stream.stopped:
                raise StreamError(f"{stream!r} was stopped before its event ran")
            _call(stream, ev.payload, tx)
            tx.commit()
        except BaseException:
            if tx.state is TxState.OPEN:
                tx.abort()
            raise
        for target, payload in tx.outbox:
            self._push(target, payload, ev)


def _call(stream: Stream, payload: Any, tx: Transaction, *, owned: bool = False) -> None:
    """The handler on one (validated) event, its writes going into ``tx``. ``owned``: the
    payload is a copy nobody else holds (else the handler gets one: a queued event's payload
    is run again when its commit conflicts)."""
    handler = stream.handler
    event = payload if owned else copy_json(payload)  # the sender's value is never reached
    if handler.event_model is not None:
        event = handler.event_model.model_validate(event)
    elif _asks_for_cells(handler.event_schema):
        event = _live(event, handler.event_schema, tx.docs, stream.key)
    token = tx.bind()  # bound() without its generator-based context manager: per event
    try:
        with signals.untracked():
            returned = handler.fn(event, **stream.bindings)
    finally:
        tx.unbind(token)
    if returned is not None and inspect.isawaitable(returned):
        if hasattr(returned, "close"):
            returned.close()  # never awaited: don't leave a warning behind
        raise PatternError(
            f"handler {stream.name} returned an awaitable, which never runs: handlers "
            "are synchronous; start async work with current_runtime().spawn(...)"
        )


_CELL_SCHEMAS: dict[int, tuple[Any, bool]] = {}  # id(schema) -> (schema, mentions asCell)


def _asks_for_cells(schema: Any) -> bool:
    """Does an event schema ask for a cell anywhere? (Looked up by identity: a handler's
    schema is the same object event after event.)"""
    if not isinstance(schema, dict):
        return False
    hit = _CELL_SCHEMAS.get(id(schema))
    if hit is None or hit[0] is not schema:
        if len(_CELL_SCHEMAS) >= 1024:
            _CELL_SCHEMAS.clear()
        hit = _CELL_SCHEMAS[id(schema)] = (schema, '"asCell"' in json.dumps(schema))
    return hit[1]


def _live(value: Any, schema: Any, docs: Documents, base: DocKey) -> Any:
    """The event with each link where its schema asks for a cell (``{"asCell": true}``)
    turned into a live ``Cell`` (a bare path resolves in the stream's own scope)."""
    if asks_for_link(schema) and is_link(value):
        from .cell import Cell

        key, path = parse_link(value, base)
        return Cell(docs, key, path)
    if type(value) is dict:
        return {k: _live(v, subschema(schema, (k,)), docs, base) for k, v in value.items()}
    if type(value) is list:
        return [_live(v, subschema(schema, (i,)), docs, base) for i, v in enumerate(value)]
    return value


_running: ContextVar[Stream | None] = ContextVar("celldialog_handler", default=None)


def running_stream() -> Stream | None:
    """The stream whose handler is running in this task, if any."""
    return _running.get()


def _chain_cycle(ev: Event, limit: int) -> CycleError:
    names: list[str] = []
    streams: list[Any] = []
    e: Event | None = ev
    for _ in range(64):
        if e is None:
            break
        if e.stream not in streams:
            streams.append(e.stream)
            names.append(e.stream.name)
        e = e.parent
    names.reverse()
    streams.reverse()
    return CycleError(
        f"events keep causing each other ({limit} in a row): "
        + " -> ".join(names)
        + " -> ... (a handler's write wakes something that sends to it again; if the chain"
        " is legitimate, raise Runtime(max_event_chain=...))",
        streams,
    )
