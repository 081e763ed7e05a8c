"""The local model's reply grammar: what it relaxes, how a reply streams back as events, and
(with the model) that outputs sampled under it validate against random schemas of the
supported subset."""

from __future__ import annotations

import logging
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.llm import (
    Fault,
    LLMError,
    Sampling,
    TextDelta,
    Tool,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from runtime.llm.events import Assembler, Stop
from runtime.llm.providers._grammar import (
    CALL_SUFFIX,
    ReplyParser,
    call_prefix,
    compile_tools,
    relax_schema,
    render_call,
)
from runtime.llm.types import StopReason

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the grammar uses "
                    "its JSON-Schema converter): pip install -e '.[local]'")

ADD = {"type": "object", "properties": {"title": {"type": "string", "pattern": r"\S"}},
       "required": ["title"], "title": "AddItem"}


def tool(name: str, schema: dict[str, Any]) -> Tool:
    return Tool(name=name, input_schema=schema)


# -- relaxation ---------------------------------------------------------------------------


def test_supported_keywords_pass_and_annotations_go() -> None:
    schema = {"type": "object", "title": "T", "description": "d", "properties": {
        "n": {"type": "integer", "default": 1}, "tags": {"type": "array", "items": {
            "type": "string", "maxLength": 3}, "maxItems": 2},
        "kind": {"enum": ["a", "b"]}}, "required": ["n"], "additionalProperties": False}
    relaxed, dropped = relax_schema(schema)
    assert dropped == []
    assert relaxed == {"type": "object", "properties": {
        "n": {"type": "integer"}, "tags": {"type": "array", "items": {
            "type": "string", "maxLength": 3}, "maxItems": 2},
        "kind": {"enum": ["a", "b"]}}, "required": ["n"], "additionalProperties": False}


@pytest.mark.parametrize(("schema", "pointer"), [
    (ADD, "/properties/title/pattern"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}, "minimum"),
    ({"type": "object", "properties": {"v": {"oneOf": [{"type": "string"}]}}}, "oneOf"),
    ({"type": "object", "properties": {"v": {"type": ["string", "null"], "maxLength": 3}}},
     "/properties/v/maxLength (beside type)"),
    ({"type": "object", "required": ["ghost"]}, "/required"),
    ({"type": "string"}, "not an object schema"),
    ({"type": "object", "properties": {"r": {"$ref": "https://example.com/s.json"}}},
     "only local references"),
])
def test_what_the_converter_cannot_express_is_dropped_and_named(schema: dict[str, Any],
                                                                 pointer: str) -> None:
    _, dropped = relax_schema(schema)
    assert any(pointer in d for d in dropped), dropped
    compiled = compile_tools([tool("t", schema)])
    assert compiled.relaxed == {"t": dropped}


def test_the_model_logs_what_a_grammar_does_not_enforce(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    from runtime.llm.providers.local import LocalModel

    model = LocalModel()
    with caplog.at_level(logging.WARNING, logger="celldialog.llm.local"):
        model.grammar([tool("addItem", ADD)])
        model.grammar([tool("addItem", ADD)])  # cached: logged once
    [record] = caplog.records
    assert record.tool == "addItem" and "/properties/title/pattern" in record.getMessage()


def test_grammar_shape_and_llama_cpp_accepts_it() -> None:
    import llama_cpp

    from runtime.llm.providers.local import _engine, default_model_path

    compiled = compile_tools([tool("a", ADD), tool("b", {"type": "object"})])
    text = compiled.text
    assert text.startswith("root ::= answer | call0 | call1\n")
    assert '"<tool_call>\\n{\\"name\\": \\"a\\", \\"arguments\\": " tool0-args' in text
    assert "call1 ::=" in text and "tool1-args" in text
    assert compile_tools([tool("a", ADD)], text=False).text.startswith("root ::= call0\n")
    engine = _engine((str(default_model_path()), 64, 1, ""))  # a tiny context: just the vocab
    sampler = llama_cpp.llama_sampler_init_grammar(engine.vocab, text.encode(), b"root")
    assert sampler
    llama_cpp.llama_sampler_free(sampler)


# -- reading a reply back -----------------------------------------------------------------


def events_of(pieces: list[str], tools: list[Tool]) -> list[Any]:
    parser = ReplyParser(tools, lambda name: f"call-{name}")
    out = [e for p in pieces for e in parser.feed(p)]
    return [*out, *parser.finish()]


def assembled(events: list[Any]) -> Any:
    asm = Assembler("local")
    for e in events:
        asm.feed(e)
    asm.feed(Stop(stop_reason=StopReason.TOOL_USE))
    return asm.response().message


@given(st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40),
       st.sampled_from(["Rome", 'Qu"ote\\d', "new\nline", "ünï"]))
def test_a_call_streams_back_whatever_the_pieces(cuts: list[int], city: str) -> None:
    text = render_call("get_weather", {"city": city})
    text = text.replace("\\n", "\n") if "new" in city else text  # a raw newline in a string
    pieces, i = [], 0
    for n in cuts:
        pieces.append(text[i:i + n])
        i += n
    pieces.append(text[i:])
    events = events_of([p for p in pieces if p], [tool("get_weather", {"type": "object"})])
    assert isinstance(events[0], ToolCallStart) and events[0].name == "get_weather"
    assert isinstance(events[-1], ToolCallEnd)
    assert all(isinstance(e, ToolCallDelta) for e in events[1:-1])
    [use] = assembled(events).tool_uses()
    assert use.input == {"city": city} and use.id == "call-get_weather"


def test_text_is_text_and_a_cut_call_is_a_transient_error() -> None:
    assert events_of(["Hel", "lo <tool_call>"], [tool("t", {})]) == [
        TextDelta(index=0, text="Hel"), TextDelta(index=0, text="lo <tool_call>")]
    with pytest.raises(LLMError) as info:
        events_of([call_prefix("t") + '{"a": 1'], [tool("t", {})])
    assert info.value.fault is Fault.TRANSIENT and "inside a tool call" in str(info.value)
    with pytest.raises(LLMError, match="not advertised"):
        events_of([call_prefix("nope") + "{}" + CALL_SUFFIX], [tool("t", {})])


# -- the property: sampled outputs validate -------------------------------------------------

LEAVES = st.one_of(
    st.builds(lambda lo, hi: {"type": "string", "minLength": lo, "maxLength": lo + hi},
              st.integers(0, 2), st.integers(0, 6)),
    st.just({"type": "integer"}),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": ["integer", "null"]}),
    st.lists(st.one_of(st.integers(-5, 5), st.sampled_from(["x", "y z", "é"]), st.booleans()),
             min_size=1, max_size=3, unique=True).map(lambda vs: {"enum": vs}),
    st.sampled_from(["on", 3, None]).map(lambda v: {"const": v}),
    st.just({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}),
    st.builds(lambda lo, extra: {"type": "array", "items": {"type": "integer"},
                                 "minItems": lo, "maxItems": lo + extra},
              st.integers(0, 1), st.integers(0, 2)),
)
NAMES = st.sampled_from(["a", "b", "city", "n", "flag", "x_y"])


def objects(values: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        props = draw(st.dictionaries(NAMES, values, min_size=1, max_size=3))
        required = draw(st.lists(st.sampled_from(sorted(props)), unique=True))
        schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    return build()


SCHEMAS = objects(st.one_of(LEAVES, objects(LEAVES)))


@pytest.mark.local
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**31 - 1))
def test_outputs_sampled_under_the_grammar_validate(schema: dict[str, Any], seed: int) -> None:
    from runtime.llm.providers.local import LocalModel, _engine, _Job

    compiled = compile_tools([tool("t", schema)], text=False)
    assert compiled.relaxed == {}, "the strategy stays inside the supported subset"
    engine = _engine(LocalModel()._key)
    prompt = "<|im_start|>user\nCall the tool t.<|im_end|>\n<|im_start|>assistant\n"
    job = _Job(engine)
    job.start(prompt, compiled.text, Sampling(seed=seed, temperature=1.0), 160, pinned=False)
    parser = ReplyParser([tool("t", schema)], lambda name: "call_1")
    events: list[Any] = []
    try:  # synchronous, bounded by the token budget (no event loop to guard)
        while True:
            step = job.step()
            events.extend(parser.feed(step.text))
            if step.stop is not None:
                break
    finally:
        job.close()
    assert step.stop is StopReason.END_TURN, "the call ended within the token budget"
    events.extend(parser.finish())
    [use] = assembled(events).tool_uses()
    jsonschema.validate(use.input, schema)

