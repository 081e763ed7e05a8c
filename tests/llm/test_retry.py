"""The shared retry layer: backoff and jitter bounds, Retry-After, time and attempt bounds,
terminal faults, and no replay of a stream that already delivered output."""

from __future__ import annotations

import email.utils
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from runtime.llm import (
    NO_RETRY,
    Fault,
    LLMError,
    RetryPolicy,
    parse_retry_after,
    retry_call,
    retry_stream,
)

pytestmark = pytest.mark.anyio


def transient(retry_after: float | None = None) -> LLMError:
    return LLMError("busy", fault=Fault.TRANSIENT, provider="p", status=503,
                    retry_after=retry_after)


TERMINAL = LLMError("bad", fault=Fault.TERMINAL, provider="p", status=400)


class Clock:
    """Virtual time: the policy's sleep advances it instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def policy(clock: Clock, **kw) -> RetryPolicy:
    return RetryPolicy(sleep=clock.sleep, clock=clock, **kw)


class Flaky:
    """A call failing with the given errors in turn, then returning "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


# -- delays --------------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_without_jitter() -> None:
    p = RetryPolicy(base_delay=0.5, max_delay=3.0, jitter=0.0)
    assert [p.delay(n, transient()) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("attempt", [1, 2, 3, 6])
def test_jitter_stays_within_its_range_and_varies(attempt: int) -> None:
    p = RetryPolicy(base_delay=1.0, max_delay=10.0, jitter=0.25)
    nominal = min(2.0 ** (attempt - 1), 10.0)
    samples = [p.delay(attempt, transient()) for _ in range(300)]
    assert all(nominal * 0.75 <= s <= nominal * 1.25 for s in samples)
    assert min(samples) < nominal < max(samples)


@pytest.mark.parametrize(("hint", "want"), [(7.0, 7.0), (0.0, 0.0), (-3.0, 0.0), (500.0, 20.0)])
def test_retry_after_replaces_backoff_and_is_capped(hint: float, want: float) -> None:
    p = RetryPolicy(base_delay=0.5, max_delay=20.0)
    assert p.delay(1, transient(retry_after=hint)) == want
    assert p.delay(4, transient(retry_after=hint)) == want


@pytest.mark.parametrize(
    ("header", "want"),
    [("3", 3.0), ("1.5", 1.5), (" 2 ", 2.0), ("0", 0.0), ("-5", 0.0), ("", None), (None, None),
     ("soon", None), ("Wed, 99 Foo 2015", None)],
)
def test_parse_retry_after_seconds(header: str | None, want: float | None) -> None:
    assert parse_retry_after(header) == want


def test_parse_retry_after_http_date() -> None:
    future = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 27.0 <= parse_retry_after(future) <= 30.5
    past = email.utils.format_datetime(datetime.now(UTC) - timedelta(hours=1), usegmt=True)
    assert parse_retry_after(past) == 0.0


# -- retry_call ----------------------------------------------------------------------------


async def test_transient_faults_are_retried_until_success() -> None:
    clock = Clock()
    call = Flaky(transient(), transient(retry_after=4.0))
    assert await retry_call(call, policy(clock, jitter=0.0, base_delay=1.0)) == "ok"
    assert call.calls == 3 and clock.waits == [1.0, 4.0]


async def test_attempts_are_bounded() -> None:
    clock = Clock()
    last = transient()
    call = Flaky(transient(), transient(), last, transient())
    with pytest.raises(LLMError) as info:
        await retry_call(call, policy(clock, max_attempts=3))
    assert info.value is last and call.calls == 3 and len(clock.waits) == 2


async def test_total_time_is_bounded() -> None:
    clock = Clock()
    call = Flaky(*(transient(retry_after=4.0) for _ in range(10)))
    with pytest.raises(LLMError):
        await retry_call(call, policy(clock, max_attempts=10, max_elapsed=10.0))
    # waits of 4s: after 8s another 4s wait would cross 10s, so it is never started
    assert clock.waits == [4.0, 4.0] and call.calls == 3 and clock.now <= 10.0


async def test_terminal_faults_are_not_retried() -> None:
    clock = Clock()
    call = Flaky(TERMINAL)
    with pytest.raises(LLMError) as info:
        await retry_call(call, policy(clock))
    assert info.value is TERMINAL and call.calls == 1 and clock.waits == []


async def test_other_exceptions_are_not_retried() -> None:
    call = Flaky(ValueError("bug"))
    with pytest.raises(ValueError):
        await retry_call(call, policy(Clock()))
    assert call.calls == 1


async def test_no_retry_policy_tries_once() -> None:
    call = Flaky(transient())
    with pytest.raises(LLMError):
        await retry_call(call, NO_RETRY)
    assert call.calls == 1


async def test_default_policy_really_sleeps_the_retry_after() -> None:
    call = Flaky(transient(retry_after=0.05))
    started = time.monotonic()
    assert await retry_call(call, RetryPolicy()) == "ok"
    assert time.monotonic() - started >= 0.05


# -- retry_stream --------------------------------------------------------------------------


class FlakyStream:
    """Each open yields ``items`` and fails after ``fail_after`` of them with the next error."""

    def __init__(self, items: list[str], *plan: tuple[int, BaseException]) -> None:
        self.items = items
        self.plan = list(plan)
        self.opens = 0

    def __call__(self) -> AsyncIterator[str]:
        self.opens += 1
        plan = self.plan.pop(0) if self.plan else None
        return self._run(plan)

    async def _run(self, plan: tuple[int, BaseException] | None) -> AsyncIterator[str]:
        for i, item in enumerate(self.items):
            if plan and i == plan[0]:
                raise plan[1]
            yield item


async def drain(stream: AsyncIterator[str], into: list[str]) -> None:
    async for item in stream:
        into.append(item)


async def test_a_stream_failing_before_output_is_reopened() -> None:
    clock = Clock()
    opener = FlakyStream(["a", "b"], (0, transient()), (0, transient()))
    got: list[str] = []
    await drain(retry_stream(opener, policy(clock)), got)
    assert got == ["a", "b"] and opener.opens == 3 and len(clock.waits) == 2


async def test_a_stream_that_delivered_output_is_never_replayed() -> None:
    clock = Clock()
    error = transient()
    opener = FlakyStream(["a", "b", "c"], (2, error))
    got: list[str] = []
    with pytest.raises(LLMError) as info:
        await drain(retry_stream(opener, policy(clock)), got)
    assert info.value is error and got == ["a", "b"]
    assert opener.opens == 1 and clock.waits == []


async def test_a_terminal_stream_fault_is_not_retried() -> None:
    opener = FlakyStream(["a"], (0, TERMINAL))
    with pytest.raises(LLMError):
        await drain(retry_stream(opener, policy(Clock())), [])
    assert opener.opens == 1


async def test_stream_attempts_are_bounded() -> None:
    opener = FlakyStream(["a"], *((0, transient()) for _ in range(5)))
    with pytest.raises(LLMError):
        await drain(retry_stream(opener, policy(Clock(), max_attempts=4)), [])
    assert opener.opens == 4


async def test_stopping_early_closes_the_inner_stream_at_once() -> None:
    """A consumer that stops early and closes the retry stream closes the provider's stream
    with it, before ``aclose`` returns (not whenever the garbage collector gets to it), so
    an HTTP response is released deterministically."""
    log: list[str] = []

    async def inner() -> AsyncIterator[str]:
        try:
            yield "a"
            yield "b"
        finally:
            log.append("inner closed")

    stream = retry_stream(inner, policy(Clock()))
    assert await anext(stream) == "a"
    await stream.aclose()
    log.append("outer closed")
    assert log == ["inner closed", "outer closed"]


async def test_an_inner_stream_without_aclose_is_fine() -> None:
    class Plain:  # an AsyncIterator, but no async generator: nothing to close
        def __init__(self) -> None:
            self.items = ["a", "b"]

        def __aiter__(self) -> Plain:
            return self

        async def __anext__(self) -> str:
            if not self.items:
                raise StopAsyncIteration
            return self.items.pop(0)

    stream = retry_stream(Plain, policy(Clock()))
    assert await anext(stream) == "a"
    await stream.aclose()
    got: list[str] = []
    await drain(retry_stream(Plain, policy(Clock())), got)
    assert got == ["a", "b"]
