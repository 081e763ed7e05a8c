"""ReactiveX at the edge of the graph: a cell's values as an Rx ``Observable`` and an Rx
observable fed into a stream, so inputs and outputs compose with Rx operators (``debounce``,
``throttle_first``, ``switch_map``...). The graph itself never uses Rx.

``observe(cell)`` (``Cell.observe()``) is cold: each subscription installs its own
``cell.sink``, which emits the current value at once and then every committed change of it;
disposing the subscription removes the sink.

``feed(source, stream)`` (``Stream.feed(source)``) subscribes to ``source`` and sends each
item to ``stream`` as an event. Rx time operators call back on their own threads; the
runtime is single-threaded, so items are handed to the event loop that was running when
``feed()`` was called (``loop.call_soon_threadsafe``) and sent from there, in the order they
were emitted. Sent events are queued like any ``stream.send``: they run when the runtime
drains (``await rt.idle()``, ``await rt.settled()``, ``await inst.send(...)``).

What goes where (docs/reactivex.md has the why):

- ``observe``: the sink's computation failing when the subscription starts goes to
  ``on_error``; failing later is reported in ``rt.errors`` (the commit stands) and the
  observable stays live, emitting again when the value recovers. ``on_error`` is final in Rx,
  a failing computation is not.
- ``feed``: an item the stream refuses (its event schema, a value JSON cannot hold) is
  reported in ``rt.errors`` and the feed goes on with the next item. The source failing is
  reported there too and ends the feed; so does completing (without a report). Disposing
  stops it. A stopped stream (its instance stopped) ends the feed at the next item, silently;
  a stream whose instance was parked feeds the instance brought back.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import reactivex
from reactivex import abc
from reactivex.disposable import Disposable, SingleAssignmentDisposable

from ..errors import ClosedError, StreamError

if TYPE_CHECKING:
    from .cell import Cell, Stream

__all__ = ["Feed", "feed", "observe"]


class _Home:
    """The runtime's thread (the one running its event loop): what runs there runs inline,
    what is called from any other thread is handed to the loop."""

    __slots__ = ("loop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.thread = threading.get_ident()

    @classmethod
    def capture(cls) -> _Home:
        try:
            return cls(asyncio.get_running_loop())
        except RuntimeError:
            return cls(None)  # no loop: everything runs on the calling thread

    def here(self) -> bool:
        return self.loop is None or threading.get_ident() == self.thread

    def call(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the home thread: now if we are there, else soon. False if the loop
        has closed (the runtime is gone)."""
        if self.here():
            fn()
            return True
        assert self.loop is not None
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed
            return False
        return True


# ---------------------------------------------------------------------------- observe


def observe(cell: Cell) -> reactivex.Observable[Any]:
    """The values of ``cell`` as a cold Rx observable: each subscriber gets the current value
    at once, then each committed change of it (an unchanged value is not emitted again; a
    missing path reads as ``None``). Values are copies. Disposing the subscription removes
    its sink. Subscribing or disposing from another thread is handed to the runtime's loop."""
    home = _Home.capture()

    def subscribe(observer: abc.ObserverBase[Any],
                  scheduler: abc.SchedulerBase | None = None) -> abc.DisposableBase:
        unsubscribe: Callable[[], None] | None = None
        disposed = False

        def install() -> None:  # on the home thread
            nonlocal unsubscribe
            if disposed:
                return
            try:
                stop = cell.sink(observer.on_next)
            except Exception as e:  # its computation failed: nothing to start from
                observer.on_error(e)
                return
            if disposed:  # disposed while it emitted the first value (take(1))
                stop()
            else:
                unsubscribe = stop

        def dispose() -> None:  # on the home thread
            nonlocal unsubscribe, disposed
            disposed = True
            stop, unsubscribe = unsubscribe, None
            if stop is not None:
                stop()

        if not home.call(install):
            raise ClosedError(f"observe({cell!r}): the runtime's event loop has closed")
        return Disposable(lambda: home.call(dispose))

    return reactivex.create(subscribe)


# ---------------------------------------------------------------------------- feed

_NEXT, _ERROR, _DONE = 0, 1, 2


class Feed(abc.DisposableBase):
    """A running ``feed(source, stream)``. ``dispose()`` stops it (from any thread);
    ``done`` says it has ended; ``await wait()`` returns once it has: the source completed or
    failed (after its last item was sent), it was disposed, or its stream stopped."""

    def __init__(self, stream: Stream, home: _Home) -> None:
        self.stream = stream
        self._home = home
        self._lock = threading.Lock()
        self._inbox: deque[tuple[int, Any]] = deque()
        self._scheduled = False  # a flush is on its way to the loop
        self._flushing = False
        self._stopping = False  # dispose() was called (any thread): take nothing more
        self._ended = False  # home thread only
        self._finished = anyio.Event()
        self._subscription = SingleAssignmentDisposable()

    @property
    def done(self) -> bool:
        return self._ended

    async def wait(self) -> None:
        """Return when the feed has ended (its items sent; run them with ``rt.idle()``)."""
        await self._finished.wait()

    def dispose(self) -> None:
        self._stopping = True
        self._subscription.dispose()
        if not self._home.call(self._end):
            self._ended = True  # the loop is gone: nobody can be waiting

    # -- the observer side: any thread ----------------------------------------------

    def _on_next(self, item: Any) -> None:
        self._post(_NEXT, item)

    def _on_error(self, error: Exception) -> None:
        self._post(_ERROR, error)

    def _on_completed(self) -> None:
        self._post(_DONE, None)

    def _post(self, kind: int, value: Any) -> None:
        if self._stopping:
            return
        here = self._home.here()
        with self._lock:
            self._inbox.append((kind, value))
            if not here:
                if self._scheduled:
                    return  # the flush on its way takes this one too
                self._scheduled = True
        if here:
            self._flush()  # earlier items from other threads go first
            return
        if not self._home.call(self._flush):  # the loop has closed: the runtime is gone
            self._stopping = True
            self._subscription.dispose()

    # -- the runtime side: the home thread ------------------------------------------

    def _flush(self) -> None:
        if self._flushing:
            return  # an item sent while delivering one: the loop below takes it
        self._flushing = True
        try:
            while True:
                with self._lock:
                    if not self._inbox or self._stopping:
                        self._inbox.clear()
                        self._scheduled = False
                        return
                    kind, value = self._inbox.popleft()
                self._deliver(kind, value)
        finally:
            self._flushing = False

    def _deliver(self, kind: int, value: Any) -> None:
        stream = self.stream
        if kind == _NEXT:
            try:
                if stream.stopped:  # its instance parked since (Runtime.park): the live one
                    stream = self.stream = stream._scheduler.current_stream(stream) or stream
            except Exception as e:  # it could not come back: said, and the feed ends
                self._report(e, f"feed into {stream!r}")
                self._end()
                return
            if stream.stopped:
                self._end()
                return
            try:
                stream.send(value)
            except Exception as e:
                if stream.stopped:
                    self._end()
                else:  # a bad item: say so and go on with the next one
                    self._report(e, f"feed into {stream!r}")
        elif kind == _ERROR:
            self._report(value, f"feed into {stream!r} (its source failed)")
            self._end()
        else:
            self._end()

    def _report(self, error: BaseException, where: str) -> None:
        self.stream._scheduler.docs.report(error, where)

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._stopping = True
        self._subscription.dispose()
        with self._lock:
            self._inbox.clear()
        self._finished.set()

    def __repr__(self) -> str:
        state = "done" if self._ended else "running"
        return f"Feed(into {self.stream!r}, {state})"


def feed(source: reactivex.Observable[Any], stream: Stream, *,
         scheduler: abc.SchedulerBase | None = None) -> Feed:
    """Subscribe to ``source`` and send each item to ``stream`` as an event, on the runtime's
    event loop whatever thread the item arrives on. Call it from the runtime's async code (it
    captures the running loop). ``scheduler`` is the default scheduler of the subscription:
    time operators that were not given one use it (Rx's default: a thread per timer).

    Returns the ``Feed``: ``dispose()`` it to stop. A stream that is already stopped is a
    ``StreamError`` here. See the module docstring for what happens
    to bad items, the source's completion and errors, and a stopped stream."""
    if stream.stopped:  # its instance parked since it was handed out: the live stream
        stream = stream._scheduler.current_stream(stream) or stream
    if stream.stopped:  # the caller hears of it now, as stream.send would say
        raise StreamError(f"{stream!r} belongs to a stopped instance; nothing would handle "
                          "what is fed into it")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise ClosedError(
            f"feed() into {stream!r} needs the runtime's event loop: call it from the async "
            "code that runs the runtime (inside `async with Runtime()`), on its thread"
        ) from None
    running = Feed(stream, _Home(loop))
    running._subscription.disposable = source.subscribe(
        running._on_next, running._on_error, running._on_completed, scheduler=scheduler
    )
    return running
