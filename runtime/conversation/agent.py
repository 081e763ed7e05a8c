"""``Agent``: a spawned conversation, a loop that takes prompts and runs their turns.

States (``AgentState``), and what moves between them::

    IDLE ──send/resume──▶ RUNNING ──turn done──▶ WAITING_INPUT ──send──▶ RUNNING
      │                     │  ▲                                         │
      pause                 │  └────resume───── PAUSED ◀──pause──────────┤
      ▼                     │                                            │
    PAUSED        model error / step limit ──▶ FAILED ──resume──▶ RUNNING│
                                                                         │
    any state ──stop──▶ STOPPED ──send/resume──▶ RUNNING / WAITING_INPUT ◀┘

A prompt sent while a turn runs waits for it (one turn per prompt, in order); ``await
agent.send(prompt)`` returns the conversation after that prompt's turn. ``pause`` and
``stop`` cancel a running turn: its progress is kept (a valid history) and its input stays
pending on the conversation, so ``resume`` (or a send, after a stop) steps it again.

Structured concurrency: the loop is a task of the caller's task group
(``spawn(task_group=tg)``) or of the agent's own scope (``async with agent:``, which stops it
on exit). It is started by the first ``send`` or ``resume``, never by ``spawn``: a spawned
agent costs nothing until it is used. Agents are addressable in this process by ``handle``
(``LLM.agent(handle, name)``) while they live.
"""

from __future__ import annotations

import uuid
import weakref
from collections import deque
from enum import StrEnum
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from .errors import AgentStateError
from .history import has_pending

if TYPE_CHECKING:
    from .llm import LLM

__all__ = ["Agent", "AgentState", "lookup"]


class AgentState(StrEnum):
    IDLE = "IDLE"  # ready to be prompted; no loop started
    RUNNING = "RUNNING"  # a turn is being evaluated
    WAITING_INPUT = "WAITING_INPUT"  # the loop is up, waiting for a prompt
    PAUSED = "PAUSED"  # parked: sends wait until resume
    STOPPED = "STOPPED"  # the loop is gone; its snapshot kept; send or resume relaunches
    FAILED = "FAILED"  # the last turn failed (``error``); resume retries past it


_LIVE: weakref.WeakValueDictionary[str, Agent] = weakref.WeakValueDictionary()


def lookup(handle: str, name: str = "") -> Agent:
    """The live agent minted under ``handle``."""
    agent = _LIVE.get(handle)
    if agent is None:
        raise AgentStateError(f"no agent with handle {handle!r} lives in this process: spawn "
                              "one, or restore it with llm.spawn(handle=...)")
    if name and name != agent.name:
        raise AgentStateError(f"the agent {handle!r} is named {agent.name!r}, not {name!r}")
    return agent


class _Letter:
    __slots__ = ("done", "error", "prompt", "result")

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.done = anyio.Event()
        self.result: LLM | None = None
        self.error: BaseException | None = None


class Agent:
    """A conversation running as a loop; see the module docstring. Made by ``LLM.spawn``."""

    def __init__(self, conversation: LLM, *, name: str, handle: str, state: AgentState,
                 error: str, task_group: TaskGroup | None, max_steps: int | None) -> None:
        self.name = name
        self.handle = handle
        self.max_steps = max_steps
        self._conversation = conversation
        self._state = state
        self._error = error
        self._tg = task_group
        self._own: TaskGroup | None = None
        self._mailbox: deque[_Letter] = deque()
        self._current: _Letter | None = None  # the letter of the turn in flight or paused
        self._changed = anyio.Event()
        self._worker: anyio.CancelScope | None = None
        self._turn: anyio.CancelScope | None = None
        self._want: AgentState | None = None  # PAUSED or STOPPED, asked of a running loop

    @classmethod
    def _spawn(cls, conversation: LLM, *, name: str | None, handle: str | None, state: str,
               error: str, task_group: TaskGroup | None, max_steps: int | None = None
               ) -> Agent:
        try:
            chosen = AgentState(state)
        except ValueError:
            raise AgentStateError(f"unknown agent state {state!r}: one of "
                                  f"{', '.join(s.value for s in AgentState)}") from None
        if chosen in (AgentState.RUNNING, AgentState.WAITING_INPUT):
            raise AgentStateError(
                f"an agent cannot be created {chosen.value}: that describes a loop, and a "
                "restored loop died with the process that ran it. Restore it IDLE: its "
                "interrupted turn's input is still pending on the conversation")
        if error and chosen is not AgentState.FAILED:
            raise AgentStateError(f"error={error!r} is only for state FAILED, not {chosen.value}")
        if chosen is AgentState.FAILED and not error:
            error = "failed (restored without an error message)"
        if handle is not None and handle in _LIVE:
            raise AgentStateError(
                f"an agent with handle {handle!r} already lives in this process: a restore "
                "must come before anything else addresses it; use LLM.agent(handle) to reach it")
        if conversation._ops and conversation._memo.result is None:
            from .errors import NotEvaluatedError

            raise NotEvaluatedError("spawn: this conversation has queued step/loop work; "
                                    "await it first, then spawn the result")
        conversation = conversation.progress
        agent = cls(conversation, name=name or _default_name(conversation),
                    handle=handle or f"agent-{uuid.uuid4().hex[:12]}", state=chosen,
                    error=error, task_group=task_group, max_steps=max_steps)
        _LIVE[agent.handle] = agent
        return agent

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, handle={self.handle!r}, state={self._state.value})"

    # -- what it is ----------------------------------------------------------------------

    @property
    def state(self) -> AgentState:
        return self._state

    @property
    def error(self) -> str:
        """The last turn's error in FAILED, else ""."""
        return self._error

    @property
    def conversation(self) -> LLM:
        """The committed conversation: after the last turn (or as far as an interrupted one
        got)."""
        return self._conversation

    async def wait_for(self, *states: AgentState | str) -> AgentState:
        """Return once the agent is in one of ``states``."""
        wanted = {AgentState(s) for s in states}
        while self._state not in wanted:
            await self._changed.wait()
        return self._state

    # -- scope -------------------------------------------------------------------------

    async def __aenter__(self) -> Agent:
        if self._tg is not None:
            raise AgentStateError(f"agent {self.name!r} already runs in a task group")
        self._own = anyio.create_task_group()
        await self._own.__aenter__()
        self._tg = self._own
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        self.stop()
        own, self._own, self._tg = self._own, None, None
        assert own is not None
        return await own.__aexit__(et, e, tb)

    # -- operations ----------------------------------------------------------------------

    async def send(self, prompt: str) -> LLM:
        """Queue ``prompt`` and return the conversation after its turn (raises the turn's
        error; the agent is FAILED then). While a turn runs, or the agent is paused or
        failed, the prompt waits."""
        from .llm import _text

        _text(prompt, "Agent.send")
        letter = _Letter(prompt)
        self._mailbox.append(letter)
        if self._state in (AgentState.IDLE, AgentState.STOPPED, AgentState.WAITING_INPUT):
            self._launch()
        self._notify()
        await letter.done.wait()
        if letter.error is not None:
            raise letter.error
        assert letter.result is not None
        return letter.result

    def pause(self) -> None:
        """Park the agent: a running turn is cancelled (its progress kept, its input still
        pending) and the state is PAUSED once it has stopped (``wait_for(PAUSED)``); prompts
        wait until ``resume``."""
        if self._state in (AgentState.STOPPED, AgentState.FAILED):
            raise AgentStateError(f"pause: agent {self.name!r} is {self._state.value}; resume "
                                  "it (or send to it) instead")
        if self._turn is not None:
            self._want = AgentState.PAUSED
            self._turn.cancel()
        else:
            self._set(AgentState.PAUSED)

    def resume(self) -> None:
        """Run again from PAUSED, FAILED (retrying the failed turn's pending input),
        STOPPED or IDLE (stepping any input pending on the conversation)."""
        if self._state in (AgentState.RUNNING, AgentState.WAITING_INPUT) and \
                self._want is None:
            raise AgentStateError(f"resume: agent {self.name!r} is already "
                                  f"{self._state.value}")
        self._error = ""
        self._want = None
        work = self._current is not None or bool(self._mailbox) or \
            has_pending(self._conversation.messages)
        self._set(AgentState.RUNNING if work else AgentState.WAITING_INPUT)
        self._launch()

    def stop(self) -> None:
        """End the loop (the state is STOPPED once it has ended: ``wait_for(STOPPED)``);
        the conversation so far is kept and ``send``/``resume`` relaunch it. Prompts still
        waiting are failed."""
        self._fail_waiting(AgentStateError(f"agent {self.name!r} was stopped"))
        if self._worker is not None:
            self._want = AgentState.STOPPED
            self._worker.cancel()
        else:
            self._set(AgentState.STOPPED)

    # -- the loop ------------------------------------------------------------------------

    def _launch(self) -> None:
        if self._worker is not None:
            return
        if self._tg is None:
            raise AgentStateError(
                f"agent {self.name!r} has no task group to run in: use `async with agent:` "
                "or llm.spawn(..., task_group=tg)")
        self._worker = anyio.CancelScope()
        self._tg.start_soon(self._run, self._worker, name=f"agent {self.name}")

    async def _run(self, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                while True:
                    await self._next_turn()
        finally:
            self._worker = None
            self._want = None
            self._error = ""  # an error belongs to FAILED
            self._set(AgentState.STOPPED)
            if self._mailbox and self._tg is not None:  # sent to while it was stopping
                self._launch()

    async def _next_turn(self) -> None:
        if self._state in (AgentState.PAUSED, AgentState.FAILED):
            await self._changed.wait()
            return
        conversation = self._conversation
        if self._current is None and not has_pending(conversation.messages):
            if not self._mailbox:
                self._set(AgentState.WAITING_INPUT)
                await self._changed.wait()
                return
            self._current = self._mailbox.popleft()
            conversation = conversation.with_prompt(self._current.prompt)
        queued = conversation.loop(max_steps=self.max_steps)
        self._set(AgentState.RUNNING)
        failure: Exception | None = None
        try:
            with anyio.CancelScope() as turn:
                self._turn = turn
                try:
                    done = await queued._sync(agent=self.handle)
                except Exception as e:
                    failure = e
        except BaseException:  # stopped, or the caller's scope cancelled: keep the progress
            self._conversation = _progress(queued, conversation)
            raise
        finally:
            self._turn = None
        if turn.cancelled_caught:  # cut by pause: keep the progress; the letter waits
            self._conversation = _progress(queued, conversation)
            if self._want is AgentState.PAUSED:
                self._want = None
                self._set(AgentState.PAUSED)
            return
        letter, self._current = self._current, None
        if failure is not None:
            self._conversation = _progress(queued, conversation)
            self._error = f"{type(failure).__name__}: {failure}"
            self._set(AgentState.FAILED)
            if letter is not None:
                letter.error = failure
                letter.done.set()
            return
        self._conversation = done
        if letter is not None:
            letter.result = done
            letter.done.set()
        self._set(AgentState.WAITING_INPUT)

    def _set(self, state: AgentState) -> None:
        self._state = state
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _fail_waiting(self, error: BaseException) -> None:
        letters = list(self._mailbox)
        self._mailbox.clear()
        if self._current is not None:
            letters.insert(0, self._current)
            self._current = None
        for letter in letters:
            letter.error = error
            letter.done.set()


def _progress(queued: LLM, fallback: LLM) -> LLM:
    try:
        return queued.progress
    except Exception:
        return fallback


def _default_name(conversation: LLM) -> str:
    for m in conversation.messages:
        words = m.text_content().split()
        if words:
            return "-".join(w.lower() for w in words[:3] if w.isalnum())[:32] or "agent"
    return "agent"
