"""``celldialog mcp PATTERN``: a pattern's handlers as MCP tools, served over stdio.

One instance of the pattern runs in a Runtime for the life of the server. Its tools are
the streams of its result whose handler has an event schema (a handler taking any event
cannot tell a client what to send). A call sends its arguments as the event, waits until
the runtime settles (dialog turns the event started included) and answers with the
instance's state: its cells' values as JSON, also as ``structuredContent``. A refused
event answers ``isError`` with the reason; the state is unchanged (a failed handler commits
nothing).

An MCP tool's input is an object; a handler whose event is not one (``set_notes`` takes a
string) is advertised as ``{"event": <its schema>}`` and called with what is under
``event``. Built on the official SDK's low-level ``Server``: the schemas are the handlers'
own, not derived from Python signatures.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from .common import pattern_args, scope_options, store_option, store_url

if TYPE_CHECKING:
    from ..cells import Instance, Pattern, Runtime

__all__ = ["command", "tools_of"]

WRAPPED = "event"  # the key a non-object event travels under


@click.command(name="mcp")
@click.argument("pattern")
@click.option("--args", "args_json", default=None, metavar="JSON",
              help="The pattern's arguments, a JSON object.")
@store_option("memory")
@scope_options
@click.option("--model", default=None, metavar="NAME",
              help="The model the pattern's dialogs use (default: as `celldialog models`).")
def command(pattern: str, args_json: str | None, store: str | None, space: str,
            user: str | None, session: str | None, model: str | None) -> None:
    """Serve PATTERN's handler tools as an MCP server on stdin/stdout (for an MCP client
    to start: command `celldialog`, args `mcp PATTERN ...`)."""
    args = pattern_args(args_json)
    url = store_url(store, "memory")

    from .loading import load_pattern

    target = load_pattern(pattern)

    import anyio

    anyio.run(_serve, target, args, url, space, user, session, model)


def tools_of(inst: Instance) -> dict[str, tuple[dict[str, Any], bool, str]]:
    """Tool name -> (input schema, wrapped, description) for the instance's handler tools."""
    out: dict[str, tuple[dict[str, Any], bool, str]] = {}
    for name, stream in sorted(inst.streams.items()):
        schema = stream.event_schema
        if schema is None:
            continue
        wrapped = schema.get("type") != "object"
        if wrapped:
            schema = {"type": "object", "properties": {WRAPPED: schema},
                      "required": [WRAPPED]}
        doc = (stream.handler.fn.__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(doc.split()) or f"Send an event to {name}."
        out[name] = (schema, wrapped, f"{doc} Returns the pattern's state after the event.")
    return out


async def _serve(pattern: Pattern, args: dict[str, Any] | None, url: str, space: str,
                 user: str | None, session: str | None, model_name: str | None) -> None:
    from .. import Runtime
    from .common import DeferredModel, start

    model = DeferredModel(model_name)
    try:
        async with Runtime(store=url, model=model) as rt:
            inst = start(rt, pattern, args, space, user, session)
            await _run_server(rt, inst, pattern)
    finally:
        await model.aclose()


async def _run_server(rt: Runtime, inst: Instance, pattern: Pattern) -> None:
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    from ..errors import CelldialogError
    from .common import result_state
    from .errors import redact

    tools = tools_of(inst)
    listed = [types.Tool(name=name, description=desc, input_schema=schema)
              for name, (schema, _, desc) in tools.items()]

    def state() -> types.CallToolResult:
        value = result_state(inst)
        structured = value if isinstance(value, dict) else {"result": value}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(value, ensure_ascii=False))],
            structured_content=structured)

    def refused(text: str) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=redact(text))],
                                    is_error=True)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        entry = tools.get(params.name)
        if entry is None:
            return refused(f"unknown tool {params.name!r}; the tools: {', '.join(tools)}")
        _, wrapped, _ = entry
        arguments = dict(params.arguments or {})
        if wrapped and WRAPPED not in arguments:
            return refused(f"{params.name} takes its event under {WRAPPED!r}: "
                           f'{{"{WRAPPED}": ...}}')
        event = arguments[WRAPPED] if wrapped else arguments
        try:
            await inst.send(params.name, event)
            await rt.settled()
        except CelldialogError as e:
            return refused(f"{params.name} refused the event: {e}")
        return state()

    server: Server[Any] = Server(
        "celldialog", version=_version(),
        instructions=f"Tools of the celldialog pattern {pattern.key}: each sends an event to "
                     "one of its handlers and returns the pattern's state afterwards.",
        on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("celldialog")
    except PackageNotFoundError:
        return "0"
