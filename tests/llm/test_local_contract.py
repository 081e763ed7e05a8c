"""The contract suite for ``LocalModel``, part by part.

The shared suite (``test_contract.py``) scripts each reply, and a real model cannot be
scripted, so every contract test is either held here by a counterpart that checks the same
promise on real output, or listed in ``NOT_HONOURED`` with the reason. A guard fails when a
contract test is in neither table, so a new part of the contract gets a decision.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from runtime.llm import (
    CacheHint,
    Fault,
    ImageBlock,
    LLMError,
    Message,
    OpaqueBlock,
    Request,
    Response,
    Role,
    Sampling,
    StopReason,
    TextBlock,
    Tool,
    ToolResult,
    ToolUse,
    assemble,
)
from runtime.llm.providers._grammar import render_call

from .backend_local import GREEDY, RecordingLocalModel, local_model, tokens

pytestmark = [pytest.mark.anyio, pytest.mark.local]

Mode = Literal["generate", "stream"]
MODES: list[Mode] = ["generate", "stream"]

NO_HTTP = "in-process: there is no server, so no HTTP status, retry, quota or cut connection"
NOT_HONOURED = {
    "test_two_parallel_tool_calls": "the grammar admits one call per reply (a small model "
    "asked one thing at a time stays valid; the step engine calls again after each result); "
    "parallel calls in the history are still rendered (test_tool_round_trip here)",
    "test_cache_hint_placement": "no cache markers or routing key: llama.cpp's KV cache reuses "
    "any common prompt prefix by itself, so a CacheHint changes nothing (checked in "
    "test_request_prefix_is_byte_identical_across_three_turns here)",
    "test_images_reach_the_wire": "the model reads text only: every image is refused with a "
    "terminal error, never dropped (test_unsupported_image_is_refused_not_dropped here)",
    "test_opaque_blocks_in_replies_are_replayed_byte_for_byte": "the model produces no opaque "
    "blocks (no thinking signatures)",
    "test_opaque_blocks_in_history_are_sent_verbatim": "an opaque block is another provider's "
    "bytes and means nothing to this model: it is dropped, as the OpenAI adapter drops other "
    "providers' (test_adapter_drops_opaque_blocks_of_other_providers here)",
    "test_rate_limit_is_retried_after_the_servers_delay": NO_HTTP,
    "test_exhausted_quota_fails_at_once": NO_HTTP,
    "test_server_errors_are_retried_then_fail_transient": NO_HTTP,
    "test_client_errors_are_terminal": NO_HTTP,
    "test_broken_stream_fails_without_a_response": NO_HTTP + " (a reply cut inside a tool "
    "call is a transient error: test_local.py)",
    "test_broken_reply_to_generate_is_retried_only_if_cut_short": NO_HTTP,
    "test_adapter_refuses_to_send_a_key_over_plain_http": "no key and no URL",
    "test_connection_refused_is_retried_then_a_transient_fault": NO_HTTP,
    "test_an_owned_client_is_pooled_until_closed": "no HTTP client",
    "test_a_key_starting_an_overlong_tool_name_is_redacted_even_in_part": "no key: nothing "
    "to leak, and the model names only the tools it was given",
    "test_a_given_client_is_used_and_left_open": "no HTTP client",
    "test_reasoning_tokens_are_reported_where_the_provider_counts_them": "the grammar gives "
    "the small model no thinking phase: every token it writes is the reply, so "
    "reasoning_tokens stays 0 (test_usage_is_counted_by_the_tokenizer here)",
}
HONOURED = {  # contract test -> its counterpart here
    "test_text_reply": "test_text_reply",
    "test_tool_round_trip": "test_tool_round_trip",
    "test_stream_assembles_to_the_generate_response":
        "test_stream_assembles_to_the_generate_response",
    "test_usage_is_normalised_with_cache_reads_and_writes":
        "test_usage_is_counted_by_the_tokenizer",
    "test_request_prefix_is_byte_identical_across_three_turns":
        "test_request_prefix_is_byte_identical_across_three_turns",
    "test_unsupported_image_is_refused_not_dropped":
        "test_unsupported_image_is_refused_not_dropped",
    "test_cancel_returns_promptly_and_the_model_stays_usable":
        "test_cancel_returns_promptly_and_the_model_stays_usable",
    "test_concurrent_calls_each_get_one_reply": "test_concurrent_calls_queue_and_each_get_a_reply",
    "test_adapter_drops_opaque_blocks_of_other_providers":
        "test_adapter_drops_opaque_blocks_of_other_providers",
    "test_a_model_is_usable_from_one_event_loop_after_another":
        "test_a_model_is_usable_from_one_event_loop_after_another",
    "test_a_cancelled_call_closes_its_request": "test_a_cancelled_call_frees_the_model",
}

WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]},
)
CLOCK = Tool(name="get_time", description="Current time in a city.",
             input_schema={"type": "object", "properties": {"city": {"type": "string"}}})


def ask(text: str = "Hi", max_tokens: int = 8, **kw: Any) -> Request:
    return Request(messages=(Message.text(Role.USER, text),), max_tokens=max_tokens,
                   sampling=kw.pop("sampling", GREEDY), **kw)


async def run(model: RecordingLocalModel, request: Request, mode: Mode) -> Response:
    with anyio.fail_after(120):
        if mode == "generate":
            return await model.generate(request)
        return await assemble(model.stream(request))


def test_every_contract_test_is_honoured_here_or_listed_with_a_reason() -> None:
    source = Path(__file__).with_name("test_contract.py").read_text()
    contract = {n.name for n in ast.parse(source).body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                and n.name.startswith("test_")}
    assert contract - set(HONOURED) - set(NOT_HONOURED) == set(), "decide for these"
    assert set(HONOURED) & set(NOT_HONOURED) == set()
    assert set(HONOURED) | set(NOT_HONOURED) <= contract, "stale entries"
    here = {n for n in globals() if n.startswith("test_")}
    assert set(HONOURED.values()) <= here


# -- replies -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_text_reply(mode: Mode) -> None:
    model = local_model()
    got = await run(model, ask("Say hello."), mode)
    assert [type(b) for b in got.message.blocks] == [TextBlock]
    assert got.message.text_content().strip()
    assert got.stop_reason in (StopReason.END_TURN, StopReason.MAX_TOKENS)
    assert got.model == model.name == "SmolLM2-135M-Instruct.Q4_1"
    assert model.provider == "local" and len(model.prompts) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_tool_round_trip(mode: Mode) -> None:
    """A call and its result in the history reach the model as it would write and read
    them (parallel calls included), and the reply is text or a valid call."""
    model = local_model()
    a = ToolUse(id="call_a", name="get_weather", input={"city": "Oslo"})
    b = ToolUse(id="call_b", name="get_time", input={"city": "Lima"})
    request = Request(system="Be brief.", tools=(WEATHER, CLOCK), max_tokens=40,
                      sampling=GREEDY, messages=(
        Message.text(Role.USER, "Oslo weather and Lima time?"),
        Message(role=Role.ASSISTANT, blocks=(TextBlock(text="Checking."), a, b)),
        Message(role=Role.USER, blocks=(
            ToolResult(tool_use_id="call_a", content="sunny, 21C"),
            ToolResult(tool_use_id="call_b", content="no such city", is_error=True))),
    ))
    got = await run(model, request, mode)
    prompt = model.prompts[0]
    assert render_call("get_weather", {"city": "Oslo"}) in prompt
    assert render_call("get_time", {"city": "Lima"}) in prompt
    assert '{"name": "get_weather", "content": "sunny, 21C"}' in prompt
    assert '{"name": "get_time", "content": "no such city", "error": true}' in prompt
    assert "Be brief." in prompt and '"name": "get_time"' in prompt
    uses = got.message.tool_uses()
    if uses:
        assert got.stop_reason is StopReason.TOOL_USE and len(uses) == 1
        assert uses[0].name in ("get_weather", "get_time") and uses[0].id.startswith("call_")
    else:
        assert got.message.text_content()


async def test_stream_assembles_to_the_generate_response() -> None:
    model = local_model()
    request = Request(system="Be brief.", tools=(WEATHER, CLOCK), max_tokens=96,
                      sampling=GREEDY, messages=(Message.text(Role.USER, "Weather in Rome?"),))
    with anyio.fail_after(120):
        generated = await model.generate(request)
        events = [e async for e in model.stream(request)]

    async def replay():  # type: ignore[no-untyped-def]
        for e in events:
            yield e

    assert await assemble(replay()) == generated  # ids included: derived from the request


async def test_usage_is_counted_by_the_tokenizer() -> None:
    model = local_model(sampling=Sampling(temperature=0.0))  # the model's own, not pinned
    first = await run(model, ask("Count to three.", sampling=None), "generate")
    prompt = model.prompts[0]
    assert first.usage.input_tokens == tokens(model, prompt)
    assert 0 < first.usage.output_tokens <= 8
    assert first.usage.cache_write_tokens == 0
    assert first.usage.cache_read_tokens <= first.usage.input_tokens
    again = await run(model, ask("Count to three.", sampling=None), "stream")
    # the same prompt again: all of it but the last token comes from the KV cache
    assert again.usage.cache_read_tokens == again.usage.input_tokens - 1
    pinned = await run(model, ask("Count to three."), "generate")
    assert pinned.usage.cache_read_tokens == 0  # a pinned request is evaluated whole


async def test_request_prefix_is_byte_identical_across_three_turns() -> None:
    model = local_model()
    system = "You are a weather assistant. " * 20
    use = ToolUse(id="toolu_c1", name="get_weather", input={"city": "Bergen"})
    history = [
        Message.text(Role.USER, "Weather in Bergen?"),
        Message(role=Role.ASSISTANT, blocks=(use,)),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id=use.id, content="rain"),)),
        Message.text(Role.ASSISTANT, "It rains in Bergen."),
        Message.text(Role.USER, "And tomorrow?"),
    ]
    prompts = []
    for n in (1, 3, 5):
        hint = CacheHint(prefix=True, stable_messages=n, key="conv-bergen")
        request = Request(system=system, tools=(WEATHER, CLOCK), messages=tuple(history[:n]),
                          cache=hint)
        prompts.append(await model.prompt(request))
        assert await model.prompt(request.model_copy(update={"cache": CacheHint()})) \
            == prompts[-1]  # a hint changes nothing
    end_of_first_user = prompts[0].index("Weather in Bergen?") + len("Weather in Bergen?")
    assert prompts[1].startswith(prompts[0][:end_of_first_user])
    end_of_result = prompts[1].index('"content": "rain"}')
    assert prompts[2].startswith(prompts[1][:end_of_result])


async def test_unsupported_image_is_refused_not_dropped() -> None:
    model = local_model()
    for media_type in ("image/bmp", "image/png"):
        request = Request(messages=(Message(role=Role.USER, blocks=(
            TextBlock(text="What is this?"), ImageBlock(media_type=media_type, data=b"BM..."))),))
        for mode in MODES:
            with pytest.raises(LLMError) as info:
                await run(model, request, mode)
            assert info.value.fault is Fault.TERMINAL and media_type in str(info.value)
            assert "text only" in str(info.value)


async def test_adapter_drops_opaque_blocks_of_other_providers() -> None:
    model = local_model()
    foreign = '{"type":"reasoning","encrypted":"not-for-you-7f3a"}'
    history = (
        Message.text(Role.USER, "Rain?"),
        Message(role=Role.ASSISTANT, blocks=(OpaqueBlock(provider="elsewhere", raw=foreign),
                                             TextBlock(text="Rain."))),
        Message.text(Role.USER, "Thanks"),
    )
    got = await run(model, Request(messages=history, max_tokens=4, sampling=GREEDY), "generate")
    assert got.message.text_content()
    assert "not-for-you-7f3a" not in model.prompts[0] and "Rain." in model.prompts[0]


# -- cancellation and concurrency -------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_returns_promptly_and_the_model_stays_usable(mode: Mode) -> None:
    model = local_model()
    long = ask("Write a long story about a lighthouse keeper.", max_tokens=400)
    await run(model, ask(), mode)  # loaded and warm, so the budget below is generation's
    started = time.monotonic()
    got_text = anyio.Event()
    with anyio.move_on_after(60) as outer:
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                if mode == "generate":
                    await model.generate(long)
                else:
                    async for _ in model.stream(long):
                        got_text.set()

            tg.start_soon(consume)
            if mode == "stream":
                await got_text.wait()  # mid-stream
            tg.cancel_scope.cancel()
    assert not outer.cancelled_caught
    assert time.monotonic() - started < 5.0  # far less than 400 tokens take
    again = await run(model, ask("Say hi."), mode)
    assert again.message.text_content()


async def test_concurrent_calls_queue_and_each_get_a_reply() -> None:
    model = local_model()
    texts: list[str] = []
    one = ask("Name a colour.", max_tokens=6)
    solo = (await run(model, one, "generate")).message.text_content()

    async def call() -> None:
        texts.append((await run(model, one, "stream")).message.text_content())

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(call)
    assert texts == [solo] * 3  # queued one after another: none saw another's state


def test_a_model_is_usable_from_one_event_loop_after_another() -> None:
    model = local_model()

    async def call() -> str:
        return (await run(model, ask("Hello"), "generate")).message.text_content()

    first = anyio.run(call)
    assert anyio.run(call) == first  # same engine, same bytes


async def test_a_cancelled_call_frees_the_model() -> None:
    """Cancelled while another request waits for the model: the waiting one gets it at once
    (its wait is well under what the cancelled generation would have taken)."""
    model = local_model()
    await run(model, ask(), "generate")
    cancelled = anyio.CancelScope()
    started = anyio.Event()
    done: list[float] = []

    async def long_one() -> None:
        with cancelled:
            async for _ in model.stream(ask("Tell a very long story.", max_tokens=400)):
                started.set()

    async def next_one() -> None:
        t = time.monotonic()
        await run(model, ask("Say hi.", max_tokens=4), "generate")
        done.append(time.monotonic() - t)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_one)
            await started.wait()
            tg.start_soon(next_one)  # queues behind the long one
            cancelled.cancel()
    assert done and done[0] < 10.0
