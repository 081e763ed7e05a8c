"""The step engine: call the model, run the tools it asks for, call it again, until it answers.

One loop, written once, for every caller of the port that lets a model use tools: the
``llm_dialog`` builtin (tools routed to handler cells) and the conversation object (tools
that are Python methods). It knows nothing of cells: a caller gives it

- ``build_request(history, step) -> Request``, called before *every* model call with the
  whole history so far (the dialog rebuilds its system prompt each step). The engine
  changes nothing in the request it gets but a forcing ``tool_choice`` (below); it reads
  ``request.tools`` to check the calls made;
- ``execute(call) -> output``, an async function that runs one tool call;
- a ``StepSink`` of optional callbacks that hear what happens as it happens.

One **step** is one model call plus the tool calls of its reply::

    build_request -> model.stream -> append the reply -> check and run each call, in order
                  -> append one message of results -> next step

The loop ends, returning a ``StepsOutcome``, on a reply without tool calls (``COMPLETED``),
after ``max_steps`` model calls (``MAX_STEPS``: the last step's tools have run and their
results are appended, so the history is valid and a caller can go on later), or when the
model fails (``ERROR``: an ``LLMError`` left over after the port's own retries, or an empty
reply). It never raises for those three; it raises for cancellation and for bugs (an
exception from ``build_request`` or from a sink callback).

Tool calls never break the loop: an unknown tool name, arguments that fail the advertised
tool's ``input_schema``, an ``execute`` that raises, all become an error ``ToolResult`` whose
text tells the model what a correct call looks like, and the loop goes on. Such a text
quotes the model's input only in part (``_NAME_CHARS`` of a name or a path,
``_DETAIL_CHARS`` of a validation message), so a 1 MB tool name costs the next request a
few hundred characters, not a megabyte.

A reply's tool call ids are the engine's to keep unique and replayable, for any model: a
reply whose call reuses an id of the history (or of another call of the same reply), or
carries one no provider would take back (not ``replayable_call_id``: a 900 KB id, one
holding U+FFFD or punctuation), has that call's id replaced by a fresh one (``CallIds``)
before it is appended, and a warning is logged. The id only pairs a call
with its result, which the engine writes itself, so nothing is lost; refusing the reply
instead would fail a turn over a model's bookkeeping (a scripted model restarted on an old
history repeats its ids, and so do some OpenAI-compatible servers).

A forcing ``tool_choice`` (``required``, or a named tool) makes the model call a tool, and
a reply with a call is never the last: under such a choice at every step a run could only
end at ``max_steps``. So a forcing choice goes only with a request that answers a prompt
(``ToolChoiceScope.PROMPT``, the default): a request whose last message carries tool
results (every step after the first, in a run that starts from a prompt) goes out with
``tool_choice="auto"``, whatever ``build_request`` put there. The model called the tools it
chose; with their results it must be free to answer. The rule reads the history, not the
run, so a caller going one step at a time (``max_steps=1``) gets it too. ``EVERY_STEP``
sends each request as built, for a caller that ends the run itself. ``auto`` and ``none``
are always sent as built.

Cancellation is the caller's anyio cancel scope. Whatever is in flight (the model request,
a tool) is cancelled; but every tool call the sink has been told about is answered before
the cancellation propagates, so what the sink heard is always a history every provider
accepts. See ``run_steps`` for the precise contract.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

import anyio
import pydantic_core
from anyio.lowlevel import checkpoint_if_cancelled

from .._text import scrub_text
from .errors import Fault, LLMError, cap_message
from .events import Assembler, TextDelta
from .history import CallIds
from .model import Model
from .types import (
    AUTO,
    Message,
    Request,
    Response,
    Role,
    Tool,
    ToolResult,
    ToolUse,
    Usage,
    made,
)

__all__ = [
    "DEFAULT_MAX_STEPS",
    "TOOL_CANCELLED",
    "BuildRequest",
    "Execute",
    "StepSink",
    "StepsOutcome",
    "StepsStatus",
    "ToolChoiceScope",
    "ToolError",
    "ToolOutput",
    "check_arguments",
    "run_steps",
]

LOGGER = logging.getLogger("celldialog.llm.steps")

DEFAULT_MAX_STEPS = 50
TOOL_CANCELLED = "Tool call cancelled"
"""The content of the error result that answers a tool call cut short by cancellation."""

_SCHEMA_CHARS = 4000  # the most of a tool's schema quoted back to the model
_DETAIL_CHARS = 500  # the most of one validation or exception message quoted back
_NAME_CHARS = 200  # the most of a tool name or an argument path (model input) quoted back

ToolOutput: TypeAlias = Any
"""What ``execute`` returns: a ``str`` (the result text, as is), a ``ToolResult`` (used as
is, ``is_error`` included; its ``tool_use_id`` is set to the call's), or any other value
pydantic can serialise (dicts, lists, numbers, None, dataclasses, models), sent as compact
JSON."""

BuildRequest: TypeAlias = Callable[[Sequence[Message], int], Request]
Execute: TypeAlias = Callable[[ToolUse], Awaitable[ToolOutput]]
_Callback: TypeAlias = Callable[[Any], Awaitable[None] | None] | None


class ToolError(Exception):
    """Raise it from ``execute`` to answer the call with exactly this message as an error
    result: no exception type, no schema added (any other exception gets both)."""


class ToolChoiceScope(StrEnum):
    """Which requests a forcing ``tool_choice`` (``required``, a named tool) goes with."""

    PROMPT = "prompt"  # those answering a prompt; one sending tool results goes with "auto"
    EVERY_STEP = "every_step"  # every request as built: the run ends at max_steps at the
    #                            latest (for a caller that ends it itself, by cancelling)


class StepsStatus(StrEnum):
    """How ``run_steps`` ended."""

    COMPLETED = "completed"  # a reply without tool calls: ``StepsOutcome.final``
    MAX_STEPS = "max_steps"  # max_steps model calls made; the last one's results appended
    ERROR = "error"  # the model failed or gave an empty reply: ``StepsOutcome.error``


@dataclass(frozen=True)
class StepsOutcome:
    """What a run did. ``messages`` are the messages it appended, in order (assistant
    replies and tool results; the caller's history is not repeated); ``steps`` counts the
    model calls made (a failed one included); ``usage`` sums the usage of those that
    answered; ``response`` is the last reply received (None if none was)."""

    status: StepsStatus
    messages: tuple[Message, ...]
    steps: int
    usage: Usage
    response: Response | None = None
    error: LLMError | None = None

    @property
    def final(self) -> Message | None:
        """The reply without tool calls that completed the run, or None."""
        return self.messages[-1] if self.status is StepsStatus.COMPLETED else None


@dataclass(frozen=True)
class StepSink:
    """Callbacks that hear a run as it happens; each is optional and may be sync or async.

    - ``on_step(step)``: a model call is about to be made (``step`` counts from 1);
    - ``on_text(delta)``: text of the reply, as it streams in;
    - ``on_usage(usage)``: what that model call cost, once its reply is complete;
    - ``on_message(message)``: a message was appended to the history: the assistant reply,
      then (if it called tools) the user message holding one result per call. Each arrives
      before anything later happens (the next tool call, the next model call), one at a
      time, in order, and is delivered even under cancellation (shielded): what
      ``on_message`` heard is always a valid history;
    - ``on_tool_result(result)``: one tool call finished with ``result``, before the next
      call starts (the step's results message follows when its last call is done; a caller
      that ends a step early, by cancelling it, knows from these which calls really ran);
    - ``on_end(outcome)``: the run returned ``outcome`` (not called when it raises);
    - ``on_response(response)``: a model call's reply is complete (its stop reason, its
      usage), before it is appended; not called for a call that failed.
    """

    on_step: Callable[[int], Awaitable[None] | None] | None = None
    on_text: Callable[[str], Awaitable[None] | None] | None = None
    on_usage: Callable[[Usage], Awaitable[None] | None] | None = None
    on_message: Callable[[Message], Awaitable[None] | None] | None = None
    on_tool_result: Callable[[ToolResult], Awaitable[None] | None] | None = None
    on_end: Callable[[StepsOutcome], Awaitable[None] | None] | None = None
    on_response: Callable[[Response], Awaitable[None] | None] | None = None


async def _emit(callback: _Callback, value: Any) -> None:
    if callback is not None:
        result = callback(value)
        if result is not None and inspect.isawaitable(result):  # most sinks return None
            await result


async def run_steps(
    model: Model,
    build_request: BuildRequest,
    *,
    execute: Execute,
    history: Sequence[Message] = (),
    sink: StepSink | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    tool_choice_scope: ToolChoiceScope | str = ToolChoiceScope.PROMPT,
    arguments_ok: Callable[[Tool, dict[str, Any]], bool] | None = None,
) -> StepsOutcome:
    """Run model calls and their tool calls until the model answers without calling a tool.

    ``history`` is the conversation so far; ``build_request(history + appended, step)``
    builds each request. Each reply is streamed (``model.stream``), its text forwarded to
    ``sink.on_text`` as it arrives, and appended as it assembled (blocks in the order the
    model produced them: reasoning, text, tool calls). Its tool calls are checked against
    the tools of the request that produced it and run through ``execute`` one at a time, in
    order; their results form one user message, a ``ToolResult`` per call in call order.

    Returns a ``StepsOutcome``: ``COMPLETED``, ``MAX_STEPS`` (after ``max_steps`` model
    calls, whose last tool results are appended) or ``ERROR`` (an ``LLMError`` from the model,
    including a malformed stream, or an empty reply: no text and no tool calls, which is not
    appended). Raises ``ValueError`` for a ``max_steps`` below 1.

    ``tool_choice_scope``: a forcing ``tool_choice`` (``required``, a named tool) goes only
    with a request that answers a prompt; one whose last message carries tool results goes
    out with ``"auto"`` (``PROMPT``, the default: in a run from a prompt, every step after
    the first). ``EVERY_STEP`` sends every request as built.

    ``arguments_ok(tool, arguments)``: a caller's own quick check of a call's arguments, for
    a caller that checks them again anyway (the dialog checks a handler's event against its
    schema): True means they fit the tool's schema, so the engine's check is skipped; False
    means "not known", and the engine checks (its verdict and its words for the model). It
    must never say True of arguments the schema refuses.

    Cancellation (the caller's cancel scope, or any exception that interrupts the tools):

    - during a model call (or ``on_step`` / ``on_text`` / ``on_usage``): the stream is
      closed, which aborts the provider request; nothing is appended for that step;
    - once a reply with tool calls is being appended: its ``on_message`` completes (shielded);
      then the tool in flight is cancelled (``execute`` sees anyio's cancellation at its next
      checkpoint), no further tool starts, and each call without a result is answered with
      ``ToolResult(is_error=True, content=TOOL_CANCELLED)``; that results message is appended
      and delivered to ``on_message`` (shielded) before the cancellation propagates;
    - the exception propagates unchanged and ``on_end`` is not called. What ``on_message``
      heard is the progress made: a history in which every tool call has its result.

    An ``execute`` that swallows the cancellation keeps the result it returns; the next tool
    still does not start.
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    try:
        scope = ToolChoiceScope(tool_choice_scope)
    except ValueError:
        raise ValueError(f"tool_choice_scope must be one of {[s.value for s in ToolChoiceScope]}"
                         f", got {tool_choice_scope!r}") from None
    past = list(history)
    run = _StepLoop(model, build_request, execute, past, sink or StepSink(), CallIds.of(past),
                    relax_choice=scope is ToolChoiceScope.PROMPT, arguments_ok=arguments_ok)
    outcome = await run.loop(max_steps)
    await _emit(run.sink.on_end, outcome)
    return outcome


@dataclass
class _StepLoop:
    model: Model
    build_request: BuildRequest
    execute: Execute
    history: list[Message]
    sink: StepSink
    ids: CallIds  # every call id of the history: a reply's calls get ids none of these
    relax_choice: bool = True  # a forcing tool_choice goes with a prompt only (module doc)
    arguments_ok: Callable[[Tool, dict[str, Any]], bool] | None = None  # run_steps' doc
    appended: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    steps: int = 0
    last: Response | None = None

    def outcome(self, status: StepsStatus, error: LLMError | None = None) -> StepsOutcome:
        return StepsOutcome(status, tuple(self.appended), self.steps, self.usage, self.last,
                            error)

    async def loop(self, max_steps: int) -> StepsOutcome:
        while self.steps < max_steps:
            await checkpoint_if_cancelled()  # cancelled while a message was reported: stop
            self.steps += 1
            request = self.build_request(tuple(self.history), self.steps)
            if not isinstance(request, Request):
                raise TypeError(
                    f"build_request must return a runtime.llm Request, got "
                    f"{type(request).__name__}"
                )
            if self.relax_choice and request.tool_choice.forces and _sends_results(request):
                request = request.model_copy(update={"tool_choice": AUTO})  # module doc
            await _emit(self.sink.on_step, self.steps)
            try:
                response = await self.call_model(request)
            except LLMError as e:
                return self.outcome(StepsStatus.ERROR, e)
            response = self.own_ids(response)
            self.last = response
            await _emit(self.sink.on_response, response)
            self.usage += response.usage
            await _emit(self.sink.on_usage, response.usage)
            message = response.message
            calls = message.tool_uses()
            if not calls and not message.text_content().strip():
                return self.outcome(StepsStatus.ERROR, self.empty(response))
            await self.append(message)
            if not calls:
                return self.outcome(StepsStatus.COMPLETED)
            await self.run_tools(calls, request.tools)
        return self.outcome(StepsStatus.MAX_STEPS)

    async def call_model(self, request: Request) -> Response:
        assembler = Assembler(self.model.provider)
        stream = self.model.stream(request)
        closing = aclosing(stream) if hasattr(stream, "aclose") else nullcontext()
        async with closing:  # closed at once when cancelled: the HTTP request is released
            async for event in stream:
                assembler.feed(event)
                if isinstance(event, TextDelta) and event.text:
                    await _emit(self.sink.on_text, scrub_text(event.text))
        return assembler.response()

    def own_ids(self, response: Response) -> Response:
        """``response`` with each tool call whose id is already used (by the history or an
        earlier call of the reply) or not replayable given a fresh one (module doc)."""
        blocks = list(response.message.blocks)
        renamed = []
        for i, block in enumerate(blocks):
            if isinstance(block, ToolUse):
                cid = self.ids.take(block.id)
                if cid != block.id:
                    renamed.append(block.id)
                    blocks[i] = block.model_copy(update={"id": cid})
        if not renamed:
            return response
        LOGGER.warning("%s replied with tool call ids already used in the history or that "
                       "no provider would take back (%s): fresh ids given", self.model.provider,
                       ", ".join(_quoted(r, 40) for r in renamed[:5]))
        message = response.message.model_copy(update={"blocks": tuple(blocks)})
        return response.model_copy(update={"message": message})

    def empty(self, response: Response) -> LLMError:
        return LLMError(
            f"the model returned an empty reply: no text and no tool calls "
            f"(stop reason: {response.stop_reason.value})",
            fault=Fault.TERMINAL, provider=self.model.provider,
        )

    async def append(self, message: Message) -> None:
        self.history.append(message)
        self.appended.append(message)
        callback = self.sink.on_message
        if callback is None:
            return
        result = callback(message)  # a synchronous callback cannot be cancelled midway
        if result is not None and inspect.isawaitable(result):
            with anyio.CancelScope(shield=True):  # a message appended is a message reported
                await result

    async def run_tools(self, calls: list[ToolUse], tools: Sequence[Tool]) -> None:
        advertised: dict[str, Tool] = {}
        for tool in tools:
            advertised.setdefault(tool.name, tool)
        results: list[ToolResult] = []
        try:
            for call in calls:
                await checkpoint_if_cancelled()  # no tool starts once cancelled
                result = await self.run_tool(call, advertised)
                results.append(result)
                await _emit(self.sink.on_tool_result, result)
        finally:  # every call gets a result, whatever interrupted the loop
            results += [ToolResult(tool_use_id=c.id, content=TOOL_CANCELLED, is_error=True)
                        for c in calls[len(results):]]
            await self.append(made(Message, role=Role.USER, blocks=tuple(results)))

    async def run_tool(self, call: ToolUse, advertised: dict[str, Tool]) -> ToolResult:
        tool = advertised.get(call.name)
        if tool is None:
            return _error(call, _unknown_tool(call.name, advertised))
        ok = self.arguments_ok
        problem = None if ok is not None and ok(tool, call.input) else check_arguments(
            tool, call.input)
        if problem is not None:
            return _error(call, problem)
        try:
            output = await self.execute(call)
        except ToolError as e:
            return _error(call, str(e) or f"Tool {_quoted(call.name)} failed.")
        except Exception as e:
            LOGGER.warning("tool %s raised %s", _quoted(call.name), type(e).__name__,
                           exc_info=True)
            return _error(call, f"Tool {_quoted(call.name)} failed: {_describe(e)}. "
                                f"{_schema_hint(tool)}")
        if isinstance(output, ToolResult):
            return output if output.tool_use_id == call.id else output.model_copy(
                update={"tool_use_id": call.id})
        if isinstance(output, str):
            return ToolResult(tool_use_id=call.id, content=output)
        try:
            text = pydantic_core.to_json(output, inf_nan_mode="null").decode()
        except (ValueError, TypeError, RecursionError) as e:
            LOGGER.error("tool %s returned a value that is not JSON: %s", _quoted(call.name), e)
            return _error(call, f"Tool {_quoted(call.name)} ran, but returned a value that cannot "
                                f"be sent to the model ({type(output).__name__}): the tool is "
                                "broken, not the call. Do not retry it.")
        return ToolResult(tool_use_id=call.id, content=text)


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> str | None:
    """None if ``arguments`` fit the tool's schema, else what to tell the model (the
    engine's own check, for a caller that runs a tool outside it)."""
    import jsonschema  # on first use: importing the port stays cheap

    try:
        validator = _tool_validator(tool)
        if validator.is_valid(arguments):  # the common case: no error tree to rank
            return None
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    except RecursionError:
        return (f"Invalid arguments for tool {tool.name!r}: they nest too deeply to check. "
                f"{_schema_hint(tool)}")
    except Exception as e:  # an invalid schema, a $ref that cannot be resolved...
        LOGGER.error("tool %r has an unusable input schema: %s", tool.name, _describe(e))
        return (f"Tool {tool.name!r} cannot be called: its input schema is unusable "
                f"({_describe(e)}). The tool is broken, not the call: do not retry it.")
    if error is None:
        return None
    where = "".join(f"/{p}" for p in error.absolute_path) or "the top level"
    where = cap_message(where, _NAME_CHARS)  # the keys are the model's input
    return (f"Invalid arguments for tool {tool.name!r}: at {where}, "
            f"{cap_message(error.message, _DETAIL_CHARS)}. {_schema_hint(tool)}")


_BY_TOOL: dict[int, tuple[Tool, Any]] = {}  # id(tool) -> (tool: keeps the id unique, validator)


def _tool_validator(tool: Tool) -> Any:
    """The validator of a tool's schema. A caller advertises the same ``Tool`` objects step
    after step, so they are looked up by identity first (no canonical JSON per call)."""
    hit = _BY_TOOL.get(id(tool))
    if hit is not None and hit[0] is tool:
        return hit[1]
    validator = _validator(json.dumps(tool.input_schema, sort_keys=True))
    if len(_BY_TOOL) >= 1024:
        _BY_TOOL.clear()
    _BY_TOOL[id(tool)] = (tool, validator)
    return validator


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """The validator of a schema (given as canonical JSON), its schema checked once: checking
    costs a millisecond, and every run of a dialog advertises the same tools again."""
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _sends_results(request: Request) -> bool:
    """Does ``request`` send tool results (its last message carries one), rather than ask
    the model to answer a prompt?"""
    return bool(request.messages) and any(
        type(b) is ToolResult for b in request.messages[-1].blocks)


def _error(call: ToolUse, text: str) -> ToolResult:
    return ToolResult(tool_use_id=call.id, content=text, is_error=True)


def _describe(e: BaseException) -> str:
    text = str(e)
    return type(e).__name__ + (f": {cap_message(text, _DETAIL_CHARS)}" if text else "")


def _schema_hint(tool: Tool) -> str:
    schema = json.dumps(tool.input_schema, ensure_ascii=False, separators=(",", ":"))
    return (f"A correct call passes arguments matching this JSON Schema: "
            f"{cap_message(schema, _SCHEMA_CHARS)}")


def _quoted(text: str, limit: int = _NAME_CHARS) -> str:
    """``repr(text)``, of at most ``limit`` characters of it: how model input is quoted."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r} [... {len(text):,} characters in all]"


def _unknown_tool(name: str, advertised: dict[str, Tool]) -> str:
    if not advertised:
        return (f"There is no tool {_quoted(name)}: no tools are available. Answer without "
                "calling one.")
    names = ", ".join(repr(n) for n in advertised)
    return (f"There is no tool {_quoted(name)}. Call one of the available tools by its exact "
            f"name: {names}.")
