"""Every error celldialog raises, in one tree. Each message names what was wrong and the fix.

    CelldialogError                   the base: ``except CelldialogError`` catches all of ours
    ├── CellError                     the cell graph (runtime.cells)
    │   ├── SchemaError               a value failed its schema (also: a schema that is invalid)
    │   ├── NotJSONError              a value JSON cannot hold: a set, NaN, a cycle, too deep
    │   ├── PathError                 a read of a path or document that does not exist
    │   │   └── LinkError             a malformed link, a link cycle, a link that crosses scopes
    │   ├── ScopeError                a user or session id that is empty or not a string
    │   ├── BindingError              a handler bound to something that is not a cell
    │   ├── StreamError               an event for an unknown or stopped stream
    │   ├── PatternError              a pattern or handler used wrongly
    │   ├── ReadOnlyError             a write to a computed cell or an instance's result
    │   ├── UsageError                a cell operation on the wrong kind of value
    │   ├── WriteInComputationError   a computation (lift, computed) tried to write
    │   ├── CycleError                computations or events that trigger themselves forever
    │   └── ClosedError               the runtime was used after it closed
    ├── StorageError                  a store failed (runtime.storage)
    │   ├── ConflictError             another writer changed the document first: retry
    │   ├── StoreBusyError            the database stayed locked longer than the busy timeout
    │   ├── StoreConfigError          a store URL, option or write that cannot be used
    │   └── StoreClosedError          the store was used after it was closed
    ├── (the LLM port, runtime.llm.errors)
    │   ├── LLMError                  a model call failed; ``fault`` says if retrying can help
    │   └── ConfigurationError        an unknown model, a missing key, an unusable URL or key
    ├── (the conversation object, runtime.conversation)
    │   ├── ConversationError         the LLM value used wrongly
    │   │   ├── NotEvaluatedError     a result field read before the conversation was awaited
    │   │   ├── StepLimitError        loop(max_steps=...) reached; ``.progress`` holds the rest
    │   │   ├── PortableIdError       a portable id that cannot be made or restored
    │   │   └── AgentStateError       an agent asked for a transition its state forbids
    │   ├── MCPServerError            an MCP server that cannot start (names it, never its env)
    │   └── SkillError                a skills directory that cannot be used
    │       └── SkillFormatError      a SKILL.md without valid name/description frontmatter
    ├── (the evaluator, runtime.evals)
    │   ├── EvalLoadError             an EVALS path or module that cannot be loaded
    │   └── ReportError               a CSV report that cannot be read or compared
    └── (the web page, runtime.web.errors)
        └── WebError                  the server cannot do what it was asked
            └── WebConfigError        a secret, limit, auth hook or pattern it cannot use

Errors of the libraries underneath (``sqlite3``, ``jsonschema``, ``httpx``) never escape
bare: they are wrapped in one of these. Storage errors keep the original as ``__cause__``;
errors leaving an LLM adapter carry no chained exception at all, because the httpx error
underneath holds the request and with it the API key. The builtin bases
(``ValueError``, ``LookupError``, ``TypeError``, ``RuntimeError``) are kept beside ours so
code that caught those before keeps working.

This module imports nothing: every layer may use it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BindingError",
    "CellError",
    "CelldialogError",
    "ClosedError",
    "ConflictError",
    "CycleError",
    "LinkError",
    "NotJSONError",
    "PathError",
    "PatternError",
    "ReadOnlyError",
    "SchemaError",
    "ScopeError",
    "StorageError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreConfigError",
    "StreamError",
    "UsageError",
    "WriteInComputationError",
]


class CelldialogError(Exception):
    """The base of every error celldialog raises."""


# ---------------------------------------------------------------------------- the cell graph


class CellError(CelldialogError):
    """The cell graph's errors."""


class SchemaError(CellError, ValueError):
    """A value failed its schema. ``path`` is the JSON pointer inside the value, ``rule`` the
    JSON Schema keyword that failed (``type``, ``required``, ``minimum``...)."""

    def __init__(self, message: str, *, path: str = "", rule: str = ""):
        super().__init__(message)
        self.path = path
        self.rule = rule


class NotJSONError(CellError, TypeError):
    """A value that is not JSON: a type JSON lacks, NaN or infinity, a non-string key, a
    value that contains itself, or one nested deeper than the runtime allows."""


class PathError(CellError, LookupError):
    """A read of a path that does not exist, or of a document that was never created."""


class LinkError(PathError):
    """A link that cannot be followed: malformed, cyclic, or crossing into a scope the
    document holding it may not reach."""


class ScopeError(CellError, ValueError):
    """A user or session id that cannot name a scope."""


class BindingError(CellError, TypeError):
    """A handler bound to something that is not a cell, or with a binding missing."""


class StreamError(CellError, LookupError):
    """An event sent to an unknown or stopped stream."""


class PatternError(CellError, TypeError):
    """A pattern or handler used wrongly: bad arguments, builders called outside a pattern,
    an ``async def`` handler."""


class ReadOnlyError(CellError, TypeError):
    """A write to something only the runtime writes: a computed cell, an instance's result."""


class UsageError(CellError, TypeError):
    """A cell operation used on the wrong kind of value: ``push`` on an object, ``update``
    with a list, a cell's truth value while the graph is being built."""


class WriteInComputationError(CellError, RuntimeError):
    """Computations are pure: they read, never write."""


class CycleError(CellError, RuntimeError):
    """A computation that depends on itself, or effects or events that re-trigger each
    other forever. ``nodes`` names what takes part in the loop."""

    def __init__(self, message: str, nodes: list[Any]) -> None:
        super().__init__(message)
        self.nodes = nodes


class ClosedError(CellError, RuntimeError):
    """The runtime was used after its ``async with`` block ended."""


# ---------------------------------------------------------------------------- storage


class StorageError(CelldialogError, RuntimeError):
    """A store could not do what was asked; nothing was committed."""


class ConflictError(StorageError):
    """A conditional write found a different version than it expected; nothing committed."""


class StoreBusyError(StorageError):
    """The database stayed locked by another writer for longer than the busy timeout."""


class StoreConfigError(StorageError, ValueError, TypeError):
    """A store that cannot be opened as asked (an unknown URL, a bad option), or a write
    built wrongly (a patch without the version it applies to)."""


class StoreClosedError(StorageError):
    """The store was used after ``close()``."""
