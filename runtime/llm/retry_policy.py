"""The retry policy and the loop that applies it: exponential backoff with jitter, honouring
``Retry-After``.

Only transient faults are retried, within a bounded number of attempts and a bounded total
time. A stream is retried only if it failed before delivering any event: output the caller
has already seen is never replayed.

Every failed attempt is logged, once, on the ``celldialog.llm.retry`` logger (``LOGGER``):
WARNING when another attempt follows (with the wait before it), INFO when it was the last
(with why: a terminal fault, the attempts or the time budget used up, output already
delivered). Each record carries ``provider``, ``status``, ``fault``, ``attempt``,
``max_attempts`` and ``delay`` (None on the last) as attributes, for filters and structured
handlers. The error finally raised has ``attempts`` set to the number of attempts made.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, nullcontext
from dataclasses import dataclass, field
from datetime import UTC
from typing import TypeVar

import anyio

from .errors import LLMError

T = TypeVar("T")

LOGGER = logging.getLogger("celldialog.llm.retry")

MAX_RETRY_AFTER = 86_400.0
"""The largest ``Retry-After`` the port reads (one day); a larger one (a date in the year
9999, ``1e12``) is read as this. ``RetryPolicy.max_delay`` caps the wait much lower anyway."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. ``max_attempts`` counts the first try; ``max_elapsed`` bounds the
    total seconds spent including waits (a wait that would cross it is not started).

    ``clock`` is the clock the port measures time with: ``max_elapsed`` across attempts,
    and an adapter's ``timeout`` within one attempt. ``sleep`` is how it waits."""

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_elapsed: float = 60.0
    jitter: float = 0.25
    sleep: Callable[[float], Awaitable[None]] = field(default=anyio.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def delay(self, attempt: int, error: LLMError) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): the server's
        ``retry_after`` when it sent a usable one (clamped to ``[0, max_delay]``), else
        exponential backoff with jitter. A hint that is not a finite number is ignored."""
        hint = error.retry_after
        if hint is not None and isinstance(hint, int | float) and math.isfinite(hint):
            return min(max(float(hint), 0.0), self.max_delay)
        d = min(self.base_delay * (2 ** (attempt - 1)), self.max_delay)
        return d * (1 + random.uniform(-self.jitter, self.jitter))


NO_RETRY = RetryPolicy(max_attempts=1)

_SECONDS = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) as seconds from now, or None.

    Defensive, as the header comes from whoever answers: a number of seconds is digits with
    an optional fraction (``nan``, ``inf``, ``1e3``, ``1_000`` and other garbage are None,
    i.e. ignored: the policy's own backoff applies); a negative number or a past date is 0;
    anything above ``MAX_RETRY_AFTER`` is ``MAX_RETRY_AFTER``. Never raises."""
    if not value or not isinstance(value, str):
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        return _clamp(float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:  # "-0000": UTC, by RFC 5322
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return _clamp(seconds)


def parse_retry_after_ms(value: str | None) -> float | None:
    """A ``retry-after-ms`` header (OpenAI's, milliseconds) as seconds, by the same rules."""
    if not value or not isinstance(value, str) or not _SECONDS.fullmatch(value.strip()):
        return None
    return _clamp(float(value.strip()) / 1000)


def _clamp(seconds: float) -> float | None:
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _give_up(
    policy: RetryPolicy, attempt: int, started: float, error: LLMError, delivered: bool = False
) -> float | None:
    """The wait before the next attempt, or None when the error must propagate. Logs the
    failed attempt either way and records ``attempts`` on the error."""
    reason = None
    wait = None
    if delivered:
        reason = "output already delivered, not replayed"
    elif not error.transient:
        reason = "terminal fault, not retried"
    elif attempt >= policy.max_attempts:
        reason = "no attempts left"
    else:
        wait = policy.delay(attempt, error)
        if policy.clock() - started + wait > policy.max_elapsed:
            reason = f"waiting {wait:.2f} s would cross max_elapsed ({policy.max_elapsed:g} s)"
            wait = None
    _log(policy, attempt, error, wait, reason)
    if wait is None:
        error.attempts = attempt
    return wait


def _log(
    policy: RetryPolicy, attempt: int, error: LLMError, wait: float | None, reason: str | None
) -> None:
    where = f"{error.provider} {error.status}" if error.status is not None else error.provider
    extra = {
        "provider": error.provider,
        "status": error.status,
        "fault": error.fault.value,
        "attempt": attempt,
        "max_attempts": policy.max_attempts,
        "delay": wait,
    }
    head = "%s: attempt %d of %d failed (%s: %s)"
    args = (where, attempt, policy.max_attempts, error.fault.value, error.message)
    if wait is not None:
        LOGGER.warning(head + "; retrying in %.2f s", *args, wait, extra=extra)
    else:
        LOGGER.info(head + "; giving up: %s", *args, reason, extra=extra)


async def retry_call(call: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Run ``call`` until it succeeds, a terminal fault occurs, or the policy's bounds run out."""
    started = policy.clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except LLMError as e:
            wait = _give_up(policy, attempt, started, e)
            if wait is None:
                raise
        await policy.sleep(wait)


async def retry_stream(
    open_stream: Callable[[], AsyncIterator[T]], policy: RetryPolicy
) -> AsyncGenerator[T, None]:
    """Yield from ``open_stream()``, reopening it after a transient fault that struck before
    the first event. After output has been delivered a fault propagates as is.

    Closing this generator (a consumer that stops early, a cancelled scope) closes the
    stream it is reading at once, so the provider's HTTP response is released before
    ``aclose()`` returns rather than whenever the garbage collector finalises it."""
    started = policy.clock()
    attempt = 0
    while True:
        attempt += 1
        delivered = False
        try:
            stream = open_stream()
            closing = aclosing(stream) if isinstance(stream, AsyncGenerator) else nullcontext()
            async with closing:
                async for item in stream:
                    delivered = True
                    yield item
            return
        except LLMError as e:
            wait = _give_up(policy, attempt, started, e, delivered)
            if wait is None:
                raise
        await policy.sleep(wait)
