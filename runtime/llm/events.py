"""Streaming events and the assembler that turns them into the ``Response`` ``generate`` gives.

Block positions are ``index`` values: each block of the final message is announced by its
first event at a fresh index, and the assembled message keeps blocks in index order. A
backend's ``stream`` must assemble to exactly what its ``generate`` returns for the same reply.

Events come from a model, so what they carry is provider text: the assembler replaces any
lone surrogate in it by U+FFFD (``runtime._text.scrub``) as it builds the vocabulary, which
refuses such text. The adapters already scrub what they decode; this covers any other model.

The assembler is the one place every model's reply passes (the step engine streams each
reply through one, ``ScriptedModel.generate`` too), so the rules on a reply's shape that hold
for any model are kept here: a tool name longer than ``MAX_TOOL_NAME_CHARS`` fails the reply
as its start arrives, and arguments nested too deeply to parse (``RecursionError``) are a
malformed reply; both terminal, as the same model would send the same again. How many
characters a reply may hold in all is the adapters' cap (``ReplyLimits.reply_chars``, set
per adapter); the ids a reply's calls carry are the step engine's to make unique and
replayable (``CallIds``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Callable
from typing import Annotated, Any, Literal

from pydantic import Field

from .._text import scrub, scrub_text
from ._json import decode as decode_json
from .errors import Fault, LLMError
from .limits import MAX_TOOL_NAME_CHARS
from .types import (
    Block,
    Message,
    OpaqueBlock,
    Response,
    Role,
    StopReason,
    TextBlock,
    ToolUse,
    Usage,
    _Value,
    made,
)


class TextDelta(_Value):
    type: Literal["text_delta"] = "text_delta"
    index: int
    text: str


class ToolCallStart(_Value):
    type: Literal["tool_call_start"] = "tool_call_start"
    index: int
    id: str
    name: str


class ToolCallDelta(_Value):
    """A fragment of the call's arguments as JSON text; fragments concatenate."""

    type: Literal["tool_call_delta"] = "tool_call_delta"
    index: int
    arguments: str


class ToolCallEnd(_Value):
    type: Literal["tool_call_end"] = "tool_call_end"
    index: int


class OpaqueDone(_Value):
    """A complete provider-verbatim block (e.g. thinking with its signature)."""

    type: Literal["opaque"] = "opaque"
    index: int
    block: OpaqueBlock


class UsageUpdate(_Value):
    """Usage so far; a later update replaces an earlier one."""

    type: Literal["usage"] = "usage"
    usage: Usage


class Stop(_Value):
    """The last event of a successful stream."""

    type: Literal["stop"] = "stop"
    stop_reason: StopReason
    model: str = ""


StreamEvent = Annotated[
    TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | OpaqueDone | UsageUpdate | Stop,
    Field(discriminator="type"),
]


_NO_USAGE = Usage()  # immutable: one for every stream that reports none


class Assembler:
    """Folds stream events into a ``Response``; raises ``LLMError`` on an incoherent stream."""

    def __init__(self, provider: str = "stream") -> None:
        self._provider = provider
        self._texts: dict[int, list[str]] = {}
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self._opaque: dict[int, OpaqueBlock] = {}
        self._usage = _NO_USAGE
        self._stop: Stop | None = None

    def _bad(self, what: str) -> LLMError:
        return LLMError(f"malformed stream: {what}", fault=Fault.TRANSIENT, provider=self._provider)

    def feed(self, event: TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | OpaqueDone
             | UsageUpdate | Stop) -> None:
        if self._stop is not None:
            raise self._bad(f"event {event.type!r} after stop")
        feed = _FEED.get(type(event))  # one lookup, not a class test per kind
        if feed is None:  # a subclass of an event type (an adapter's own)
            feed = next((f for kind, f in _FEED.items() if isinstance(event, kind)), None)
            if feed is None:
                return  # not an event: nothing to fold
        feed(self, event)

    def _text(self, event: TextDelta) -> None:
        self._texts.setdefault(event.index, []).append(event.text)

    def _start(self, event: ToolCallStart) -> None:
        name = event.name
        if len(name) > MAX_TOOL_NAME_CHARS:
            raise tool_name_too_long(name, self._provider)
        self._calls[event.index] = (event.id, name, [])

    def _arguments(self, event: ToolCallDelta) -> None:
        call = self._calls.get(event.index)
        if call is None:
            raise self._bad(f"arguments for tool call {event.index} before its start")
        call[2].append(event.arguments)

    def _end(self, event: ToolCallEnd) -> None:
        if event.index not in self._calls:
            raise self._bad(f"end of tool call {event.index} before its start")

    def _opaque_done(self, event: OpaqueDone) -> None:
        self._opaque[event.index] = event.block

    def _usage_update(self, event: UsageUpdate) -> None:
        self._usage = event.usage

    def _stopped(self, event: Stop) -> None:
        self._stop = event

    def response(self) -> Response:
        if self._stop is None:
            raise self._bad("ended without a stop event")
        blocks: dict[int, Block] = {}
        for i, parts in self._texts.items():
            blocks[i] = made(TextBlock, kind="text", text=scrub_text("".join(parts)))
        for i, (cid, name, parts) in self._calls.items():
            raw = "".join(parts).strip() or "{}"
            name = scrub_text(name)
            # The call is named by its place, not by the name the provider chose: this runs
            # after the adapter, whose errors are redacted of its key, and a server echoing
            # the key as a tool name must not get it into an error here either.
            which = f"tool call {len(blocks) + 1} (a {len(name)}-character name)"
            try:
                args = decode_json(raw)  # NaN, Infinity, 1e999 are refused: not JSON
                if not isinstance(args, dict):
                    raise self._bad(f"{which}: its arguments are not a JSON object")
                # JSON text that is ASCII without a \u escape cannot decode to a surrogate
                if not raw.isascii() or "\\u" in raw:
                    args = scrub(args)
                # made, not validated again: the id and name are scrubbed strings, the
                # arguments a JSON object freshly decoded (refusing what is not JSON) and
                # scrubbed, so what the constructor would check (Unicode text, a JSON
                # object) holds already; its copy of the arguments would be the only one
                blocks[i] = made(ToolUse, kind="tool_use", id=scrub_text(cid), name=name,
                                 input=args)
            except RecursionError:
                raise LLMError(f"malformed reply: {which}: its arguments nest too deeply to "
                               "parse", fault=Fault.TERMINAL, provider=self._provider) from None
            except ValueError as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
                raise self._bad(f"{which}: its arguments are not JSON ({msg})") from None
        blocks.update(self._opaque)
        # every part is a value validated already (the blocks above, the events' fields)
        message = made(Message, role=Role.ASSISTANT,
                       blocks=tuple(blocks[i] for i in sorted(blocks)))
        stop = self._stop
        return made(Response, message=message, stop_reason=stop.stop_reason,
                    usage=self._usage, model=stop.model)


_FEED: dict[type, Callable[[Assembler, Any], None]] = {
    TextDelta: Assembler._text,
    ToolCallStart: Assembler._start,
    ToolCallDelta: Assembler._arguments,
    ToolCallEnd: Assembler._end,
    UsageUpdate: Assembler._usage_update,
    Stop: Assembler._stopped,
    OpaqueDone: Assembler._opaque_done,
}


def tool_name_too_long(name: str, provider: str) -> LLMError:
    """A reply calling a tool by a name past ``MAX_TOOL_NAME_CHARS``: terminal (module doc)."""
    return LLMError(
        f"malformed reply: a tool call's name is {len(name):,} characters long, more than "
        f"the {MAX_TOOL_NAME_CHARS} a tool name may have (the tool name cap; it starts "
        f"{name[:40]!r})", fault=Fault.TERMINAL, provider=provider)


def too_deep(name: str, provider: str) -> LLMError:
    """Tool call arguments nested too deeply to parse: terminal (module doc)."""
    return LLMError(
        f"malformed reply: tool call {name[:200]!r} arguments nest too deeply to parse",
        fault=Fault.TERMINAL, provider=provider)


async def assemble(events: AsyncIterable[StreamEvent], provider: str = "stream") -> Response:
    """Drain a stream into the ``Response`` it describes."""
    asm = Assembler(provider)
    async for event in events:
        asm.feed(event)
    return asm.response()


def response_events(response: Response) -> list[StreamEvent]:
    """The canonical event sequence for a response (used by test doubles and fakes)."""
    out: list[StreamEvent] = []
    for i, block in enumerate(response.message.blocks):
        if isinstance(block, TextBlock):
            out.append(TextDelta(index=i, text=block.text))
        elif isinstance(block, ToolUse):
            out.append(ToolCallStart(index=i, id=block.id, name=block.name))
            out.append(ToolCallDelta(index=i, arguments=json.dumps(block.input)))
            out.append(ToolCallEnd(index=i))
        elif isinstance(block, OpaqueBlock):
            out.append(OpaqueDone(index=i, block=block))
    out.append(UsageUpdate(usage=response.usage))
    out.append(Stop(stop_reason=response.stop_reason, model=response.model))
    return out
