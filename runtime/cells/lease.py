"""``ProcessLease``: the runtime's lease in the store, which tells other processes it is alive.

A dialog's turn is owned by the process that accepted it. Others must be able to recover the
turn when that process dies, and must never take it from one that is merely quiet (a model
call can write nothing for minutes). A heartbeat written with a turn's own writes gets both
wrong; a lease gets both right because it belongs to the process, not to the turn: one per
runtime, renewed in the background every ``ttl/3`` while the runtime owns turns, whatever
those turns are doing. A turn records the holder id, and another process may take it over
only once ``store.lease_remaining(holder)`` says the lease has expired. The contract of the
store's side is in ``runtime.storage.base``.

Use: ``hold()`` when a turn starts and ``drop()`` when it ends (``hold`` renews at once only
if less than ``ttl/2`` is left, so a turn adds a write at most at its start); ``keep()``
runs in the runtime's task group for the runtime's life (it is not work to wait for); a
turn writes as owner only while ``valid()``; ``close()`` releases the lease at shutdown, so
other processes recover its turns at once instead of after the TTL. Nothing is written per
step, nothing while idle: with no turn held the keeper waits on an event and the lease runs
out, and the next ``hold()`` takes a new one.

Fencing, the local rule: the deadline of a renewal is counted from just *before* it was
sent, on the local monotonic clock, so it never falls after the store's; ``valid()`` keeps a
margin below it. A holder past that deadline is never renewed again (another process may
have taken over its turns, the store may have forgotten it): the lease moves to a new holder
id, and the turns recorded under the old one stop writing as owner (their holder is no
longer ``holder``). The store's answer agrees: an expired lease renews to False, not back
to life.

``DEFAULT_TTL`` is 10 s. A killed owner's turn is recovered within it (a user waits that
long once, after a crash). A live owner keeps its lease through any pause shorter than
ttl * (2/3 - margin), 5.7 s, wherever the pause falls: a garbage collection, a swap-in, an
event loop blocked for a few seconds. Renewals come every 3.3 s, so one that waits the
SQLite store's default ``busy_timeout`` (5 s) for a locked file still reaches the store
before the lease ends. Shorter would take turns from loaded processes; longer would keep a
dead one's turn pending for longer; the writes (one small row each 3.3 s per process that
owns turns) cost nothing.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from enum import Enum

import anyio

from ..errors import ClosedError, StorageError, StoreClosedError, UsageError
from ..storage.base import Store, check_lease_ttl, is_lease_holder

__all__ = ["DEFAULT_TTL", "SAFETY_MARGIN", "ProcessLease"]

log = logging.getLogger("celldialog.lease")

DEFAULT_TTL = 10.0  # seconds; the module's docstring says why
SAFETY_MARGIN = 0.1  # of the ttl: valid() ends this much before the local deadline


class _State(Enum):
    OPEN = "open"
    CLOSED = "closed"


class ProcessLease:
    """One runtime's lease: a holder id, renewed in ``store`` while turns are held.

    ``clock`` is the local monotonic clock the lease's own deadline is kept on (injectable
    for tests); the store keeps the lease on its own clock.
    """

    def __init__(self, store: Store, ttl: float = DEFAULT_TTL, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        check_lease_ttl(ttl, "ProcessLease(ttl=...)")
        self._store = store
        self._ttl = float(ttl)
        self._clock = clock
        self._holder = uuid.uuid4().hex
        # the start of the current holder's last successful renewal + ttl; None: never taken
        self._deadline: float | None = None
        self._next = -math.inf  # when the keeper renews next
        self._held = 0
        self._given_up: set[str] = set()  # holders this lease moved away from: never live
        self._wake: anyio.Event | None = None  # the keeper's, while it waits
        # the keeper waits with no renewal to come (no turn held since the last one): a
        # first hold wakes it. Otherwise it wakes at the renewal time anyway and renews if
        # a turn is held then, so a turn starting after the last one ended (turn after turn)
        # costs no wake (hold() renews at once if the lease runs short)
        self._idle = False
        self._keeping = False
        self._state = _State.OPEN

    @property
    def holder(self) -> str:
        """The current holder id; a new one once the lease was lost."""
        return self._holder

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def held(self) -> int:
        """How many turns hold the lease (``hold()`` minus ``drop()``)."""
        return self._held

    # -- turns -----------------------------------------------------------------------

    def ensure(self) -> str:
        """Make sure the lease is held with at least ``ttl/2`` left (a store write only if
        not) and return the holder id, without counting a turn: for a handler that records
        the holder but may abort or run again (its ``hold()`` belongs in the turn's task).
        Raises the store's ``StorageError`` if it cannot renew and the lease is not valid."""
        self._check_open("ensure()")
        if self._left() < self._ttl / 2:
            try:
                self._renew()
            except StorageError as e:
                if not self.valid():
                    raise
                log.warning("lease %s: renewal failed, %.1f s left; the keeper retries: %s",
                            self._holder, self._left(), e)
        return self._holder

    def hold(self) -> str:
        """A turn owned here starts: ``ensure()``, count it, wake the keeper. Returns the
        holder id to record in the turn. Pair it with exactly one ``drop()``."""
        holder = self.ensure()
        self._held += 1
        if self._held == 1 and self._idle:  # a keeper waiting for a renewal wakes then
            self._poke()
        return holder

    def drop(self) -> None:
        """A turn owned here ended. With none left the keeper stops renewing."""
        if self._held == 0:
            raise UsageError("ProcessLease.drop() without a hold(): call it once per hold(), "
                             "when the turn that held it ends")
        self._held -= 1

    def valid(self, holder: str | None = None) -> bool:
        """Local knowledge, no store call: is the lease (of ``holder``, default the
        current one) held, with its deadline minus the margin still ahead? False for a
        holder given up, and after ``close()``."""
        if holder is not None and holder != self._holder:
            return False
        return self._state is _State.OPEN and self._left() > 0

    def is_live(self, holder: object) -> bool:
        """May a turn recorded under ``holder`` still be running? Ours: ``valid()``;
        another's: its lease has time left on the store's clock (one read). Something that
        is not a holder id (a damaged or old turn record) belongs to no live process."""
        if not is_lease_holder(holder):
            return False
        if holder == self._holder:
            return self.valid()
        if holder in self._given_up:
            return False
        remaining = self._store.lease_remaining(holder)
        return remaining is not None and remaining > 0

    # -- the keeper ------------------------------------------------------------------

    async def keep(self) -> None:
        """Renew every ``ttl/3`` while turns are held; while none are, wait on an event.
        A renewal the store fails (busy) is retried at the next tick; a lost lease moves
        to a new holder. Returns after ``close()`` or once the store is closed; never
        raises a ``StorageError``. Run one per lease, in the runtime's task group."""
        if self._keeping:
            raise UsageError("ProcessLease.keep() is already running: start it once, in the "
                             "runtime's task group")
        self._keeping = True
        try:
            while self._state is _State.OPEN:
                wait = math.inf
                if self._held:
                    wait = self._next - self._clock()
                    if wait <= 0:
                        if not self._tick():
                            return
                        continue
                elif (due := self._next - self._clock()) > 0:
                    # the last turn ended before its renewal came: wait for that time as if
                    # one were held (a turn starting meanwhile needs no wake), idle after
                    wait = due
                wake = self._wake = anyio.Event()
                self._idle = wait == math.inf
                with anyio.move_on_after(wait):
                    await wake.wait()
        finally:
            self._keeping = False
            self._wake = None
            self._idle = False

    def _tick(self) -> bool:
        """One renewal by the keeper; False: the store is closed, nothing left to keep."""
        started = self._clock()
        self._next = started + self._ttl / 3  # the next tick, whatever this one does
        try:
            self._renew()
        except StoreClosedError:
            log.info("lease %s: the store is closed; the keeper stops", self._holder)
            return False
        except StorageError as e:
            log.warning("lease %s: renewal failed, %.1f s left; retrying in %.1f s: %s",
                        self._holder, self._left(), self._ttl / 3, e)
        return True

    # -- renewing --------------------------------------------------------------------

    def _renew(self) -> None:
        """Renew the current holder; one past its deadline, or lost, is given up for a
        new one. Raises the store's ``StorageError`` (then nothing changed but, perhaps,
        the holder)."""
        if self._deadline is not None and self._left() <= 0:
            self._give_up("its deadline passed before it was renewed")
        for _ in range(2):
            started = self._clock()
            if self._store.renew_lease(self._holder, self._ttl):
                self._deadline = started + self._ttl
                self._next = started + self._ttl / 3
                return
            self._give_up("the store says it expired")
        raise StorageError(f"the store refused a new lease holder {self._holder!r} twice; "
                           f"renew_lease() must create an absent lease")

    def _give_up(self, why: str) -> None:
        """Move to a new holder id; the old one is released (best effort) and never live."""
        old = self._holder
        log.warning("lease %s lost (%s): continuing as a new holder; turns recorded under "
                    "it no longer write as owner", old, why)
        self._given_up.add(old)
        self._holder = uuid.uuid4().hex
        self._deadline = None
        try:
            self._store.release_lease(old)  # others see it dead now, not at its expiry
        except StorageError:
            log.info("lease %s: release failed; it expires by itself", old, exc_info=True)

    def _left(self) -> float:
        """Seconds ``valid()`` has left on the local clock (-inf: never taken)."""
        if self._deadline is None:
            return -math.inf
        return self._deadline - self._ttl * SAFETY_MARGIN - self._clock()

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Release the lease (others may recover its turns at once) and stop the keeper.
        A release the store fails is logged: the lease then expires within the ttl."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._poke()
        if self._deadline is None:
            return
        self._deadline = None
        try:
            self._store.release_lease(self._holder)
        except StorageError:
            log.warning("lease %s: release at close failed; it expires within %.1f s",
                        self._holder, self._ttl, exc_info=True)

    def _check_open(self, what: str) -> None:
        if self._state is _State.CLOSED:
            raise ClosedError(f"ProcessLease.{what} after close(): the runtime that owned "
                              f"the lease has closed; a new runtime has its own lease")

    def _poke(self) -> None:
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.set()

    def __repr__(self) -> str:
        state = "closed" if self._state is _State.CLOSED else (
            f"{self._left():.1f} s left" if self._deadline is not None else "not taken")
        return f"ProcessLease({self._holder}, ttl={self._ttl:g}, {self._held} held, {state})"
