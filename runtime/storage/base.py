"""The storage port: documents by key, committed atomically, with versions; and leases.

Versions make optimistic concurrency possible: a write may name the version it read, and
the commit fails with ``ConflictError`` if another writer got there first. Several runtimes
(processes) sharing one SQLite file rely on it today; a PostgreSQL backend will too.

Leases say which processes are alive. A runtime that owns turns (a dialog's model call)
holds a lease under a holder id it chose, with a short time to live, and renews it while it
owns turns (``runtime.cells.lease.ProcessLease``). A turn records its owner's holder id;
another process may take the turn over only once that holder's lease has expired. Liveness
is then a property of the process, not of how recently a turn happened to write: a live
owner silent in a long model call keeps its turn, a killed one loses it within the TTL.
Every store implements the same contract:

- ``renew_lease(holder, ttl) -> bool``, one atomic step: a holder with no lease gets one
  expiring ``ttl`` seconds from now (True); an unexpired lease's expiry becomes now + ``ttl``
  (True; a shorter ``ttl`` shortens it); an expired one is left as it is and the answer is
  False: the lease was lost. An expired lease is never revived by renewing it: others may
  already have taken over its turns, so its holder must stop acting as owner and start again
  under a new id.
- ``lease_remaining(holder) -> float | None``: seconds until it expires, on the store's
  clock; zero or less once expired; None when there is no such lease (never taken,
  released, or expired and collected). A read: it writes nothing.
- ``release_lease(holder) -> None``: drop it (no lease: nothing happens), so other
  processes may recover its turns at once instead of after the TTL. A clean shutdown does it.
- Collection: a store may forget a lease ``LEASE_COLLECT_AFTER`` seconds after it expired,
  not sooner (until then renewing it answers False). Callers never renew a holder once
  their own deadline for it has passed (``ProcessLease``: the start of its last successful
  renewal + ttl, on its monotonic clock, which is never later than the store's), so a
  collected holder is never brought back.
- The clock is the store's, the one every holder sharing it reads: memory, this process's
  ``time.monotonic()`` (the store is the process); SQLite, the host's ``time.time()``, which
  every process on the host shares (a step of the host's wall clock moves every lease by as
  much); PostgreSQL, the server's clock (``clock_timestamp()``), whichever host asks.
- Cost: a lease is written only when renewed or released (``ProcessLease``: every ttl/3
  while it owns turns, nothing while idle); document commits never touch it.
- Input: a holder is 1 to ``LEASE_HOLDER_MAX`` of ``A-Z a-z 0-9 - _ .`` (a uuid4 hex is
  what ``ProcessLease`` uses), a ttl a number of seconds in (0, ``LEASE_TTL_MAX``]; anything
  else raises ``StoreConfigError`` naming it, before the store is touched.

Every error a store raises is a ``StorageError`` (``runtime.errors``): ``ConflictError``
(re-read and retry), ``StoreBusyError`` (locked longer than the backend waits),
``StoreConfigError`` (an argument it cannot use), ``StoreClosedError`` (used after
``close()``); a driver's own errors never escape bare.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol, TypeGuard

from ..errors import ConflictError, StorageError, StoreBusyError, StoreClosedError, StoreConfigError

__all__ = [
    "LEASE_COLLECT_AFTER",
    "LEASE_HOLDER_MAX",
    "LEASE_TTL_MAX",
    "ConflictError",
    "DocKey",
    "StorageError",
    "Store",
    "StoreBusyError",
    "StoreClosedError",
    "Stored",
    "Write",
    "check_lease_holder",
    "check_lease_ttl",
    "is_lease_holder",
]

LEASE_HOLDER_MAX = 128  # characters of a holder id (a uuid4 hex has 32)
# a lease is a liveness signal: one that lasts longer than an hour would keep a dead
# process's turns for longer than anyone waits for them
LEASE_TTL_MAX = 3600.0
LEASE_COLLECT_AFTER = 3600.0  # seconds after expiry before a store may forget a lease
_HOLDER = re.compile(r"[A-Za-z0-9_.\-]+", re.ASCII)


class DocKey(NamedTuple):
    """Where a document lives: its space, its scope key ("" shared, "user:<u>",
    "session:<s>") and its cause-derived id."""

    space: str
    scope: str
    id: str


class Stored(NamedTuple):
    value: Any
    version: int


Path = tuple[str | int, ...]


class _WriteFields(NamedTuple):
    key: DocKey
    value: Any
    expect: int | None
    patch: tuple[tuple[Path, Any], ...] | None
    checked: bool


class Write(_WriteFields):
    """One document's change in a commit (immutable).

    ``expect`` is the version the change was based on: ``None`` writes unconditionally, ``0``
    creates the document only if it does not exist yet, ``n`` requires version ``n``.

    ``patch``, when given, is the same change as a sequence of ``(path, value)``
    assignments to the document at version ``expect`` (parents exist; a list index equal to
    the length appends; the empty path replaces the whole value). A store may persist the
    patch instead of the whole value, so a write costs what it changes, not the size of the
    document. A patch needs ``expect`` (it applies to a known version) and ``value`` is then
    ignored (pass ``None``). Stores never keep a reference to a value handed to them, nor
    hand out one they keep: the runtime changes its own copy in place after a commit.

    ``checked``: the caller has applied ``patch`` to its own copy of version ``expect``
    (every path exists there), as the runtime does with each write it commits. A store
    may then skip checking the paths again, and need not keep a value of its own to check
    them against. Its values are plain JSON the caller made (dicts with text keys, lists,
    text without lone surrogates, numbers, booleans, None), so a store may encode them
    without asking whether they are JSON at all. A checked patch whose paths do not exist,
    or whose values are anything else, is the caller's bug: the store may persist it.
    Unchecked patches (the default) are always checked.
    """

    # A named tuple: a commit makes one per document it writes, and a frozen dataclass
    # costs twice as much to make. Immutable all the same (and equal to a plain tuple of
    # the same five fields, as named tuples are).
    __slots__ = ()

    def __new__(cls, key: DocKey, value: Any, expect: int | None = None,
                patch: tuple[tuple[Path, Any], ...] | None = None,
                checked: bool = False) -> Write:
        if patch is not None and expect is None:
            raise StoreConfigError(
                f"Write.patch needs expect: a patch applies to a known version of "
                f"{key}; pass expect=<the version the patch was computed from> "
                f"(0 for a new document), or write the whole value without a patch"
            )
        return tuple.__new__(cls, (key, value, expect, patch, checked))

    def _replace(self, **changes: Any) -> Write:
        """A copy with ``changes``, checked as a new ``Write`` is."""
        return Write(**{**self._asdict(), **changes})

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Write:
        return cls(*iterable)


class Store(Protocol):
    """Documents (``load``, ``commit``, ``keys``) and leases (the module's docstring has
    the lease contract); every backend passes ``tests/storage/test_conformance.py``."""

    def load(self, key: DocKey) -> Stored | None: ...

    def commit(self, writes: Sequence[Write]) -> dict[DocKey, int]:
        """Apply every write or none; return the new version of each written key."""
        ...

    def keys(self, space: str) -> Iterable[DocKey]: ...

    def renew_lease(self, holder: str, ttl: float) -> bool:
        """Atomically: create the holder's lease (expiring ``ttl`` s from now) or extend an
        unexpired one to now + ``ttl``: True. An expired lease stays expired: False (lost)."""
        ...

    def lease_remaining(self, holder: str) -> float | None:
        """Seconds left on the store's clock (<= 0: expired); None: no such lease."""
        ...

    def release_lease(self, holder: str) -> None:
        """Drop the lease (none: nothing happens); others may take over its turns at once."""
        ...

    def close(self) -> None: ...


def is_lease_holder(value: object) -> TypeGuard[str]:
    """Is ``value`` a holder id a lease can have? (A turn record's holder is data: one that
    is not cannot belong to a live process.)"""
    return (isinstance(value, str) and 0 < len(value) <= LEASE_HOLDER_MAX
            and _HOLDER.fullmatch(value) is not None)


def check_lease_holder(holder: object, what: str) -> None:
    """Raise ``StoreConfigError`` naming what is wrong with ``holder`` (never quoting more
    than a few characters of it: it may be a megabyte)."""
    if is_lease_holder(holder):
        return
    rule = (f"a lease holder is 1 to {LEASE_HOLDER_MAX} of the characters A-Z a-z 0-9 - _ . "
            f"(ProcessLease uses a uuid4 hex)")
    if not isinstance(holder, str):
        raise StoreConfigError(f"{what}: {rule}; got {type(holder).__name__} "
                               f"{_preview(holder)}")
    if not holder:
        raise StoreConfigError(f"{what}: {rule}; got an empty string")
    if len(holder) > LEASE_HOLDER_MAX:
        raise StoreConfigError(f"{what}: {rule}; got {len(holder)} characters: "
                               f"{_preview(holder)}")
    at = next(i for i, c in enumerate(holder) if _HOLDER.fullmatch(c) is None)
    raise StoreConfigError(f"{what}: {rule}; got {_preview(holder)}, where {holder[at]!r} "
                           f"(at index {at}) is not allowed")


def check_lease_ttl(ttl: object, what: str) -> None:
    """Raise ``StoreConfigError`` unless ``ttl`` is seconds in (0, ``LEASE_TTL_MAX``]."""
    if (isinstance(ttl, int | float) and not isinstance(ttl, bool)
            and math.isfinite(ttl) and 0 < ttl <= LEASE_TTL_MAX):
        return
    raise StoreConfigError(
        f"{what}: ttl is the lease's seconds to live, a finite number > 0 and <= "
        f"{LEASE_TTL_MAX:g}; got {type(ttl).__name__} {_preview(ttl)}")


def _preview(value: object) -> str:
    return _SHORT.repr(value)  # bounded: a megabyte of input is not quoted back


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 40
