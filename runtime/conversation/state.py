"""The state of a conversation: what one ``LLM`` value holds once its work has run.

Frozen: every ``with_*`` makes a new state with ``dataclasses.replace``; a step makes one at
its end. Bindings are kept flattened: re-binding an object of the same type, or an MCP
server of the same name, replaces the earlier one (superseded state is dropped, as
``portable_id`` wants it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..llm.types import AUTO, Message, Tool, ToolChoice, Usage
from .model_choice import ModelChoice
from .object_tools import ObjectBinding

__all__ = ["DEFAULT_SYSTEM_PROMPT", "REASONING_EFFORTS", "State", "TokenUsage"]

REASONING_EFFORTS: dict[str, str | None] = {
    "": None, "none": None, "low": "low", "medium": "medium", "high": "high"}
"""The efforts ``with_reasoning_effort`` takes, and what each sends through the port."""

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. When tools are available, use them to do what is asked "
    "rather than guessing their results; when the task is done, answer in plain text."
)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Cumulative token usage of a conversation, summed exactly over every model call.

    ``input_tokens`` is the whole input processed (cache reads included, as the port counts
    it); ``cache_read_tokens`` is its cached part; ``cache_write_tokens`` comes on top;
    ``total_tokens`` sums input, output and cache writes."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    total_tokens: int = 0

    def add(self, usage: Usage, total: int | None = None) -> TokenUsage:
        return TokenUsage(
            self.input_tokens + usage.input_tokens,
            self.output_tokens + usage.output_tokens,
            self.cache_read_tokens + usage.cache_read_tokens,
            self.cache_write_tokens + usage.cache_write_tokens,
            self.total_tokens + (total if total is not None else
                                 usage.input_tokens + usage.output_tokens
                                 + usage.cache_write_tokens),
        )


@dataclass(frozen=True, slots=True)
class State:
    model: ModelChoice
    reasoning_effort: str = ""
    tool_choice: ToolChoice = AUTO  # forcing: only with a call answering a prompt (the engine)
    system_prompts: tuple[str, ...] = ()
    default_system_prompt: bool = True
    history: tuple[Message, ...] = ()
    usage: TokenUsage = TokenUsage()
    # occupancy of the context at the last model call (its input + output), and the
    # history length then: context_tokens estimates only what came after
    context_at_last_call: int = 0
    history_at_last_call: int = 0
    objects: tuple[ObjectBinding, ...] = ()
    blocked: frozenset[tuple[str, str]] = frozenset()
    mcp: tuple[Any, ...] = ()  # runtime.conversation.mcp.MCPServer specs, by name
    skills: tuple[Path, ...] = ()
    workspace: Any = None  # a runtime.cells Instance
    static_tools: bool = False
    advertised: tuple[Tool, ...] | None = None  # the tools of the last step, if any
    labels: tuple[str, ...] = ()  # fork labels, oldest first
    key: str = ""  # names the conversation to a provider's prompt cache (a fork gets its own)

    def system(self) -> str:
        prompts = ((DEFAULT_SYSTEM_PROMPT,) if self.default_system_prompt else ()) \
            + self.system_prompts
        return "\n\n".join(prompts)
