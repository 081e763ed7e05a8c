"""``llm_dialog``: a conversation with a model that lives in the cell graph.

The dialog's state is cells (``pending``, ``partial``, ``error``, ``usage``, ``result``...),
scoped like the ``messages`` cell it is given; its inputs are streams (``add_message``,
``cancel_generation``). A turn reads as a pipeline::

    add_message -> accept (one commit: pending, the user message, a new turn id)
                -> spawn the turn -> run_steps (the port's step engine)
                -> each message appended, guarded by the turn id -> the end (pending false)

Every write a turn makes happens only while its turn id is still the current one, so a late
reply to a cancelled turn lands nowhere. Tools are routed to bound handler streams: a handler
tool runs in its own transaction and may write the caller's state it was bound with.

The six management tools (``read``, ``invoke``, ``schema``, ``pin``, ``unpin``,
``updateArgument``) come from ``management.py``. Not here yet (see the issue): pattern tools,
heartbeats for several processes.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import anyio

from ..cells import Cell, Pattern, Stream, current_runtime
from ..cells.builtin import BuiltinNode
from ..cells.documents import Transaction
from ..cells.jsonpath import is_link
from ..cells.runtime import Runtime
from ..errors import ConflictError, PatternError
from ..llm import (
    TOOL_CANCELLED,
    CacheHint,
    Message,
    Model,
    Request,
    Role,
    StepSink,
    StepsOutcome,
    StepsStatus,
    TextBlock,
    Tool,
    ToolError,
    ToolResult,
    ToolUse,
    Usage,
    resolve_model,
    run_steps,
)
from .management import MANAGEMENT_GUIDE, MANAGEMENT_TOOL_NAMES, MANAGEMENT_TOOLS, Management

__all__ = ["PRESENT_RESULT", "Dialog", "llm_dialog", "tool_result"]

log = logging.getLogger("celldialog.dialog")

PRESENT_RESULT = "presentResult"
ERROR_PREFIX = "I encountered an error generating a response"
PARTIAL_INTERVAL = 0.25  # seconds between writes of streamed text into `partial`
TAKEOVER_AFTER = 300.0  # seconds without a heartbeat after which a pending turn is dead
VALUE_LIMIT = 2000  # characters of a context cell's value shown to the model

_USAGE_ZERO = {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
               "cache_write_tokens": 0}


@dataclass(frozen=True)
class Dialog:
    """The outputs of ``llm_dialog``: put them in the pattern's result as you need them."""

    pending: Cell
    add_message: Stream
    cancel_generation: Stream
    result: Cell
    partial: Cell
    error: Cell
    usage: Cell
    dropped: Cell
    pinned_cells: Cell
    pin_cell: Stream
    unpin_all_cells: Stream
    flattened_tools: list[dict[str, Any]]


@dataclass(frozen=True)
class _ToolSpec:
    tool: Tool
    stream: Stream | None  # None: a pattern tool or a built-in (management, presentResult)
    pattern: Pattern | None = None  # a pattern tool: run fresh for each call


def llm_dialog(messages: Cell, *, system: str | Cell | None = None,
               tools: Mapping[str, Any] | None = None, model: str | Model | None = None,
               max_tokens: int | None = None, context: Mapping[str, Cell] | None = None,
               builtin_tools: bool = True, result_schema: dict[str, Any] | None = None,
               max_steps: int = 50, name: str | None = None,
               takeover_after: float = TAKEOVER_AFTER) -> Dialog:
    """A dialog over ``messages`` (a cell holding the port's messages as JSON). Call it
    inside a ``@pattern``; send a string (or a user message) to ``add_message``.

    ``system`` is a string, or a Cell holding one (read at every step, so an edit applies
    from the next model call). ``takeover_after`` (seconds of the runtime's clock): a turn
    whose heartbeat is older is taken to be dead (its process stopped), and the next message
    starts a new turn."""
    if not isinstance(messages, Cell):
        raise PatternError(f"llm_dialog(messages=...) takes a Cell, got {messages!r}")
    context = dict(context or {})
    for key, c in context.items():
        if not isinstance(c, Cell):
            raise PatternError(f"llm_dialog context {key!r} must be a Cell, got {c!r}")
    catalog = _catalog(tools or {}, builtin_tools, result_schema)
    if system is not None and not isinstance(system, str | Cell):
        raise PatternError(f"llm_dialog(system=...) takes a string or a Cell holding one, "
                           f"got {type(system).__name__}")
    inputs = [messages, *context.values(), *([system] if isinstance(system, Cell) else [])]
    node = BuiltinNode("llm_dialog", inputs, name=name)
    turn = _Turns(node, messages, system, catalog, model, max_tokens, context, max_steps,
                  builtin_tools is not False, takeover_after)
    return Dialog(
        pending=turn.pending, add_message=turn.add_stream, cancel_generation=turn.cancel_stream,
        result=turn.result, partial=turn.partial, error=turn.error, usage=turn.usage,
        dropped=turn.dropped, pinned_cells=turn.pins, pin_cell=turn.pin_stream,
        unpin_all_cells=turn.unpin_all_stream,
        flattened_tools=[s.tool.model_dump(mode="json") for s in catalog.values()],
    )


def _catalog(tools: Mapping[str, Any], builtin_tools: bool,
             result_schema: dict[str, Any] | None) -> dict[str, _ToolSpec]:
    builtins_on = builtin_tools is not False
    reserved = {PRESENT_RESULT, *(MANAGEMENT_TOOL_NAMES if builtins_on else ())}
    out: dict[str, _ToolSpec] = {}
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
        out[tool_name] = _ToolSpec(
            Tool(name=tool_name, description=spec.get("description", ""),
                 input_schema=_inline_refs(schema)), stream,
            tool_pattern if isinstance(tool_pattern, Pattern) else None)
    if builtins_on:  # after the pattern's own tools, before presentResult
        for tool in MANAGEMENT_TOOLS:
            out[tool.name] = _ToolSpec(tool, None)
    if result_schema is not None:
        out[PRESENT_RESULT] = _ToolSpec(Tool(
            name=PRESENT_RESULT,
            description="Present the final result of the task, in the shape its schema asks.",
            input_schema=_inline_refs(result_schema)), None)
    return out


_NOTHING: Any = object()

_PIN_EVENT = {"type": "object", "required": ["path"], "properties": {
    "path": {"asCell": True}, "name": {"type": "string"}}}

_tool_result: ContextVar[Cell | None] = ContextVar("celldialog_tool_result", default=None)


def tool_result() -> Cell:
    """Inside a handler the dialog runs as a tool: the cell whose value becomes the tool's
    result for the model (``tool_result().set({"added": title})``). Without a write the
    model is told "<tool> done."."""
    cell = _tool_result.get()
    if cell is None:
        raise PatternError(
            "tool_result() is only known while a dialog runs this handler as a tool call")
    return cell


class _Run:
    """What one turn's task keeps to itself (a cancelled turn still winding down never
    shares it with the next one)."""

    __slots__ = ("dead", "ended", "last_partial", "management", "outputs", "partial",
                 "present", "results", "step_tx", "text", "turn_id", "usage")

    def __init__(self, turn_id: str, now: float) -> None:
        self.turn_id = turn_id
        self.management: Management | None = None
        self.text = ""
        self.last_partial = now
        self.present: Any = _NOTHING
        self.usage: Usage | None = None  # reported, not written yet
        self.results: dict[str, ToolResult] = {}  # the step's calls that finished, by id
        self.outputs = False  # a handler tool of this step wrote its result into tool_output
        self.partial = False  # this step wrote streamed text into `partial`
        self.ended = False  # the final reply's commit ended the turn already
        self.dead = False  # a write found the turn cancelled or replaced: run no more tools
        # a step whose tools are all handlers is one commit: the call, what the handlers
        # wrote, the results (open from the assistant message to the results message)
        self.step_tx: Transaction | None = None


class _Turns:
    """One dialog node: its state cells, its two streams, and the turn it may be running."""

    def __init__(self, node: BuiltinNode, messages: Cell, system: str | Cell | None,
                 catalog: dict[str, _ToolSpec], model: str | Model | None,
                 max_tokens: int | None, context: dict[str, Cell], max_steps: int,
                 builtins_on: bool, takeover_after: float) -> None:
        self.node = node
        self.messages = messages
        self.system: str | Cell = "" if system is None else system
        self.catalog = catalog
        self.model = model
        self.max_tokens = max_tokens
        self.context = context
        self.max_steps = max_steps
        self.builtins_on = builtins_on
        self.takeover_after = takeover_after
        self.pending = node.state("pending", False, bool)
        self.turn = node.state("turn", None)
        self.partial = node.state("partial", None)
        self.error = node.state("error", None)
        self.usage = node.state("usage", dict(_USAGE_ZERO))
        self.result = node.state("result", None)
        self.dropped = node.state("dropped", 0, int)
        self.pins = node.state("pins", [])
        # what handler tools answer, by tool call id: cleared in the commit of the step's
        # results (no commit of its own per call)
        self.tool_output = node.state("tool_output", {})
        self.add_stream = node.stream("add_message", self._on_add)
        self.cancel_stream = node.stream("cancel_generation", self._on_cancel)
        self.pin_stream = node.stream("pin_cell", self._on_pin, event=_PIN_EVENT)
        self.unpin_all_stream = node.stream("unpin_all_cells", self._on_unpin_all)
        self.own_streams = frozenset(s._key for s in (
            self.add_stream, self.cancel_stream, self.pin_stream, self.unpin_all_stream))
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._runs: dict[str, _Run] = {}  # what each running turn of this process knows
        self._rt: Runtime | None = None  # known once a turn was accepted here
        node.on_stop(self._stop)

    # -- the two streams (handlers: synchronous, one transaction each) ---------------

    def _on_add(self, event: Any) -> None:
        message = _user_message(event)
        rt = self._rt = current_runtime()
        now = rt.clock()
        if self.pending.get():
            turn = self.turn.get() or {}
            if now - turn.get("heartbeat", now) <= self.takeover_after:
                # seed 003: a message while a turn runs is ignored; counted, never silent
                self.dropped.set(self.dropped.get() + 1)
                log.info("%s: a message arrived while a turn is pending; ignored (cancel "
                         "the turn before sending a replacement)", self.node.label)
                return
            # its owner has not written for longer than the bound: the turn is dead
            log.warning("%s: taking over turn %s, silent for %.0f s", self.node.label,
                        turn.get("id"), now - turn.get("heartbeat", now))
            self._cancel()
        turn_id = uuid.uuid4().hex
        self.pending.set(True)
        self.turn.set({"id": turn_id, "heartbeat": now})
        self.error.set(None)
        self.partial.set(None)
        self.tool_output.set({})  # whatever a turn cut short left there
        self.messages.push(message.model_dump(mode="json"))
        self._scopes[turn_id] = self.node.spawn(self._run, rt, turn_id,
                                                name=f"{self.node.label} turn")

    def _on_cancel(self, event: Any) -> None:
        self._cancel()

    def _on_pin(self, event: dict[str, Any]) -> None:
        """From the pattern's side: show a cell under "# Available Cells" from the next step
        on, as the model's ``pin`` does (``{"path": cell.link() or "/<id>/<path>", "name"}``)."""
        path = event["path"]
        if isinstance(path, Cell):  # the schema asks for a cell: it arrives live
            path = path.link()
        if is_link(path):
            entry = {"path": path["@link"], "name": event.get("name") or path["@link"]}
            if path.get("scope"):
                entry["scope"] = path["scope"]
        elif isinstance(path, str) and path.startswith("/"):
            entry = {"path": path, "name": event.get("name") or path}
        else:
            raise PatternError(
                "pin_cell takes {'path': <a cell's link, cell.link(), or '/<id>/<path>'>, "
                f"'name': '...'}}, got path {str(path)[:80]!r}")
        pins = self.pins.get() or []
        if any(p.get("path") == entry["path"] and p.get("scope") == entry.get("scope")
               for p in pins):
            return  # already pinned
        self.pins.push(entry)

    def _on_unpin_all(self, event: Any) -> None:
        self.pins.set([])

    def _cancel(self) -> None:
        """End the pending turn now (in the caller's transaction): pending false, its
        unanswered tool calls answered, its task cancelled."""
        if not self.pending.get():
            return
        turn_id = (self.turn.get() or {}).get("id")
        self.pending.set(False)
        self.turn.set(None)
        self.partial.set(None)
        unanswered = _unanswered(self.messages.get())
        if unanswered:  # the history stays valid for every provider
            # calls of the step that already ran keep their real result (their writes
            # stand); only those that had not finished are answered as cancelled
            ran = self._runs[turn_id].results if turn_id in self._runs else {}
            self.messages.push(Message(role=Role.USER, blocks=tuple(
                ran.get(i) or ToolResult(tool_use_id=i, content=TOOL_CANCELLED, is_error=True)
                for i in unanswered)).model_dump(mode="json"))
        scope = self._scopes.pop(turn_id, None)
        if scope is not None:
            scope.cancel()

    def _stop(self) -> None:
        """The instance stops: its turn is cancelled as by ``cancel_generation``, so a later
        run of the instance does not find a turn pending that nothing runs."""
        try:
            if self._scopes and self._rt is not None:  # a turn of this process runs
                with self._rt.transaction():
                    self._cancel()
        finally:
            for scope in self._scopes.values():
                scope.cancel()
            self._scopes.clear()

    # -- a turn ----------------------------------------------------------------------

    async def _run(self, rt: Runtime, turn_id: str) -> None:
        run = self._runs[turn_id] = _Run(turn_id, rt.clock())
        try:
            model = self._resolve(rt)
            run.management = Management(rt, pins=self.pins, space=self.node.space,
                                        own_streams=self.own_streams,
                                        scope=self.node.scope.key)
            history = tuple(Message.model_validate(m) for m in self.messages.get())
            stable = len(history)

            def build(history_now: Any, step: int) -> Request:
                return Request(
                    system=self._system_prompt(run), messages=tuple(history_now),
                    tools=tuple(s.tool for s in self.catalog.values()),
                    max_tokens=self.max_tokens,
                    cache=CacheHint(prefix=True, stable_messages=stable, key=self.node.cause),
                )

            sink = StepSink(
                on_text=lambda delta: self._on_text(rt, run, delta),
                on_usage=lambda usage: self._on_usage(run, usage),
                on_message=lambda message: self._append(rt, run, message),
                on_tool_result=lambda result: run.results.__setitem__(result.tool_use_id,
                                                                      result),
            )
            outcome = await run_steps(model, build, execute=self._execute(rt, run),
                                      history=history, sink=sink, max_steps=self.max_steps)
            self._finish(rt, run, outcome)
        except Exception as e:  # no path leaves a turn pending
            log.exception("%s: the turn failed", self.node.label)
            self._end(rt, run, f"{ERROR_PREFIX}: {e}", str(e))
        finally:
            if run.step_tx is not None:  # interrupted mid-step: none of the step lands
                run.step_tx.abort()
                run.step_tx = None
            self._scopes.pop(turn_id, None)
            self._runs.pop(turn_id, None)
            if run.usage is not None:  # cut short after a call: its tokens still count
                with rt.transaction():
                    self._flush_usage(run)

    def _resolve(self, rt: Runtime) -> Model:
        return model_for(self.node.label, "llm_dialog", self.model, rt)

    def _guarded(self, rt: Runtime, turn_id: str) -> bool:
        """Inside a transaction: may this turn still write? If so, its heartbeat is renewed
        in the same commit when it has aged a tenth of ``takeover_after`` (a live turn
        that writes is never taken for dead, and most writes add nothing to renew it)."""
        turn = self.turn.get()
        if not (isinstance(turn, dict) and turn.get("id") == turn_id and self.pending.get()):
            return False
        now = rt.clock()
        beat = turn.get("heartbeat")
        if not isinstance(beat, int | float) or now - beat >= self.takeover_after / 10:
            self.turn.set({"id": turn_id, "heartbeat": now})
        return True

    def _append(self, rt: Runtime, run: _Run, message: Message) -> None:
        """A message of the turn, guarded by its id. A step whose tool calls all go to
        handlers (or are refused by the engine, or present the result) is one commit, from
        the assistant message to its results: observers never see a call without its
        result, and the handlers' writes land with them or not at all."""
        tx = run.step_tx
        if tx is not None:  # the results of such a step: its one commit
            run.step_tx = None
            with tx.bound():  # guarded when the step began, in this same transaction
                self._append_writes(rt, run, message, guarded=True)
            try:
                tx.commit()
            except ConflictError as e:  # another process wrote what the step read
                raise PatternError(
                    f"the step was not stored: another process changed a cell its tools read "
                    f"({e}); send the message again") from None
            return
        calls = message.tool_uses() if message.role is Role.ASSISTANT else ()
        if calls and all(self._inline(c) for c in calls):
            tx = rt.begin()
            with tx.bound():
                kept = self._append_writes(rt, run, message)
            if kept:
                run.step_tx = tx
            else:
                tx.commit()  # only the spent tokens: the guard let nothing else in
            return
        with rt.transaction():  # one commit: the message, its call's usage, the heartbeat
            self._append_writes(rt, run, message)

    def _inline(self, call: ToolUse) -> bool:
        """Does this call run inside its step's commit? Handler tools (synchronous) and
        presentResult do; so does a call the engine refuses (unknown tool). Management and
        pattern tools do their own commits."""
        spec = self.catalog.get(call.name)
        return spec is None or spec.stream is not None or call.name == PRESENT_RESULT

    def _append_writes(self, rt: Runtime, run: _Run, message: Message,
                       guarded: bool = False) -> bool:
        """Inside a transaction: the message and what goes with it; False if the turn may
        no longer write (a late reply to a cancelled or replaced turn lands nowhere).
        ``guarded``: this transaction checked the turn already (anyone changing it since
        makes the commit a conflict)."""
        self._flush_usage(run)
        if not guarded and not self._guarded(rt, run.turn_id):
            run.dead = True
            return False
        self.messages.push(_inert_message(message.model_dump(mode="json")))
        if message.role is Role.ASSISTANT:
            run.results.clear()  # a new step: its calls have not run yet
            run.text = ""
            if run.partial:
                self.partial.set(None)
                run.partial = False
            if not message.tool_uses():
                # the final reply (the engine completes on a reply without calls):
                # the turn ends in the commit that stores it
                self._end_writes(None, run)
                run.ended = True
        elif run.outputs:  # the step's results: what its handlers answered goes
            self.tool_output.set({})
            run.outputs = False
        if run.present is not _NOTHING:  # presentResult: in the commit of its results
            self.result.set(run.present)
            run.present = _NOTHING
        return True

    def _on_text(self, rt: Runtime, run: _Run, delta: str) -> None:
        run.text += delta
        now = rt.clock()
        if now - run.last_partial < PARTIAL_INTERVAL:
            return  # coarsened: a few writes a second, not one per token
        run.last_partial = now
        with rt.transaction():
            if self._guarded(rt, run.turn_id):
                self.partial.set(run.text)
                run.partial = True

    @staticmethod
    def _on_usage(run: _Run, usage: Usage) -> None:
        run.usage = usage if run.usage is None else run.usage + usage  # written with the reply

    def _flush_usage(self, run: _Run) -> None:
        """Inside a transaction: add the turn's unwritten usage to ``usage`` (spent tokens
        count even for a turn cancelled since, so this is not guarded)."""
        if run.usage is None:
            return
        total = dict(self.usage.get())
        usage = run.usage
        for k in _USAGE_ZERO:
            total[k] = total.get(k, 0) + getattr(usage, k)
        self.usage.set(total)
        run.usage = None

    def _execute(self, rt: Runtime, run: _Run) -> Any:
        async def execute(call: ToolUse) -> Any:
            spec = self.catalog[call.name]  # the engine checked the name and arguments
            if call.name == PRESENT_RESULT:  # the last call wins
                run.present = call.input
                return "Result presented."
            if spec.pattern is not None:
                return self._run_pattern_tool(rt, spec.pattern, call)
            if spec.stream is None:  # a management tool
                assert run.management is not None
                outcome = await run.management.call(call.name, call.input)
                return outcome.as_tool_result(call.id)
            if run.dead:
                raise ToolError("the turn was cancelled; the tool did not run")
            assert run.management is not None
            # links the model sends (where the event schema asks for a cell) reach only the
            # dialog's scopes; the handler gets them as live cells
            event = run.management.accept_input(call.input, spec.stream, "input")
            token = _tool_result.set(self.tool_output.key(call.id))
            try:
                if run.step_tx is not None:  # in the step's commit (see _append)
                    with run.step_tx.bound():
                        rt.deliver(spec.stream, event)
                        output = self.tool_output.key(call.id).get(None)
                else:
                    await rt.send(spec.stream, event)
                    output = self.tool_output.key(call.id).get(None)
            finally:
                _tool_result.reset(token)
            if output is None:
                return f"{call.name} done."
            run.outputs = True
            return output

        return execute

    def _run_pattern_tool(self, rt: Runtime, tool: Pattern, call: ToolUse) -> dict[str, Any]:
        """A pattern tool runs in a fresh instance (cause: the tool call's id) in the
        dialog's space and scope. It gets the model's input as its arguments (values: links
        there are refused unless its argument schema asks for one), so it cannot write the
        caller's cells; the model gets where its result lives and what it holds."""
        scope = self.node.scope
        inst = rt.run(tool, call.input, space=self.node.space, user=scope.user,
                      session=scope.session, cause=["tool call", self.node.cause, call.id])
        return {"@resultLocation": inst.result.link()["@link"],
                "result": inst.result.get(None), "schema": tool.argument_schema}

    def _finish(self, rt: Runtime, run: _Run, outcome: StepsOutcome) -> None:
        if outcome.status is StepsStatus.COMPLETED:
            self._end(rt, run, None, None)
        elif outcome.status is StepsStatus.MAX_STEPS:
            why = f"the turn reached its limit of {self.max_steps} model calls (max_steps)"
            self._end(rt, run, f"{ERROR_PREFIX}: {why}.", why)
        else:
            why = str(outcome.error) if outcome.error is not None else "the model failed"
            self._end(rt, run, f"{ERROR_PREFIX}: {why}", why)

    def _end(self, rt: Runtime, run: _Run, text: str | None, error: str | None) -> None:
        if run.ended:
            return  # the final reply's commit ended it
        with rt.transaction():
            self._flush_usage(run)
            if not self._guarded(rt, run.turn_id):
                return
            if text is not None:
                self.messages.push(Message.text(Role.ASSISTANT, text).model_dump(mode="json"))
            self._end_writes(error, run)

    def _end_writes(self, error: str | None, run: _Run | None) -> None:
        """Inside the guarded transaction: the turn is over."""
        self.error.set(error)
        if run is None or run.partial:
            self.partial.set(None)
        self.pending.set(False)
        self.turn.set(None)
        if run is not None and run.outputs:
            self.tool_output.set({})

    def _system_prompt(self, run: _Run) -> str:
        """Rebuilt each step: the pattern's system prompt, the guide to cells (built-ins on),
        then "# Available Cells" (context first, then pins). Stable while nothing changes:
        it is the cacheable prefix of every request."""
        system = self.system
        if isinstance(system, Cell):  # read at each step: an edit applies from the next one
            value = system.get(None)
            system = value if isinstance(value, str) else "" if value is None else json.dumps(
                value)
        parts = [system] if system else []
        if self.builtins_on:
            parts.append(MANAGEMENT_GUIDE)
        assert run.management is not None
        cells = run.management.available_cells(self.context, value_limit=VALUE_LIMIT)
        if cells:
            parts.append(cells)
        return "\n\n".join(parts)


def model_for(label: str, kind: str, chosen: str | Model | None, rt: Runtime) -> Model:
    """The model a builtin uses: its own (a name resolved through the port, or a Model),
    else the runtime's, else a clear error naming both ways to set one."""
    chosen = chosen if chosen is not None else rt.model
    if chosen is None:
        raise PatternError(
            f"{label} has no model: pass {kind}(..., model='claude-sonnet-4-5') (a name or a "
            "Model), or Runtime(model=...) for every builtin")
    return resolve_model(chosen) if isinstance(chosen, str) else chosen


def _user_message(event: Any) -> Message:
    if isinstance(event, str):
        if not event.strip():
            raise PatternError("add_message got an empty string; send the user's text")
        return Message(role=Role.USER, blocks=(TextBlock(text=event),))
    if isinstance(event, dict):
        try:
            message = Message.model_validate(event)
        except ValueError as e:
            raise PatternError(f"add_message takes a string or a user message: {e}") from None
        if message.role is Role.USER:
            return message
    raise PatternError(
        "add_message takes a string (the user's text) or a user message "
        "{'role': 'user', 'blocks': [{'kind': 'text', 'text': '...'}]}, "
        f"got {type(event).__name__} {str(event)[:80]}")


def _inert_message(message: dict[str, Any]) -> dict[str, Any]:
    """``_inert`` of a message: only blocks that carry the model's own JSON (a call's input,
    a provider's opaque data) can hold a link; text and results are strings."""
    blocks = message.get("blocks")
    if isinstance(blocks, list):
        message["blocks"] = [_inert(b) if isinstance(b, dict) and b.get("kind") not in (
            "text", "tool_result") else b for b in blocks]
    return message


def _inert(value: Any) -> Any:
    """A message the model wrote, with each link-shaped object in it stored as its JSON
    text: the history must never hold a live link the model made up (it would alias other
    documents on read). The call itself ran with what the model sent."""
    if isinstance(value, dict):
        if is_link(value):
            return json.dumps(value, sort_keys=True)
        return {k: _inert(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_inert(v) for v in value]
    return value


def _unanswered(history: list[dict[str, Any]]) -> list[str]:
    """Tool calls of the last assistant message that no later message answers."""
    for i in range(len(history) - 1, -1, -1):
        m = history[i]
        if m.get("role") == "assistant":
            calls = [b["id"] for b in m.get("blocks", []) if b.get("kind") == "tool_use"]
            answered = {b.get("tool_use_id") for later in history[i + 1:]
                        for b in later.get("blocks", []) if b.get("kind") == "tool_result"}
            return [c for c in calls if c not in answered]
    return []


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
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
