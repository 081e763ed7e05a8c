"""One test per row of the spec's table (../shared/spec/conversation.md), on ScriptedModel."""

from __future__ import annotations

import anyio
import pytest

from runtime import LLM
from runtime.conversation import NotEvaluatedError, PortableIdError
from runtime.conversation.state import DEFAULT_SYSTEM_PROMPT
from runtime.llm import Message, Reply, Role, ScriptedModel, TextBlock, ToolUse, Usage, call

pytestmark = pytest.mark.anyio
LIMIT = 10


class Counter:
    """A counter the model can bump."""

    def __init__(self) -> None:
        self.n = 0

    def bump(self, by: int = 1) -> int:
        """Add ``by``; the new value."""
        self.n += by
        return self.n


async def test_with_prompt_queues_a_user_message(tmp_path) -> None:
    model = ScriptedModel(["hi there"])
    prompt_file = tmp_path / "p.txt"
    prompt_file.write_text("from a file")
    llm = LLM(model=model).with_prompt("hello").with_prompt_file(prompt_file)
    assert llm.has_pending and not model.requests  # queued, nothing sent
    with anyio.fail_after(LIMIT):
        done = await llm.loop()
    sent = model.requests[0].messages
    assert [m.role for m in sent] == [Role.USER]
    assert [b.text for b in sent[0].blocks] == ["hello", "from a file"]
    assert done.last_reply == "hi there"


async def test_system_prompts_are_kept_in_order_and_can_be_cleared() -> None:
    model = ScriptedModel(["a", "b", "c"])
    llm = LLM(model=model).with_system_prompt("One.").with_system_prompt("Two.")
    with anyio.fail_after(LIMIT):
        await llm.with_prompt("x").loop()
        await llm.without_system_prompts().with_prompt("x").loop()
        await llm.without_default_system_prompt().with_prompt("x").loop()
    first, cleared, no_default = (r.system for r in model.requests)
    assert first == f"{DEFAULT_SYSTEM_PROMPT}\n\nOne.\n\nTwo."
    assert cleared == DEFAULT_SYSTEM_PROMPT
    assert no_default == "One.\n\nTwo."


async def test_without_message_history_keeps_system_prompts_only() -> None:
    model = ScriptedModel(["first", "second"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_system_prompt("S.").with_prompt("one").loop()
        again = await done.without_message_history().with_prompt("two").loop()
    assert len(done.messages) == 2
    assert [m.text_content() for m in model.requests[1].messages] == ["two"]
    assert model.requests[1].system.endswith("S.")
    assert again.token_usage == done.token_usage  # usage stays cumulative


async def test_with_response_and_with_tool_result_append_without_calling_the_model() -> None:
    model = ScriptedModel(["It is sunny."])
    llm = (LLM(model=model).with_prompt("Weather?")
           .with_response([TextBlock(text="Checking."),
                           ToolUse(id="c1", name="weather", input={"city": "Oslo"})],
                          input_tokens=5, output_tokens=3, cached_token_reads=2)
           .with_tool_result("c1", "sunny", errored=False))
    assert not model.requests and llm.has_pending
    assert llm.token_usage.input_tokens == 5 and llm.token_usage.total_tokens == 8
    assert llm.last_reply == "Checking."
    with pytest.raises(Exception, match="no tool call 'nope' awaits a result"):
        llm.with_tool_result("nope", "x")
    with anyio.fail_after(LIMIT):
        done = await llm.step()
    assert [m.role for m in model.requests[0].messages] == [Role.USER, Role.ASSISTANT, Role.USER]
    assert done.last_reply == "It is sunny." and not done.has_pending


async def test_step_is_one_model_call_with_its_tool_calls_and_results_queued() -> None:
    model = ScriptedModel([Reply(text="Bumping.", tool_calls=[call("bump", {"by": 2})]),
                           "Now 2."])
    llm = LLM(model=model).with_tools(Counter()).with_prompt("bump by 2")
    with anyio.fail_after(LIMIT):
        one = await llm.step(max_tokens=100)
    assert len(model.requests) == 1 and model.requests[0].max_tokens == 100
    assert one.has_pending  # the results are queued for the next step
    assert one.messages[-1].blocks[0].content == "2"
    with anyio.fail_after(LIMIT):
        two = await one.step()
    assert two.last_reply == "Now 2." and not two.has_pending


async def test_loop_steps_until_the_turn_ends_and_raises_at_max_steps() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("bump")]), Reply(tool_calls=[call("bump")]),
                           "done"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Counter()).with_prompt("go").loop(max_tokens=50)
    assert done.last_reply == "done" and len(model.requests) == 3
    assert all(r.max_tokens == 50 for r in model.requests)


async def test_has_pending_follows_prompts_and_tool_results() -> None:
    llm = LLM(model=ScriptedModel([Reply(tool_calls=[call("bump")])])).with_tools(Counter())
    assert not llm.has_pending
    queued = llm.with_prompt("go")
    assert queued.has_pending
    with anyio.fail_after(LIMIT):
        stepped = await queued.step()
    assert stepped.has_pending  # the tool results are queued, not yet sent


async def test_last_reply_messages_and_transcript() -> None:
    model = ScriptedModel([Reply(text="Let me bump.", tool_calls=[call("bump")]), "It is 1."])
    llm = LLM(model=model).with_system_prompt("Secret system text.").with_tools(Counter())
    assert llm.last_reply is None
    with anyio.fail_after(LIMIT):
        done = await llm.with_prompt("bump it").loop()
    assert done.last_reply == "It is 1."
    assert [m.role for m in done.messages] == [Role.USER, Role.ASSISTANT, Role.USER,
                                               Role.ASSISTANT]
    assert all(isinstance(m, Message) for m in done.messages)
    text = done.transcript
    assert "User: bump it" in text and "Assistant called bump({})" in text
    assert "Tool result of bump: 1" in text and text.endswith("Assistant: It is 1.")
    assert "Secret system text." not in text


async def test_token_usage_context_tokens_and_context_window() -> None:
    u1 = Usage(input_tokens=100, output_tokens=10, cache_read_tokens=40, cache_write_tokens=5)
    u2 = Usage(input_tokens=130, output_tokens=7, cache_read_tokens=100)
    model = ScriptedModel([Reply(tool_calls=[call("bump")], usage=u1), Reply(text="ok", usage=u2)])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Counter()).with_prompt("go").loop()
    usage = done.token_usage
    assert (usage.input_tokens, usage.output_tokens) == (230, 17)
    assert (usage.cache_read_tokens, usage.cache_write_tokens) == (140, 5)
    assert usage.total_tokens == 230 + 17 + 5
    assert done.context_tokens == 137  # the last call's input + output: nothing came after
    assert done.with_prompt("x" * 400).context_tokens == 137 + 100
    assert LLM(model=ScriptedModel()).context_window is None
    assert LLM(model="claude-sonnet-4-5").context_window == 200_000


async def test_model_provider_and_reasoning_effort_resolved_without_a_key(monkeypatch) -> None:
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CELLDIALOG_MODEL"):
        monkeypatch.delenv(var, raising=False)
    llm = LLM(model="sonnet")
    assert (llm.provider, llm.model, llm.reasoning_effort) == ("anthropic",
                                                               "claude-sonnet-4-5", "")
    assert LLM(model="llama3.1:8b", provider="openai").provider == "openai"
    monkeypatch.setenv("CELLDIALOG_MODEL", "gpt-4.1")
    assert LLM().model == "gpt-4.1"
    with pytest.raises(Exception, match="reasoning effort 'extreme'"):
        llm.with_reasoning_effort("extreme")
    with anyio.fail_after(LIMIT), pytest.raises(Exception, match="ANTHROPIC_API_KEY"):
        await llm.with_prompt("hi").loop()  # resolved at the first step: no key here


async def test_with_model_small_model_and_reasoning_effort_apply_from_the_next_step() -> None:
    first, second = ScriptedModel(["one"]), ScriptedModel(["two"], name="other")
    with anyio.fail_after(LIMIT):
        a = await LLM(model=first).with_prompt("1").loop()
        b = await a.with_model(second).with_reasoning_effort("high").with_prompt("2").loop()
    assert b.model == "other" and b.reasoning_effort == "high"
    assert second.requests[0].reasoning_effort == "high"
    assert [m.text_content() for m in second.requests[0].messages] == ["1", "one", "2"]
    assert first.requests[0].reasoning_effort is None
    assert LLM(model="sonnet").with_small_model().model == "claude-haiku-4-5"
    assert LLM(model="gpt-4.1").with_small_model().model == "gpt-5-mini"
    assert LLM(model=first).with_small_model().model == "scripted"  # no small model: kept
    assert LLM(model=first).with_reasoning_effort("none").reasoning_effort == "none"


async def test_with_tools_and_tools_documentation() -> None:
    llm = LLM(model=ScriptedModel()).with_tools(Counter())
    doc = llm.tools
    assert doc.startswith("## bump") and "Add ``by``; the new value." in doc
    assert '"by":{"default":1,"type":"integer"}' in doc
    assert LLM(model=ScriptedModel()).tools == "No tools are exposed."


async def test_fork_gives_independent_conversations() -> None:
    model = ScriptedModel([Reply(tool_calls=[call("bump")]), "a", Reply(tool_calls=[call("bump")]),
                           "b"])
    base = LLM(model=model).with_tools(Counter()).with_prompt("go")
    with anyio.fail_after(LIMIT):
        a = await base.fork("attempt-1").loop()
        b = await base.fork("attempt-2").loop()
    assert (a.last_reply, b.last_reply) == ("a", "b")
    assert a.messages[2].blocks[0].content == "1" == b.messages[2].blocks[0].content
    assert base._state.objects[0].obj.n == 0  # the original counter was never touched
    assert model.requests[0].cache.key != model.requests[2].cache.key


async def test_portable_id_round_trip_in_process() -> None:
    from tests.conversation.fixtures import Notebook

    model = ScriptedModel([Reply(tool_calls=[call("add", {"line": "milk"})]), "noted"])
    with anyio.fail_after(LIMIT):
        done = await (LLM(model=model).with_system_prompt("Be brief.").with_reasoning_effort("low")
                      .with_tools(Notebook()).with_prompt("note milk").loop())
    restored = LLM.restore(done.portable_id, model=ScriptedModel())
    assert restored.messages == done.messages and restored.token_usage == done.token_usage
    assert restored.reasoning_effort == "low"
    assert restored._state.objects[0].obj == Notebook(("milk",))
    assert restored._state.system_prompts == ("Be brief.",)


async def test_spawn_and_agent_lookup() -> None:
    llm = LLM(model=ScriptedModel(["hi"]))
    agent = llm.spawn("helper")
    assert agent.state == "IDLE" and LLM.agent(agent.handle, "helper") is agent
    async with agent:
        with anyio.fail_after(LIMIT):
            reply = await agent.send("hello")
    assert reply.last_reply == "hi"


async def test_with_workspace_and_workspace() -> None:
    from runtime import Runtime, cell, handler, pattern

    @handler
    def add(event: dict, items):
        items.push(event["title"])

    @pattern
    def todo():
        items = cell([], name="items")
        return {"items": items, "add": add(items=items)}

    model = ScriptedModel([Reply(tool_calls=[call("add", {"title": "milk"})]),
                           Reply(tool_calls=[call("workspace_read", {"path": "items"})]),
                           "Added."])
    with pytest.raises(Exception, match="no workspace"):
        _ = LLM(model=model).workspace
    async with Runtime() as rt:
        inst = rt.run(todo)
        llm = LLM(model=model).with_workspace(inst)
        assert llm.workspace is inst
        with anyio.fail_after(LIMIT):
            done = await llm.with_prompt("add milk").loop()
        assert inst.result.key("items").get() == ["milk"]
        assert done.messages[4].blocks[0].content == '["milk"]'
        tools = {t.name for t in model.requests[0].tools}
        assert {"add", "workspace_read", "ListSkills", "ReadSkill"} == tools
        with pytest.raises(PortableIdError, match="workspace"):
            _ = done.portable_id
    with pytest.raises(Exception, match="running pattern instance"):
        LLM(model=model).with_workspace(object())


async def test_id_sync_and_emit_history() -> None:
    model = ScriptedModel(["ok"])
    llm = LLM(model=model).with_prompt("go").loop()
    assert llm.id.startswith("llm-") and llm.id != llm.fork("x").id
    with pytest.raises(NotEvaluatedError, match="await it"):
        _ = llm.messages
    with anyio.fail_after(LIMIT):
        done = await llm.sync()
    assert llm.messages == done.messages  # an awaited value reads its result
    assert await llm is done  # evaluated once
    assert done.emit_history() is done
    assert len(model.requests) == 1


async def test_model_choices_fail_clearly_and_keep_secrets_out() -> None:
    from runtime.conversation import ImportedModel
    from runtime.llm import ConfigurationError

    with pytest.raises(ConfigurationError, match="cannot tell the provider"):
        LLM(model="no-such-model")
    broken = LLM(model=ImportedModel("tests.conversation.fixtures:missing"))
    assert "missing" in repr(broken)  # the repr does not import it
    with anyio.fail_after(LIMIT), pytest.raises(ConfigurationError, match="cannot import"):
        await broken.with_prompt("x").loop()
    imported = LLM(model=ImportedModel("tests.conversation.fixtures:continuation_model"))
    assert imported.provider == "scripted"
    secret = LLM(model=ScriptedModel()).with_mcp_server("gh", "npx", ("server",),
                                                      env={"TOKEN": "s3cr3t-value"})
    assert "s3cr3t-value" not in repr(secret) + secret.tools
