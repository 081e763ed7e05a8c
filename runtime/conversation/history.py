"""Pure functions over a conversation's history (a tuple of port ``Message``s).

The history is kept valid for every provider at all times: roles alternate (a message of
the same role as the last one is merged into it, so a prompt queued after tool results
travels in their message, as Anthropic wants and the OpenAI adapter splits), and every tool
call gets its result before the next model call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..llm.types import Message, Role, TextBlock, ToolResult, ToolUse

__all__ = [
    "append",
    "estimate_tokens",
    "has_pending",
    "last_reply",
    "transcript",
]

_CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and JSON


def append(history: tuple[Message, ...], message: Message) -> tuple[Message, ...]:
    """``history`` with ``message`` added, merged into the last message if it has the same
    role (tool results first: a provider wants them at the start of their message)."""
    if history and history[-1].role is message.role:
        last = history[-1]
        blocks = last.blocks + message.blocks
        if message.role is Role.USER:
            blocks = tuple(b for b in blocks if isinstance(b, ToolResult)) + tuple(
                b for b in blocks if not isinstance(b, ToolResult))
        return (*history[:-1], Message(role=last.role, blocks=blocks))
    return (*history, message)


def has_pending(history: Sequence[Message]) -> bool:
    """An unsent prompt or unsent tool results: the last message is the user's."""
    return bool(history) and history[-1].role is Role.USER


def last_reply(history: Sequence[Message]) -> str | None:
    """The text of the most recent assistant message that has text, or None."""
    for m in reversed(history):
        if m.role is Role.ASSISTANT:
            text = m.text_content()
            if text:
                return text
    return None


def transcript(history: Sequence[Message]) -> str:
    """The history as plain text (no system prompts): one paragraph per block, labelled by
    who said it, tool calls and results included, for a summariser or a human."""
    names: dict[str, str] = {}
    parts: list[str] = []
    for m in history:
        who = "User" if m.role is Role.USER else "Assistant"
        for b in m.blocks:
            if isinstance(b, TextBlock):
                parts.append(f"{who}: {b.text}")
            elif isinstance(b, ToolUse):
                names[b.id] = b.name
                args = json.dumps(b.input, ensure_ascii=False, separators=(",", ":"))
                parts.append(f"Assistant called {b.name}({args})")
            elif isinstance(b, ToolResult):
                label = "error from" if b.is_error else "result of"
                parts.append(f"Tool {label} {names.get(b.tool_use_id, b.tool_use_id)}: "
                             f"{b.content}")
            else:
                parts.append(f"{who}: [{b.kind}]")
    return "\n\n".join(parts)


def estimate_tokens(messages: Sequence[Message], extra_chars: int = 0) -> int:
    """A rough token count of ``messages`` (about four characters a token)."""
    chars = extra_chars
    for m in messages:
        for b in m.blocks:
            if isinstance(b, TextBlock):
                chars += len(b.text)
            elif isinstance(b, ToolUse):
                chars += len(b.name) + len(json.dumps(b.input))
            elif isinstance(b, ToolResult):
                chars += len(b.content)
            else:
                chars += 400  # an image or an opaque block: a guess
    return -(-chars // _CHARS_PER_TOKEN)
