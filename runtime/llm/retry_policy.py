"""The retry policy and the loop that applies it: exponential backoff with jitter, honouring
``Retry-After``.

Only transient faults are retried, within a bounded number of attempts and a bounded total
time. A stream is retried only if it failed before delivering any event: output the caller
has already seen is never replayed.

``max_elapsed`` is the call's wall-clock deadline: all attempts and the waits between them
end by then. It is an anyio cancel scope around every await of the loop (an attempt, each
event of a stream, each wait), never open across a ``yield``, so it cuts an attempt that is
running (a stream that keeps delivering) as surely as a wait that would cross it, which is
not even started. Passing it fails the call with a transient ``LLMError`` that names the
deadline and how to raise it.

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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC
from typing import TypeVar

import anyio

from .errors import Fault, LLMError
from .limits import DEFAULT_CALL_TIMEOUT

T = TypeVar("T")

LOGGER = logging.getLogger("celldialog.llm.retry")

MAX_RETRY_AFTER = 86_400.0
"""The largest ``Retry-After`` the port reads (one day); a larger one (a date in the year
9999, ``1e12``) is read as this. ``RetryPolicy.max_delay`` caps the wait much lower anyway."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. ``max_attempts`` counts the first try; ``max_elapsed`` is the call's
    wall-clock deadline in seconds, all attempts and waits included: it cuts a running
    attempt, and a wait that would cross it is not started (module doc).

    ``clock`` is what decides whether a wait would cross ``max_elapsed`` (the cut itself is
    a cancel scope, on the event loop's clock); ``sleep`` is how the loop waits. Tests pass
    their own for both."""

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_elapsed: float = DEFAULT_CALL_TIMEOUT
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


class CallDeadline:
    """The wall-clock deadline of one call under ``policy`` (module doc): ``at`` is a time on
    anyio's clock; ``passed`` says whether it ended the call."""

    __slots__ = ("_policy", "_provider", "at", "passed")

    def __init__(self, policy: RetryPolicy, provider: str) -> None:
        self._policy = policy
        self._provider = provider
        self.at = anyio.current_time() + policy.max_elapsed
        self.passed = False

    @contextmanager
    def within(self) -> Iterator[None]:
        """Run the block under the deadline; raises the deadline's ``LLMError`` if it cuts
        the block short."""
        with anyio.CancelScope(deadline=self.at) as scope:
            yield
        if scope.cancelled_caught:
            raise self.expired()

    def check(self) -> None:
        """Raise the deadline's ``LLMError`` if it has passed: before each event of a
        stream, which may come without any wait the cancel scope could cut."""
        if anyio.current_time() >= self.at:
            raise self.expired()

    def expired(self) -> LLMError:
        """The error that ends the call at its deadline (and ``passed`` set): for a stream
        that bounds its own waits by ``at`` to raise when one of them runs out."""
        self.passed = True
        seconds = self._policy.max_elapsed
        return LLMError(
            f"the call passed its deadline of {seconds:g} s (wall-clock, every attempt and "
            "the waits between them); raise it with retry=RetryPolicy(max_elapsed=seconds)",
            fault=Fault.TRANSIENT, provider=self._provider,
        )

    def give_up(self, attempt: int, error: LLMError) -> None:
        """Log the attempt the deadline ended and count the attempts on its error."""
        _log(self._policy, attempt, error, None, "the call's deadline (max_elapsed) passed")
        error.attempts = attempt


async def retry_call(
    call: Callable[[], Awaitable[T]], policy: RetryPolicy, *, provider: str = "model"
) -> T:
    """Run ``call`` until it succeeds, a terminal fault occurs, or the policy's bounds run
    out; ``provider`` names who failed when the deadline ends the call."""
    deadline = CallDeadline(policy, provider)
    started = policy.clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            with deadline.within():
                return await call()
        except LLMError as e:
            if deadline.passed:
                deadline.give_up(attempt, e)
                raise
            wait = _give_up(policy, attempt, started, e)
            if wait is None:
                raise
        try:
            with deadline.within():
                await policy.sleep(wait)
        except LLMError as e:
            deadline.give_up(attempt, e)
            raise


async def retry_stream(
    open_stream: Callable[[], AsyncIterator[T]],
    policy: RetryPolicy,
    *,
    provider: str = "model",
    deadline: CallDeadline | None = None,
) -> AsyncGenerator[T, None]:
    """Yield from ``open_stream()``, reopening it after a transient fault that struck before
    the first event. After output has been delivered a fault propagates as is.

    The call's deadline is wall-clock: each wait for the next event runs under it, and an
    event that arrives after it (the consumer's own time counts) ends the call instead. A
    caller whose streams already hold every wait to the deadline passes it as ``deadline``
    (``CallDeadline(policy, provider)``, raising ``deadline.expired()`` when a wait runs
    out), which spares a cancel scope per event: the HTTP adapters, whose every network
    read runs in one.

    Closing this generator (a consumer that stops early, a cancelled scope) closes the
    stream it is reading at once, so the provider's HTTP response is released before
    ``aclose()`` returns rather than whenever the garbage collector finalises it."""
    bounded = deadline is not None
    deadline = deadline or CallDeadline(policy, provider)
    started = policy.clock()
    attempt = 0
    while True:
        attempt += 1
        delivered = False
        try:
            stream = open_stream()
            closing = aclosing(stream) if isinstance(stream, AsyncGenerator) else nullcontext()
            async with closing:
                events = aiter(stream)
                while True:
                    with nullcontext() if bounded else deadline.within():  # not across yield
                        try:
                            item = await anext(events)
                        except StopAsyncIteration:
                            return
                    deadline.check()
                    delivered = True
                    yield item
        except LLMError as e:
            if deadline.passed:
                deadline.give_up(attempt, e)
                raise
            wait = _give_up(policy, attempt, started, e, delivered)
            if wait is None:
                raise
        try:
            with deadline.within():
                await policy.sleep(wait)
        except LLMError as e:
            deadline.give_up(attempt, e)
            raise
