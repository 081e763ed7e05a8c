"""Keeping the cyclic garbage collector's cost flat with many live instances.

CPython's full collections walk every tracked object alive. A pattern instance is a few
hundred of them (cells, documents, handlers), so with thousands of sessions the full
collections that the turns' allocations trigger walk millions of objects: a step cost
~1.25x more at 4,000 sessions than at 100 (``bench/dialog.py``), all of it the collector.

``FreezePolicy`` (``Runtime(freeze_gc=True)``; on in ``celldialog serve``) moves what is
alive out of the collector's sight (``gc.freeze()``) after a collection, whenever as many
instances were started since the last time as were running then (and at least
``FLOOR``). The collection that goes with it is a pause proportional to what is alive,
taken once each time the instances double (or churn through once), so its cost per
instance stays constant; in between, collections walk only what is new. Objects frozen
are still freed by reference counting; only garbage *cycles* among them (a stopped
instance's graph) wait for the next refreeze, which unfreezes and collects first.

While such a runtime is open, the youngest generation is collected every ``YOUNG``
allocations instead of CPython's 700. Thousands of sessions keep many turns in flight
(each awaiting its model with its frames, tasks and messages alive), so nearly everything
young survives a young collection and is walked again in the middle one: at 4,000
sessions the collector cost about 35-49 µs per dialog step at 700 and 19-25 at 10,000
(``gc.callbacks`` around the collections; gen0 pauses of at most 28-42 ms against 52-75 at
700, which had full collections too). Cycles that became garbage wait for up to ``YOUNG``
allocations: a few megabytes at most.

Process-wide by nature (the collector is one per process), so it is off by default in
the library: an application that owns its process turns it on. The first such runtime
opened sets the threshold, the last one closed puts back what it found (unless the
application set thresholds of its own meanwhile: those stay).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

__all__ = ["FLOOR", "YOUNG", "FreezePolicy"]

FLOOR = 1000  # instances started before the first refreeze
YOUNG = 10_000  # allocations between young collections while a policy is open

_open = 0  # policies open in this process
_found: tuple[int, int, int] | None = None  # the thresholds before the first one opened
_set: tuple[int, int, int] | None = None  # the thresholds the first one set
_lock = threading.Lock()  # runtimes in other threads open and close policies too


class FreezePolicy:
    """When to refreeze (see the module docstring); ``live()`` counts running instances."""

    __slots__ = ("_live", "_next", "_started", "frozen", "opened", "refreezes")

    def __init__(self, live: Callable[[], int]) -> None:
        self._live = live
        self._started = 0
        self._next = FLOOR
        self.refreezes = 0
        self.frozen = False
        self.opened = False

    def open(self) -> None:
        """The runtime opened: young collections every ``YOUNG`` allocations (at least)."""
        global _open, _found, _set
        with _lock:
            if self.opened:
                return
            self.opened = True
            if _open == 0:
                _found = gc.get_threshold()
                young, older, oldest = _found
                _set = (max(young, YOUNG), older, oldest)
                gc.set_threshold(*_set)
            _open += 1

    def started(self) -> None:
        """An instance was started: refreeze once enough were."""
        self._started += 1
        if self._started >= self._next:
            self.refreeze()

    def refreeze(self) -> None:
        """Collect everything (the frozen objects too), then freeze what is left."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.frozen = True
        self.refreezes += 1
        self._started = 0
        self._next = max(FLOOR, self._live())

    def close(self) -> None:
        """Hand the frozen objects back to the collector (the runtime closed); the last
        policy open puts back the thresholds it found."""
        global _open, _found, _set
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
        with _lock:
            if not self.opened:
                return
            self.opened = False
            _open -= 1
            if _open == 0 and _found is not None:
                if gc.get_threshold() == _set:  # else the application set its own since
                    gc.set_threshold(*_found)
                _found = _set = None
