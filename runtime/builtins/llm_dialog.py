"""``llm_dialog``: a conversation with a model that lives in the cell graph.

The dialog's state is cells (``pending``, ``partial``, ``error``, ``usage``, ``stop_reason``,
``result``...; the turn protocol's are fields of two records, ``turns.TurnState``), scoped
like the ``messages`` cell it is given; its inputs are streams
(``add_message``, ``cancel_generation``). A turn reads as a pipeline::

    add_message -> accept (one commit: pending, the user message, a turn owned by this
                   process's lease) -> spawn the turn -> run_steps (the port's step engine)
                -> each step committed (``StepCommit``), guarded by the turn -> the end

Every write a turn makes happens only while it is still the current turn and its process
still holds its lease (``turns.py``), so a late reply to a cancelled or taken-over turn lands
nowhere. A message that arrives while a turn is pending is dropped (and counted) unless the
turn's owner is dead (its lease expired): then its unanswered calls are answered as
interrupted, the turn ends with a clear message, and the new message starts a turn.

Tools (``dialog_tools.py``) are routed to bound handler streams, to patterns run fresh for
each call, and to the six management tools (``management.py``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import anyio

from .._text import scrub_text
from ..cells import (
    BuiltinNode,
    Cell,
    Runtime,
    Stream,
    Transaction,
    current_runtime,
    is_link,
    validate,
)
from ..errors import ConflictError, PatternError, SchemaError
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
    StopReason,
    Tool,
    ToolChoice,
    ToolError,
    ToolResult,
    ToolUse,
    Usage,
    resolve_model,
    run_steps,
    unanswered_calls,
)
from .dialog_input import TypedHistory, inert, user_message
from .dialog_tools import (
    PRESENT_RESULT,
    ToolSpec,
    build_catalog,
    dialog_tool_choice,
    tool_result,
    tool_result_cell,
)
from .management import MANAGEMENT_GUIDE, VALUE_LIMIT, Management
from .turns import PartialText, TurnState, log_failed_turn

__all__ = ["PRESENT_RESULT", "Dialog", "llm_dialog", "model_for", "tool_result"]

log = logging.getLogger("celldialog.dialog")

ERROR_PREFIX = "I encountered an error generating a response"
INTERRUPTED = ("Tool call interrupted: the process running this turn stopped before the "
               "call finished")
STEP_RETRIES = 3  # writes of a turn's commit again after a conflict on fresh copies
_INTERRUPTED_TURN = ("the turn was interrupted: the process running it stopped (its lease "
                     "expired)")

_USAGE_ZERO = {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
               "cache_write_tokens": 0}
# the dialog's fields of the turn protocol's records (turns.py), with their initial values
_TURN_OWN = {"stop_reason": None, "tool_output": {}}
_TURN_OUTCOME = {"usage": _USAGE_ZERO, "dropped": 0, "pins": []}
_OUTCOME_SCHEMA = {"type": "object", "properties": {"dropped": {"type": "integer"}}}
_TURN_START = {"stop_reason": None, "tool_output": {}}  # as a turn starts (unless so already)
_NOTHING: Any = object()

_PIN_EVENT = {"type": "object", "required": ["path"], "properties": {
    "path": {"asCell": True}, "name": {"type": "string"}}}


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
    stop_reason: Cell
    dropped: Cell
    pinned_cells: Cell
    pin_cell: Stream
    unpin_all_cells: Stream
    tools: tuple[Tool, ...] = field(repr=False)
    """The tools the dialog advertises, in order (shared by every instance: read-only)."""

    @property
    def flattened_tools(self) -> list[dict[str, Any]]:
        """The advertised tools as plain JSON (a fresh list, for a UI), made when asked
        for: most patterns never do, and each instance would pay for it."""
        return [tool.model_dump(mode="json") for tool in self.tools]


def llm_dialog(messages: Cell, *, system: str | Cell | None = None,
               tools: Mapping[str, Any] | None = None, model: str | Model | None = None,
               max_tokens: int | None = None, context: Mapping[str, Cell] | None = None,
               builtin_tools: bool = True, result_schema: dict[str, Any] | None = None,
               max_steps: int = 50, name: str | None = None,
               tool_choice: ToolChoice | str = "auto") -> Dialog:
    """A dialog over ``messages`` (a cell holding the port's messages as JSON). Call it
    inside a ``@pattern``; send a string (or a user message) to ``add_message``.

    ``system`` is a string, or a Cell holding one (read at every step, so an edit applies
    from the next model call). ``tool_choice`` ("auto", "required", "none", or the name of
    a tool the dialog advertises) applies to the first model call of every turn; the
    turn's later calls are "auto" (the port's step engine), so a forced turn still ends.
    Turns are owned by the runtime's process lease (``Runtime(lease_ttl=...)``): a turn is
    taken over only once its process is dead."""
    if not isinstance(messages, Cell):
        raise PatternError(f"llm_dialog(messages=...) takes a Cell, got {messages!r}")
    context = dict(context or {})
    for key, c in context.items():
        if not isinstance(c, Cell):
            raise PatternError(f"llm_dialog context {key!r} must be a Cell, got {c!r}")
    catalog = build_catalog(tools or {}, builtin_tools, result_schema)
    choice = dialog_tool_choice(tool_choice, catalog, "llm_dialog")
    if system is not None and not isinstance(system, str | Cell):
        raise PatternError(f"llm_dialog(system=...) takes a string or a Cell holding one, "
                           f"got {type(system).__name__}")
    inputs = [messages, *context.values(), *([system] if isinstance(system, Cell) else [])]
    node = BuiltinNode("llm_dialog", inputs, name=name)
    d = _DialogNode(node, messages, system, catalog, model, max_tokens, context, max_steps,
                    builtin_tools is not False, choice)
    return Dialog(
        pending=d.state.pending, add_message=d.add_stream, cancel_generation=d.cancel_stream,
        result=d.result, partial=d.state.partial, error=d.state.error, usage=d.usage,
        stop_reason=d.stop_reason, dropped=d.dropped, pinned_cells=d.pins, pin_cell=d.pin_stream,
        unpin_all_cells=d.unpin_all_stream,
        tools=tuple(s.tool for s in catalog.values()),
    )


class TurnPhase(Enum):
    """Where a turn's task is, as far as its commits go."""

    MODEL = "model"  # between steps: nothing open
    INLINE = "inline"  # a step whose calls run in its one commit: the transaction is open
    CALLS = "calls"  # a step whose calls commit on their own: its message is stored,
    #                  its results are still to come
    ENDED = "ended"  # the final reply's commit ended the turn
    DEAD = "dead"  # a write found the turn cancelled or taken over: nothing more lands


class _TurnLost(Exception):
    """The turn is no longer this process's (cancelled or taken over elsewhere)."""


class StepCommit:
    """The commit state of one turn's steps (its phase and the open transaction).

    A step whose tool calls all run inline (handler tools, presentResult, calls the engine
    refuses) is one commit from the assistant message to its results: observers never see
    a call without its result, and the handlers' writes land with them or not at all. Any
    other step stores its message first (the calls then commit on their own) and its
    results later; if those cannot be stored with what goes with them, they are stored
    alone as errors, so every call still ends with exactly one result."""

    __slots__ = ("phase", "rt", "tx")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.phase = TurnPhase.MODEL
        self.tx: Transaction | None = None

    def begin_inline(self) -> Transaction:
        self.tx = self.rt.begin()
        self.phase = TurnPhase.INLINE
        return self.tx

    def finish(self) -> None:
        """Commit the inline step; on any failure nothing of it lands (the assistant message
        included, so the stored history has no call without a result)."""
        tx, self.tx = self.tx, None
        self.phase = TurnPhase.MODEL
        assert tx is not None
        try:
            tx.commit()
        except BaseException:
            tx.abort()
            raise

    def abort(self) -> None:
        """Take back an open inline step (the turn was interrupted in its middle)."""
        tx, self.tx = self.tx, None
        if tx is not None:
            tx.abort()
        if self.phase is TurnPhase.INLINE:
            self.phase = TurnPhase.MODEL


class _TurnRun:
    """What one turn's task keeps to itself (a cancelled turn still winding down never
    shares it with the next one)."""

    __slots__ = ("calls", "management", "outputs", "present", "results", "step",
                 "steps", "stop", "text", "turn_id", "usage")

    def __init__(self, turn_id: str, step: StepCommit, text: PartialText) -> None:
        self.turn_id = turn_id
        self.step = step
        self.text = text
        self.management: Management | None = None
        self.present: Any = _NOTHING
        self.usage: Usage | None = None  # reported, not written yet
        self.stop: StopReason | None = None  # the last model call's; written as the turn ends
        self.results: dict[str, ToolResult] = {}  # the step's calls that finished, by id
        self.outputs = False  # a handler tool of this step answered through tool_output
        self.steps = 0  # assistant messages stored so far in this turn
        self.calls: list[ToolUse] = []  # the step's calls, in the reply's order


class _DialogNode:
    """One dialog node: its state cells, its streams, and the turn it may be running."""

    def __init__(self, node: BuiltinNode, messages: Cell, system: str | Cell | None,
                 catalog: dict[str, ToolSpec], model: str | Model | None,
                 max_tokens: int | None, context: dict[str, Cell], max_steps: int,
                 builtins_on: bool, tool_choice: ToolChoice) -> None:
        self.node = node
        self.messages = messages
        self.system: str | Cell = "" if system is None else system
        self.catalog = catalog
        self.model = model
        self.max_tokens = max_tokens
        self.context = context
        self.max_steps = max_steps
        self.builtins_on = builtins_on
        self.tool_choice = tool_choice
        # the turn protocol's two records (turns.py): the turn's own, with why its last
        # model call stopped (cleared as a turn starts, written as it ends) and what
        # handler tools answer by tool call id (cleared in the commit of the step's
        # results, no commit of its own per call); the outcome, with usage, the count of
        # messages dropped and the pins: written only by commits run again on a conflict
        # (handlers, a turn's start and end, the pin tools)
        state = self.state = TurnState(node, _TURN_OWN, _TURN_OUTCOME, _OUTCOME_SCHEMA)
        self.tool_output = state.record["tool_output"]
        self.stop_reason = state.record["stop_reason"]
        self.usage = state.outcome["usage"]
        self.dropped = state.outcome["dropped"]
        self.pins = state.outcome["pins"]
        # written by presentResult's step, a commit not run again: a document of its own, or
        # a user's write to an outcome from another process (a usage reset, an error
        # dismissed) would make that step conflict
        self.result = node.state("result", None)
        # what a handler tool run inside its step's commit answers: read in that same commit,
        # so it never needs storing (nor clearing after)
        self.answers = node.scratch("tool_answers", {})
        self.add_stream = node.stream("add_message", self._on_add)
        self.cancel_stream = node.stream("cancel_generation", self._on_cancel)
        self.pin_stream = node.stream("pin_cell", self._on_pin, event=_PIN_EVENT)
        self.unpin_all_stream = node.stream("unpin_all_cells", self._on_unpin_all)
        self.own_streams = frozenset(s.key for s in (
            self.add_stream, self.cancel_stream, self.pin_stream, self.unpin_all_stream))
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._runs: dict[str, _TurnRun] = {}  # what each running turn of this process knows
        self._rt: Runtime | None = None  # known once a turn was accepted here
        self._ending: set[str] = set()  # turns of this process ending by their own commit
        self.typed = TypedHistory()  # the history as messages, kept from turn to turn
        self._management: Management | None = None  # made for the first turn (_manager)
        node.on_stop(self._stop)
        self._watching = False  # _stop_lost_turns watches ``turn`` (from the first turn here)

    # -- the streams (handlers: synchronous, one transaction each) -------------------

    def _on_add(self, event: Any) -> None:
        message = user_message(event)
        rt = self._rt = current_runtime()
        # this copy may be a moment behind another process's start or end of a turn (the
        # change feed is on its way): accept or drop on the store's word, read before this
        # transaction reads the turn (a read after it would only make its commit conflict)
        self.state.refresh(rt)
        if self.state.is_pending():
            if self._owner_alive(rt):
                # as in CommonTools' llmDialog: a message while a turn runs is ignored; counted
                self.dropped.set(self.dropped.get() + 1)
                log.info("%s: a message arrived while a turn is pending; ignored (cancel "
                         "the turn before sending a replacement)", self.node.label)
                return
            self._recover()
        else:  # a history stored with a call left open (before every step answered its
            # calls) is answered first: no provider takes a call without its result
            self._answer_unanswered(INTERRUPTED, {})
        # no answers (whatever a turn cut short left there), no stop reason (the last
        # turn's, not this one's)
        turn_id = self.state.begin(rt, _TURN_START)
        self._push_message(message)
        self._scopes[turn_id] = self.node.spawn(self._run, rt, turn_id,
                                                name=f"{self.node.label} turn")

    def _manager(self, rt: Runtime) -> Management:
        """The dialog's management tools: made once (they keep nothing between calls but
        where the dialog lives), not at every turn."""
        manager = self._management
        if manager is None or manager.rt is not rt:
            manager = self._management = Management(
                rt, pins=self.pins, space=self.node.space, own_streams=self.own_streams,
                scope=self.node.scope.key)
        return manager

    def _owner_alive(self, rt: Runtime) -> bool:
        """Is the pending turn's owner alive? Another process: its lease says. This one:
        only while one of its tasks runs the turn (a turn whose end could not be stored is
        an orphan, recovered like a dead one's)."""
        if not self.state.holder_alive(rt):
            return False
        turn = self.state.fields().get("turn") or {}
        return turn.get("holder") != rt.lease.holder or turn.get("id") in self._scopes

    def _stop_lost_turns(self) -> None:
        """The turn changed (a sink on ``turn``). A turn running here that is
        no longer the pending one was cancelled or taken over elsewhere (another process's
        commit, brought by the store's change feed): it stops now, in the middle of its
        model call, not at its next step. Turns ending by their own commit are left to end."""
        if not self._scopes:
            return
        current = self.state.current_id() if self.state.is_pending() else None
        for turn_id in [t for t in self._scopes if t != current and t not in self._ending]:
            log.info("%s: turn %s was cancelled or taken over by another process; it stops",
                     self.node.label, turn_id)
            self._scopes.pop(turn_id).cancel()

    def _on_cancel(self, event: Any) -> None:
        # the turn may have started in another process since this copy was read: a cancel
        # decided on a stale copy would be lost without a trace
        rt = current_runtime()
        self.state.refresh(rt)
        rt.docs.reload([self.messages.resolve().doc_key])  # the calls it may answer
        self._cancel()

    def _on_pin(self, event: dict[str, Any]) -> None:
        """From the pattern's side: show a cell under "# Available Cells" from the next step
        on, as the model's ``pin`` does (``{"path": cell.link() or "/<id>/<path>", "name"}``)."""
        path = event["path"]
        if isinstance(path, Cell):  # the schema asks for a cell: it arrives live
            path = path.link()
        self._manager(current_runtime()).pin_from_pattern(path, event.get("name"))

    def _on_unpin_all(self, event: Any) -> None:
        self.pins.set([])

    def _cancel(self) -> None:
        """End the pending turn now (in the caller's transaction): pending false, its
        unanswered tool calls answered, its task cancelled."""
        if not self.state.is_pending():
            return
        turn_id = self.state.current_id()
        run = self._runs.get(turn_id) if turn_id is not None else None
        # calls of the step that already ran keep their real result (their writes stand);
        # only those that had not finished are answered as cancelled
        self._answer_unanswered(TOOL_CANCELLED, run.results if run is not None else {})
        self.state.end(None)
        scope = self._scopes.pop(turn_id, None) if turn_id is not None else None
        if scope is not None:
            scope.cancel()

    def _recover(self) -> None:
        """Inside the accepting transaction: the pending turn's owner is dead. Its
        unanswered calls are answered as interrupted and it ends with a message saying so."""
        log.warning("%s: recovering turn %s, whose process stopped (its lease expired)",
                    self.node.label, self.state.current_id())
        self._answer_unanswered(INTERRUPTED, {})
        self._push_message(Message.text(Role.ASSISTANT, f"{ERROR_PREFIX}: {_INTERRUPTED_TURN}."))
        self.state.end(_INTERRUPTED_TURN)

    def _answer_unanswered(self, content: str, known: Mapping[str, ToolResult]) -> None:
        """Inside a transaction: every call of the history's last step without a result gets
        one (``known`` where the call finished, else an error saying ``content``), so the
        history stays valid for every provider."""
        unanswered = unanswered_calls(_last_step(self.messages))
        if unanswered:
            self._push_message(Message(role=Role.USER, blocks=tuple(
                known.get(i) or ToolResult(tool_use_id=i, content=content, is_error=True)
                for i in unanswered)))

    def _stop(self) -> None:
        """The instance stops: its turn is cancelled as by ``cancel_generation``, so a later
        run of the instance does not find a turn pending that nothing runs."""
        try:
            if self._scopes and self._rt is not None:  # a turn of this process runs
                for attempt in range(STEP_RETRIES + 1):  # again on the state caught up with
                    try:
                        with self._rt.transaction():
                            self._cancel()
                        break
                    except ConflictError:
                        if attempt == STEP_RETRIES:
                            raise
        finally:
            for scope in self._scopes.values():
                scope.cancel()
            self._scopes.clear()

    # -- a turn ----------------------------------------------------------------------

    async def _run(self, rt: Runtime, turn_id: str) -> None:
        if not self._watching:
            # from the first turn this process runs here: ``turn`` changes with every
            # start, end, cancel or takeover (``pending`` is written with it, in one
            # commit), and one sink sees them all (it runs now too: a turn lost before it
            # began stops at once). A write of ``pending`` alone (a user's) stops a turn
            # here at its next write instead, which reads both (``owns``). An instance
            # that never runs a turn here (most sessions a server starts) makes none
            self._watching = True
            self.node.on_stop(self.state.turn.sink(lambda _: self._stop_lost_turns()))
        rt.lease.hold()
        run = self._runs[turn_id] = _TurnRun(turn_id, StepCommit(rt), PartialText(
            self.state, rt.clock(), trails=True))
        try:
            model = model_for(self.node.label, "llm_dialog", self.model, rt)
            run.management = self._manager(rt)
            history = self.typed.load_cell(self.messages)
            stable = len(history)
            tools = tuple(s.tool for s in self.catalog.values())
            cache = CacheHint(prefix=True, stable_messages=stable, key=self.node.cause)

            first: list[Request] = []

            def build(history_now: Any, step: int) -> Request:
                if step > 1 and not self._still_owned(rt, run):
                    raise _TurnLost  # cancelled or taken over by another process: no call
                system, messages = self._system_prompt(run), tuple(history_now)
                if first:
                    # what a step changes: the history, grown by the engine (which keeps its
                    # call ids unique), and the system prompt (scrubbed text). The rest was
                    # validated with the turn's first request, the history's ids too
                    return first[0].model_copy(update={"system": system, "messages": messages})
                first.append(Request(
                    system=system, messages=messages, tools=tools, max_tokens=self.max_tokens,
                    tool_choice=self.tool_choice, cache=cache,
                ))
                return first[0]

            sink = StepSink(
                # why the last reply stopped (written as the turn ends): none while a call
                # runs, so a call that fails or is cut short leaves none
                on_step=lambda _: setattr(run, "stop", None),
                on_response=lambda response: setattr(run, "stop", response.stop_reason),
                on_text=lambda delta: run.text.feed(rt, turn_id, delta),
                on_usage=lambda usage: self._on_usage(run, usage),
                on_message=lambda message: self._append(rt, run, message),
                on_tool_result=lambda result: run.results.__setitem__(result.tool_use_id,
                                                                      result),
            )
            try:
                outcome = await run_steps(model, build, execute=self._execute(rt, run),
                                          history=history, sink=sink,
                                          max_steps=self.max_steps, arguments_ok=_fits)
            finally:
                run.text.stop()
            self._finish(rt, run, outcome)
        except _TurnLost:
            log.info("%s: turn %s was cancelled or taken over elsewhere; it stops",
                     self.node.label, turn_id)
        except Exception as e:  # no path leaves a turn pending
            if isinstance(e, ConflictError) and not self._still_owned(rt, run):
                log.info("%s: turn %s was cancelled or taken over elsewhere; its last write "
                         "was refused", self.node.label, turn_id)
            else:
                log_failed_turn(log, self.node.label, "the turn failed", e)
            self._end(rt, run, f"{ERROR_PREFIX}: {e}", str(e))
        finally:
            run.step.abort()  # interrupted mid-step: none of the step lands
            self._scopes.pop(turn_id, None)
            self._runs.pop(turn_id, None)
            self._ending.discard(turn_id)
            try:
                if run.usage is not None:  # cut short after a call: its tokens still count
                    self._flush_usage_alone(rt, run)
            finally:
                rt.lease.drop()

    def _still_owned(self, rt: Runtime, run: _TurnRun) -> bool:
        """Between steps and before a call that commits on its own: is the turn still this
        process's, as the store has it now? (Another process's cancel or takeover reaches
        this process's copy of the turn only when read again; the guarded writes read the
        copy.)"""
        self.state.refresh(rt)
        return self._owns(rt, run)

    def _owns(self, rt: Runtime, run: _TurnRun) -> bool:
        """Inside a transaction: may this turn still write? (Marks it dead if not.)"""
        if self.state.owns(rt, run.turn_id):
            return True
        run.step.phase = TurnPhase.DEAD
        return False

    def _append(self, rt: Runtime, run: _TurnRun, message: Message) -> None:
        """A message of the turn (the step engine's ``on_message``), committed as
        ``StepCommit`` says."""
        if message.role is Role.ASSISTANT:
            self._append_reply(rt, run, message)
        else:
            self._append_results(rt, run, message)

    def _append_reply(self, rt: Runtime, run: _TurnRun, message: Message) -> None:
        calls = message.tool_uses()
        run.results.clear()  # a new step: its calls have not run yet
        run.calls = calls
        run.steps += 1
        if calls and all(self._inline(c) for c in calls):
            tx = run.step.begin_inline()
            with tx.bound():
                kept = self._write_reply(rt, run, message)
            if not kept:
                run.step.abort()  # the guard let nothing in
                run.step.phase = TurnPhase.DEAD
            return
        # one commit: the message and its call's usage (the final reply: the turn's end)
        if self._retrying(rt, run, lambda: self._write_reply(rt, run, message)):
            run.step.phase = TurnPhase.CALLS if calls else TurnPhase.ENDED

    def _retrying(self, rt: Runtime, run: _TurnRun, write: Callable[[], bool]) -> bool:
        """``write()`` in a transaction of its own. A commit another process's write made
        stale (its copy of a cell this turn writes, brought by the change feed a moment
        later) is written again on the fresh copies while the turn is still this one's: a
        turn's reply is never lost to a conflict on its bookkeeping."""
        for attempt in range(STEP_RETRIES + 1):
            usage, outputs = run.usage, run.outputs
            try:
                with rt.transaction():
                    return write()
            except ConflictError:
                run.usage, run.outputs = usage, outputs  # nothing of it was stored
                if attempt == STEP_RETRIES or not self._still_owned(rt, run):
                    raise
        raise AssertionError("unreachable")

    def _write_reply(self, rt: Runtime, run: _TurnRun, message: Message) -> bool:
        """Inside a transaction: the assistant's reply; False if the turn may no longer
        write (a late reply to a cancelled or replaced turn lands nowhere). The turn's usage
        is written with its last commit, not at every step."""
        if not self._owns(rt, run):
            return False
        self._push_message(message)
        run.text.reset()
        if not message.tool_uses():
            # the final reply (the engine completes on a reply without calls): the turn
            # ends in the commit that stores it, with what it spent
            self._ending.add(run.turn_id)
            self._flush_usage(run)
            self._end_writes(run, None)
        return True

    def _append_results(self, rt: Runtime, run: _TurnRun, message: Message) -> None:
        phase = run.step.phase
        if phase is TurnPhase.DEAD:
            return
        if phase is TurnPhase.INLINE:
            tx = run.step.tx
            assert tx is not None
            try:
                with tx.bound():  # guarded when the step began, in this same transaction
                    self._write_results(run, message)
                run.step.finish()
            except ConflictError as e:  # another process wrote what the step read
                raise PatternError(
                    f"the step was not stored: another process changed a cell its tools read "
                    f"({e}); send the message again") from None
            return
        try:
            with rt.transaction():
                if self._owns(rt, run):
                    self._write_results(run, message)
                    run.step.phase = TurnPhase.MODEL
        except Exception as e:
            # what goes with the results (the presented result, the handlers' answers)
            # could not be stored: the results are stored alone, as errors, so the stored
            # history keeps exactly one result per call; then the turn ends
            why = f"the step's results could not be stored ({e})"
            with rt.transaction():
                if self._owns(rt, run):
                    self._push_message(Message(role=Role.USER, blocks=tuple(
                        ToolResult(tool_use_id=b.tool_use_id, content=f"Not stored: {why}.",
                                   is_error=True)
                        for b in message.blocks if isinstance(b, ToolResult))))
            run.step.phase = TurnPhase.MODEL
            raise PatternError(why) from None

    def _write_results(self, run: _TurnRun, message: Message) -> None:
        """Inside the step's transaction: its results and what goes with them."""
        self._push_message(message)
        if run.outputs:  # what its handlers answered goes
            self.tool_output.set({})
            run.outputs = False
        if run.present is not _NOTHING:  # presentResult: in the commit of its results
            self.result.set(run.present)
            run.present = _NOTHING

    def _push_message(self, message: Message) -> None:
        """Append ``message`` to the history as JSON made fresh for it, checked in the same
        pass that makes the model's own JSON (a call's input) inert: a link-shaped object
        in it is kept as its text, so the history never holds a live link the model made
        up. One pass over the message and no second copy (``Cell.push(owned=True)``)."""
        self.messages.push(message.model_dump(mode="json"), owned=True)

    def _inline(self, call: ToolUse) -> bool:
        """Does this call run inside its step's commit? Handler tools (synchronous) and
        presentResult do; so does a call the engine refuses (unknown tool). Management and
        pattern tools do their own commits."""
        spec = self.catalog.get(call.name)
        return spec is None or spec.stream is not None or call.name == PRESENT_RESULT

    @staticmethod
    def _on_usage(run: _TurnRun, usage: Usage) -> None:
        run.usage = usage if run.usage is None else run.usage + usage  # written with the reply

    def _flush_usage_alone(self, rt: Runtime, run: _TurnRun) -> None:
        """``_flush_usage`` in a commit of its own, run again on a conflict (another
        process's write to the outcome record, caught up with since)."""
        usage = run.usage
        for attempt in range(STEP_RETRIES + 1):
            try:
                with rt.transaction():
                    self._flush_usage(run)
                return
            except ConflictError:
                run.usage = usage  # nothing of it was stored
                if attempt == STEP_RETRIES:
                    raise

    def _flush_usage(self, run: _TurnRun) -> None:
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

    def _execute(self, rt: Runtime, run: _TurnRun) -> Any:
        async def execute(call: ToolUse) -> Any:
            spec = self.catalog[call.name]  # the engine checked the name and arguments
            if run.step.phase is TurnPhase.DEAD or (
                    run.step.phase is not TurnPhase.INLINE and not self._still_owned(rt, run)):
                # a call that commits on its own first asks the store whether its turn is
                # still this process's: one cancelled or taken over elsewhere runs nothing
                raise ToolError("the turn was cancelled; the tool did not run")
            if call.name == PRESENT_RESULT:  # the last call wins
                # the model's JSON, stored inert: a link it wrote is kept as text, never
                # followed (and never a reason for the results' commit to fail)
                run.present = inert(call.input)
                return "Result presented."
            if spec.pattern is not None:
                return self._run_pattern_tool(rt, run, spec, call)
            assert run.management is not None
            if spec.stream is None:  # a management tool
                outcome = await run.management.call(call.name, call.input)
                return outcome.as_tool_result(call.id)
            # links the model sends (where the event schema asks for a cell) reach only the
            # dialog's scopes; the handler gets them as live cells
            event = run.management.accept_input(call.input, spec.stream, "input")
            inline = run.step.phase is TurnPhase.INLINE  # in the step's commit
            answer = (self.answers if inline else self.tool_output).key(call.id)
            token = tool_result_cell.set(answer)
            try:
                if inline:
                    assert run.step.tx is not None
                    with run.step.tx.bound():
                        rt.deliver(spec.stream, event)
                        output = answer.get(None)
                else:
                    await rt.send(spec.stream, event)
                    output = answer.get(None)
            finally:
                tool_result_cell.reset(token)
            if output is None:
                return f"{call.name} done."
            run.outputs = run.outputs or not inline  # a stored answer is cleared with results
            return output

        return execute

    def _run_pattern_tool(self, rt: Runtime, run: _TurnRun, spec: ToolSpec,
                          call: ToolUse) -> dict[str, Any]:
        """A pattern tool runs in a fresh instance in the dialog's space and scope, whose
        cause is the turn and the call's place in it (never the model's call id, which a
        server may reuse). It gets the model's input as its arguments (values: links there
        are refused unless its argument schema asks for one), so it cannot write the
        caller's cells; the model gets where its result lives and what it holds."""
        assert spec.pattern is not None
        scope = self.node.scope
        where = ["tool call", self.node.cause, run.turn_id, run.steps,
                 next((i for i, c in enumerate(run.calls) if c.id == call.id), -1)]
        inst = rt.run(spec.pattern, call.input, space=self.node.space, user=scope.user,
                      session=scope.session, cause=where)
        return {"@resultLocation": inst.result.link()["@link"],
                "result": inst.result.get(None), "schema": spec.tool.input_schema}

    def _finish(self, rt: Runtime, run: _TurnRun, outcome: StepsOutcome) -> None:
        if outcome.status is StepsStatus.COMPLETED:
            self._end(rt, run, None, None)
        elif outcome.status is StepsStatus.MAX_STEPS:
            why = f"the turn reached its limit of {self.max_steps} model calls (max_steps)"
            self._end(rt, run, f"{ERROR_PREFIX}: {why}.", why)
        else:
            why = str(outcome.error) if outcome.error is not None else "the model failed"
            self._end(rt, run, f"{ERROR_PREFIX}: {why}", why)

    def _end(self, rt: Runtime, run: _TurnRun, text: str | None, error: str | None) -> None:
        if run.step.phase is TurnPhase.ENDED:
            return  # the final reply's commit ended it
        run.step.abort()
        self._ending.add(run.turn_id)

        def end() -> bool:
            self._flush_usage(run)
            if not self._owns(rt, run):
                return False
            # whatever failed on the way, no call is left without its result
            self._answer_unanswered(TOOL_CANCELLED, run.results)
            if text is not None:
                self._push_message(Message.text(Role.ASSISTANT, text))
            self._end_writes(run, error)
            return True

        try:
            ended = self._retrying(rt, run, end)
        except ConflictError:
            if self._still_owned(rt, run):
                raise
            ended = False  # another process ended or took it meanwhile
        if ended:
            run.step.phase = TurnPhase.ENDED

    def _end_writes(self, run: _TurnRun, error: str | None) -> None:
        """Inside the guarded transaction: the turn is over, and why its last model call
        stopped is written (once a turn: kept in memory until now)."""
        also: dict[str, Any] = {}
        if run.stop is not None:
            also["stop_reason"] = run.stop.value
        if run.outputs:
            also["tool_output"] = {}
            run.outputs = False
        self.state.end(error, also)

    def _system_prompt(self, run: _TurnRun) -> str:
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
        # text that must leave in a request is repaired, not refused: a computed context
        # cell (never checked at the boundary) must not fail every turn of every user
        return scrub_text("\n\n".join(parts))


def model_for(label: str, kind: str, chosen: str | Model | None, rt: Runtime) -> Model:
    """The model a builtin uses: its own (a name resolved through the port, or a Model),
    else the runtime's, else a clear error naming both ways to set one."""
    chosen = chosen if chosen is not None else rt.model
    if chosen is None:
        raise PatternError(
            f"{label} has no model: pass {kind}(..., model='claude-sonnet-4-5') (a name or a "
            "Model), or Runtime(model=...) for every builtin")
    return resolve_model(chosen) if isinstance(chosen, str) else chosen


def _fits(tool: Tool, arguments: dict[str, Any]) -> bool:
    """The step engine's quick check of a call's arguments: the cell layer's compiled,
    strict check of the advertised schema (the one the event schema is checked with when
    the handler gets it). It accepts only what the engine's own check would; whatever it
    refuses the engine checks again, for its verdict and its words to the model."""
    try:
        validate(arguments, tool.input_schema, "arguments")
    except (SchemaError, RecursionError):  # refused, or too deep to say: the engine says
        return False
    return True


def _last_step(messages: Cell) -> list[Any]:
    """The history from its last assistant message on (what ``unanswered_calls`` reads),
    read without copying the rest: a turn must not cost what the whole history costs."""
    raw = messages.raw(copy=False)
    if not isinstance(raw, list):
        return messages.get()
    for i in range(len(raw) - 1, -1, -1):
        item = raw[i]
        if not isinstance(item, dict) or is_link(item):
            return messages.get()  # unusual: read it all, links followed
        if item.get("role") == Role.ASSISTANT.value:
            return [messages.key(j).get() for j in range(i, len(raw))]
    return []
