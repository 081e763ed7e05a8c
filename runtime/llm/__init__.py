"""The LLM port: the only thing the rest of celldialog knows about language models.

It knows nothing of cells. Backends (``providers/``) adapt the vocabulary in ``types`` to a
vendor's wire format; ``ScriptedModel`` is the deterministic backend for tests.

Importing the package stays cheap: the adapters (and httpx with them) load on first use
of ``AnthropicModel``, ``OpenAIModel``, ``AzureOpenAIModel``, ``OpenAIResponsesModel`` or
``GeminiModel`` (or of ``resolve_model``), so a caller that only needs the vocabulary or the
scripted model never pays for them. ``LocalModel`` (the embedded model)
loads the same way, and llama-cpp-python only when one is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .catalog import ModelInfo, aliases, by_alias, lookup, small_model
from .config import DEFAULT_MODEL_VAR, Settings
from .errors import (
    MAX_MESSAGE_CHARS,
    ConfigurationError,
    Fault,
    LLMError,
    quota_exhausted,
    retry_class,
)
from .events import (
    Assembler,
    OpaqueDone,
    Stop,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    UsageUpdate,
    assemble,
)
from .history import (
    CallIds,
    fresh_call_id,
    repeated_call_ids,
    unanswered_calls,
    with_unique_call_ids,
)
from .limits import (
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_CALL_TIMEOUT,
    MAX_BODY_BYTES,
    MAX_REPLY_CHARS,
    MAX_SSE_EVENT_BYTES,
    MAX_SSE_LINE_BYTES,
    ReplyLimits,
)
from .model import Model
from .resolve import ModelSettings, model_settings, parse_model_name, resolve_model
from .retry_policy import (
    NO_RETRY,
    CallDeadline,
    RetryPolicy,
    parse_retry_after,
    parse_retry_after_ms,
    retry_call,
    retry_stream,
)
from .retrying_model import RetryingModel, with_retry
from .safety import (
    check_api_key,
    check_base_url,
    display_url,
    is_loopback_host,
    is_loopback_url,
    safe_base_url,
    supported_image_media_type,
)
from .scripted import Delayed, Pause, Reply, ScriptedModel, call, delayed
from .steps import (
    DEFAULT_MAX_STEPS,
    TOOL_CANCELLED,
    BuildRequest,
    Execute,
    StepSink,
    StepsOutcome,
    StepsStatus,
    ToolChoiceScope,
    ToolError,
    ToolOutput,
    run_steps,
)
from .types import (
    Block,
    CacheHint,
    ImageBlock,
    Message,
    OpaqueBlock,
    Request,
    Response,
    Role,
    Sampling,
    StopReason,
    TextBlock,
    Tool,
    ToolChoice,
    ToolResult,
    ToolUse,
    Usage,
)

if TYPE_CHECKING:  # what type checkers see; at run time ``__getattr__`` loads them
    from .providers.anthropic import AnthropicModel
    from .providers.gemini import GeminiModel
    from .providers.local import LocalModel
    from .providers.openai import AzureOpenAIModel, OpenAIModel
    from .providers.openai_responses import OpenAIResponsesModel

_LAZY = {
    "AnthropicModel": ".providers.anthropic",
    "AzureOpenAIModel": ".providers.openai",
    "GeminiModel": ".providers.gemini",
    "LocalModel": ".providers.local",
    "OpenAIModel": ".providers.openai",
    "OpenAIResponsesModel": ".providers.openai_responses",
}


def __getattr__(name: str) -> Any:
    """The adapters, imported on first access (``from runtime.llm import OpenAIModel``)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_MODEL_VAR",
    "MAX_BODY_BYTES",
    "MAX_MESSAGE_CHARS",
    "MAX_REPLY_CHARS",
    "MAX_SSE_EVENT_BYTES",
    "MAX_SSE_LINE_BYTES",
    "NO_RETRY",
    "TOOL_CANCELLED",
    "AnthropicModel",
    "Assembler",
    "AzureOpenAIModel",
    "Block",
    "BuildRequest",
    "CacheHint",
    "CallDeadline",
    "CallIds",
    "ConfigurationError",
    "Delayed",
    "Execute",
    "Fault",
    "GeminiModel",
    "ImageBlock",
    "LLMError",
    "LocalModel",
    "Message",
    "Model",
    "ModelInfo",
    "ModelSettings",
    "OpaqueBlock",
    "OpaqueDone",
    "OpenAIModel",
    "OpenAIResponsesModel",
    "Pause",
    "Reply",
    "ReplyLimits",
    "Request",
    "Response",
    "RetryPolicy",
    "RetryingModel",
    "Role",
    "Sampling",
    "ScriptedModel",
    "Settings",
    "StepSink",
    "StepsOutcome",
    "StepsStatus",
    "Stop",
    "StopReason",
    "StreamEvent",
    "TextBlock",
    "TextDelta",
    "Tool",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolChoice",
    "ToolChoiceScope",
    "ToolError",
    "ToolOutput",
    "ToolResult",
    "ToolUse",
    "Usage",
    "UsageUpdate",
    "aliases",
    "assemble",
    "by_alias",
    "call",
    "check_api_key",
    "check_base_url",
    "delayed",
    "display_url",
    "fresh_call_id",
    "is_loopback_host",
    "is_loopback_url",
    "lookup",
    "model_settings",
    "parse_model_name",
    "parse_retry_after",
    "parse_retry_after_ms",
    "quota_exhausted",
    "repeated_call_ids",
    "resolve_model",
    "retry_call",
    "retry_class",
    "retry_stream",
    "run_steps",
    "safe_base_url",
    "small_model",
    "supported_image_media_type",
    "unanswered_calls",
    "with_retry",
    "with_unique_call_ids",
]
