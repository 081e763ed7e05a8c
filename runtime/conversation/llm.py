"""``LLM``: a conversation with a model, as an immutable value (Dagger's ``LLM`` type).

API in one paragraph (for the evals and other callers): ``LLM(model="claude-sonnet-4-5")``
(a name, resolved through ``runtime.llm.resolve_model`` at the first step, so constructing
never needs a key; or any ``runtime.llm.Model``, e.g. ``ScriptedModel``) is a value; every
``with_*`` returns a new one (``with_system_prompt``, ``with_prompt``, ``with_tools(obj)``,
``with_model``...). ``step()`` and ``loop(max_steps=None, max_tokens=None)`` *queue* work;
``done = await llm`` (or ``await llm.sync()``) runs everything queued, in order, and returns
the evaluated value, so ``await LLM(m).with_prompt(a).loop().with_prompt(b).loop()`` is one
evaluation. Read results from an evaluated value: ``last_reply`` (str or None),
``messages`` (tuple of port ``Message``s), ``transcript`` (plain text, no system prompts),
``token_usage`` (``TokenUsage``: input, output, cache reads/writes, total; exact sums),
``has_pending``, ``context_tokens``; reading them from a value with queued work raises
``NotEvaluatedError`` ("await it"). ``fork(label)`` gives an independent copy (bound objects
deep-copied) for retries and eval attempts. A loop that reaches ``max_steps`` raises
``StepLimitError`` (its ``.progress`` is the conversation so far); the model's failures are the
port's ``LLMError``; after a cancelled or failed evaluation ``llm.progress`` is the progress
made (a valid history), and awaiting the value again resumes from there.
``with_tool_choice("required" | "none" | a tool's name)`` forces (or forbids) a tool call in
the model's answer to each prompt.

Everything runs on the port's step engine (``runtime.llm.steps.run_steps``): this module
only queues, evaluates and reads. ``evaluation.py`` bridges to the engine, ``object_tools.py``
turns methods into tools, ``portable.py`` saves and restores, ``agent.py`` runs spawned loops.
"""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import pydantic

from ..llm import catalog
from ..llm.history import unanswered_calls
from ..llm.model import Model
from ..llm.types import Block, Message, Role, TextBlock, Tool, ToolChoice, ToolResult, Usage
from . import history as hist
from .errors import ConversationError, NotEvaluatedError
from .evaluation import Evaluation, RunOp
from .model_choice import ModelChoice
from .object_tools import ObjectBinding, ObjectTools, method_specs
from .state import REASONING_EFFORTS, State, TokenUsage

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .agent import Agent

__all__ = ["LLM", "TokenUsage"]

_Op: TypeAlias = "Callable[[State], State] | RunOp"


class _Memo:
    """The mutable side of a value: its evaluation's result or progress, and its id."""

    __slots__ = ("id", "progress", "result", "running")

    def __init__(self) -> None:
        self.result: LLM | None = None
        self.progress: tuple[State, int, int] | None = None  # state, next op, its steps done
        self.running: anyio.Event | None = None  # set when the evaluation in flight ends
        self.id: str | None = None


class LLM:
    """A conversation with a model: an immutable value; ``with_*`` return new values,
    ``step``/``loop`` queue work that ``await`` runs. See the module docstring."""

    __slots__ = ("_memo", "_ops", "_state")
    _state: State
    _ops: tuple[_Op, ...]
    _memo: _Memo

    def __init__(self, model: str | Model | None = None, *, provider: str | None = None) -> None:
        """``model``: a name (``"claude-sonnet-4-5"``, ``"openai:gpt-4.1"``, an alias),
        resolved at the first step; a ``runtime.llm.Model``; or None for the configured
        default (``CELLDIALOG_MODEL``). ``provider`` overrides the one the name implies."""
        state = State(model=ModelChoice(model, provider), key=_new_key())
        for name, value in (("_state", state), ("_ops", ()), ("_memo", _Memo())):
            object.__setattr__(self, name, value)

    @classmethod
    def _of(cls, state: State, ops: tuple[_Op, ...] = ()) -> LLM:
        value = object.__new__(cls)
        object.__setattr__(value, "_state", state)
        object.__setattr__(value, "_ops", ops)
        object.__setattr__(value, "_memo", _Memo())
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("an LLM is immutable: with_* methods return a new value")

    def __repr__(self) -> str:
        s = self._state
        queued = sum(isinstance(op, RunOp) for op in self._ops)
        evaluated = "" if not queued or self._memo.result is None else ", evaluated"
        return (f"LLM(model={s.model.label!r}, messages={len(s.history)}"
                + (f", queued steps={queued}{evaluated}" if queued else "") + ")")

    # -- deriving values ---------------------------------------------------------------

    def _current(self) -> tuple[State, tuple[_Op, ...]]:
        if self._ops and self._memo.result is not None:
            return self._memo.result._state, ()
        return self._state, self._ops

    def _derive(self, fn: Callable[[State], State]) -> LLM:
        state, ops = self._current()
        if ops:
            return LLM._of(state, (*ops, fn))
        return LLM._of(fn(state))

    def _queue(self, op: RunOp) -> LLM:
        state, ops = self._current()
        return LLM._of(state, (*ops, op))

    def _done(self, field: str) -> State:
        """The evaluated state, or a clear error for a value with queued work."""
        if not self._ops:
            return self._state
        if self._memo.result is not None:
            return self._memo.result._state
        raise NotEvaluatedError(
            f"LLM.{field} read from a value whose queued step/loop has not run: await it "
            f"first (`llm = await llm` or `llm = await llm.sync()`), then read {field}")

    # -- prompts and history -----------------------------------------------------------

    def with_prompt(self, prompt: str) -> LLM:
        """Queue a user prompt, sent at the next step or loop."""
        _text(prompt, "with_prompt")
        message = Message(role=Role.USER, blocks=(TextBlock(text=prompt),))
        return self._derive(lambda s: replace(s, history=hist.append(s.history, message)))

    def with_prompt_file(self, path: str | os.PathLike[str]) -> LLM:
        """Queue a file's contents (UTF-8 text) as a user prompt, like ``with_prompt``."""
        return self.with_prompt(Path(path).read_text(encoding="utf-8"))

    def with_system_prompt(self, prompt: str) -> LLM:
        """Add a system prompt, for the whole conversation (prompts are kept in order)."""
        _text(prompt, "with_system_prompt")
        return self._derive(lambda s: replace(s, system_prompts=(*s.system_prompts, prompt)))

    def without_system_prompts(self) -> LLM:
        """Clear the added system prompts, keeping the default one."""
        return self._derive(lambda s: replace(s, system_prompts=()))

    def without_default_system_prompt(self) -> LLM:
        """Disable the default system prompt (``state.DEFAULT_SYSTEM_PROMPT``)."""
        return self._derive(lambda s: replace(s, default_system_prompt=False))

    def without_message_history(self) -> LLM:
        """Clear the message history, keeping the system prompts (and the usage so far)."""
        return self._derive(lambda s: replace(s, history=(), context_at_last_call=0,
                                              history_at_last_call=0))

    def with_response(self, content: str | Sequence[Block], *, input_tokens: int = 0,
                      output_tokens: int = 0, cached_token_reads: int = 0,
                      cached_token_writes: int = 0, total_tokens: int = 0) -> LLM:
        """Append an assistant response without calling the model (to rebuild a
        conversation from another source, or in tests); its usage is added to
        ``token_usage`` (``total_tokens`` 0: input + output + cache writes)."""
        blocks = (TextBlock(text=content),) if isinstance(content, str) else tuple(content)
        message = Message(role=Role.ASSISTANT, blocks=blocks)
        usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                      cache_read_tokens=cached_token_reads,
                      cache_write_tokens=cached_token_writes)
        total = total_tokens or None
        return self._derive(lambda s: replace(
            s, history=hist.append(s.history, message), usage=s.usage.add(usage, total)))

    def with_tool_result(self, call_id: str, content: str, errored: bool = False) -> LLM:
        """Append the result of the tool call ``call_id`` of the last reply."""

        def apply(s: State) -> State:
            waiting = unanswered_calls(s.history)
            if call_id not in waiting:
                ids = ", ".join(repr(i) for i in waiting) or "none"
                raise ConversationError(
                    f"with_tool_result: no tool call {call_id!r} awaits a result; the calls "
                    f"of the last reply still without one: {ids}")
            result = Message(role=Role.USER, blocks=(
                ToolResult(tool_use_id=call_id, content=content, is_error=errored),))
            return replace(s, history=hist.append(s.history, result))

        return self._derive(apply)

    # -- model ---------------------------------------------------------------------------

    def with_model(self, model: str | Model, provider: str | None = None) -> LLM:
        """Change the model from the next step on; the history is kept."""
        choice = ModelChoice(model, provider)
        return self._derive(lambda s: replace(s, model=choice))

    def with_small_model(self) -> LLM:
        """Switch to the small model of the current provider (``CELLDIALOG_SMALL_MODEL``,
        else the catalog's); a provider without one keeps its model."""
        return self._derive(lambda s: replace(s, model=s.model.small()))

    def with_reasoning_effort(self, effort: str) -> LLM:
        """Set the reasoning effort from the next step on: "low", "medium", "high", or
        "none" (or "") to disable reasoning."""
        effort = effort.strip().lower()
        if effort not in REASONING_EFFORTS:
            raise ConversationError(
                f"reasoning effort {effort!r} is not one the port sends: use 'low', 'medium', "
                "'high', or 'none' to disable reasoning")
        return self._derive(lambda s: replace(s, reasoning_effort=effort))

    def with_tool_choice(self, choice: ToolChoice | str) -> LLM:
        """Which tools the model may call, from the next step on: "auto" (the default),
        "required", "none", or a tool's name (``ToolChoice.tool(name)`` for one called like
        a mode). A forcing choice goes with each model call that answers a prompt; a call
        that sends tool results (a loop's later calls, a second ``step()``) is "auto". A
        name is checked against the tools at the step (``ConversationError`` naming them)."""
        try:
            value = ToolChoice.model_validate(choice)
        except pydantic.ValidationError as e:
            why = e.errors()[0]["msg"].removeprefix("Value error, ")
            raise ConversationError(f"with_tool_choice: {why}") from None
        return self._derive(lambda s: replace(s, tool_choice=value))

    # -- tools -------------------------------------------------------------------------

    def with_tools(self, obj: Any, except_: Sequence[str] = ()) -> LLM:
        """Expose every public method of ``obj`` as a tool (schema from type hints,
        description from docstrings); ``except_`` hides methods. A method returning
        ``obj``'s own type replaces it as the state for later calls. Binding another object
        of the same type replaces the earlier one; methods two bound types share are
        prefixed with the type name (``Notes_add``)."""
        if isinstance(except_, str):
            except_ = (except_,)
        specs = method_specs(type(obj))  # a method that cannot be a tool fails here
        unknown = sorted(set(except_) - set(specs))
        if unknown:
            raise ConversationError(
                f"with_tools: except_ names {unknown}, which {type(obj).__name__} has no public "
                f"method called; its methods: {sorted(specs)}")
        binding = ObjectBinding(obj, frozenset(except_))

        def apply(s: State) -> State:
            kept = tuple(b for b in s.objects if type(b.obj) is not type(obj))
            return replace(s, objects=(*kept, binding), advertised=None)

        return self._derive(apply)

    def with_blocked_function(self, type_name: str, function: str) -> LLM:
        """Stop exposing ``type_name``'s method ``function`` as a tool (as Dagger's
        ``withBlockedFunction``)."""
        return self._derive(lambda s: replace(
            s, blocked=s.blocked | {(type_name, function)}, advertised=None))

    def with_static_tools(self) -> LLM:
        """Serve the tools through a fixed pair, ``list_methods`` and ``call_method``, for
        clients that cannot take a tool list that changes (as Dagger's ``withStaticTools``)."""
        return self._derive(lambda s: replace(s, static_tools=True, advertised=None))

    def with_mcp_server(self, name: str, command: str, args: Sequence[str] = (),
                        env: Mapping[str, str] | None = None) -> LLM:
        """Add the tools of an external MCP server over stdio (the official ``mcp`` SDK).
        Its process starts at the first step that needs it and is gone when the
        evaluation ends, however it ends. A server of the same name is replaced."""
        from .mcp import MCPServer

        server = MCPServer(name, command, tuple(args), env)

        def apply(s: State) -> State:
            kept = tuple(m for m in s.mcp if m.name != name)
            return replace(s, mcp=(*kept, server), advertised=None)

        apply.starts_processes = True  # type: ignore[attr-defined]  # an evaluation needs a task group
        return self._derive(apply)

    def with_skills(self, directory: str | os.PathLike[str]) -> LLM:
        """Install the skills (``SKILL.md`` with ``name``/``description`` frontmatter) found
        anywhere under ``directory``; the model lists them with ``ListSkills`` and reads one
        with ``ReadSkill`` (offered, with the built-in skills, once skills are installed or
        a workspace is bound). A later installation wins over an earlier one; built-in
        skills are never shadowed."""
        from .skills import Skills

        try:
            Skills().with_skills(directory)  # a directory that is not one fails here
        except Exception as e:
            raise ConversationError(str(e)) from None

        def apply(s: State) -> State:
            return replace(s, skills=Skills(installed=s.skills).with_skills(directory).installed,
                           advertised=None)

        return self._derive(apply)

    def with_workspace(self, instance: Any) -> LLM:
        """Bind a running pattern instance (``runtime.Instance``): its handler streams become
        tools (a call sends the event and waits until the runtime settles) and its cells are
        readable (``workspace_read``)."""
        if not hasattr(instance, "streams") or not hasattr(instance, "result"):
            raise ConversationError(
                f"with_workspace takes a running pattern instance (rt.run(pattern)), got "
                f"{type(instance).__name__}")
        return self._derive(lambda s: replace(s, workspace=instance, advertised=None))

    @property
    def workspace(self) -> Any:
        """The pattern instance this conversation is bound to."""
        ws = self._done("workspace").workspace
        if ws is None:
            raise ConversationError("this conversation has no workspace: bind one with "
                                    "with_workspace(instance)")
        return ws

    @property
    def tools(self) -> str:
        """Markdown documentation of the tools exposed to the model (as of the last step;
        before any step, those of the bound objects and workspace, and a note for each MCP
        server and skills directory, whose tools are listed when they open)."""
        s = self._done("tools")
        if s.advertised is not None:
            return _tools_markdown(s.advertised, ())
        tools: list[Tool] = []
        if s.objects:
            tools += ObjectTools(s.objects, s.blocked).tools
        if s.workspace is not None:
            from .workspace import WorkspaceTools

            tools += WorkspaceTools(s.workspace).tools
        notes = [f"MCP server `{m.name}` (`{m.command_line}`): its tools are listed when it "
                 "starts, at the first step." for m in s.mcp]
        if s.skills or s.workspace is not None:
            notes.append("Skills (built-in" + "".join(f", `{p}`" for p in s.skills)
                         + "): served by the ListSkills and ReadSkill tools.")
        if s.static_tools and tools:
            notes.insert(0, "Static mode: the model calls these through list_methods and "
                            "call_method.")
        return _tools_markdown(tools, notes)

    @property
    def skills(self) -> tuple[Any, ...]:
        """The skills visible to the model (``runtime.conversation.skills.Skill``: name,
        description, source, path), in the order ``ListSkills`` serves them: built-in,
        then installed. Reads the directories now."""
        from .skills import Skills

        return Skills(installed=self._done("skills").skills).skills

    # -- queued work -----------------------------------------------------------------

    def step(self, max_tokens: int | None = None) -> LLM:
        """Queue one step: send the pending prompt or tool results, run the tool calls of
        the reply, queue their results. Nothing pending: nothing done."""
        return self._queue(RunOp(False, None, _positive(max_tokens, "max_tokens")))

    def loop(self, max_steps: int | None = None, max_tokens: int | None = None) -> LLM:
        """Queue steps until the model ends its turn (a reply without tool calls).
        Reaching ``max_steps`` (default 50) first raises ``StepLimitError``; ``max_tokens``
        caps each reply."""
        return self._queue(RunOp(True, _positive(max_steps, "max_steps"),
                                 _positive(max_tokens, "max_tokens")))

    def __await__(self) -> Generator[Any, None, LLM]:
        return self.sync().__await__()

    async def sync(self) -> LLM:
        """Run the queued work; the evaluated value (this one's result is kept: awaiting
        again returns it, and after an interruption resumes from the progress made)."""
        return await self._sync()

    async def _sync(self, agent: str | None = None) -> LLM:
        if not self._ops:
            return self
        memo = self._memo
        while memo.result is None:
            running = memo.running
            if running is not None:  # another task evaluates it: share its outcome
                await running.wait()
                continue
            memo.running = anyio.Event()
            try:
                memo.result = await self._evaluate(memo, agent)
                memo.progress = None
            finally:
                running, memo.running = memo.running, None
                running.set()
        return memo.result

    async def _evaluate(self, memo: _Memo, agent: str | None) -> LLM:
        state, start, steps = memo.progress or (self._state, 0, 0)
        ops = self._ops
        if not (state.mcp or any(getattr(op, "starts_processes", False) for op in ops[start:])):
            return await self._run_ops(memo, agent, state, start, steps, None)
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:  # the MCP servers run in it
            try:
                result = await self._run_ops(memo, agent, state, start, steps, tg)
            except Exception as e:  # raised below, as it is, not in an exception group
                failure = e
        if failure is not None:
            raise failure
        return result

    async def _run_ops(self, memo: _Memo, agent: str | None, state: State, start: int,
                       steps: int, tg: TaskGroup | None) -> LLM:
        ops = self._ops
        ev = Evaluation(tg, agent=agent)
        i = start
        try:
            for i in range(start, len(ops)):
                op = ops[i]
                if isinstance(op, RunOp):
                    state = await ev.run(state, op, steps_done=steps if i == start else 0)
                else:
                    state = op(state)
        except BaseException:
            progress = ev.interrupted()
            memo.progress = (state, i, 0) if progress is None else (progress, i, ev.steps)
            raise
        finally:
            await ev.aclose()
        return LLM._of(state)

    @property
    def progress(self) -> LLM:
        """What evaluating this value got done: the result once it completed; after a
        cancelled or failed evaluation, the conversation as far as it got (a valid
        history, nothing queued)."""
        if not self._ops:
            return self
        if self._memo.result is not None:
            return self._memo.result
        if self._memo.progress is not None:
            return LLM._of(self._memo.progress[0])
        raise NotEvaluatedError("LLM.progress: this value has not been awaited yet")

    # -- results ---------------------------------------------------------------------

    @property
    def id(self) -> str:
        """A unique identifier of this value (``portable_id`` is the one to persist)."""
        memo = self._memo
        if memo.id is None:
            memo.id = f"llm-{uuid.uuid4().hex}"
        return memo.id

    @property
    def has_pending(self) -> bool:
        """Whether a step would send something: an unsent prompt or unsent tool results."""
        return hist.has_pending(self._done("has_pending").history)

    @property
    def last_reply(self) -> str | None:
        """The text of the model's most recent reply, or None before any."""
        return hist.last_reply(self._done("last_reply").history)

    @property
    def messages(self) -> tuple[Message, ...]:
        """The full message history (port ``Message``s; system prompts are not in it)."""
        return self._done("messages").history

    @property
    def transcript(self) -> str:
        """The history as plain text, without system prompts (to summarise, to read)."""
        return hist.transcript(self._done("transcript").history)

    @property
    def token_usage(self) -> TokenUsage:
        """Cumulative token usage over every model call (and ``with_response``)."""
        return self._done("token_usage").usage

    @property
    def context_tokens(self) -> int:
        """An estimate of the tokens the context holds now (not cumulative): the last
        call's input and output, plus about a token per four characters added since."""
        s = self._done("context_tokens")
        if s.context_at_last_call:
            return s.context_at_last_call + hist.estimate_tokens(
                s.history[s.history_at_last_call:])
        tools = s.advertised or ()
        extra = len(s.system()) + sum(len(json.dumps(t.input_schema)) + len(t.description)
                                      for t in tools)
        return hist.estimate_tokens(s.history, extra)

    @property
    def context_window(self) -> int | None:
        """The model's context window in tokens, from the catalog; None if unknown."""
        return catalog.lookup(self.model).context_window if self.model else None

    @property
    def model(self) -> str:
        """The model id the conversation runs on (the configured default resolved)."""
        return self._done("model").model.name

    @property
    def provider(self) -> str:
        """The provider serving the model: "anthropic", "openai", "scripted"..."""
        return self._done("provider").model.provider

    @property
    def reasoning_effort(self) -> str:
        """The reasoning effort in use: "low", "medium", "high"; "" when not set."""
        return self._done("reasoning_effort").reasoning_effort

    @property
    def tool_choice(self) -> ToolChoice:
        """The tool choice of the next step (``with_tool_choice``); auto when not set."""
        return self._done("tool_choice").tool_choice

    # -- copies, saving, agents ------------------------------------------------------

    def fork(self, label: str) -> LLM:
        """An independent copy, for retries and eval attempts: its own evaluation (queued
        work runs again for it), its own prompt-cache key, and deep copies of the bound
        objects where they allow it (an object that refuses, holding a client, say, is
        shared)."""
        _text(label, "fork")
        state, ops = self._current()
        state = replace(state, objects=tuple(ObjectBinding(_copied(b.obj), b.except_)
                                             for b in state.objects),
                        labels=(*state.labels, label), key=f"{state.key}/{label}")
        return LLM._of(state, ops)

    @property
    def portable_id(self) -> str:
        """A self-contained string from which ``LLM.restore`` rebuilds this conversation in
        another process (history, system prompts, model, reasoning effort, tool choice,
        tools by import path with their state, MCP servers by command, skills by
        directory)."""
        from .portable import dump

        return dump(self._done("portable_id"))

    @classmethod
    def restore(cls, portable_id: str, *, model: str | Model | None = None) -> LLM:
        """The conversation a ``portable_id`` describes; ``model`` overrides the recorded
        one (a conversation that ran on a hand-built model names it by import path, or
        gets one here)."""
        from .portable import load

        return cls._of(load(portable_id, model))

    def emit_history(self) -> LLM:
        """Re-emit OpenTelemetry spans for the whole history (a loaded conversation shows
        in a trace viewer); nothing happens without OpenTelemetry. Returns this value."""
        from .telemetry import emit_history

        s = self._done("emit_history")
        emit_history(s.history, provider=s.model.provider, model=s.model.name)
        return self

    def spawn(self, name: str | None = None, handle: str | None = None, state: str = "IDLE",
              error: str = "", *, task_group: TaskGroup | None = None) -> Agent:
        """This conversation as an ``Agent``: a startable loop (not started: it spends
        nothing until prompted or resumed). ``handle`` restores an agent under that handle
        (refused if one already exists in this process) in ``state`` (IDLE, PAUSED, FAILED
        with ``error``, STOPPED; RUNNING and WAITING_INPUT are refused). Its loop runs in
        ``task_group``, or in ``async with agent:``."""
        from .agent import Agent

        return Agent._spawn(self, name=name, handle=handle, state=state, error=error,
                            task_group=task_group)

    @classmethod
    def agent(cls, handle: str, name: str = "") -> Agent:
        """The agent a ``spawn`` minted under ``handle`` (``name``, if given, must match)."""
        from .agent import lookup

        return lookup(handle, name)


def _new_key() -> str:
    return f"conv-{uuid.uuid4().hex[:16]}"


def _text(value: Any, where: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConversationError(f"{where} takes a non-empty string, got {value!r}")


def _positive(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConversationError(f"{name} must be a positive integer or None, got {value!r}")
    return value


def _copied(obj: Any) -> Any:
    try:
        return copy.deepcopy(obj)
    except Exception:  # a lock, a client, a socket: the fork shares it
        return obj


def _tools_markdown(tools: Sequence[Tool], notes: Sequence[str]) -> str:
    if not tools and not notes:
        return "No tools are exposed."
    parts = []
    for t in tools:
        schema = json.dumps(t.input_schema, ensure_ascii=False, separators=(",", ":"))
        parts.append(f"## {t.name}\n\n{t.description}\n\nArguments (JSON Schema): `{schema}`")
    parts += notes
    return "\n\n".join(parts)
