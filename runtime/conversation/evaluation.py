"""One evaluation of a conversation's queued work: the bridge to the step engine.

An ``Evaluation`` lives for one ``await llm``. It runs each ``step``/``loop`` op through
``runtime.llm.steps.run_steps`` (the one turn loop, shared with ``llm_dialog``), opening the
tool sources lazily, at the first op that needs them, and closing them all when the
evaluation ends, however it ends. It tracks the op in flight, so an interrupted evaluation
(cancelled, failed) still yields the progress made: ``snapshot()``, a valid history.

A forcing tool choice (``with_tool_choice("required")`` or a tool's name) goes with a model
call that answers a prompt; one that sends tool results (a loop's later calls, a second
``step()``, a loop resumed) is "auto": the step engine's rule (``ToolChoiceScope.PROMPT``).

The hot path (one model call and its tool calls) does a request build (``model_construct``:
the parts are already valid), the engine's own work, one routing lookup per tool call and a
few appends: no schema is built, no source reopened, no state copied until the op ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..llm.history import unanswered_calls
from ..llm.steps import DEFAULT_MAX_STEPS, StepSink, StepsStatus, run_steps
from ..llm.types import CacheHint, Message, Request, Tool, ToolUse, Usage
from . import telemetry
from .errors import ConversationError, StepLimitError
from .history import has_pending
from .object_tools import ObjectBinding, ObjectTools
from .state import REASONING_EFFORTS, State
from .static_tools import StaticTools
from .toolset import Toolset
from .workspace import WorkspaceTools

__all__ = ["Evaluation", "RunOp"]

@dataclass(frozen=True, slots=True)
class RunOp:
    """A queued ``step`` (``loop=False``: one model call) or ``loop``."""

    loop: bool
    max_steps: int | None = None
    max_tokens: int | None = None


class Evaluation:
    """The open sources and the op in flight of one evaluation."""

    def __init__(self, task_group: TaskGroup | None, *, agent: str | None = None) -> None:
        self._tg = task_group
        self._agent = agent
        self._open: dict[Any, Toolset] = {}  # MCP servers and skills, by their spec
        self._catalog_key: Any = None
        self._catalog: tuple[tuple[Tool, ...], dict[str, tuple[Toolset, str]],
                             ObjectTools | None] | None = None
        # the op in flight
        self._base: State | None = None
        self._appended: list[Message] = []
        self._usage = Usage()
        self._calls = 0
        self._steps = 0
        self._objects: ObjectTools | None = None
        self._last = Usage()
        self._history_at_last = 0

    # -- tool sources ---------------------------------------------------------------

    async def _toolsets(self, state: State) -> tuple[tuple[Tool, ...],
                                                     dict[str, tuple[Toolset, str]],
                                                     ObjectTools | None]:
        key = (tuple(id(b.obj) for b in state.objects), state.blocked, state.mcp,
               state.skills, id(state.workspace), state.static_tools,
               tuple(b.except_ for b in state.objects))
        if self._catalog is not None and key == self._catalog_key and not state.mcp:
            return self._catalog  # (an MCP server's tools may change: listed per op)
        tools: list[Tool] = []
        routes: dict[str, tuple[Toolset, str]] = {}
        objects = ObjectTools(state.objects, state.blocked) if state.objects else None
        sources: list[Toolset] = [objects] if objects is not None else []
        if state.workspace is not None:
            sources.append(WorkspaceTools(state.workspace))
        for server in state.mcp:
            sources.append(await self._open_mcp(server))
        if state.skills or state.workspace is not None:  # built-in skills come with both
            sources.append(await self._open_skills(state))
        for source in sources:
            for tool in await source.list_tools():
                name = original = tool.name
                if name in routes:  # a clash across sources: prefix with the source's name
                    prefix = getattr(source, "name", type(source).__name__)
                    name = f"{prefix}_{tool.name}"[:64]
                    if name in routes:
                        raise ConversationError(
                            f"two tools are both called {name!r}: unbind one source, or hide "
                            "a method with with_tools(obj, except_=(...)) / "
                            "with_blocked_function")
                    tool = tool.model_copy(update={"name": name})
                routes[name] = (source, original)
                tools.append(tool)
        if state.static_tools and tools:
            static = StaticTools(tools, routes)
            tools = list(static.tools)
            routes = {t.name: (static, t.name) for t in tools}
        self._catalog_key = key
        self._catalog = (tuple(tools), routes, objects)
        return self._catalog

    async def _open_mcp(self, server: Any) -> Toolset:
        toolset = self._open.get(server)
        if toolset is None:
            if self._tg is None:  # the LLM opens one whenever an MCP server may be bound
                raise RuntimeError("an MCP server was bound without the evaluation knowing")
            toolset = self._open[server] = await server.open(self._tg)
        return toolset

    async def _open_skills(self, state: State) -> Toolset:
        key = ("skills", state.skills)
        toolset = self._open.get(key)
        if toolset is None:
            from .skills import Skills

            toolset = self._open[key] = await Skills(installed=state.skills).open()
        return toolset

    async def aclose(self) -> None:
        """Close every source opened (an MCP server's process is gone when this returns)."""
        if not self._open:
            return
        with anyio.CancelScope(shield=True):
            for toolset in self._open.values():
                await toolset.aclose()
            self._open.clear()

    # -- running ops -----------------------------------------------------------------

    async def run(self, state: State, op: RunOp, *, steps_done: int = 0) -> State:
        """Run ``op`` on ``state``; the new state (``StepLimitError`` at a loop's limit,
        the port's ``LLMError`` when the model fails)."""
        history = state.history
        if not has_pending(history):
            waiting = unanswered_calls(history)
            if waiting:
                ids = ", ".join(repr(i) for i in waiting)
                raise ConversationError(
                    f"the last reply has tool calls without results ({ids}): answer them "
                    "with with_tool_result(call_id, content, errored) before stepping")
            if not history:
                raise ConversationError(
                    "nothing to send: queue a prompt with with_prompt(...) before step/loop")
            return state  # the turn is complete: nothing to do
        model = state.model.get()
        tools, routes, objects = await self._toolsets(state)
        self._base, self._appended, self._usage = state, [], Usage()
        self._calls, self._steps, self._objects = 0, steps_done, objects
        limit = (op.max_steps or DEFAULT_MAX_STEPS) if op.loop else 1
        left = limit - steps_done
        if left < 1:
            raise self._limit(limit, state)
        system = state.system()
        effort = REASONING_EFFORTS.get(state.reasoning_effort, state.reasoning_effort)
        key = state.key
        max_tokens = op.max_tokens
        choice = state.tool_choice
        if choice.mode != "auto":  # the requests are built unchecked: check it once here
            try:
                choice.check(tools)
            except ValueError as e:
                raise ConversationError(f"with_tool_choice: {e}") from None

        def build(messages: Sequence[Message], step: int) -> Request:
            return Request.model_construct(
                system=system, messages=tuple(messages), tools=tools, max_tokens=max_tokens,
                cache=CacheHint.model_construct(prefix=True, stable_messages=len(messages),
                                                key=key),
                sampling=None, reasoning_effort=effort, tool_choice=choice)

        async def execute(call: ToolUse) -> Any:
            source, name = routes[call.name]  # the engine checked the name
            return await source.call(name, call.input)

        appended = self._appended

        def on_usage(usage: Usage) -> None:
            self._usage += usage
            self._last = usage
            self._history_at_last = len(history) + len(appended) + 1  # with this reply
            self._calls += 1
            self._steps += 1

        t = telemetry.tracer()
        spans = None
        if t is None:
            sink = StepSink(on_usage=on_usage, on_message=appended.append)
        else:
            spans = telemetry.StepSpans(t, kind="loop" if op.loop else "step",
                                        provider=model.provider, model=model.name,
                                        agent=self._agent)

            def on_message(message: Message) -> None:
                appended.append(message)
                spans.on_message(message)

            def on_usage_traced(usage: Usage) -> None:
                on_usage(usage)
                spans.on_usage(usage)

            sink = StepSink(on_step=spans.on_step, on_usage=on_usage_traced,
                            on_message=on_message, on_tool_result=spans.on_tool_result)
        try:
            outcome = await run_steps(model, build, execute=execute, history=history,
                                      sink=sink, max_steps=left)
        except BaseException as e:
            if spans is not None:
                spans.failed(e)
                spans.close(self._usage)
            raise
        if spans is not None:
            if outcome.status is StepsStatus.ERROR and outcome.error is not None:
                spans.failed(outcome.error)
            spans.close(self._usage)
        new = self.snapshot(tools)
        if outcome.status is StepsStatus.ERROR:
            assert outcome.error is not None
            raise outcome.error  # the progress stays readable: interrupted()
        if outcome.status is StepsStatus.MAX_STEPS and op.loop:
            raise self._limit(limit, new)
        self._base = None
        return new

    @staticmethod
    def _limit(limit: int, progress: State) -> StepLimitError:
        from .llm import LLM

        return StepLimitError(
            f"loop(max_steps={limit}) reached its limit of {limit} model calls before the "
            "model ended its turn (its last reply still called tools): raise max_steps, or "
            "go on from the error's .progress with .loop()",
            max_steps=limit, progress=LLM._of(progress))

    @property
    def steps(self) -> int:
        """Model calls the op in flight has made (those of earlier tries included)."""
        return self._steps

    def snapshot(self, tools: tuple[Tool, ...] | None) -> State:
        """The state with the op in flight's progress so far: what the sink heard (always a
        valid history), the usage of the calls that answered, the objects' current states."""
        base = self._base
        assert base is not None
        history = base.history + tuple(self._appended)
        changes: dict[str, Any] = {"history": history}
        if self._calls:
            changes["usage"] = base.usage.add(self._usage)
            last = self._last
            occupied = last.input_tokens + last.cache_write_tokens + last.output_tokens
            if occupied:
                changes["context_at_last_call"] = occupied
                changes["history_at_last_call"] = self._history_at_last
        if tools is not None:
            changes["advertised"] = tools
        if self._objects is not None:
            changes["objects"] = _with_objects(base.objects, self._objects.objects)
        return replace(base, **changes)

    def interrupted(self) -> State | None:
        """The progress of the op that did not complete (cancelled, failed, at its limit),
        or None when no op is in flight."""
        return self.snapshot(None) if self._base is not None else None


def _with_objects(bindings: tuple[ObjectBinding, ...], objects: list[Any]
                  ) -> tuple[ObjectBinding, ...]:
    """The bindings with each object's current state (the same tuple when none changed)."""
    if all(b.obj is o for b, o in zip(bindings, objects, strict=True)):
        return bindings
    return tuple(ObjectBinding(o, b.except_) for b, o in zip(bindings, objects, strict=True))
