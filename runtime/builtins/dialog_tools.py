"""A dialog's tool catalog: the pattern's tools, the six management tools, presentResult.

A tool is a bound handler (it runs in the caller's transaction and may write the state it
was bound with), a pattern (run fresh for each call, in the dialog's scope; it cannot write
the caller's cells), or a built-in. The catalog keeps the schema each tool is *advertised*
with apart from the one it is checked with: our internal markers (``asCell``) never reach a
provider; the advertised schema describes the link form in words instead.

A dialog's ``tool_choice`` is checked against the same catalog (``dialog_tool_choice``): a
named tool must be one the dialog advertises, built-ins included, so the mistake shows when
the pattern runs, not at the first model call.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import pydantic

from ..cells import Cell, Pattern, Stream, TextByObject
from ..errors import PatternError
from ..llm import Tool, ToolChoice
from .management import MANAGEMENT_TOOL_NAMES, MANAGEMENT_TOOLS

__all__ = ["PRESENT_RESULT", "ToolSpec", "advertised_schema", "build_catalog",
           "dialog_tool_choice", "inline_refs", "tool_result", "tool_result_cell"]

PRESENT_RESULT = "presentResult"

_CELL_WORDS = ('A cell, given by its path "/<id>/<path>" (document id, then keys or list '
               'indexes) or as a link {"@link": "/<id>/<path>"}')
_CELL_FORMS = [
    {"type": "string"},
    {"type": "object", "properties": {"@link": {"type": "string"}, "scope": {"type": "string"}},
     "required": ["@link"]},
]


@dataclass(frozen=True)
class ToolSpec:
    tool: Tool  # as advertised to the model (and checked by the step engine)
    stream: Stream | None  # None: a pattern tool or a built-in (management, presentResult)
    pattern: Pattern | None = None  # a pattern tool: run fresh for each call


def build_catalog(tools: Mapping[str, Any], builtin_tools: bool,
                  result_schema: dict[str, Any] | None) -> dict[str, ToolSpec]:
    """The catalog in the order it is advertised: the pattern's tools, the management
    tools (unless ``builtin_tools`` is False), then presentResult (with a result schema)."""
    builtins_on = builtin_tools is not False
    reserved = {PRESENT_RESULT, *(MANAGEMENT_TOOL_NAMES if builtins_on else ())}
    out: dict[str, ToolSpec] = {}
    for tool_name, spec in tools.items():
        if tool_name in reserved:
            remedy = ("pick another name" if tool_name == PRESENT_RESULT else
                      "rename it, or pass builtin_tools=False to drop the built-in tools")
            raise PatternError(
                f"tool name {tool_name!r} is reserved for the dialog's built-in tools: {remedy}")
        if isinstance(spec, Stream):
            spec = {"handler": spec}
        elif isinstance(spec, Pattern):
            spec = {"pattern": spec}
        stream = spec.get("handler") if isinstance(spec, Mapping) else None
        tool_pattern = spec.get("pattern") if isinstance(spec, Mapping) else None
        if isinstance(stream, Stream):
            schema = spec.get("input_schema") or stream.event_schema or {"type": "object"}
        elif isinstance(tool_pattern, Pattern):
            schema = spec.get("input_schema") or tool_pattern.argument_schema
        else:
            raise PatternError(
                f"tool {tool_name!r} needs a bound handler or a pattern: "
                "{'description': '...', 'handler': my_handler(state=cell)} or "
                "{'description': '...', 'pattern': my_pattern}")
        out[tool_name] = ToolSpec(
            _tool(tool_name, spec.get("description", ""), schema), stream,
            tool_pattern if isinstance(tool_pattern, Pattern) else None)
    if builtins_on:  # after the pattern's own tools, before presentResult
        for tool in MANAGEMENT_TOOLS:
            out[tool.name] = ToolSpec(tool, None)
    if result_schema is not None:
        out[PRESENT_RESULT] = ToolSpec(_tool(
            PRESENT_RESULT,
            "Present the final result of the task, in the shape its schema asks.",
            result_schema), None)
    return out


_TOOLS: OrderedDict[tuple[str, str, str], Tool] = OrderedDict()
CACHED_TOOLS = 1024  # advertised tools remembered (the least recently used go first)
# a schema object's sorted text (a handler's event schema is one dict every instance
# passes): the text costs far more than telling the object is unchanged
_SCHEMA_TEXT = TextByObject()


def _tool(name: str, description: Any, schema: dict[str, Any]) -> Tool:
    """The tool as advertised. Every instance of a pattern declares the same tools: they
    share one (immutable) ``Tool``, made once, instead of each rewriting the schema."""
    try:
        text = _SCHEMA_TEXT.get(schema)
        if text is None:
            text = json.dumps(schema, sort_keys=True)
            _SCHEMA_TEXT.put(schema, text)
        key = (name, description, text)
        hit = _TOOLS.get(key)
    except (TypeError, ValueError):  # not plain JSON (or an unhashable description)
        return Tool(name=name, description=description,
                    input_schema=advertised_schema(inline_refs(schema)))
    if hit is None:
        hit = _TOOLS[key] = Tool(name=name, description=description,
                                 input_schema=advertised_schema(inline_refs(schema)))
        while len(_TOOLS) > CACHED_TOOLS:
            _TOOLS.popitem(last=False)
    else:
        _TOOLS.move_to_end(key)
    return hit


_AUTO = ToolChoice()


def dialog_tool_choice(choice: Any, catalog: Mapping[str, ToolSpec], where: str) -> ToolChoice:
    """``choice`` (a ``ToolChoice`` or a string) as the port's value, checked against the
    tools the dialog advertises; a ``PatternError`` naming them (and why a built-in is not
    among them) otherwise. ``where`` names the builtin in the error."""
    if choice == "auto" and type(choice) is str:  # the default: nothing to check
        return _AUTO
    try:
        value = ToolChoice.model_validate(choice)
        value.check([spec.tool for spec in catalog.values()])
    except (pydantic.ValidationError, ValueError) as e:
        why = (e.errors()[0]["msg"].removeprefix("Value error, ")
               if isinstance(e, pydantic.ValidationError) else str(e))
        name = choice if isinstance(choice, str) else getattr(choice, "name", None)
        if name == PRESENT_RESULT:
            why += " (presentResult is advertised only with result_schema=...)"
        elif name in MANAGEMENT_TOOL_NAMES:
            why += " (the management tools are advertised only with builtin_tools on)"
        raise PatternError(f"{where}(tool_choice=...): {why}") from None
    return value


def advertised_schema(schema: Any) -> Any:
    """``schema`` as a model is shown it: each ``{"asCell": true, ...}`` (a place that takes
    a cell) becomes the two forms a cell may be given in (a path string or a link object),
    described in words, with what the cell holds; no internal marker is left."""
    if isinstance(schema, list):
        return [advertised_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("asCell") is True:
        rest = {k: v for k, v in schema.items() if k not in ("asCell", "description")}
        words = _CELL_WORDS
        if rest:
            words += f", whose value follows {json.dumps(advertised_schema(rest), sort_keys=True)}"
        described = schema.get("description")
        if isinstance(described, str) and described.strip():
            words = f"{described.strip()} ({words})"
        return {"description": words + ".", "anyOf": _CELL_FORMS}
    return {k: advertised_schema(v) for k, v in schema.items()
            if not (k == "asCell" and isinstance(v, bool))}


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with local ``$ref``s replaced by what they name (models advertise better
    without indirection); a recursive ref is left as it is."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}

    def walk(node: Any, seen: frozenset[str]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
                target = ref.rsplit("/", 1)[1]
                if target in defs and ref not in seen:
                    rest = {k: v for k, v in node.items() if k != "$ref"}
                    return {**walk(defs[target], seen | {ref}), **walk(rest, seen)}
            return {k: walk(v, seen) for k, v in node.items() if k not in ("$defs", "definitions")
                    or node is not schema}
        if isinstance(node, list):
            return [walk(v, seen) for v in node]
        return node

    out = walk(schema, frozenset())
    if "$ref" in json.dumps(out):  # a recursive ref is left: keep what it names
        out.update({k: schema[k] for k in ("$defs", "definitions") if k in schema})
    return out


tool_result_cell: ContextVar[Cell | None] = ContextVar("celldialog_tool_result", default=None)


def tool_result() -> Cell:
    """Inside a handler the dialog runs as a tool: the cell whose value becomes the tool's
    result for the model (``tool_result().set({"added": title})``). Without a write the
    model is told "<tool> done."."""
    cell = tool_result_cell.get()
    if cell is None:
        raise PatternError(
            "tool_result() is only known while a dialog runs this handler as a tool call")
    return cell
