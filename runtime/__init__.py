"""celldialog's runtime: a reactive graph of JSON cells, persisted, with LLM builtins.

The rooms (see docs/architecture.md), each knowing only those below it:
``cells`` (the reactive kernel and the cell graph) with ``storage``; ``llm`` (the LLM port,
which knows nothing of cells); ``builtins`` joining the two. ``errors`` is the one error
tree all of them share.

This package is the public API. Its names load lazily, so ``import runtime.llm`` does not
pay for the cell graph (anyio, jsonschema, sqlite3) and the reverse.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    BindingError,
    CelldialogError,
    CellError,
    ClosedError,
    ConflictError,
    CycleError,
    LinkError,
    NotJSONError,
    PathError,
    PatternError,
    ReadOnlyError,
    SchemaError,
    ScopeError,
    StorageError,
    StoreBusyError,
    StoreClosedError,
    StoreConfigError,
    StreamError,
    UsageError,
    WriteInComputationError,
)

if TYPE_CHECKING:
    from .builtins import (
        Dialog,
        Generation,
        generate_object,
        generate_text,
        llm_dialog,
        tool_result,
    )
    from .cells import (
        Cell,
        Change,
        Handler,
        Instance,
        Pattern,
        Runtime,
        Stream,
        cell,
        computed,
        current_instance,
        current_runtime,
        handler,
        lift,
        pattern,
    )
    from .storage import MemoryStore, PostgresStore, SQLiteStore, Store

_LAZY = {
    **dict.fromkeys(
        ("Cell", "Change", "Handler", "Instance", "Pattern", "Runtime", "Stream", "cell",
         "computed", "current_instance", "current_runtime", "handler", "lift", "pattern"),
        "runtime.cells",
    ),
    **dict.fromkeys(("MemoryStore", "PostgresStore", "SQLiteStore", "Store"),
                    "runtime.storage"),
    **dict.fromkeys(("Dialog", "Generation", "generate_object", "generate_text", "llm_dialog",
                    "tool_result"), "runtime.builtins"),
    **dict.fromkeys(("LLM", "Agent"), "runtime.conversation"),
}

__all__ = [
    "LLM",
    "Agent",
    "BindingError",
    "Cell",
    "CellError",
    "CelldialogError",
    "Change",
    "ClosedError",
    "ConflictError",
    "CycleError",
    "Dialog",
    "Generation",
    "Handler",
    "Instance",
    "LinkError",
    "MemoryStore",
    "NotJSONError",
    "PathError",
    "Pattern",
    "PatternError",
    "PostgresStore",
    "ReadOnlyError",
    "Runtime",
    "SQLiteStore",
    "SchemaError",
    "ScopeError",
    "StorageError",
    "Store",
    "StoreBusyError",
    "StoreClosedError",
    "StoreConfigError",
    "Stream",
    "StreamError",
    "UsageError",
    "WriteInComputationError",
    "cell",
    "computed",
    "current_instance",
    "current_runtime",
    "generate_object",
    "generate_text",
    "handler",
    "lift",
    "llm_dialog",
    "pattern",
    "tool_result",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
