"""``with_static_tools``: the bound tools behind a fixed pair of tools.

Some clients cannot take a tool list that changes (MCP clients without dynamic tool
registration, the case of Dagger's ``withStaticTools``). In static mode the model sees only
``list_methods`` (every tool: name, description, JSON Schema) and ``call_method`` (a name and
its arguments), whatever is bound. Arguments are checked against the inner tool's schema by
the step engine's own checker, so a bad call reads exactly as it would have without the
indirection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..llm.steps import ToolError, ToolOutput, check_arguments
from ..llm.types import Tool
from .toolset import Toolset

__all__ = ["CALL_METHOD", "LIST_METHODS", "StaticTools"]

LIST_METHODS = "list_methods"
CALL_METHOD = "call_method"


class StaticTools:
    """A ``Toolset`` of two tools over ``tools`` routed by ``routes`` (name -> (source,
    the source's own name))."""

    def __init__(self, tools: Sequence[Tool], routes: Mapping[str, tuple[Toolset, str]]) -> None:
        self._tools = {t.name: t for t in tools}
        self._routes = routes
        names = sorted(self._tools)
        self.tools = [
            Tool(name=LIST_METHODS, description="List the methods call_method can call: "
                 "each one's name, description and JSON Schema of its arguments.",
                 input_schema={"type": "object", "properties": {}}),
            Tool(name=CALL_METHOD, description="Call one of the methods list_methods lists.",
                 input_schema={"type": "object", "properties": {
                     "method": {"type": "string", "enum": names} if names else
                     {"type": "string"},
                     "arguments": {"type": "object"}}, "required": ["method"]}),
        ]

    async def list_tools(self) -> list[Tool]:
        return self.tools

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutput:
        if name == LIST_METHODS:
            return [t.model_dump() for t in self._tools.values()]
        method = arguments["method"]
        tool = self._tools.get(method)
        if tool is None:
            raise ToolError(f"There is no method {method!r}; call list_methods to see them.")
        inner = dict(arguments.get("arguments") or {})
        problem = check_arguments(tool, inner)
        if problem is not None:
            raise ToolError(problem)
        source, original = self._routes[method]
        return await source.call(original, inner)

    async def aclose(self) -> None:
        pass
