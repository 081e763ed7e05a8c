"""Agents: every state transition (FAILED then resume included), prompts waiting for the turn,
restore under a handle, structured concurrency."""

from __future__ import annotations

import anyio
import pytest

from runtime import LLM, Agent
from runtime.conversation import AgentState, AgentStateError
from runtime.llm import TOOL_CANCELLED, Fault, LLMError, Reply, ScriptedModel, call

pytestmark = pytest.mark.anyio
LIMIT = 10
S = AgentState


class Gate:
    """A tool whose calls hold until the test lets one through."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def wait(self) -> str:
        """Wait at the gate."""
        self.started.set()
        await self.release.wait()
        return "through"

    def reset(self) -> None:
        self.started, self.release = anyio.Event(), anyio.Event()


async def test_every_state_transition() -> None:
    gate = Gate()
    model = ScriptedModel([
        Reply(tool_calls=[call("wait")]), "first",              # turn 1 (held at the gate)
        "second",                                              # turn 2 (sent while 1 ran)
        Reply(tool_calls=[call("wait")]), "third",             # turn 3 (paused mid-tool)
        LLMError("down", fault=Fault.TERMINAL, provider="scripted"),  # turn 4 fails
        "recovered",                                           # resumed turn 4
        "after stop",                                          # turn 5, relaunched
    ])
    agent = LLM(model=model).with_tools(gate).spawn("worker")
    assert isinstance(agent, Agent) and agent.state is S.IDLE
    replies: dict[str, str | None] = {}

    async def send(prompt: str) -> None:
        replies[prompt] = (await agent.send(prompt)).last_reply

    with anyio.fail_after(LIMIT):
        async with agent:
            async with anyio.create_task_group() as tg:
                tg.start_soon(send, "one")
                await gate.started.wait()
                assert agent.state is S.RUNNING                       # IDLE -> RUNNING
                tg.start_soon(send, "two")  # waits for turn 1
                await anyio.lowlevel.checkpoint()
                assert "two" not in replies and len(model.requests) == 1
                gate.release.set()
            assert replies == {"one": "first", "two": "second"}
            assert agent.state is S.WAITING_INPUT                     # RUNNING -> WAITING
            second_request = model.requests[2].messages
            assert [m.text_content() for m in second_request][-1] == "two"
            assert len(second_request) == 5  # turn 1 whole before turn 2's prompt

            agent.pause()                                             # WAITING -> PAUSED
            assert agent.state is S.PAUSED
            agent.resume()                                            # PAUSED -> WAITING
            await agent.wait_for(S.WAITING_INPUT)

            gate.reset()
            async with anyio.create_task_group() as tg:
                tg.start_soon(send, "three")
                await gate.started.wait()
                agent.pause()                                         # RUNNING -> PAUSED
                await agent.wait_for(S.PAUSED)  # once the turn has stopped
                cut = agent.conversation.messages[-1]
                assert [b.content for b in cut.blocks] == [TOOL_CANCELLED]
                assert "three" not in replies  # its sender waits for the resumed turn
                gate.release.set()
                agent.resume()                                        # PAUSED -> RUNNING
            assert replies["three"] == "third"

            with pytest.raises(LLMError, match="down"):
                await agent.send("four")                              # RUNNING -> FAILED
            assert agent.state is S.FAILED and "down" in agent.error
            assert agent.conversation.has_pending  # the failed turn's input stays pending
            agent.resume()                                            # FAILED -> RUNNING
            await agent.wait_for(S.WAITING_INPUT)
            assert agent.conversation.last_reply == "recovered" and agent.error == ""

            agent.stop()                                              # -> STOPPED
            await agent.wait_for(S.STOPPED)
            assert (await agent.send("five")).last_reply == "after stop"  # STOPPED -> RUNNING
            assert agent.state is S.WAITING_INPUT
        assert agent.state is S.STOPPED  # the scope's end stopped it
    model.assert_complete()


async def test_restore_under_a_handle() -> None:
    with anyio.fail_after(LIMIT):
        history = await LLM(model=ScriptedModel(["earlier"])).with_prompt("hi").loop()
    pending = history.with_prompt("and now?")
    for refused in ("RUNNING", "WAITING_INPUT"):
        with pytest.raises(AgentStateError, match="Restore it IDLE"):
            pending.spawn(handle="h-1", state=refused)
    with pytest.raises(AgentStateError, match="only for state FAILED"):
        pending.spawn(handle="h-1", state="IDLE", error="boom")
    with pytest.raises(AgentStateError, match="unknown agent state"):
        pending.spawn(handle="h-1", state="ASLEEP")

    restored = pending.with_model(ScriptedModel(["resumed"])).spawn(
        "restored", handle="h-1", state="FAILED", error="the old loop died")
    assert LLM.agent("h-1", "restored") is restored
    assert (restored.state, restored.error) == (S.FAILED, "the old loop died")
    with pytest.raises(AgentStateError, match="already lives"):
        pending.spawn(handle="h-1")
    with pytest.raises(AgentStateError, match="named 'restored', not 'other'"):
        LLM.agent("h-1", "other")
    with pytest.raises(AgentStateError, match="no agent with handle"):
        LLM.agent("h-unknown")
    async with restored:
        restored.resume()  # the interrupted input pending on the conversation is stepped
        with anyio.fail_after(LIMIT):
            await restored.wait_for(S.WAITING_INPUT)
        assert restored.conversation.last_reply == "resumed"
        assert [m.text_content() for m in restored.conversation.messages] == [
            "hi", "earlier", "and now?", "resumed"]

    paused = history.spawn(handle="h-2", state="PAUSED")
    assert paused.state is S.PAUSED


async def test_an_agent_runs_in_the_callers_task_group_and_needs_one() -> None:
    agent = LLM(model=ScriptedModel(["ok"])).spawn()
    with anyio.fail_after(LIMIT), pytest.raises(AgentStateError, match="no task group"):
        await agent.send("hi")
    agent2 = LLM(model=ScriptedModel(["ok"])).spawn()
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            agent3 = LLM(model=ScriptedModel(["ok"])).spawn("mine", task_group=tg)
            assert (await agent3.send("hi")).last_reply == "ok"
            agent3.stop()  # its loop ends: the task group can close
            await agent3.wait_for(S.STOPPED)
    assert agent3.state is S.STOPPED and agent2.state is S.IDLE
    with pytest.raises(Exception, match="await it first"):
        LLM(model=ScriptedModel()).with_prompt("x").loop().spawn()
