"""The port's vocabulary: exact JSON round trips, value semantics, and the small pure tables
(fault classes, safe base URLs, image media types, sampling) the adapters rely on."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from runtime.llm import (
    Assembler,
    CacheHint,
    Fault,
    ImageBlock,
    LLMError,
    Message,
    OpaqueBlock,
    OpaqueDone,
    Request,
    Response,
    Role,
    Sampling,
    Stop,
    StopReason,
    StreamEvent,
    TextBlock,
    TextDelta,
    Tool,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    ToolUse,
    Usage,
    UsageUpdate,
    retry_class,
    safe_base_url,
    supported_image_media_type,
)
from runtime.llm.events import response_events
from runtime.llm.history import repeated_call_ids
from runtime.llm.safety import display_url, is_loopback_host, is_loopback_url

IMAGE = bytes(range(256)) + b"\x00\xff\xfe not utf-8 \x80"
RAW = '{"type":"thinking","thinking":"é ✓ \\u00e9","signature":"AbC+/=="}'

FULL_REQUEST = Request(
    system="You are terse.",
    messages=(
        Message.text(Role.USER, "look"),
        Message(role=Role.USER, blocks=(TextBlock(text="and this"),
                                        ImageBlock(media_type="image/png", data=IMAGE))),
        Message(role=Role.ASSISTANT, blocks=(
            OpaqueBlock(provider="anthropic", raw=RAW),
            TextBlock(text="calling"),
            ToolUse(id="t1", name="f", input={"a": [1, 2.5, None, {"b": "ü"}], "c": True}),
        )),
        Message(role=Role.USER, blocks=(ToolResult(tool_use_id="t1", content="E", is_error=True),)),
    ),
    tools=(Tool(name="f", description="does f", input_schema={
        "type": "object", "properties": {"a": {"type": "array"}}}),),
    max_tokens=300,
    cache=CacheHint(prefix=True, stable_messages=3, key="conv-1"),
    sampling=Sampling(seed=7, temperature=0.2, top_p=0.9),
    reasoning_effort="medium",
)
FULL_RESPONSE = Response(
    message=FULL_REQUEST.messages[2],
    stop_reason=StopReason.TOOL_USE,
    usage=Usage(input_tokens=100, output_tokens=7, cache_read_tokens=80, cache_write_tokens=5),
    model="m-1",
)


@pytest.mark.parametrize(
    "value",
    [
        TextBlock(text=""),
        TextBlock(text="multi\nline ✓"),
        ToolUse(id="x", name="n"),
        ToolResult(tool_use_id="x", content="out"),
        OpaqueBlock(provider="anthropic", raw=RAW),
        ImageBlock(media_type="image/webp", data=IMAGE),
        ImageBlock(media_type="image/png", data=b""),
        Tool(name="t"),
        CacheHint(),
        Sampling(),
        Sampling(seed=-3, temperature=1.5, top_p=0.5),
        Usage(),
        Request(),
        FULL_REQUEST,
        FULL_RESPONSE,
    ],
    ids=lambda v: type(v).__name__,
)
def test_exact_json_round_trip(value) -> None:
    text = value.model_dump_json()
    back = type(value).model_validate_json(text)
    assert back == value
    assert back.model_dump_json() == text
    assert type(value).model_validate(json.loads(text)) == value


def test_images_are_base64_in_json_and_bytes_in_python() -> None:
    block = ImageBlock(media_type="image/png", data=IMAGE)
    dumped = json.loads(block.model_dump_json())
    assert dumped["kind"] == "image" and isinstance(dumped["data"], str)
    assert ImageBlock.model_validate_json(block.model_dump_json()).data == IMAGE


def test_opaque_raw_survives_untouched() -> None:
    block = OpaqueBlock(provider="anthropic", raw=RAW)
    assert OpaqueBlock.model_validate_json(block.model_dump_json()).raw == RAW


def test_blocks_are_discriminated_by_kind() -> None:
    message = Message.model_validate_json(FULL_REQUEST.messages[2].model_dump_json())
    assert [type(b) for b in message.blocks] == [OpaqueBlock, TextBlock, ToolUse]


def test_values_are_frozen_and_strict() -> None:
    with pytest.raises(ValidationError):
        TextBlock(text="x", txet="typo")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        TextBlock(text="x").text = "y"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Request(max_tokens=0)
    with pytest.raises(ValidationError):
        CacheHint(stable_messages=-1)
    with pytest.raises(ValidationError):
        Message.model_validate({"role": "robot", "blocks": []})


@pytest.mark.parametrize(
    ("given_", "hint"),
    [
        ({"role": "user", "content": "hi"}, "Message.text('user', 'hi')"),
        ({"role": "assistant", "content": "x" * 100}, "Message.text('assistant', 'xxx"),
        ({"role": "user", "content": [{"type": "text", "text": "hi"}]},
         "Message.text(role, text)"),
    ],
)
def test_a_vendor_style_message_gets_a_hint(given_: dict, hint: str) -> None:
    """``{"role", "content"}`` is the vendors' wire format, not the port's: the error says
    what to write instead."""
    with pytest.raises(ValidationError) as info:
        Request(messages=[given_])
    assert hint in str(info.value) and "blocks" in str(info.value)
    with pytest.raises(ValidationError, match=r"Message\.text\("):
        Message(**given_)
    assert Request(messages=[Message.text("user", "hi")]).messages[0].text_content() == "hi"


def test_message_helpers_and_usage_sum() -> None:
    m = FULL_REQUEST.messages[2]
    assert m.text_content() == "calling"
    assert [u.id for u in m.tool_uses()] == ["t1"]
    assert Message.text("user", "hi") == Message(role=Role.USER, blocks=(TextBlock(text="hi"),))
    total = Usage(input_tokens=1, output_tokens=2, cache_read_tokens=3, cache_write_tokens=4) \
        + Usage(input_tokens=10, output_tokens=20, cache_read_tokens=30, cache_write_tokens=40)
    assert total == Usage(input_tokens=11, output_tokens=22, cache_read_tokens=33,
                          cache_write_tokens=44)


EVENTS: list[StreamEvent] = [
    TextDelta(index=0, text="a"),
    ToolCallStart(index=1, id="c", name="f"),
    ToolCallDelta(index=1, arguments='{"x":'),
    ToolCallEnd(index=1),
    OpaqueDone(index=2, block=OpaqueBlock(provider="p", raw="{}")),
    UsageUpdate(usage=Usage(input_tokens=3)),
    Stop(stop_reason=StopReason.REFUSAL, model="m"),
]


def test_stream_events_round_trip_through_their_union() -> None:
    adapter = TypeAdapter(list[StreamEvent])
    assert adapter.validate_json(adapter.dump_json(EVENTS)) == EVENTS


# -- property: any request or response round-trips exactly ------------------------------

texts = st.text(max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
blocks = st.one_of(
    st.builds(TextBlock, text=texts),
    st.builds(ToolUse, id=texts, name=texts, input=st.dictionaries(texts, json_values,
                                                                   max_size=3)),
    st.builds(ToolResult, tool_use_id=texts, content=texts, is_error=st.booleans()),
    st.builds(OpaqueBlock, provider=texts, raw=texts),
    st.builds(ImageBlock, media_type=texts, data=st.binary(max_size=64)),
)
messages = st.builds(Message, role=st.sampled_from(Role),
                     blocks=st.lists(blocks, max_size=4).map(tuple))
counts = st.integers(min_value=0, max_value=10**9)
requests = st.builds(
    Request,
    system=texts,
    # a history never reuses a call id (Request refuses one that does: test_history.py)
    messages=st.lists(messages, max_size=4).map(tuple).filter(
        lambda ms: not repeated_call_ids(ms)),
    tools=st.lists(st.builds(Tool, name=texts, description=texts,
                             input_schema=st.dictionaries(texts, json_values, max_size=2)),
                   max_size=2).map(tuple),
    max_tokens=st.none() | st.integers(min_value=1, max_value=10**6),
    cache=st.builds(CacheHint, prefix=st.booleans(), stable_messages=st.integers(0, 9),
                    key=texts),
    sampling=st.none() | st.builds(Sampling, seed=st.none() | st.integers(),
                                   temperature=st.floats(allow_nan=False, allow_infinity=False),
                                   top_p=st.floats(allow_nan=False, allow_infinity=False)),
    reasoning_effort=st.sampled_from([None, "low", "medium", "high"]),
)
responses = st.builds(Response, message=messages, stop_reason=st.sampled_from(StopReason),
                      usage=st.builds(Usage, input_tokens=counts, output_tokens=counts,
                                      cache_read_tokens=counts, cache_write_tokens=counts),
                      model=texts)


@settings(deadline=None)
@given(requests)
def test_any_request_round_trips(request: Request) -> None:
    assert Request.model_validate_json(request.model_dump_json()) == request


@settings(deadline=None)
@given(responses)
def test_any_response_round_trips(response: Response) -> None:
    assert Response.model_validate_json(response.model_dump_json()) == response


# -- sampling -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_", "normal", "deterministic"),
    [
        ((0.0, 0.0), (0.0, 0.0), True),
        ((-1.0, 0.5), (0.0, 0.5), True),
        ((math.nan, math.nan), (0.0, 0.0), True),
        ((math.inf, math.inf), (0.0, 0.0), True),
        ((-math.inf, -math.inf), (0.0, 0.0), True),
        ((0.7, 1.5), (0.7, 1.0), False),
        ((2.0, -0.2), (2.0, 0.0), False),
        ((1e-9, 1.0), (1e-9, 1.0), False),
    ],
)
def test_sampling_normalized_and_deterministic(given_, normal, deterministic) -> None:
    s = Sampling(seed=42, temperature=given_[0], top_p=given_[1])
    n = s.normalized()
    assert (n.temperature, n.top_p, n.seed) == (*normal, 42)
    assert s.deterministic() is deterministic
    assert n.normalized() == n


# -- fault classes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "quota", "fault"),
    [
        (429, False, Fault.TRANSIENT),
        (429, True, Fault.TERMINAL),
        (500, False, Fault.TRANSIENT),
        (502, False, Fault.TRANSIENT),
        (503, False, Fault.TRANSIENT),
        (504, False, Fault.TRANSIENT),
        (529, False, Fault.TRANSIENT),
        (599, False, Fault.TRANSIENT),
        (400, False, Fault.TERMINAL),
        (401, False, Fault.TERMINAL),
        (402, True, Fault.TERMINAL),
        (403, False, Fault.TERMINAL),
        (404, False, Fault.TERMINAL),
        (413, False, Fault.TERMINAL),
        (422, False, Fault.TERMINAL),
    ],
)
def test_retry_class(status: int, quota: bool, fault: Fault) -> None:
    assert retry_class(status, quota) is fault


def test_llm_error_carries_its_classification() -> None:
    e = LLMError("slow down", fault=Fault.TRANSIENT, provider="openai", status=429,
                 retry_after=3.0)
    assert (e.transient, e.provider, e.status, e.retry_after) == (True, "openai", 429, 3.0)
    assert str(e) == "openai 429 (transient): slow down"
    assert "status=429" in repr(e) and "'transient'" in repr(e)
    t = LLMError("refused", fault="terminal", provider="anthropic")
    assert (t.fault, t.transient, str(t)) == (Fault.TERMINAL, False,
                                              "anthropic (terminal): refused")


# -- safety tables --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("", True),
        (None, True),
        ("https://api.anthropic.com", True),
        ("https://gateway.internal:8443/v1", True),
        ("http://127.0.0.1:8080/v1", True),
        ("http://127.9.9.9", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000", True),
        ("HTTP://127.0.0.1", True),
        ("https://", False),
        ("http://example.com", False),
        ("http://10.0.0.5:8000", False),
        ("http://0.0.0.0:8000", False),
        ("http://localhost.evil.example", False),
        ("http://127.0.0.1.evil.example", False),
        ("ftp://127.0.0.1", False),
        ("api.openai.com/v1", False),
        ("ws://localhost", False),
        ("http://[invalid", False),  # unparseable: not safe (and never a raw ValueError)
    ],
)
def test_safe_base_url(url: str | None, safe: bool) -> None:
    assert safe_base_url(url) is safe


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("https://127.9.9.9", True),
        ("http://LOCALHOST:11434/v1", True),
        ("http://[::1]:8000", True),
        ("ws://localhost", True),  # any scheme: whether it is *safe* is safe_base_url's call
        ("http://localhost.evil.example", False),
        ("http://127.0.0.1.evil.example", False),
        ("http://10.0.0.5", False),
        ("http://0.0.0.0", False),
        ("https://api.openai.com/v1", False),
        ("127.0.0.1:8080", False),  # no scheme: no host either
        ("http://[::1", False),  # unparseable
        ("", False),
        (None, False),
    ],
)
def test_is_loopback_url(url: str | None, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://api.openai.com/v1", "https://api.openai.com/v1"),
        ("https://user:sk-SECRET@gw.example:8443/v1?key=sk-SECRET#x", "https://gw.example:8443/v1"),
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        ("http://host:notaport/v1", "http://host/v1"),
        ("http://[invalid/v1?key=sk-SECRET", "http://(unparseable)"),
    ],
)
def test_display_url_drops_what_may_hold_credentials(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_is_loopback_host_takes_a_bare_hostname() -> None:
    assert is_loopback_host("::1") and is_loopback_host("127.0.0.2")
    assert is_loopback_host("LocalHost")
    assert not is_loopback_host("[::1]") and not is_loopback_host("") and not is_loopback_host("::")


@pytest.mark.parametrize(
    ("media_type", "ok"),
    [
        ("image/png", True),
        ("image/jpeg", True),
        ("image/gif", True),
        ("image/webp", True),
        (" Image/PNG ", True),
        ("image/jpg", False),
        ("image/bmp", False),
        ("image/svg+xml", False),
        ("image/heic", False),
        ("application/pdf", False),
        ("", False),
    ],
)
def test_supported_image_media_type(media_type: str, ok: bool) -> None:
    assert supported_image_media_type(media_type) is ok


# -- the assembler ------------------------------------------------------------------------


def test_assembler_orders_blocks_by_index_and_keeps_the_last_usage() -> None:
    asm = Assembler()
    for e in [
        ToolCallStart(index=1, id="c", name="f"),
        TextDelta(index=0, text="He"),
        ToolCallDelta(index=1, arguments='{"x"'),
        UsageUpdate(usage=Usage(input_tokens=1)),
        TextDelta(index=0, text="llo"),
        ToolCallDelta(index=1, arguments=": [1]}"),
        ToolCallEnd(index=1),
        OpaqueDone(index=2, block=OpaqueBlock(provider="p", raw="{}")),
        UsageUpdate(usage=Usage(input_tokens=5, output_tokens=2)),
        Stop(stop_reason=StopReason.TOOL_USE, model="m"),
    ]:
        asm.feed(e)
    r = asm.response()
    assert r.message.blocks == (TextBlock(text="Hello"),
                                ToolUse(id="c", name="f", input={"x": [1]}),
                                OpaqueBlock(provider="p", raw="{}"))
    assert (r.usage, r.stop_reason, r.model) == (Usage(input_tokens=5, output_tokens=2),
                                                 StopReason.TOOL_USE, "m")


def test_a_call_without_arguments_has_empty_input() -> None:
    asm = Assembler()
    for e in [ToolCallStart(index=0, id="c", name="f"), ToolCallEnd(index=0),
              Stop(stop_reason=StopReason.TOOL_USE)]:
        asm.feed(e)
    assert asm.response().message.tool_uses() == [ToolUse(id="c", name="f", input={})]


STOP = Stop(stop_reason=StopReason.END_TURN)


@pytest.mark.parametrize(
    ("events", "complaint"),
    [
        ([ToolCallDelta(index=0, arguments="{}"), STOP], "before its start"),
        ([ToolCallEnd(index=0), STOP], "before its start"),
        ([STOP, TextDelta(index=0, text="late")], "after stop"),
        ([TextDelta(index=0, text="no stop")], "without a stop"),
        ([], "without a stop"),
        ([ToolCallStart(index=0, id="c", name="f"), ToolCallDelta(index=0, arguments="{bad"),
          STOP], "not JSON"),
        ([ToolCallStart(index=0, id="c", name="f"), ToolCallDelta(index=0, arguments="[1]"),
          STOP], "not a JSON object"),
    ],
)
def test_incoherent_streams_raise(events: list[StreamEvent], complaint: str) -> None:
    asm = Assembler("prov")
    with pytest.raises(LLMError) as info:
        for e in events:
            asm.feed(e)
        asm.response()
    assert complaint in str(info.value)
    assert (info.value.fault, info.value.provider) == (Fault.TRANSIENT, "prov")


def test_response_events_assemble_back() -> None:
    asm = Assembler()
    for e in response_events(FULL_RESPONSE):
        asm.feed(e)
    assert asm.response() == FULL_RESPONSE


COUNTS = st.integers(min_value=0, max_value=10**12)


@given(st.tuples(COUNTS, COUNTS, COUNTS, COUNTS, COUNTS),
       st.tuples(COUNTS, COUNTS, COUNTS, COUNTS, COUNTS))
def test_usage_adds_field_by_field_and_nothing_added_is_the_same(a: tuple, b: tuple) -> None:
    names = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
             "reasoning_tokens")
    left = Usage(**dict(zip(names, a, strict=True)))
    right = Usage(**dict(zip(names, b, strict=True)))
    total = left + right
    assert total.model_dump() == {n: x + y for n, x, y in zip(names, a, b, strict=True)}
    assert left + Usage() is left  # adding what reported no usage makes nothing new
    assert (Usage() + right).model_dump() == right.model_dump()
