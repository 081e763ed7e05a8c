"""The conversation's main paths once against each adapter, on the port's loopback fakes
(real HTTP on 127.0.0.1, wire bodies checked against the official SDK types): a prompt,
a tool call routed to a Python method, the result sent back, the reply, exact token sums,
system prompt and tools on the wire, and a cancelled loop releasing its request."""

from __future__ import annotations

import anyio
import pytest

from runtime import LLM
from runtime.llm import Message, Response, Role, StopReason, TextBlock, ToolUse, Usage
from tests.conversation.fixtures import Notebook
from tests.llm import harness
from tests.llm.steps import Hang

pytestmark = pytest.mark.anyio
LIMIT = 20
ADAPTERS = ["openai", "anthropic"]


def reply(*blocks, stop=StopReason.END_TURN, usage: Usage | None = None) -> Response:
    return Response(message=Message(role=Role.ASSISTANT, blocks=blocks), stop_reason=stop,
                    usage=usage or Usage(), model="m")


@pytest.fixture(params=ADAPTERS)
def backend(request):
    with harness.load(request.param) as b:
        yield b


async def close(model) -> None:
    await model.aclose()  # the pooled client an adapter owns


async def test_a_tool_loop_over_http(backend) -> None:
    u1 = Usage(input_tokens=50, output_tokens=8, cache_read_tokens=0)
    u2 = Usage(input_tokens=70, output_tokens=5, cache_read_tokens=40)
    backend.script(
        reply(TextBlock(text="Noting."), ToolUse(id="t1", name="add", input={"line": "milk"}),
              stop=StopReason.TOOL_USE, usage=u1),
        reply(TextBlock(text="Noted: milk."), usage=u2),
    )
    model = backend.model()
    try:
        with anyio.fail_after(LIMIT):
            done = await (LLM(model=model).with_system_prompt("Be brief.")
                          .with_tools(Notebook()).with_prompt("Note milk.").loop(max_steps=4))
    finally:
        await close(model)
    assert done.last_reply == "Noted: milk."
    assert done._state.objects[0].obj == Notebook(("milk",))
    usage = done.token_usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (120, 13, 40)
    first, second = backend.sent()
    wire = str(first)
    assert "Be brief." in wire and '"add"' in str(first).replace("'", '"')
    assert "Done: the Notebook returned is now the state" in str(second)
    assert done.provider == backend.name


async def test_a_cancelled_loop_releases_the_request_and_keeps_a_valid_history(backend) -> None:
    backend.script(Hang(reply(TextBlock(text="never finished"))))
    model = backend.model()
    queued = LLM(model=model).with_prompt("hi").loop()
    try:
        with anyio.fail_after(LIMIT):
            with anyio.move_on_after(0.3):  # the server hangs: give up on it
                await queued
    finally:
        await close(model)
    assert queued.progress.messages == (Message.text(Role.USER, "hi"),)
    assert queued.progress.has_pending
    closed = await anyio.to_thread.run_sync(backend.closed_by_client, 0, 5.0)
    assert closed


async def test_a_name_resolved_lazily_through_the_environment(monkeypatch) -> None:
    with harness.load("openai") as b:
        monkeypatch.setenv("OPENAI_BASE_URL", b.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0penai-fake-key-9f8e7d6c5b4a")
        b.script(reply(TextBlock(text="hello from the wire")))
        llm = LLM(model="gpt-test", provider="openai")
        with anyio.fail_after(LIMIT):
            done = await llm.with_prompt("hi").loop()
        await close(llm._state.model.get())
    assert done.last_reply == "hello from the wire" and done.model == "gpt-test"
    assert b.sent()[0]["model"] == "gpt-test"
    assert "sk-test" not in repr(done) and "sk-test" not in repr(done._state.model)
