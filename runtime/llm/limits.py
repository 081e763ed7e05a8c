"""How much a provider may make the port hold, and for how long: the caps and deadlines.

Whoever answers a model call decides how much it sends and how fast, so everything that grows
with a reply has a cap and every call has a deadline (``docs/llm-port.md``, "Deadlines and
caps"). The defaults are here, named once; ``ReplyLimits`` overrides the caps where an
adapter is built (``OpenAIModel(..., limits=ReplyLimits(reply_chars=...))``), the adapter's
``timeout`` the attempt's deadline and ``RetryPolicy.max_elapsed`` the call's.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_CALL_TIMEOUT",
    "MAX_BODY_BYTES",
    "MAX_REPLY_CHARS",
    "MAX_SSE_EVENT_BYTES",
    "MAX_SSE_LINE_BYTES",
    "MAX_TOOL_NAME_CHARS",
    "ReplyLimits",
]

MiB = 1024 * 1024

MAX_SSE_LINE_BYTES = 1 * MiB
"""The longest line of an event stream. A model API's lines are one JSON event each, a few
hundred bytes; even a whole tool call's arguments in one line stay far below."""
MAX_SSE_EVENT_BYTES = 4 * MiB
"""The most ``data`` one event may gather before the blank line that ends it."""
MAX_BODY_BYTES = 16 * MiB
"""The largest non-streaming (``generate``) reply body: a reply of ``MAX_REPLY_CHARS``
characters, JSON-escaped, fits."""
MAX_REPLY_CHARS = 1_000_000
"""The most characters one reply may hold, counted as they arrive: its text, its tool calls'
arguments, names and ids, and its thinking (text and signatures). About 250,000 tokens,
beyond the output limit of any model the catalog knows."""
MAX_TOOL_NAME_CHARS = 256
"""The longest tool name a reply may call, for any model (the assembler holds every model to
it, the adapters too): the providers allow 64 characters for a tool's name, so a longer one
names no tool that was offered, and each call's name is stored and replayed with the
history. Not a ``ReplyLimits`` knob, as the assembler of every model holds to it."""

DEFAULT_ATTEMPT_TIMEOUT = 300.0
"""Seconds one attempt may take, wall-clock, from connecting to the reply's last byte (an
adapter's ``timeout``): the largest reply the adapters ask for by default (4,096 tokens plus
a 16,384-token thinking budget) streams in about 5 minutes at 70 tokens/s."""
DEFAULT_CALL_TIMEOUT = 600.0
"""Seconds one call may take, wall-clock, all attempts and the waits between them
(``RetryPolicy.max_elapsed``): a slow full attempt and the retries before it."""


@dataclass(frozen=True)
class ReplyLimits:
    """The caps an adapter holds a reply to (defaults above); past one the call fails."""

    sse_line_bytes: int = MAX_SSE_LINE_BYTES
    sse_event_bytes: int = MAX_SSE_EVENT_BYTES
    body_bytes: int = MAX_BODY_BYTES
    reply_chars: int = MAX_REPLY_CHARS

    def __post_init__(self) -> None:
        for name in ("sse_line_bytes", "sse_event_bytes", "body_bytes", "reply_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ReplyLimits.{name} must be a positive integer, not {value!r}")
