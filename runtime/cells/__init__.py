"""The cell graph: the reactive kernel, documents and transactions, cells and streams, the
event scheduler, patterns and the ``Runtime`` that owns them. Persists through
``runtime.storage``; knows nothing of LLMs (``runtime.llm``)."""

from ..errors import (
    BindingError,
    CellError,
    CycleError,
    LinkError,
    NotJSONError,
    PathError,
    PatternError,
    ReadOnlyError,
    SchemaError,
    ScopeError,
    StreamError,
    UsageError,
    WriteInComputationError,
)
from .cell import Cell, Stream
from .documents import Change
from .pattern import Handler, Pattern, cell, computed, handler, lift, pattern
from .runtime import Instance, Runtime, current_instance, current_runtime

__all__ = [
    "BindingError",
    "Cell",
    "CellError",
    "Change",
    "CycleError",
    "Handler",
    "Instance",
    "LinkError",
    "NotJSONError",
    "PathError",
    "Pattern",
    "PatternError",
    "ReadOnlyError",
    "Runtime",
    "SchemaError",
    "ScopeError",
    "Stream",
    "StreamError",
    "UsageError",
    "WriteInComputationError",
    "cell",
    "computed",
    "current_instance",
    "current_runtime",
    "handler",
    "lift",
    "pattern",
]
