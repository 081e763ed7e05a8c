"""What one user or one session may ask of the server, and the counters that hold them to it.

Every buffer that grows with a client's input has a cap and every rate has a bucket, so one
user's flood costs that user, not the others: a body larger than ``max_body`` is refused
before it is read whole, a session's events beyond its rate are refused (429, with the
seconds until its bucket has a token), a user's connections beyond ``max_connections`` are
refused, and a tab too slow to read its patches
is dropped (it reconnects to a snapshot) instead of holding an ever-growing queue.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .errors import WebConfigError

__all__ = ["ConnectionCounter", "Limits", "RateLimiter"]


@dataclass(frozen=True)
class Limits:
    """The server's limits (``create_app(limits=Limits(...))``).

    - ``max_body``: bytes of one POSTed event (413 past it); a message is at most this.
    - ``events_per_second`` and ``burst``: a session's events, as a token bucket (429).
    - ``max_connections``: open event streams per user, all tabs together (429).
    - ``max_sessions``: sessions one user may make (429 on "New chat" past it).
    - ``max_instances``: sessions kept running in memory; past it, the least recently used
      one that no tab watches and no reply runs in is parked (``Runtime.park``: its
      documents leave memory; asked for again, it comes back from them).
    - ``max_parked``: parked sessions kept findable in memory (a few KiB each); past it,
      the least recently parked is stopped (nothing of it stays in memory on a file or
      server store; asked for again, it runs anew from its documents).
    - ``queue`` and ``queue_bytes``: patches (and their bytes) waiting for one slow tab
      before it is dropped; the bytes bound what a tab that stopped reading can cost.
    - ``connects_per_second``: a user's new event streams (a reconnect storm costs a
      snapshot each), bucket of 20 (429).
    - ``new_users_per_second``: users minted for one client address, bucket of 20 (429):
      identities are free, so their rate is what bounds what anonymous clients make.
    - ``body_seconds``: the time a POSTed body may take to arrive (408 past it).
    - ``coalesce``: seconds over which commits are gathered into one patch (0: none).
    - ``ping``: seconds between keep-alive comments on an idle stream.
    """

    max_body: int = 64 * 1024
    events_per_second: float = 5.0
    burst: int = 20
    max_connections: int = 16
    max_sessions: int = 1000
    max_instances: int = 2000
    max_parked: int = 20_000
    queue: int = 256
    queue_bytes: int = 1024 * 1024
    connects_per_second: float = 2.0
    new_users_per_second: float = 2.0
    body_seconds: float = 10.0
    coalesce: float = 0.03
    ping: float = 15.0

    def __post_init__(self) -> None:
        for name in ("max_body", "burst", "max_connections", "max_sessions", "max_instances",
                     "max_parked", "queue", "queue_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise WebConfigError(f"Limits.{name} must be a positive integer, got {value!r}")
        for name, low, high in (("events_per_second", 0.0, 1e6), ("ping", 0.0, 3600.0),
                                ("coalesce", None, 10.0), ("connects_per_second", 0.0, 1e6),
                                ("new_users_per_second", 0.0, 1e6),
                                ("body_seconds", 0.0, 3600.0)):
            value = getattr(self, name)
            ok = (isinstance(value, int | float) and not isinstance(value, bool)
                  and math.isfinite(value) and value <= high
                  and (value > low if low is not None else value >= 0))
            if not ok:
                floor = "more than 0" if low is not None else "0 or more"
                raise WebConfigError(
                    f"Limits.{name} must be a number {floor}, at most {high:g}, got {value!r}")


class RateLimiter:
    """Token buckets by key: ``rate`` tokens a second, at most ``burst`` saved. Buckets are
    kept for the ``keys`` most recent keys (a full bucket needs no memory: a key not seen
    for ``burst / rate`` seconds starts full again, which dropping it does too)."""

    def __init__(self, rate: float, burst: int, keys: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.keys = keys
        self.clock = clock
        self._buckets: OrderedDict[object, tuple[float, float]] = OrderedDict()

    def take(self, key: object) -> float:
        """Take a token for ``key``: 0.0 if one was there, else the seconds until one is."""
        now = self.clock()
        tokens, then = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.keys:
            self._buckets.popitem(last=False)
        return wait


class ConnectionCounter:
    """Open connections by key, at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[object, int] = {}

    def acquire(self, key: object) -> bool:
        count = self._open.get(key, 0)
        if count >= self.limit:
            return False
        self._open[key] = count + 1
        return True

    def release(self, key: object) -> None:
        count = self._open.get(key, 0) - 1
        if count > 0:
            self._open[key] = count
        else:
            self._open.pop(key, None)

    def count(self, key: object) -> int:
        return self._open.get(key, 0)
