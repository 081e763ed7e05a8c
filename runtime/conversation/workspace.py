"""``with_workspace(instance)``: a running pattern instance as the model's workspace.

Each handler stream of the instance is a tool (its event schema is the tool's input): a call
sends the event and waits until the runtime has settled, so the model's next step sees
what the handler and everything it triggered did. ``workspace_read`` reads the instance's
cells (its result's keys that are not streams), so the model can look before it acts.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

from ..llm.steps import ToolError, ToolOutput
from ..llm.types import Tool

__all__ = ["READ_TOOL", "WorkspaceTools"]

READ_TOOL = "workspace_read"
_BAD = re.compile(r"[^A-Za-z0-9_-]")


def _tool_name(stream: str) -> str:
    return _BAD.sub("_", stream)[:64]


class WorkspaceTools:
    """The streams and cells of ``instance`` (a ``runtime.cells.Instance``) as a Toolset."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.name = "workspace"
        self._streams: dict[str, tuple[str, bool]] = {}  # tool -> (stream, event wrapped)
        self.tools: list[Tool] = []
        pattern = instance.pattern.name
        for path, stream in sorted(instance.streams.items()):
            name = _tool_name(path)
            schema = stream.event_schema
            wrapped = not (isinstance(schema, dict) and schema.get("type") == "object")
            if wrapped:  # a tool's input is an object: the event goes in its "event" field
                schema = {"type": "object", "properties": {"event": schema or {}},
                          "required": ["event"]}
            doc = inspect.getdoc(stream.handler.fn) or f"Send an event to {path}."
            self._streams[name] = (path, wrapped)
            self.tools.append(Tool(name=name, description=f"{doc} (stream {path!r} of "
                                   f"pattern {pattern})", input_schema=schema))
        cells = ", ".join(repr(c) for c in self.cells()) or "none"
        self.tools.append(Tool(
            name=READ_TOOL,
            description=f"Read a cell of the workspace (pattern {pattern}): one of {cells}, "
                        "or a path into one ('items.0'); no path reads them all.",
            input_schema={"type": "object", "properties": {"path": {"type": "string"}}}))

    def cells(self) -> list[str]:
        """The result's top-level keys that are not streams."""
        value = self.instance.result.get(None)
        if not isinstance(value, dict):
            return []
        return [k for k in value if k not in self.instance.streams]

    async def list_tools(self) -> list[Tool]:
        return self.tools

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutput:
        if name == READ_TOOL:
            return self.read(arguments.get("path") or "")
        path, wrapped = self._streams[name]
        event = arguments.get("event") if wrapped else dict(arguments)
        await self.instance.send(path, event)
        await self.instance.runtime.settled()
        return f"{path} done."

    def read(self, path: str) -> Any:
        if not path:
            return {k: self.instance.result.key(k).get(None) for k in self.cells()}
        parts = [int(p) if p.isdigit() else p for p in path.split(".")]
        if parts[0] not in self.cells():
            raise ToolError(f"The workspace has no cell {parts[0]!r}; its cells: "
                            f"{', '.join(self.cells()) or 'none'}.")
        try:
            return self.instance.result.key(*parts).get()
        except Exception as e:
            raise ToolError(f"Cannot read {path!r}: {e}") from None

    async def aclose(self) -> None:
        pass
