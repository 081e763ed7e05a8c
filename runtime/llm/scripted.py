"""``ScriptedModel``: the deterministic backend for tests.

A script is a list of steps, one per model call, consumed in order by ``generate`` and
``stream`` alike. Each step says what that call does::

    model = ScriptedModel([
        "Hello!",                                        # a text reply (end_turn)
        ScriptedModel.tool_call("search", {"q": "cats"}),  # one tool call (tool_use)
        Reply(text="Both:", tool_calls=[call("a"), call("b")]),
        LLMError("overloaded", fault=Fault.TRANSIENT, provider="scripted", status=529),
        [TextDelta(index=0, text="hi"), Stop(stop_reason=StopReason.END_TURN)],  # verbatim
        delayed(0.5, "late"),                            # any step, after a pause
    ])

Every request is recorded in ``model.requests``; a call past the end of the script fails with a
terminal ``LLMError``; ``assert_complete()`` checks that the whole script was used.

The model stands for a provider, and providers keep to a request's ``tool_choice``: a
scripted reply (text, ``Reply`` or ``Response``) that contradicts it (a call under ``none``,
no call under ``required``, another tool than the one named) fails that call with a terminal
``LLMError`` saying so, rather than let a test pass on a reply no provider would send.
``ScriptedModel(..., check_tool_choice=False)`` plays a model that ignores the choice (a
small local one, say); a verbatim list of events is never checked.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import anyio

from .errors import Fault, LLMError
from .events import Assembler, StreamEvent, TextDelta, ToolCallDelta, response_events
from .safety import supported_image_media_type
from .types import (
    ImageBlock,
    Message,
    Request,
    Response,
    Role,
    StopReason,
    TextBlock,
    ToolUse,
    Usage,
)


def call(name: str, input: Mapping[str, Any] | None = None, *, id: str = "") -> ToolUse:
    """A tool call for a ``Reply``. Without an ``id`` the model assigns a deterministic one
    (``call_<step>_<n>``), so tests need not invent ids they never look at."""
    return ToolUse(id=id, name=name, input=dict(input or {}))


@dataclass(frozen=True)
class Reply:
    """An assistant turn described by its parts; ``stop_reason`` defaults to ``tool_use``
    when there are tool calls and ``end_turn`` otherwise."""

    text: str = ""
    tool_calls: Sequence[ToolUse] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: StopReason | None = None


@dataclass(frozen=True)
class Pause:
    """Inside a streamed step: wait ``seconds`` (cancellably) before the next item."""

    seconds: float


@dataclass(frozen=True)
class Delayed:
    """Any step, played after ``seconds`` of (cancellable) delay."""

    seconds: float
    step: Step


def delayed(seconds: float, step: Step) -> Delayed:
    """``step`` after a pause: for timeouts, cancellation and concurrency tests."""
    return Delayed(seconds, step)


StreamItem: TypeAlias = StreamEvent | Pause | BaseException
"""An item of a streamed step: an event to yield, a pause, or an exception to raise there."""

Step: TypeAlias = Response | Reply | str | BaseException | Sequence[StreamItem] | Delayed


class ScriptedModel:
    """A ``Model`` that answers from a script; see the module docstring for the step kinds.

    Safe for concurrent use: each call takes the next step atomically when it starts.
    """

    def __init__(
        self, steps: Iterable[Step] = (), *, name: str = "scripted", provider: str = "scripted",
        check_tool_choice: bool = True,
    ) -> None:
        self._name = name
        self._provider = provider
        self._check_choice = check_tool_choice
        self._steps: list[Step] = list(steps)
        self._next = 0
        self._lock = threading.Lock()
        self.requests: list[Request] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def provider(self) -> str:
        return self._provider

    def __repr__(self) -> str:
        return f"ScriptedModel(name={self._name!r}, steps={len(self._steps)}, used={self._next})"

    # -- building scripts ---------------------------------------------------------------

    @staticmethod
    def tool_call(
        name: str, input: Mapping[str, Any] | None = None, id: str | None = None
    ) -> Reply:
        """A reply that makes exactly one tool call."""
        return Reply(tool_calls=[call(name, input, id=id or "")])

    def add(self, *steps: Step) -> None:
        """Append steps to the script (the scripted backend queues replies this way)."""
        with self._lock:
            self._steps.extend(steps)

    @property
    def remaining(self) -> int:
        """Steps not yet used."""
        with self._lock:
            return len(self._steps) - self._next

    def assert_complete(self) -> None:
        """Fail the test if some scripted steps were never asked for."""
        left = self.remaining
        if left:
            raise AssertionError(
                f"{left} scripted step{'s' if left != 1 else ''} unused "
                f"({self._next} of {len(self._steps)} played)"
            )

    # -- the Model protocol -------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        number, step = self._take(request)
        step = await self._wait(step)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Response | Reply | str):
            response = self._reply(request, step, number)
            if isinstance(step, Response):
                return response
            step = response
        asm = Assembler(self._provider)
        async for event in self._play(step, number):
            asm.feed(event)
        return asm.response()

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        number, step = self._take(request)
        step = await self._wait(step)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Response | Reply | str):
            step = self._reply(request, step, number)
        async for event in self._play(step, number):
            yield event

    # -- internals ----------------------------------------------------------------------

    def _take(self, request: Request) -> tuple[int, Step]:
        self._check(request)
        with self._lock:
            self.requests.append(request)
            number = len(self.requests)
            if self._next >= len(self._steps):
                raise LLMError(
                    f"script exhausted after {len(self._steps)} calls: call {number} "
                    "has no scripted step",
                    fault=Fault.TERMINAL,
                    provider=self._provider,
                )
            step = self._steps[self._next]
            self._next += 1
        return number, step

    def _check(self, request: Request) -> None:
        """Refuse what every adapter refuses before sending: an image no backend accepts."""
        for m in request.messages:
            for b in m.blocks:
                if isinstance(b, ImageBlock) and not supported_image_media_type(b.media_type):
                    raise LLMError(
                        f"unsupported image media type {b.media_type!r}: "
                        "use image/png, image/jpeg, image/gif or image/webp",
                        fault=Fault.TERMINAL,
                        provider=self._provider,
                    )

    @staticmethod
    async def _wait(step: Step) -> Step:
        while isinstance(step, Delayed):
            await anyio.sleep(step.seconds)
            step = step.step
        return step

    def _reply(self, request: Request, step: Response | Reply | str, number: int) -> Response:
        """The reply of a step, refused if it contradicts the request's ``tool_choice``."""
        response = self._response(step, number)
        choice = request.tool_choice
        if self._check_choice and choice.mode != "auto" and (
                why := choice.honoured_by(response.message)):
            raise LLMError(
                f"scripted reply {number} contradicts the request's tool_choice: {why}, which "
                "no provider would send (script a reply that keeps to it, or pass "
                "ScriptedModel(..., check_tool_choice=False) to play a model that ignores it)",
                fault=Fault.TERMINAL,
                provider=self._provider,
            )
        return response

    def _response(self, step: Response | Reply | str, number: int) -> Response:
        if isinstance(step, Response):
            return step
        reply = Reply(text=step) if isinstance(step, str) else step
        calls = [
            c if c.id else c.model_copy(update={"id": f"call_{number}_{k}"})
            for k, c in enumerate(reply.tool_calls, 1)
        ]
        blocks = ((TextBlock(text=reply.text),) if reply.text or not calls else ()) + tuple(calls)
        stop = reply.stop_reason or (StopReason.TOOL_USE if calls else StopReason.END_TURN)
        return Response(
            message=Message(role=Role.ASSISTANT, blocks=blocks),
            stop_reason=stop,
            usage=reply.usage,
            model=self._name,
        )

    async def _play(self, step: Step, number: int) -> AsyncIterator[StreamEvent]:
        if isinstance(step, Response | Reply | str):
            for event in _chunked(response_events(self._response(step, number))):
                yield event
            return
        if isinstance(step, Delayed | BaseException):  # only reachable nested in a sequence
            raise TypeError(f"step {number}: {type(step).__name__} inside a streamed step")
        for item in step:
            if isinstance(item, Pause):
                await anyio.sleep(item.seconds)
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item


def _split(s: str, parts: int = 3) -> list[str]:
    """``s`` cut into at most ``parts`` non-empty pieces (one piece if it is short)."""
    if len(s) < parts:
        return [s]
    size = -(-len(s) // parts)
    return [s[i : i + size] for i in range(0, len(s), size)]


def _chunked(events: list[StreamEvent]) -> list[StreamEvent]:
    """Split text and argument deltas the way a real stream does, so consumers that only
    handle one delta per block are caught; the concatenation is unchanged."""
    out: list[StreamEvent] = []
    for e in events:
        if isinstance(e, TextDelta):
            out.extend(TextDelta(index=e.index, text=t) for t in _split(e.text))
        elif isinstance(e, ToolCallDelta):
            out.extend(ToolCallDelta(index=e.index, arguments=a) for a in _split(e.arguments, 2))
        else:
            out.append(e)
    return out
