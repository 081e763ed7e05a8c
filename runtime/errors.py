"""Errors the cell runtime raises. Each names what was wrong and how to fix it."""

from __future__ import annotations

from .signals import CycleError, WriteInComputationError

__all__ = [
    "BindingError",
    "CellError",
    "CycleError",
    "PathError",
    "PatternError",
    "SchemaError",
    "StreamError",
    "WriteInComputationError",
]


class CellError(Exception):
    """Base class of the runtime's own errors."""


class SchemaError(CellError, ValueError):
    """A value failed its schema. ``path`` is the JSON pointer inside the value, ``rule`` the
    JSON Schema keyword that failed (``type``, ``required``, ``minimum``...)."""

    def __init__(self, message: str, *, path: str = "", rule: str = ""):
        super().__init__(message)
        self.path = path
        self.rule = rule


class PathError(CellError, LookupError):
    """A read of a path that does not exist, or a link to a missing document."""


class BindingError(CellError, TypeError):
    """A handler bound to something that is not a cell, or with a binding missing."""


class StreamError(CellError, LookupError):
    """An event sent to an unknown or stopped stream."""


class PatternError(CellError, TypeError):
    """A pattern used wrongly: bad arguments, builders called outside a pattern."""
