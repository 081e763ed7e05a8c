"""celldialog's runtime: a reactive graph of JSON cells, persisted, with LLM builtins.

Layers (see docs/architecture.md): ``signals`` is the reactive kernel; documents, cells,
transactions, the scheduler and patterns build the cell graph on it; ``storage`` persists
documents; ``llm`` is the provider-agnostic LLM port, which knows nothing of cells.
"""

from .cell import Cell, Stream
from .documents import Change
from .errors import (
    BindingError,
    CellError,
    CycleError,
    PathError,
    PatternError,
    SchemaError,
    StreamError,
    WriteInComputationError,
)
from .pattern import Handler, Pattern, cell, computed, handler, lift, pattern
from .runtime import Instance, Runtime
from .storage import ConflictError, MemoryStore, SQLiteStore, Store

__all__ = [
    "BindingError",
    "Cell",
    "CellError",
    "Change",
    "ConflictError",
    "CycleError",
    "Handler",
    "Instance",
    "MemoryStore",
    "PathError",
    "Pattern",
    "PatternError",
    "Runtime",
    "SQLiteStore",
    "SchemaError",
    "Store",
    "Stream",
    "StreamError",
    "WriteInComputationError",
    "cell",
    "computed",
    "handler",
    "lift",
    "pattern",
]
