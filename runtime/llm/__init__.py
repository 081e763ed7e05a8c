"""The LLM port: the only thing the rest of celldialog knows about language models.

It knows nothing of cells. Backends (``providers/``) adapt the vocabulary in ``types`` to a
vendor's wire format; ``ScriptedModel`` is the deterministic backend for tests.
"""

from .errors import ConfigurationError, Fault, LLMError, retry_class
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
from .model import Model
from .retry import NO_RETRY, RetryPolicy, parse_retry_after, retry_call, retry_stream
from .safety import safe_base_url, supported_image_media_type
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
    ToolResult,
    ToolUse,
    Usage,
)

__all__ = [
    "NO_RETRY",
    "Assembler",
    "Block",
    "CacheHint",
    "ConfigurationError",
    "Fault",
    "ImageBlock",
    "LLMError",
    "Message",
    "Model",
    "OpaqueBlock",
    "OpaqueDone",
    "Request",
    "Response",
    "RetryPolicy",
    "Role",
    "Sampling",
    "Stop",
    "StopReason",
    "StreamEvent",
    "TextBlock",
    "TextDelta",
    "Tool",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolResult",
    "ToolUse",
    "Usage",
    "UsageUpdate",
    "assemble",
    "parse_retry_after",
    "retry_call",
    "retry_class",
    "retry_stream",
    "safe_base_url",
    "supported_image_media_type",
]
