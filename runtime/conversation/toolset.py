"""What the conversation object asks of every source of tools.

A source of tools (Python objects bound with ``with_tools``, an MCP server, the skills, a
workspace) is opened once per evaluation of a conversation (``await llm``) and closed when
that evaluation ends, whatever way it ends. Opening is lazy: a source is opened by the first
step that needs its tools, so an MCP server's process starts only then.

The step engine (``runtime.llm.steps.run_steps``) runs the calls; a ``Toolset`` only lists
its tools and runs one call. Raise ``runtime.llm.ToolError`` from ``call`` for an error
result the model should read as is; any other exception becomes an error result too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ..llm.steps import ToolOutput
from ..llm.types import Tool

__all__ = ["Toolset"]


@runtime_checkable
class Toolset(Protocol):
    """An open source of tools for one evaluation of a conversation."""

    async def list_tools(self) -> list[Tool]:
        """The tools this source offers now, each with its JSON Schema input."""
        ...

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutput:
        """Run the tool ``name`` (one of ``list_tools``) with arguments already validated
        against its schema by the step engine."""
        ...

    async def aclose(self) -> None:
        """Release what the source holds (an MCP server's process, say). Idempotent."""
        ...
