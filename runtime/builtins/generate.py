"""``generate_text`` / ``generate_object``: one-shot generations that live in the cell graph.

Called inside a ``@pattern``, each makes one builtin node whose outputs are cells
(``pending``, ``result``, ``error``, ``partial``), scoped like the narrowest cell it reads. It
reacts to its inputs: a kernel effect (``Cell.sink``) watches the prompt (or ``messages``) and
``system``, and on every change nudges the node's ``request`` stream; that handler reads the
inputs, and starts a generation owned by the instance (``node.spawn``). A generation reads
as a pipeline::

    inputs change -> sink -> request handler (one commit: pending, the request's hash, a turn id)
                  -> spawn -> run_steps (the port's step engine) -> the end, guarded by the turn id

- **memoised**: the hash of the request (model, system, messages, tools, limits) is stored in
  a state cell; a request with the hash the outputs already answer makes no model call, in
  this process or after a restart. A request that ended in an error is tried again when the
  node is built again (a restart); a generation cut short by a stopped process (``pending``
  stored true, nothing running) runs again the same way.
- **empty** prompt or messages: no request; ``result`` None, ``pending`` False.
- **superseded**: a newer request cancels the one in flight; every write a generation makes
  happens only while its turn id is the current one, so a late reply lands nowhere.
- **errors** set ``error`` and ``pending`` False; no path leaves a generation pending.

``generate_object`` validates its result against ``schema``: without tools the model must
answer with JSON text (a fenced code block is accepted); with tools the generation ends when
the model calls ``presentResult`` (advertised with the schema; a schema that is not an object
is wrapped as ``{"result": ...}``), and it is an error if the model stops without calling it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from ..cells import (
    BuiltinNode,
    Cell,
    Runtime,
    SchemaLike,
    canonical,
    computed,
    current_runtime,
    to_json_schema,
    validate,
)
from ..errors import ConflictError, PatternError, SchemaError
from ..llm import (
    DEFAULT_MAX_STEPS,
    Message,
    Model,
    Request,
    Role,
    StepSink,
    StepsOutcome,
    StepsStatus,
    TextBlock,
    ToolUse,
    run_steps,
)
from ..llm.errors import cap_message
from .dialog_input import inert
from .dialog_tools import PRESENT_RESULT, ToolSpec, build_catalog, inline_refs
from .llm_dialog import model_for
from .turns import PartialText, TurnState, log_failed_turn

__all__ = ["Generation", "generate_object", "generate_text"]

log = logging.getLogger("celldialog.generate")

_SHOWN = 200  # characters of a bad answer quoted in an error
# a generation's field of its turn record, beside the turn protocol's (initial value)
_GENERATE_OWN = {"request": None}
_END_RETRIES = 3  # a generation's end written again on fresh state after a conflict


@dataclass(frozen=True)
class Generation:
    """The outputs of ``generate_text`` / ``generate_object``: cells to put in the pattern's
    result. ``result`` is the text (or the validated object) of the latest request, None
    while it runs; ``partial`` the text streamed so far while ``pending``."""

    pending: Cell
    result: Cell
    error: Cell
    partial: Cell


def generate_text(prompt: Cell | str | None = None, *, messages: Cell | None = None,
                  system: str | Cell | None = None, model: str | Model | None = None,
                  max_tokens: int | None = None, tools: Mapping[str, Any] | None = None,
                  max_steps: int = DEFAULT_MAX_STEPS, name: str | None = None) -> Generation:
    """The model's answer to ``prompt`` (a string or a cell holding one) or to ``messages``
    (a cell holding the port's messages as JSON), regenerated when they change. ``tools``
    are handler tools, as ``llm_dialog`` takes them; ``result`` is the final reply's text."""
    return _build("generate_text", prompt, messages, system, model, max_tokens, tools,
                  max_steps, None, name)


def generate_object(prompt: Cell | str | None = None, *, schema: SchemaLike,
                    messages: Cell | None = None, system: str | Cell | None = None,
                    model: str | Model | None = None, max_tokens: int | None = None,
                    tools: Mapping[str, Any] | None = None,
                    max_steps: int = DEFAULT_MAX_STEPS, name: str | None = None) -> Generation:
    """Like ``generate_text``, but ``result`` is a JSON value matching ``schema`` (a JSON
    Schema dict or a type pydantic understands): without tools the model answers with JSON,
    with tools it ends by calling ``presentResult``."""
    js = to_json_schema(schema)  # SchemaError names what is wrong with it
    if js is None:
        raise PatternError("generate_object(schema=...) needs a schema: a JSON Schema dict or "
                           "a type (a pydantic model, list[str]...)")
    return _build("generate_object", prompt, messages, system, model, max_tokens, tools,
                  max_steps, js, name)


def _build(kind: str, prompt: Any, messages: Any, system: Any, model: Any, max_tokens: Any,
           tools: Mapping[str, Any] | None, max_steps: Any, schema: dict[str, Any] | None,
           name: str | None) -> Generation:
    if prompt is not None and not isinstance(prompt, Cell | str):
        raise PatternError(f"{kind}(prompt=...) takes a str or a Cell, got {prompt!r}")
    if messages is not None and not isinstance(messages, Cell):
        raise PatternError(f"{kind}(messages=...) takes a Cell holding messages, got "
                           f"{messages!r}")
    if prompt is not None and messages is not None:
        raise PatternError(f"{kind}() takes a prompt or messages=..., not both")
    if prompt is None and messages is None:
        raise PatternError(f"{kind}() needs a prompt (a str or a Cell) or messages=... "
                           "(a Cell holding messages)")
    if system is not None and not isinstance(system, Cell | str):
        raise PatternError(f"{kind}(system=...) takes a str or a Cell, got {system!r}")
    if model is not None and not isinstance(model, str | Model):
        raise PatternError(f"{kind}(model=...) takes a model name or a runtime.llm Model, "
                           f"got {model!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise PatternError(f"{kind}(max_tokens=...) must be a positive integer, got "
                           f"{max_tokens!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise PatternError(f"{kind}(max_steps=...) must be a positive integer, got "
                           f"{max_steps!r}")
    wrapped = False
    present: dict[str, Any] | None = None
    if schema is not None and tools:
        present = inline_refs(schema)
        if present.get("type") != "object":  # a tool's input is an object: wrap the value
            wrapped = True
            present = {"type": "object", "properties": {"result": present},
                       "required": ["result"], "additionalProperties": False}
    catalog = build_catalog(tools or {}, False, present)
    inputs = [x for x in (prompt, messages, system) if isinstance(x, Cell)]
    node = BuiltinNode(kind, inputs, name=name)
    gen = _Generation(node, kind, prompt, messages, system, model, max_tokens, catalog,
                      max_steps, schema, wrapped)
    return Generation(pending=gen.pending, result=gen.result, error=gen.error,
                      partial=gen.partial)


class _BadInput(Exception):
    """The inputs hold something no request can be made of (the text says what)."""


class _Failure(Exception):
    """A generation that ended without a result (the text says why)."""


@dataclass(frozen=True)
class _Ask:
    """One request, ready to send, and its hash."""

    system: str
    messages: tuple[Message, ...]
    digest: str


@dataclass(frozen=True)
class _Flight:
    """A generation running in this process."""

    turn: str
    digest: str
    scope: anyio.CancelScope
    owner: _Generation


# Generations in flight per runtime, by the document of their `request` cell: two instances
# sharing a node's state (a user-scoped prompt, two sessions) share its one generation.
_FLIGHTS: weakref.WeakKeyDictionary[Runtime, dict[tuple[str, str, str], _Flight]] = (
    weakref.WeakKeyDictionary())

_NOTHING: Any = object()


class _GenerationRun:
    __slots__ = ("present", "text", "turn")

    def __init__(self, turn: str, text: PartialText) -> None:
        self.turn = turn
        self.text = text
        self.present: Any = _NOTHING


class _Generation:
    """One generate node: its state cells, its request stream, the sink that feeds it."""

    def __init__(self, node: BuiltinNode, kind: str, prompt: Cell | str | None,
                 messages: Cell | None, system: Cell | str | None, model: str | Model | None,
                 max_tokens: int | None, catalog: dict[str, ToolSpec], max_steps: int,
                 schema: dict[str, Any] | None, wrapped: bool) -> None:
        self.node = node
        self.kind = kind
        self.model = model
        self.max_tokens = max_tokens
        self.catalog = catalog
        self.max_steps = max_steps
        self.schema = schema
        self.wrapped = wrapped
        self.use_messages = messages is not None
        self.presents = PRESENT_RESULT in catalog
        self.instruction = self._instruction()
        # pending, turn, partial and the hash of the request answered: the turn's record;
        # error: its outcome (turns.py); the result a document of its own
        self.state = TurnState(node, _GENERATE_OWN)
        self.pending = self.state.pending
        self.error = self.state.error
        self.partial = self.state.partial
        self.result = node.state("result", None)
        self.request = self.state.record["request"]
        self.key = (self.request.space, self.request.scope, self.request.id)
        self._rt: Runtime | None = None

        def read() -> dict[str, Any]:
            return {"prompt": _value(prompt), "messages": _value(messages),
                    "system": _value(system)}

        read.__name__ = f"{node.name}.inputs"
        self.inputs = computed(read)
        nudge = node.stream("request", self._on_request)
        # the kernel effect: now (while the pattern builds) and after each change. The event
        # runs once the instance exists, when its handler can start work it owns
        dispose = self.inputs.sink(lambda _: nudge.send(None))
        node.on_stop(dispose)
        node.on_stop(self._stop)

    # -- the request stream (a handler: synchronous, one transaction) -----------------

    def _on_request(self, _event: Any) -> None:
        rt = self._rt = current_runtime()
        flights = _FLIGHTS.setdefault(rt, {})
        try:
            ask = self._ask(self.inputs.get(), rt)
        except Exception as e:  # an input (or a computed one it reads) is unusable
            self._cancel(flights)
            self._settle(None, str(e) or type(e).__name__)
            return
        if ask is None:  # empty: nothing to generate, and nothing left from before
            self._cancel(flights)
            self._settle(None, None)
            return
        flight = flights.get(self.key)
        if self.request.get() == ask.digest:
            if (flight is not None and flight.digest == ask.digest
                    and self.state.current_id() == flight.turn):
                return  # this very request is running
            if not self.pending.get() and self.error.get() is None:
                return  # memoised: the outputs answer it already
            if (self.pending.get() and flight is None and self.state.holder_alive(rt)
                    and (self.state.turn.get() or {}).get("holder") != rt.lease.holder):
                return  # another live process runs this very request: its answer lands
            # pending with nothing running (its process stopped), or failed: run it again
        self._cancel(flights)
        turn = self.state.begin(rt)
        self.request.set(ask.digest)
        self.result.set(None)
        scope = self.node.spawn(self._run, rt, turn, ask, name=f"{self.node.label} generation")
        flights[self.key] = _Flight(turn, ask.digest, scope, self)

    def _settle(self, digest: str | None, error: str | None) -> None:
        self.state.end(error)
        self.request.set(digest)
        self.result.set(None)

    def _cancel(self, flights: dict[tuple[str, str, str], _Flight]) -> None:
        flight = flights.pop(self.key, None)
        if flight is not None:
            flight.scope.cancel()

    def _stop(self) -> None:
        flights = _FLIGHTS.get(self._rt) if self._rt is not None else None
        if flights is None:
            return
        flight = flights.get(self.key)
        if flight is not None and flight.owner is self:
            flights.pop(self.key)
            flight.scope.cancel()

    def _ask(self, values: dict[str, Any], rt: Runtime) -> _Ask | None:
        """The request the inputs make (None when they are empty)."""
        if self.use_messages:
            raw = values["messages"]
            if raw is None or raw == []:
                return None
            if not isinstance(raw, list):
                raise _BadInput(f"messages must be a list of messages, got {type(raw).__name__}")
            try:
                history = tuple(Message.model_validate(m) for m in raw)
            except ValueError as e:
                raise _BadInput(f"messages holds something that is not a message: "
                                f"{cap_message(str(e), 500)}") from None
        else:
            prompt = values["prompt"]
            if prompt is None or (isinstance(prompt, str) and not prompt.strip()):
                return None
            if not isinstance(prompt, str):
                raise _BadInput(f"the prompt must be a string, got {type(prompt).__name__} "
                                f"{cap_message(json.dumps(prompt), 80)}")
            history = (Message(role=Role.USER, blocks=(TextBlock(text=prompt),)),)
        system = values["system"]
        if system is not None and not isinstance(system, str):
            raise _BadInput(f"the system prompt must be a string, got {type(system).__name__}")
        full = "\n\n".join(p for p in (system or "", self.instruction) if p)
        chosen = self.model if self.model is not None else rt.model
        digest = hashlib.sha256(canonical({
            "kind": self.kind, "model": _model_id(chosen), "system": full,
            "messages": [m.model_dump(mode="json") for m in history],
            "tools": [s.tool.model_dump(mode="json") for s in self.catalog.values()],
            "max_tokens": self.max_tokens, "max_steps": self.max_steps,
        }).encode()).hexdigest()
        return _Ask(full, history, digest)

    def _instruction(self) -> str:
        if self.schema is None:
            return ""
        if self.presents:
            return (f"When you have the result, call the {PRESENT_RESULT} tool with it: that "
                    "ends the task.")
        shown = json.dumps(inline_refs(self.schema), sort_keys=True, ensure_ascii=False)
        return ("Answer with only a JSON value matching this JSON Schema, with no other text: "
                + shown)

    # -- a generation ----------------------------------------------------------------

    async def _run(self, rt: Runtime, turn: str, ask: _Ask) -> None:
        rt.lease.hold()
        # the first text shows at once
        run = _GenerationRun(turn, PartialText(self.state, float("-inf")))
        try:
            value = await self._generate(rt, run, self._resolve(rt), ask)
            self._end(rt, turn, value, None)
        except Exception as e:  # no path leaves a generation pending
            if isinstance(e, _Failure):
                log.info("%s: %s", self.node.label, e)
            else:
                log_failed_turn(log, self.node.label, "the generation failed", e)
            self._end(rt, turn, None, str(e) or type(e).__name__)
        finally:
            flights = _FLIGHTS.get(rt)
            if flights is not None and (f := flights.get(self.key)) is not None \
                    and f.turn == turn:
                del flights[self.key]
            rt.lease.drop()

    def _resolve(self, rt: Runtime) -> Model:
        return model_for(self.node.label, self.kind, self.model, rt)

    async def _generate(self, rt: Runtime, run: _GenerationRun, model: Model, ask: _Ask) -> Any:
        tools = tuple(s.tool for s in self.catalog.values())
        stop = anyio.CancelScope()  # presentResult ends the run: no model call after it

        def build(history: Any, step: int) -> Request:
            return Request(system=ask.system, messages=tuple(history), tools=tools,
                           max_tokens=self.max_tokens)

        async def execute(call: ToolUse) -> Any:
            spec = self.catalog[call.name]  # the engine checked the name and arguments
            if spec.stream is None:  # presentResult: the result, and the end
                run.present = call.input
                stop.cancel()
                return "Result presented."
            await rt.send(spec.stream, call.input)
            return f"{call.name} done."

        sink = StepSink(on_text=lambda delta: self._on_text(rt, run, delta),
                        on_message=lambda message: self._on_message(rt, run, message))
        outcome: StepsOutcome | None = None
        with stop:
            outcome = await run_steps(model, build, execute=execute, history=ask.messages,
                                      sink=sink, max_steps=self.max_steps)
        if run.present is not _NOTHING:
            value = run.present["result"] if self.wrapped else run.present
            return self._check(inert(value))
        assert outcome is not None  # only presentResult cancels `stop`
        if outcome.status is StepsStatus.ERROR:
            raise _Failure(str(outcome.error) if outcome.error is not None
                           else "the model failed")
        never = f" without calling {PRESENT_RESULT}" if self.presents else ""
        if outcome.status is StepsStatus.MAX_STEPS:
            raise _Failure(f"the generation reached its limit of {self.max_steps} model calls "
                           f"(max_steps){never}")
        if self.presents:
            raise _Failure(f"the model finished{never}: {self.kind} with tools ends when the "
                           f"model calls {PRESENT_RESULT} with the result, and it answered "
                           "with text instead")
        final = outcome.final
        text = final.text_content() if final is not None else ""
        if self.schema is None:
            return text
        return self._check(inert(_parse_json(text)))

    def _check(self, value: Any) -> Any:
        assert self.schema is not None
        try:
            validate(value, self.schema, lambda: "result")
        except SchemaError as e:
            raise _Failure(f"the model's answer does not match the schema: {e}") from None
        return value

    def _on_text(self, rt: Runtime, run: _GenerationRun, delta: str) -> None:
        run.text.feed(rt, run.turn, delta)

    def _on_message(self, rt: Runtime, run: _GenerationRun, message: Message) -> None:
        if message.role is not Role.ASSISTANT or not message.tool_uses():
            return
        with rt.transaction():  # a step that called tools: the next one streams afresh
            if self.state.owns(rt, run.turn):
                run.text.reset()

    def _end(self, rt: Runtime, turn: str, value: Any, error: str | None) -> None:
        """The generation's result or error, and its end, in one commit while it is still
        the current one: run again on a conflict (another process's write to the outcome,
        say an error dismissed, caught up with since), on the fresh state."""
        for attempt in range(_END_RETRIES + 1):
            try:
                with rt.transaction():
                    if not self.state.owns(rt, turn):
                        return  # superseded, emptied or stopped: a late answer lands nowhere
                    self.result.set(value)
                    self.state.end(error)
                return
            except ConflictError:
                if attempt == _END_RETRIES:
                    raise
                self.state.refresh(rt)  # another process may have replaced the turn


def _value(x: Cell | str | None) -> Any:
    return x.get(None) if isinstance(x, Cell) else x


def _model_id(chosen: Any) -> Any:
    if chosen is None or isinstance(chosen, str):
        return chosen
    return f"{getattr(chosen, 'provider', '')}/{getattr(chosen, 'name', type(chosen).__name__)}"


_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```", re.DOTALL)


def _parse_json(text: str) -> Any:
    """The JSON value the model answered with (inside a fenced code block or not)."""
    body = text.strip()
    fenced = _FENCE.fullmatch(body)
    if fenced is not None:
        body = fenced.group(1).strip()
    if not body:
        raise _Failure("the model's answer is empty, not JSON")

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(body, parse_constant=refuse)
    except json.JSONDecodeError as e:
        raise _Failure(f"the model's answer is not JSON ({e.msg} at line {e.lineno}, column "
                       f"{e.colno}): {cap_message(body, _SHOWN)!r}") from None
    except ValueError as e:
        raise _Failure(f"the model's answer is not JSON ({e}): "
                       f"{cap_message(body, _SHOWN)!r}") from None
