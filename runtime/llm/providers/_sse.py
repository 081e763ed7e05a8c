"""A minimal Server-Sent Events reader over an httpx streaming response, with bounded buffers.

The decoder is sans-IO (``SSEDecoder.feed(bytes) -> events``); ``iter_sse`` drives it from a
response. Whoever answers decides what a stream holds, so every buffer has a cap: a line
(the bytes since the last line end) longer than ``max_line`` bytes, or an event whose
``data`` grows past ``max_event`` bytes without the blank line that ends it, fails the call
as a malformed reply (``malformed``: terminal, as a server that sends one will again) the
moment the cap is crossed, so at most about one cap plus one network read is ever held.
Without the caps, a 200 streaming bytes with no newline grew a process by a gigabyte in
seconds.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from ..limits import MAX_SSE_EVENT_BYTES, MAX_SSE_LINE_BYTES
from ._http import malformed

_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str


class SSEDecoder:
    """Bytes in, ``SSEEvent``s out (module doc for the caps).

    Follows the WHATWG rules that matter for model APIs: lines end in CRLF, LF or CR;
    ``data:`` lines join with newlines; one optional space after the colon is dropped;
    ``event`` defaults to ``"message"``; comments (``:``) and other fields are skipped. A
    stream that ends mid-event yields nothing for the partial event. Lines are split as
    bytes (no UTF-8 sequence contains CR or LF) and decoded whole, invalid UTF-8 replaced.
    """

    __slots__ = ("_data", "_event", "_line", "_max_event", "_max_line", "_provider", "_size",
                 "_skip_lf")

    def __init__(self, provider: str, *, max_line: int = MAX_SSE_LINE_BYTES,
                 max_event: int = MAX_SSE_EVENT_BYTES) -> None:
        self._provider = provider
        self._max_line = max_line
        self._max_event = max_event
        self._line = bytearray()  # the current line, up to its end
        self._skip_lf = False  # the last byte seen was a CR: an LF right after it is its end
        self._event = ""
        self._data: list[str] = []
        self._size = 0  # bytes of the current event's data

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by ``chunk``; raises ``LLMError`` past a cap."""
        if not chunk:
            return []
        out: list[SSEEvent] = []
        start = 1 if self._skip_lf and chunk[0] == 0x0A else 0
        for end in _LINE_END.finditer(chunk, start):
            raw = chunk[start:end.start()]
            if self._line:  # the line began in an earlier chunk
                self._line += raw
                raw = bytes(self._line)
                self._line.clear()
            self._check_line(len(raw))
            event = self._take_line(raw)
            if event is not None:
                out.append(event)
            start = end.end()
        if start < len(chunk):
            self._line += chunk[start:]
            self._check_line(len(self._line))
        self._skip_lf = chunk[-1] == 0x0D  # a CR ending the chunk may be half of a CRLF
        return out

    def _check_line(self, size: int) -> None:
        if size > self._max_line:
            raise malformed(self._provider, f"a stream line is longer than {self._max_line:,} "
                            "bytes (the line cap: the server sent no line end)")

    def _take_line(self, raw: bytes) -> SSEEvent | None:
        if not raw:  # a blank line ends the event
            event = None
            if self._data:
                event = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data, self._size = "", [], 0
            return event
        line = raw.decode("utf-8", "replace")
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._size += len(raw) + 1
            if self._size > self._max_event:
                raise malformed(self._provider, f"a stream event is larger than "
                                f"{self._max_event:,} bytes (the event cap: the server sent "
                                "no blank line to end it)")
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None


async def iter_sse(response: httpx.Response, provider: str, *, max_line: int = MAX_SSE_LINE_BYTES,
                   max_event: int = MAX_SSE_EVENT_BYTES) -> AsyncIterator[SSEEvent]:
    """Yield one ``SSEEvent`` per blank-line-terminated event of ``response`` (bounded)."""
    decoder = SSEDecoder(provider, max_line=max_line, max_event=max_event)
    async for chunk in response.aiter_bytes():
        for event in decoder.feed(chunk):
            yield event
