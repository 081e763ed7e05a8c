"""The six management tools a dialog gives its model: ``read``, ``invoke``, ``schema``,
``pin``, ``unpin`` and ``updateArgument``.

``MANAGEMENT_TOOLS`` are their declarations (what the model is told); ``Management`` runs
them against a ``Runtime`` on behalf of one dialog. Nothing here knows the dialog's
internals: it is given the runtime, the dialog's space and scope key, and a pins cell.

**Paths.** The model names a cell as ``"/<id>/<path>"`` (a JSON pointer: the document id,
then object keys or list indexes), as a link ``{"@link": "/<id>/<path>"}`` (with an
optional ``"scope"``), or as a JSON string holding such a link. A path resolves *as if a
document in the dialog's scope held it*: only the scopes that scope may reach (shared; the
dialog's user; the dialog's session) are looked in, so another user's or session's
documents are never reached, whatever the model writes. A path without a scope names the
document with that id in the narrowest reachable scope that has one (the dialog's session,
then its user, then the shared space). Paths this module hands to the model (in values,
pins, the "Available Cells" section) carry a scope only where a bare path would resolve
elsewhere.

**Outcomes.** ``await Management.call(name, args)`` never raises for a bad call: it returns
a ``ToolOutcome`` (text, ``is_error``) whose text, for an error, says what a correct call
looks like. Cancellation still propagates.

**Links the model sends** (in ``invoke`` events and ``updateArgument`` values) are accepted
only where the schema there asks for a link (``{"asCell": true}``); each is resolved like a
path (so it may only reach the dialog's scopes, and the target's scopes) and stored with its
scope made explicit. Elsewhere a link is refused before anything is sent or written.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..cells import (
    MISSING,
    PATTERN_REF,
    STREAM_MARKER,
    Cell,
    DocKey,
    Instance,
    Path,
    Pattern,
    Runtime,
    Scope,
    Stream,
    admit_links,
    as_link,
    is_link,
    make_link,
    parse_link,
    parse_pointer,
    pointer,
    subschema,
)
from ..errors import CelldialogError, ConflictError, LinkError, PathError, PatternError
from ..llm import Tool, ToolError, ToolResult

__all__ = ["MANAGEMENT_GUIDE", "MANAGEMENT_TOOLS", "MANAGEMENT_TOOL_NAMES", "READ_LIMIT",
           "VALUE_LIMIT", "Management", "ToolOutcome"]

log = logging.getLogger("celldialog.management")

READ_LIMIT = 8000  # characters of a value `read` returns
VALUE_LIMIT = 2000  # characters of a value shown in the "Available Cells" section
SCHEMA_LIMIT = 8000  # characters of a schema `schema` returns
_DETAIL = 500  # characters of an underlying error quoted back
_NAME_LIMIT = 200  # characters of a pin's name
MAX_PINS = 40  # cells pinned at once: each is listed in every later system prompt
PIN_RETRIES = 3  # a pin or unpin run again on fresh state after a conflict
T = TypeVar("T")
CELLS_LIMIT = 24_000  # characters of the whole "# Available Cells" section
_INFER_DEPTH = 8  # links followed when a schema is inferred from a value


# ---------------------------------------------------------------------------- declarations

_PATH = {
    "description": (
        'The cell: a path "/<id>/<path>" (document id, then keys or list indexes, e.g. '
        '"/abc123/items/0"), or a link {"@link": "/<id>/<path>"}.'
    ),
    "anyOf": [
        {"type": "string"},
        {"type": "object", "properties": {"@link": {"type": "string"},
                                          "scope": {"type": "string"}},
         "required": ["@link"]},
    ],
}

MANAGEMENT_TOOLS: tuple[Tool, ...] = (
    Tool(name="read", description=(
        "Read the current value of a cell, as JSON. Links inside it are followed; streams "
        'appear as {"$stream": "<path>"} (send them events with invoke). Large values are '
        "truncated: read a narrower path (a key or an index below it) to see more. Paths "
        'look like "/<id>/<path>" or {"@link": "/<id>/<path>"}.'),
        input_schema={"type": "object", "properties": {"path": _PATH}, "required": ["path"]}),
    Tool(name="invoke", description=(
        "Send an event to a stream (a handler, e.g. an entry shown as {\"$stream\": ...}) and "
        "run it; or run a pattern (an entry shown as {\"$pattern\": ...}) with `args` as its "
        "arguments, which returns where its result lives and what it holds. `args` is shaped "
        "as the schema tool says (without it, the call's fields other than `path` are the "
        "event). Returns a confirmation, or the error."),
        input_schema={"type": "object", "properties": {
            "path": _PATH,
            "args": {"description": "The event to send (any JSON; usually an object)."},
        }, "required": ["path"]}),
    Tool(name="schema", description=(
        "The JSON Schema of a cell (declared, or inferred from its value); for a stream, "
        "the schema of the events it takes. Use it before invoke or updateArgument."),
        input_schema={"type": "object", "properties": {"path": _PATH}, "required": ["path"]}),
    Tool(name="pin", description=(
        'Keep a cell in view: it is listed, with its current value, under "# Available '
        'Cells" in your instructions from your next step on, under `name`.'),
        input_schema={"type": "object", "properties": {
            "path": _PATH,
            "name": {"type": "string", "description": "A short name for the pinned cell."},
        }, "required": ["path", "name"]}),
    Tool(name="unpin", description="Remove a pin added with pin (give the same path).",
         input_schema={"type": "object", "properties": {"path": _PATH}, "required": ["path"]}),
    Tool(name="updateArgument", description=(
        "Change the arguments of a running pattern, which then recomputes. `path` is the "
        "pattern's result (or its argument) cell; `updates` maps argument names to new "
        'values, merged into the current arguments; a dotted key ("config.theme") sets a '
        "nested field and keeps its siblings."),
        input_schema={"type": "object", "properties": {
            "path": _PATH,
            "updates": {"type": "object", "description": (
                'Argument names (or dotted paths like "config.theme") to new values.')},
        }, "required": ["path", "updates"]}),
)

MANAGEMENT_TOOL_NAMES = tuple(t.name for t in MANAGEMENT_TOOLS)

MANAGEMENT_GUIDE = (
    "# Cells\n"
    "The application's state is cells. A cell is named by a path \"/<id>/<path>\": a "
    "document id, then object keys or list indexes (\"/abc123/items/0\"); the same path can "
    "be written as a link {\"@link\": \"/<id>/<path>\"}. Tools: read (a cell's value), "
    "schema (its JSON Schema, or the events a stream takes), invoke (send an event to a "
    "stream: values shown as {\"$stream\": \"<path>\"}), updateArgument (change the "
    "arguments of a running pattern, given its result path), pin / unpin (keep a cell "
    "listed under \"# Available Cells\")."
)

_USAGE = {
    "read": '{"path": "/<id>/<path>"}, e.g. {"path": "/abc123/items"}',
    "invoke": '{"path": "/<id>/<stream>", "args": {...the event...}}, e.g. '
              '{"path": "/abc123/add", "args": {"title": "milk"}}',
    "schema": '{"path": "/<id>/<path>"}, e.g. {"path": "/abc123/items"}',
    "pin": '{"path": "/<id>/<path>", "name": "a short name"}, e.g. '
           '{"path": "/abc123/items", "name": "todo items"}',
    "unpin": '{"path": "/<id>/<path>"} with the path of a pin, e.g. {"path": "/abc123/items"}',
    "updateArgument": '{"path": "/<id>", "updates": {"<argument>": value}} with the path of '
                      'a pattern\'s result, e.g. {"path": "/abc123", "updates": '
                      '{"title": "Groceries", "config.theme": "dark"}}',
}


@dataclass(frozen=True)
class ToolOutcome:
    """What a management tool answers: its text (JSON for values) and whether it failed."""

    text: str
    is_error: bool = False

    def as_tool_result(self, tool_use_id: str = "") -> ToolResult:
        """The port's ``ToolResult`` (the step engine sets the call's id if it differs)."""
        return ToolResult(tool_use_id=tool_use_id, content=self.text, is_error=self.is_error)


class _Refused(Exception):
    """A bad call: the message is what the model is told."""


@dataclass(frozen=True)
class _Target:
    key: DocKey
    path: Path


# ---------------------------------------------------------------------------- the tools


class Management:
    """The management tools of one dialog.

    ``rt``: the runtime. ``space`` / ``scope``: the dialog's space and scope key (its
    state's, e.g. ``node.space`` and ``node.scope.key``); paths resolve as if held by a
    document there. ``pins``: a cell holding the pins, a list of ``{"path", "name"}`` (plus
    ``"scope"`` where a bare path would resolve elsewhere); ``space`` and ``scope`` default
    to the pins cell's own.
    """

    def __init__(self, rt: Runtime, *, pins: Cell, space: str | None = None,
                 scope: str | None = None, read_limit: int = READ_LIMIT,
                 own_streams: frozenset[DocKey] = frozenset()) -> None:
        if not isinstance(pins, Cell):
            raise PatternError(f"Management(pins=...) takes a Cell, got {pins!r}")
        self.rt = rt
        self.docs = rt.docs
        self.pins = pins
        self.space = pins.space if space is None else space
        scope = pins.scope if scope is None else scope
        try:
            self._scope = Scope.parse(scope)
        except LinkError:
            raise PatternError(f"Management(scope=...) takes a scope key, got {scope!r}"
                               ) from None
        self.scope = scope
        self.base = DocKey(self.space, scope, "")
        self.read_limit = read_limit
        self.own_streams = own_streams  # the dialog's own inputs: never sent to by its model

    async def call(self, name: str, args: dict[str, Any]) -> ToolOutcome:
        """Run the tool ``name`` with the model's ``args``. Never raises for a bad call."""
        tool = _TOOLS.get(name) if isinstance(name, str) else None
        if tool is None:
            return ToolOutcome(f"Unknown management tool {_short(name)}; they are "
                               f"{', '.join(MANAGEMENT_TOOL_NAMES)}.", True)
        if not isinstance(args, dict):
            return ToolOutcome(f"{name} takes an object of arguments, got "
                               f"{type(args).__name__}. Call it as {_USAGE[name]}.", True)
        try:
            return await tool(self, args)
        except _Refused as e:
            return ToolOutcome(f"{e} Call {name} as {_USAGE[name]}.", True)
        except Exception as e:  # never an exception escaping to the model's loop
            if not isinstance(e, CelldialogError):
                log.warning("management tool %s failed", name, exc_info=True)
            return ToolOutcome(f"{name} failed: {_describe(e)}. Call {name} as "
                               f"{_USAGE[name]}.", True)

    # -- read ------------------------------------------------------------------------

    async def _read(self, args: dict[str, Any]) -> ToolOutcome:
        target = self._target(args)
        key, path, value = self._value_at(target)
        if self._is_stream(key, path, value):
            raise _Refused(f"{self._show(key, path)} is a stream, which has no value to read: "
                           "send it an event with invoke (see its events with schema).")
        return ToolOutcome(self._json(self._materialize(value, key), self.read_limit,
                                      self._show(target.key, target.path)))

    # -- invoke ----------------------------------------------------------------------

    async def _invoke(self, args: dict[str, Any]) -> ToolOutcome:
        target = self._target(args)
        key, path, value = self._value_at(target)
        if isinstance(value, dict) and set(value) == {PATTERN_REF}:
            # a capability, not a name: only a pattern a pattern's result offers at this
            # very place runs; the same shape written anywhere else is data
            pattern = self.rt.pattern_at(key, path)
            if pattern is None:
                raise _Refused(
                    f"{self._show(target.key, target.path)} holds data shaped like a pattern "
                    "reference, not a pattern offered to you: invoke runs the patterns that "
                    "a pattern's result shows (read it to find them), by their path there.")
            return self._run_pattern(pattern, _event_of(args))
        if key in self.own_streams:
            raise _Refused(
                f"{self._show(key, ())} is one of this dialog's own inputs (its messages, "
                "cancel and pins come from the user, not from you): answer in text instead.")
        if not self._is_stream(key, path, value):
            raise _Refused(
                f"{self._show(target.key, target.path)} is not a stream (it holds "
                f"{_kind(value)}): invoke sends events to streams, the entries read shows as "
                '{"$stream": "<path>"}. To change a pattern\'s arguments use updateArgument; '
                "to see a value use read.")
        stream = self._find_stream(key)
        if stream is None:
            raise _Refused(f"{self._show(key, ())} is a stream of a pattern that is not "
                           "running now, so nothing would handle the event.")
        event = self._accept_links(_event_of(args), stream.event_schema, (), stream.scope,
                                   "args")
        try:
            await self.rt.send(stream, event)
        except Exception as e:  # the handler's error, or the event's
            schema = stream.event_schema
            hint = (f" The stream takes events of this schema: {_cap(json.dumps(schema), 1500)}"
                    if schema is not None else "")
            return ToolOutcome(f"invoke of {self._show(key, ())} failed; nothing it did was "
                               f"kept: {_describe(e)}.{hint}", True)
        return ToolOutcome(f"Sent to {self._show(key, ())} (handler {stream.name}); it ran "
                           "and its changes were committed.")

    def _run_pattern(self, pattern: Pattern, event: Any) -> ToolOutcome:
        """Run a pattern a result offers, fresh (a new instance each time), in the dialog's
        space and scope, with ``event`` as its arguments."""
        if not isinstance(event, dict):
            raise _Refused(f"a pattern takes an object of arguments, got {_kind(event)}.")
        event = self._accept_links(event, pattern.argument_schema, (), self.scope, "args")
        scope = self._scope
        inst = self.rt.run(pattern, event, space=self.space, user=scope.user,
                           session=scope.session, cause=["invoke", uuid.uuid4().hex])
        return ToolOutcome(self._json({
            "@resultLocation": self._ref(inst.result.doc_key, ()),
            "result": self._materialize(inst.result.raw(), inst.result.doc_key),
        }, self.read_limit, f"the result of {pattern.name}"))

    # -- schema ----------------------------------------------------------------------

    async def _schema(self, args: dict[str, Any]) -> ToolOutcome:
        target = self._target(args)
        try:
            key, path, value = self._value_at(target)
        except _Refused:
            # nothing there yet: what its document's schema says a value there must be
            declared = self._declared_at(target)
            if declared is None:
                raise
            return ToolOutcome(_cap(json.dumps(declared, ensure_ascii=False), SCHEMA_LIMIT))
        if self._is_stream(key, path, value):
            stream = self._find_stream(key)
            schema = stream.event_schema if stream is not None else None
            out = schema if schema is not None else {
                "description": "any JSON event (the stream declares no schema)"}
        else:
            out = self._schema_of(key, path, value, 0, set())
        return ToolOutcome(_cap(json.dumps(out, ensure_ascii=False), SCHEMA_LIMIT))

    # -- pins ------------------------------------------------------------------------

    async def _pin(self, args: dict[str, Any]) -> ToolOutcome:
        target = self._target(args)
        name = args.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _Refused("pin needs a `name`: a short non-empty string.")
        name = _one_line(name)
        if not name:
            raise _Refused("pin needs a `name` with words in it, not only '#' or spaces.")
        if len(name) > _NAME_LIMIT:
            raise _Refused(f"the pin's name is {len(name)} characters; keep it under "
                           f"{_NAME_LIMIT}.")
        self._value_at(target)  # it must be there now
        ident = self._ident(target)

        def pin() -> ToolOutcome | None:
            pins = self._pin_list()
            for entry in pins:
                if self._entry_ident(entry) == ident:
                    return ToolOutcome(f"Already pinned, as {entry.get('name')!r}.")
            if len(pins) >= MAX_PINS:
                raise _Refused(f"{len(pins)} cells are pinned, the most there may be "
                               f"({MAX_PINS}); unpin one you no longer need first.")
            entry = self._entry(target, name)
            self.pins.set([*pins, entry])
            return None

        already = self._on_fresh_state(pin)
        if already is not None:
            return already
        return ToolOutcome(f"Pinned {self._show(target.key, target.path)} as {name!r}: it "
                           'is listed under "# Available Cells" from your next step on.')

    def _on_fresh_state(self, write: Callable[[], T]) -> T:
        """``write()`` in a transaction of its own, run again on a conflict (another
        process's write to the pins' record, brought by the change feed a moment later:
        the runtime has caught up, so the next run sees it), as a handler would be."""
        for attempt in range(PIN_RETRIES + 1):
            try:
                with self.rt.transaction():
                    return write()
            except ConflictError:
                if attempt == PIN_RETRIES:
                    raise
        raise AssertionError("unreachable")

    async def _unpin(self, args: dict[str, Any]) -> ToolOutcome:
        raw = args.get("path")
        target = self._target(args, must_exist=False)
        idents: set[Any] = {("path", self._show(target.key, target.path))}
        try:
            idents.add(self._ident(target))
        except CelldialogError:
            pass  # it is gone: match what the pin says

        def unpin() -> ToolOutcome | None:
            pins = self._pin_list()
            kept = [e for e in pins if self._entry_ident(e) not in idents
                    and ("path", self._entry_path(e)) not in idents]
            if len(kept) == len(pins):
                shown = ", ".join(f"{_short(e.get('path'), 120)} ({e.get('name')!r})"
                                  for e in pins) or "none"
                return ToolOutcome(f"Not found: {_short(raw)} is not pinned. Pinned: {shown}.",
                                   True)
            self.pins.set(kept)
            return None

        missing = self._on_fresh_state(unpin)
        if missing is not None:
            return missing
        return ToolOutcome(f"Unpinned {self._show(target.key, target.path)}.")

    def pin_from_pattern(self, path: Any, name: Any) -> None:
        """The pattern's ``pin_cell``: pin ``path`` (a link, or ``"/<id>/<path>"``) under
        ``name`` (the path if none). Inside the caller's transaction; a bad pin raises
        ``PatternError`` saying what to send instead."""
        if name is not None and not isinstance(name, str):
            raise PatternError(f"pin_cell's name must be a string, got {type(name).__name__}")
        if isinstance(name, str) and len(name) > _NAME_LIMIT:
            raise PatternError(f"pin_cell's name is {len(name):,} characters; keep it under "
                               f"{_NAME_LIMIT}")
        name = _one_line(name) if isinstance(name, str) else None
        if is_link(path):
            entry = {"path": path["@link"], "name": name or path["@link"]}
            if path.get("scope"):
                entry["scope"] = path["scope"]
        elif isinstance(path, str) and path.startswith("/"):
            entry = {"path": path, "name": name or path}
        else:
            raise PatternError(
                "pin_cell takes {'path': <a cell's link, cell.link(), or '/<id>/<path>'>, "
                f"'name': '...'}}, got path {_short(path)}")
        if len(entry["path"]) > 2 * _NAME_LIMIT + 1000:
            raise PatternError(f"pin_cell's path is {len(entry['path']):,} characters; give "
                               "the path of a cell (\"/<id>/<path>\")")
        pins = self._pin_list()
        if any(p.get("path") == entry["path"] and p.get("scope") == entry.get("scope")
               for p in pins):
            return  # already pinned
        if len(pins) >= MAX_PINS:
            raise PatternError(f"pin_cell: {len(pins)} cells are pinned, the most there may "
                               f"be ({MAX_PINS}); unpin some first (unpin_all_cells)")
        self.pins.push(entry)

    def pinned(self) -> list[dict[str, Any]]:
        """The pins as stored: ``[{"path", "name", "scope"?}]``."""
        return self._pin_list()

    def available_cells(self, context: Mapping[str, Cell] | None = None, *,
                        value_limit: int = VALUE_LIMIT) -> str:
        """The "# Available Cells" section of the system prompt: each context cell (by its
        key), then each pin (by its name), with the path the tools take, its schema and its
        current value (truncated to ``value_limit`` characters). ``""`` when there is none.
        Never raises: a cell that cannot be read says so. The section holds at most
        ``CELLS_LIMIT`` characters (and ``MAX_PINS`` pins): what does not fit is counted,
        not shown."""
        lines: list[str] = []
        entries: list[list[str]] = []
        for name, c in (context or {}).items():
            try:
                link = c.link()
                key, path = parse_link(link, DocKey(c.space, c.scope, c.id))
                entries.append(self._entry_lines(_cap(_one_line(str(name)), _NAME_LIMIT),
                                                 _Target(key, path), value_limit, c.schema))
            except Exception as e:
                entries.append([f"## {name}", f"(unavailable: {_describe(e)})"])
        for entry in self._pin_list(copy=False)[:MAX_PINS]:
            name = _cap(_one_line(str(entry.get("name", ""))), _NAME_LIMIT)
            try:
                target = self._target({"path": self._entry_ref(entry)})
                entries.append(self._entry_lines(name, target, value_limit, None))
            except Exception as e:
                entries.append([f"## {name}", f"path: {_cap(self._entry_path(entry), 300)}",
                                f"(unavailable: {_describe(e)})"])
        used = 0
        for n, block in enumerate(entries):
            size = sum(len(line) + 1 for line in block)
            if used + size > CELLS_LIMIT:
                rest = len(entries) - n
                lines.append(f"({rest} more cell{'s' * (rest != 1)} not shown: this section "
                             f"holds {CELLS_LIMIT:,} characters; read them with read, or "
                             "unpin what you no longer need)")
                break
            lines += block
            used += size
        return "\n".join(["# Available Cells", *lines]) if lines else ""

    def _entry_lines(self, name: str, target: _Target, limit: int,
                     schema: dict[str, Any] | None) -> list[str]:
        key, path, value = self._value_at(target)
        out = [f"## {name}", f"path: {json.dumps(self._ref(target.key, target.path))}"]
        if self._is_stream(key, path, value):
            return [*out, "a stream: send it events with invoke"]
        if schema is None:
            schema = self._schema_of(key, path, value, 0, set())
        out.append("schema: " + _cap(json.dumps(schema, sort_keys=True), limit))
        out.append("value: " + self._json(self._materialize(value, key), limit))
        return out

    def _pin_list(self, *, copy: bool = True) -> list[dict[str, Any]]:
        """The pins' entries; ``copy=False`` for a read-only look (every step's prompt)."""
        try:
            value = self.pins.raw(copy=copy)
        except PathError:
            value = None
        return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []

    def _entry(self, target: _Target, name: str) -> dict[str, Any]:
        ref = self._ref(target.key, target.path)
        if isinstance(ref, str):
            return {"path": ref, "name": name}
        return {"path": ref["@link"], "name": name, "scope": ref["scope"]}

    @staticmethod
    def _entry_ref(entry: dict[str, Any]) -> Any:
        path = entry.get("path")
        scope = entry.get("scope")
        if isinstance(path, str) and isinstance(scope, str):
            return {"@link": path, "scope": scope}
        return path

    def _entry_path(self, entry: dict[str, Any]) -> str:
        ref = self._entry_ref(entry)
        return ref if isinstance(ref, str) else json.dumps(ref)

    def _entry_ident(self, entry: dict[str, Any]) -> Any:
        try:
            target = self._target({"path": self._entry_ref(entry)})
            return self._ident(target)
        except (_Refused, CelldialogError):
            return ("path", self._entry_path(entry))

    def _ident(self, target: _Target) -> Any:
        """Which cell a pin names: its links followed, so every spelling of one cell (the
        result's entry, the cell's own document) is one pin."""
        key, path, _ = self.docs.resolve(target.key, target.path)
        return ("cell", key, tuple(str(t) for t in path))

    # -- updateArgument ----------------------------------------------------------------

    async def _update_argument(self, args: dict[str, Any]) -> ToolOutcome:
        target = self._target(args)
        inst = self._instance_of(target.key)
        if inst is None:
            raise _Refused(
                f"{self._show(target.key, target.path)} is not the result or the argument of a "
                "running pattern: give the path of a pattern's result (the document whose "
                "entries are its cells and streams).")
        updates = args.get("updates")
        if not isinstance(updates, dict) or not updates:
            raise _Refused("`updates` must be a non-empty object of argument names (or "
                           'dotted paths like "config.theme") to new values.')
        names, open_ended = _argument_names(inst)
        steps: list[tuple[tuple[str, ...], Any]] = []
        for dotted, value in updates.items():
            parts = tuple(dotted.split("."))
            if not dotted or any(not p for p in parts):
                raise _Refused(f"{dotted!r} is not an argument name or a dotted path like "
                               '"config.theme".')
            if parts[0] not in names and not open_ended:
                raise _Refused(f"pattern {inst.pattern.name} has no argument {parts[0]!r}; "
                               f"its arguments are {', '.join(sorted(names)) or 'none'}.")
            schema = subschema(inst.pattern.argument_schema, parts)
            steps.append((parts, self._accept_links(value, schema, parts, inst.argument.scope,
                                                    f"updates[{dotted!r}]")))
        argument = inst.argument
        try:
            with self.rt.transaction():
                for parts, value in steps:
                    _write_nested(argument, parts, value)
        except (_Refused, CelldialogError) as e:
            schema = inst.pattern.argument_schema
            return ToolOutcome(
                f"updateArgument changed nothing: {_describe(e)}. The arguments of "
                f"{inst.pattern.name} follow this schema: {_cap(json.dumps(schema), 1500)}; "
                f"now they are {_cap(json.dumps(argument.get(None)), 1500)}.", True)
        now = self._json(self._materialize(argument.raw(), DocKey(
            argument.space, argument.scope, argument.id)), VALUE_LIMIT)
        return ToolOutcome(f"Updated the arguments of {inst.pattern.name}; they are now {now}.")

    def _instance_of(self, key: DocKey) -> Instance | None:
        inst = self.rt.instance_of(key)
        if inst is None or inst.stopped:
            return None
        return inst

    # -- paths -----------------------------------------------------------------------

    def _target(self, args: dict[str, Any], *, must_exist: bool = True) -> _Target:
        """The cell a tool's ``path`` names, in a scope the dialog may reach."""
        raw = args.get("path", MISSING)
        if raw is MISSING:
            raise _Refused("`path` is missing.")
        link = as_link(raw)
        if link is None:
            raise _Refused(
                f"{_short(raw)} is not a path: write \"/<id>/<path>\" (starting with '/', the "
                "document id first) or {\"@link\": \"/<id>/<path>\"}.")
        return self._locate(link, self._scope.reachable, must_exist)

    def _locate(self, link: dict[str, Any], scopes: tuple[str, ...], must_exist: bool
                ) -> _Target:
        try:
            tokens = parse_pointer(link["@link"])
        except ValueError:
            tokens = ()
        if not tokens or not tokens[0]:
            raise _Refused(f"{_short(link['@link'])} names no document: a path starts with "
                           "'/' and the document id, as in \"/abc123/items\".")
        doc_id, path = str(tokens[0]), tuple(tokens[1:])
        scope = link.get("scope")
        if scope is not None:
            if scope not in scopes:
                raise _Refused(f"/{_cap(doc_id, 80)} in scope {_short(scope)} cannot be reached "
                               "from here: only your own space and scope are; give the path "
                               "without a scope.")
            key = DocKey(self.space, scope, doc_id)
            if must_exist and not self._exists(key):
                raise _Refused(self._no_document(doc_id))
            return _Target(key, path)
        for s in reversed(scopes):  # the narrowest first
            key = DocKey(self.space, s, doc_id)
            if self._exists(key):
                return _Target(key, path)
        if must_exist:
            raise _Refused(self._no_document(doc_id))
        return _Target(DocKey(self.space, scopes[-1], doc_id), path)

    @staticmethod
    def _no_document(doc_id: str) -> str:
        return (f"There is no document /{_cap(doc_id, 80)} that you can reach (check the id: "
                "use a path from your instructions or from a value you read).")

    def _exists(self, key: DocKey) -> bool:
        try:
            self.docs.doc(key)
        except CelldialogError:
            return False
        return True

    def _value_at(self, target: _Target) -> tuple[DocKey, Path, Any]:
        try:
            key, path, value = self.docs.resolve(target.key, target.path)
        except LinkError as e:
            raise _Refused(f"{self._show(target.key, target.path)} cannot be followed: "
                           f"{_describe(e)}.") from None
        except PathError:
            value, key, path = MISSING, target.key, target.path
        if value is MISSING:
            raise _Refused(self._missing(target))
        return key, path, value

    def _missing(self, target: _Target) -> str:
        where = self._show(target.key, target.path)
        for n in range(len(target.path) - 1, -1, -1):
            try:
                _, _, parent = self.docs.resolve(target.key, target.path[:n])
            except CelldialogError:
                continue
            if parent is MISSING:
                continue
            above = self._show(target.key, target.path[:n])
            if isinstance(parent, dict) and not is_link(parent):
                names = sorted(parent)
                keys = ", ".join(names[:20]) + (f", ... ({len(names)} in all)"
                                                if len(names) > 20 else "")
                return f"Nothing at {where}: {above} is an object with keys [{keys}]."
            if isinstance(parent, list):
                return (f"Nothing at {where}: {above} is a list of {len(parent)} items"
                        + (f" (indexes 0 to {len(parent) - 1})." if parent else "."))
            return f"Nothing at {where}: {above} is {_kind(parent)}, not an object or a list."
        return f"Nothing at {where}."

    def _ref(self, key: DocKey, path: Path) -> str | dict[str, Any]:
        """How the model should write the path to ``key``/``path``: the bare string, or a
        link with its scope where the bare string would resolve to another scope."""
        text = f"/{key.id}{pointer(path)}"
        reach = self._scope.reachable
        bare = next((s for s in reversed(reach) if self._exists(DocKey(self.space, s, key.id))),
                    reach[-1])  # where the bare path resolves (the narrowest scope first)
        return text if bare == key.scope else {"@link": text, "scope": key.scope}

    def _show(self, key: DocKey, path: Path) -> str:
        ref = self._ref(key, path)
        return ref if isinstance(ref, str) else json.dumps(ref)

    # -- streams -----------------------------------------------------------------------

    def _is_stream(self, key: DocKey, path: Path, value: Any) -> bool:
        if path or value != STREAM_MARKER:
            return False
        doc = self.docs.doc(key)
        return doc.readonly is not None and not doc.derived

    def _find_stream(self, key: DocKey) -> Stream | None:
        """The live ``Stream`` of a stream document (builtin nodes' streams too)."""
        return self.rt.stream_at(key)

    # -- values ------------------------------------------------------------------------

    def _materialize(self, value: Any, key: DocKey) -> Any:
        """A copy of ``value`` with links followed (streams shown as
        ``{"$stream": <path>}``; a link that cannot be followed as null)."""

        def stream_as_ref(tkey: DocKey, tpath: Any, tv: Any) -> Any:
            if self._is_stream(tkey, tpath, tv):
                return {"$stream": self._ref(tkey, ())}
            return MISSING

        return self.docs.materialize(value, key, stream_as_ref)

    def _json(self, value: Any, limit: int, where: str = "") -> str:
        text = json.dumps(value, ensure_ascii=False)
        if len(text) <= limit:
            return text
        if isinstance(value, dict):
            names = list(value)
            more = (f"it is an object with keys [{', '.join(names[:20])}"
                    + (f", ... ({len(names)} in all)" if len(names) > 20 else "") + "]")
        elif isinstance(value, list):
            more = f"it is a list of {len(value)} items"
        else:
            more = f"it is {_kind(value)}"
        hint = f"; read a narrower path such as {where}/<key or index>" if where else ""
        note = f" ... [truncated: {len(text)} characters in all; {more}{hint}]"
        return text[: max(0, limit - len(note))] + note

    def _declared_at(self, target: _Target) -> dict[str, Any] | None:
        """The declared schema at a path that holds nothing (yet), links on the way
        followed as far as they go."""
        for n in range(len(target.path), -1, -1):
            try:
                key, path, value = self.docs.resolve(target.key, target.path[:n])
            except CelldialogError:
                continue
            if value is MISSING or self._is_stream(key, path, value):
                continue
            schema = subschema(self.docs.doc(key).schema, (*path, *target.path[n:]))
            return None if schema is None else self._with_defs(schema, key)
        return None

    def _with_defs(self, schema: dict[str, Any], key: DocKey) -> dict[str, Any]:
        root = self.docs.doc(key).schema
        if root is not None and schema is not root and "$ref" in json.dumps(schema):
            return {**schema, **{k: root[k] for k in ("$defs", "definitions") if k in root}}
        return schema

    def _schema_of(self, key: DocKey, path: Path, value: Any, depth: int,
                   seen: set[Any]) -> dict[str, Any]:
        """The declared schema at ``key``/``path``, else one inferred from ``value``
        (following links to their targets' schemas)."""
        declared = subschema(self.docs.doc(key).schema, path)
        if declared is not None:
            return self._with_defs(declared, key)
        return self._infer(value, key, depth, seen)

    def _infer(self, value: Any, holder: DocKey, depth: int, seen: set[Any]
               ) -> dict[str, Any]:
        if isinstance(value, dict):
            if is_link(value):
                try:
                    target, path = parse_link(value, holder)
                    mark = (target, path)
                    if mark in seen or depth >= _INFER_DEPTH:
                        return {}
                    tkey, tpath, tv = self.docs.resolve(target, path)
                except CelldialogError:
                    return {}
                if tv is MISSING:
                    return {}
                if self._is_stream(tkey, tpath, tv):
                    stream = self._find_stream(tkey)
                    ev = stream.event_schema if stream is not None else None
                    return {"asStream": True, "event": ev if ev is not None else {}}
                return self._schema_of(tkey, tpath, tv, depth + 1, seen | {mark})
            return {"type": "object", "properties": {
                k: self._infer(v, holder, depth, seen) for k, v in value.items()}}
        if isinstance(value, list):
            return {"type": "array", "items": self._infer(value[0], holder, depth, seen)
                    } if value else {"type": "array"}
        return {"type": _json_type(value)}

    def accept_input(self, value: Any, stream: Stream, where: str) -> Any:
        """The model's input for ``stream``'s handler with its links checked and made
        explicit, as ``invoke`` does (a path, a link, or a JSON string holding one, only
        where the event schema asks for a cell); raises ``ToolError`` saying what to send
        instead."""
        try:
            return self._accept_links(value, stream.event_schema, (), stream.scope, where)
        except _Refused as e:
            raise ToolError(str(e)) from None

    def _accept_links(self, value: Any, schema: Any, at: tuple[Any, ...], holder_scope: str,
                      where: str) -> Any:
        """The model's ``value`` with its links checked by the graph's one policy
        (``runtime.cells.admit_links``: only where ``schema`` asks for a cell), each resolved
        like a path within the scopes both the dialog and the document receiving it may
        reach, and written with its scope explicit."""

        def resolve(link: dict[str, Any], holder: tuple[str, ...]) -> dict[str, Any]:
            scopes = tuple(s for s in self._scope.reachable if s in holder)
            target = self._locate(link, scopes, True)
            self._value_at(target)
            return make_link(target.key, target.path)

        try:
            return admit_links(value, schema, holder_scope, resolve, where=where, at=at)
        except LinkError as e:
            raise _Refused(str(e)) from None


# ---------------------------------------------------------------------------- helpers


_TOOLS: dict[str, Callable[[Management, dict[str, Any]], Awaitable[ToolOutcome]]] = {
    "read": Management._read, "invoke": Management._invoke, "schema": Management._schema,
    "pin": Management._pin, "unpin": Management._unpin,
    "updateArgument": Management._update_argument,
}  # the tools by name: one table, not a dict of bound methods per Management


def _one_line(name: str) -> str:
    """A name as it may appear in the system prompt: one line (whitespace runs become one
    space), no leading "#" (it would open a heading of its own), so a name the model or a
    user chose can add no structure to the instructions."""
    return " ".join(name.split()).lstrip("# ").strip()


def _event_of(args: dict[str, Any]) -> Any:
    """The event an ``invoke`` sends: its ``args``; without them, the call's other fields
    (models often write ``{"path": ..., "title": "milk"}``)."""
    if "args" in args:
        return args["args"]
    return {k: v for k, v in args.items() if k != "path"}


def _write_nested(argument: Cell, parts: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at the dotted ``parts`` of the argument, creating the objects that are
    missing on the way (a null counts as missing)."""
    for n in range(1, len(parts)):
        try:
            here = argument.key(*parts[:n]).raw()
        except PathError:
            here = MISSING
        if here is MISSING or here is None:
            nested: Any = value
            for p in reversed(parts[n:]):
                nested = {p: nested}
            argument.key(*parts[:n]).set(nested)
            return
        if not isinstance(here, dict | list):
            raise _Refused(f"{'.'.join(parts[:n])} is {_kind(here)}, so it has no field "
                           f"{parts[n]!r}")
    argument.key(*parts).set(value)


def _argument_names(inst: Instance) -> tuple[set[str], bool]:
    """The pattern's argument names, and whether it takes any others (``**kwargs``)."""
    params = inst.pattern.signature.parameters.values()
    names = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return f"a {_json_type(value)}"


def _describe(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if not isinstance(e, CelldialogError):
        text = f"{type(e).__name__}: {text}"
    return _cap(text.rstrip("."), _DETAIL)


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return _cap(text, limit)
