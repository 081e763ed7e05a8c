"""The conversation with its other tool sources: a real MCP server (the SDK-written
mcp_echo_server.py) listed, called and gone afterwards, also when the loop is cancelled or
fails; skills offered through ListSkills/ReadSkill."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from runtime import LLM
from runtime.llm import Fault, LLMError, Reply, ScriptedModel, call
from tests.conversation.fixtures import Notebook

pytestmark = pytest.mark.anyio
SERVER = str(Path(__file__).with_name("mcp_echo_server.py"))
LIMIT = 30


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Gate:
    def __init__(self) -> None:
        self.started = anyio.Event()

    async def hold(self) -> str:
        """Hold until cancelled."""
        self.started.set()
        await anyio.sleep_forever()
        return "never"


def results(done: LLM) -> list[str]:
    return [b.content for m in done.messages for b in m.blocks if b.kind == "tool_result"]


def with_echo(llm: LLM) -> LLM:
    return llm.with_mcp_server("echo", sys.executable, (SERVER,), env={"GREETING": "hello"})


async def test_an_mcp_servers_tools_beside_the_others_and_its_process_gone_after() -> None:
    model = ScriptedModel([
        Reply(tool_calls=[call("pid"), call("echo", {"text": "hi"}),
                          call("echo_add", {"a": 2, "b": 3}), call("add", {"line": "x"}),
                          call("env", {"name": "GREETING"})]),
        "done"])
    llm = with_echo(LLM(model=model).with_tools(Notebook()))
    assert "MCP server `echo`" in llm.tools  # listed when it starts: not started yet
    with anyio.fail_after(LIMIT):
        done = await llm.with_prompt("go").loop()
    pid, echoed, added, noted, env = results(done)
    assert (echoed, added, env) == ("hi", "5", "hello") and noted.startswith("Done")
    names = {t.name for t in model.requests[0].tools}
    assert {"add", "count", "echo", "echo_add", "pid"} <= names
    assert gone(int(pid))
    assert "## echo_add" in done.tools


async def test_the_process_is_gone_when_the_loop_is_cancelled() -> None:
    gate = Gate()
    model = ScriptedModel([Reply(tool_calls=[call("pid")]),
                           Reply(tool_calls=[call("hold")]), "never"])
    queued = with_echo(LLM(model=model).with_tools(gate)).with_prompt("go").loop()
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(queued.sync)
            await gate.started.wait()
            tg.cancel_scope.cancel()
    pid = int(results(queued.progress)[0])
    assert gone(pid)


async def test_the_process_is_gone_when_the_loop_fails() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("pid")]),
                           LLMError("boom", fault=Fault.TERMINAL, provider="scripted")])
    queued = with_echo(LLM(model=model)).with_prompt("go").loop()
    with anyio.fail_after(LIMIT), pytest.raises(LLMError, match="boom"):
        await queued
    assert gone(int(results(queued.progress)[0]))


async def test_an_mcp_server_that_cannot_start_fails_the_evaluation_clearly() -> None:
    llm = LLM(model=ScriptedModel(["x"])).with_mcp_server("broken", sys.executable,
                                                         (SERVER, "--crash-on-init"))
    with anyio.fail_after(LIMIT), pytest.raises(Exception, match="broken"):
        await llm.with_prompt("go").loop()


async def test_skills_are_listed_and_read(tmp_path: Path) -> None:
    skill = tmp_path / "deep" / "greeting"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: greeting\ndescription: How to greet people.\n---\nSay hello warmly.\n")
    model = ScriptedModel([Reply(tool_calls=[call("ListSkills"),
                                             call("ReadSkill", {"name": "greeting"})]), "Hello!"])
    llm = LLM(model=model).with_skills(tmp_path)
    visible = {s.name: s.source for s in llm.skills}
    assert visible["greeting"] == "installed" and "builtin" in visible.values()
    with anyio.fail_after(LIMIT):
        done = await llm.with_prompt("greet me").loop()
    listing, body = results(done)
    assert '"name":"greeting"' in listing and "Say hello warmly." in body
    with pytest.raises(Exception, match="is not a directory"):
        llm.with_skills(tmp_path / "missing")
