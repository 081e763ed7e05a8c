"""OpenTelemetry spans: one per step/loop, per model call (model, tokens, error) and per tool
call (name, error), read back from the SDK's InMemorySpanExporter; emit_history re-emits a
loaded conversation's."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime import LLM
from runtime.llm import Fault, LLMError, Reply, ScriptedModel, Usage, call
from tests.conversation.fixtures import Notebook

pytestmark = pytest.mark.anyio
LIMIT = 10
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans():
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global provider is set once a process
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_celldialog_test", False):
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        provider._celldialog_test = True
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


async def test_a_span_per_loop_step_and_tool_call(spans) -> None:
    model = ScriptedModel([
        Reply(tool_calls=[call("add", {"line": "x"}), call("add", {"line": 5})],
              usage=Usage(input_tokens=11, output_tokens=3)),
        Reply(text="done", usage=Usage(input_tokens=20, output_tokens=2, cache_read_tokens=8)),
    ])
    with anyio.fail_after(LIMIT):
        await LLM(model=model).with_tools(Notebook()).with_prompt("go").loop()
    got = {s.name: s for s in spans.get_finished_spans()}
    by_name = [s.name for s in spans.get_finished_spans()]
    assert by_name.count("chat scripted") == 2 and by_name.count("execute_tool add") == 2
    loop = got["celldialog.llm.loop"]
    steps = [s for s in spans.get_finished_spans() if s.name == "chat scripted"]
    assert all(s.parent.span_id == loop.context.span_id for s in steps)
    assert steps[0].attributes["gen_ai.usage.input_tokens"] == 11
    assert steps[1].attributes["gen_ai.usage.cache_read_input_tokens"] == 8
    assert loop.attributes["gen_ai.usage.output_tokens"] == 5
    tools = [s for s in spans.get_finished_spans() if s.name == "execute_tool add"]
    assert {t.parent.span_id for t in tools} == {steps[0].context.span_id}
    ok, bad = sorted(tools, key=lambda t: t.start_time)
    assert ok.status.is_ok and ok.attributes["gen_ai.tool.name"] == "add"
    assert not bad.status.is_ok and bad.attributes["error.type"] == "tool_error"


async def test_a_failed_step_is_an_error_span(spans) -> None:
    model = ScriptedModel([LLMError("no credit", fault=Fault.TERMINAL, provider="scripted")])
    with anyio.fail_after(LIMIT), pytest.raises(LLMError):
        await LLM(model=model).with_prompt("go").loop()
    step = next(s for s in spans.get_finished_spans() if s.name == "chat scripted")
    assert step.attributes["error.type"] == "LLMError"
    assert "no credit" in step.status.description


async def test_an_agents_loop_span_carries_its_handle(spans) -> None:
    agent = LLM(model=ScriptedModel(["hi"])).spawn("greeter")
    async with agent:
        with anyio.fail_after(LIMIT):
            await agent.send("hello")
    loop = next(s for s in spans.get_finished_spans() if s.name == "celldialog.llm.loop")
    assert loop.attributes["celldialog.agent.id"] == agent.handle


async def test_emit_history_re_emits_a_loaded_conversation(spans) -> None:
    model = ScriptedModel([Reply(tool_calls=[call("add", {"line": "x"})]), "done"])
    with anyio.fail_after(LIMIT):
        done = await LLM(model=model).with_tools(Notebook()).with_prompt("go").loop()
    loaded = LLM.restore(done.portable_id, model=ScriptedModel())
    spans.clear()
    assert loaded.emit_history() is loaded
    names = [s.name for s in spans.get_finished_spans()]
    assert names.count("chat scripted") == 2 and names.count("execute_tool add") == 1
    assert any(s.attributes.get("celldialog.llm.op") == "history"
               for s in spans.get_finished_spans())


NO_TELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # as if it were not installed
import anyio
from runtime import LLM
from runtime.conversation import telemetry
from runtime.llm import ScriptedModel

assert telemetry._AVAILABLE is False and telemetry.tracer() is None
done = anyio.run(LLM(model=ScriptedModel(["ok"])).with_prompt("x").loop().sync)
assert done.emit_history().last_reply == "ok"
assert "opentelemetry" not in [m for m in sys.modules if sys.modules[m] is not None]
print("fine")
"""

UNCONFIGURED = """
from runtime.conversation import telemetry
assert telemetry._AVAILABLE and telemetry.tracer() is None  # no provider: no spans made
print("fine")
"""


@pytest.mark.parametrize("script", [NO_TELEMETRY, UNCONFIGURED])
def test_nothing_without_opentelemetry_or_a_provider(script: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "fine", out.stderr
