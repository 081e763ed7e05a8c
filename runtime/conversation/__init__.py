"""The conversation object (``LLM``) and what it stands on: tools from Python objects, MCP
servers, skills, save and restore, agents. It stands on the LLM port and its step engine.

Names load lazily, so importing a submodule (``runtime.conversation.mcp``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import Agent, AgentState
    from .errors import (
        AgentStateError,
        ConversationError,
        NotEvaluatedError,
        PortableIdError,
        StepLimitError,
    )
    from .llm import LLM
    from .model_choice import ImportedModel
    from .state import TokenUsage

_LAZY = {
    "LLM": ".llm",
    "TokenUsage": ".state",
    "ImportedModel": ".model_choice",
    "Agent": ".agent",
    "AgentState": ".agent",
    **dict.fromkeys(("AgentStateError", "ConversationError", "NotEvaluatedError",
                     "PortableIdError", "StepLimitError"), ".errors"),
}

__all__ = [
    "LLM",
    "Agent",
    "AgentState",
    "AgentStateError",
    "ConversationError",
    "ImportedModel",
    "NotEvaluatedError",
    "PortableIdError",
    "StepLimitError",
    "TokenUsage",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime.conversation' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
