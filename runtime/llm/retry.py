"""The shared retry layer: exponential backoff with jitter, honouring ``Retry-After``.

Only transient faults are retried, within a bounded number of attempts and a bounded total
time. A stream is retried only if it failed before delivering any event: output the caller
has already seen is never replayed.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

from .errors import LLMError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. ``max_attempts`` counts the first try; ``max_elapsed`` bounds the
    total seconds spent including waits (a wait that would cross it is not started)."""

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_elapsed: float = 60.0
    jitter: float = 0.25
    sleep: Callable[[float], Awaitable[None]] = field(default=anyio.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def delay(self, attempt: int, error: LLMError) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        if error.retry_after is not None:
            return min(max(error.retry_after, 0.0), self.max_delay)
        d = min(self.base_delay * (2 ** (attempt - 1)), self.max_delay)
        return d * (1 + random.uniform(-self.jitter, self.jitter))


NO_RETRY = RetryPolicy(max_attempts=1)


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) as seconds from now, or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _give_up(policy: RetryPolicy, attempt: int, started: float, error: LLMError) -> float | None:
    """The wait before the next attempt, or None when the error must propagate."""
    if not error.transient or attempt >= policy.max_attempts:
        return None
    wait = policy.delay(attempt, error)
    if policy.clock() - started + wait > policy.max_elapsed:
        return None
    return wait


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
            wait = None if delivered else _give_up(policy, attempt, started, e)
            if wait is None:
                raise
        await policy.sleep(wait)
