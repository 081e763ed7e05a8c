"""The fast schema check is sound for acceptance: whatever it accepts, jsonschema (with our
strict types) accepts too. Random schemas of the subset against random JSON values."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.cells.fastcheck import compile_check
from runtime.cells.schema import CompiledSchema

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-5, 5, allow_nan=False)
    | st.sampled_from([0.0, 1.0, 2.0]) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]), inner, max_size=4),
    max_leaves=12,
)

TYPES = ["object", "array", "string", "integer", "number", "boolean", "null"]
scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.0, 2.0, 0.5, "a"])


def _schemas() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.just({}),
        st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
        st.builds(lambda ts: {"type": ts}, st.lists(st.sampled_from(TYPES), min_size=1,
                                                     max_size=3, unique=True)),
        st.builds(lambda e: {"enum": e}, st.lists(scalars, min_size=1, max_size=3)),
        st.builds(lambda c: {"const": c}, scalars),
        st.builds(lambda k, n: {k: n},
                  st.sampled_from(["minimum", "maximum", "exclusiveMinimum",
                                   "exclusiveMaximum"]),
                  st.integers(-3, 3) | st.sampled_from([0.5, 1.0])),
        st.builds(lambda k, n: {k: n},
                  st.sampled_from(["minLength", "maxLength", "minItems", "maxItems",
                                   "minProperties", "maxProperties"]),
                  st.integers(0, 3)),
        st.builds(lambda p: {"pattern": p}, st.sampled_from(["^a", "b$", "[0-9]", "."])),
    )

    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.builds(lambda ps, req, extra: {
                "type": "object", "properties": ps, "required": req,
                **({"additionalProperties": extra} if extra is not None else {})},
                st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
                st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
                st.none() | st.booleans() | inner),
            st.builds(lambda i: {"items": i}, inner),
            st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda xs: {"allOf": xs}, st.lists(inner, min_size=1, max_size=3)),
            st.builds(lambda x: {"oneOf": [x]}, inner),
            st.builds(lambda a, b: {**a, **b}, inner, inner),
        )

    return st.recursive(leaf, extend, max_leaves=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas(), values=st.lists(json_values, min_size=1, max_size=6))
def test_what_the_fast_check_accepts_jsonschema_accepts(schema: Any, values: list[Any]) -> None:
    check = compile_check(schema)
    assert check is not None  # everything generated is inside the subset
    authority = CompiledSchema(schema).validator
    for v in values:
        if check(v):
            assert authority.is_valid(v), (schema, v)


@settings(max_examples=200, deadline=None)
@given(schema=_schemas(), value=json_values)
def test_the_fast_check_mostly_agrees(schema: Any, value: Any) -> None:
    """Not required for soundness, but a check that rejected everything would be useless:
    on values jsonschema rejects the fast check must reject too, and (outside enum/const,
    whose equality is looser in jsonschema) so must they agree on acceptance."""
    check = compile_check(schema)
    assert check is not None
    valid = CompiledSchema({"$defs": {}, **schema}).validator.is_valid(value)
    if not valid:
        assert not check(value)
    elif "enum" not in repr(schema) and "const" not in repr(schema):
        assert check(value), (schema, value)


def test_integers_are_strict_as_json_is() -> None:
    check = compile_check({"type": "integer"})
    assert check is not None
    assert check(2) and not check(2.0) and not check(True)
    assert not CompiledSchema({"type": "integer"}).validator.is_valid(2.0)


def test_keywords_outside_the_subset_leave_it_to_jsonschema() -> None:
    for schema in ({"uniqueItems": True}, {"not": {"type": "string"}},
                   {"oneOf": [{"type": "integer"}, {"minimum": 0}]},
                   {"$schema": "http://json-schema.org/draft-04/schema#"},
                   {"patternProperties": {"^a": {}}, "additionalProperties": False},
                   {"items": [{"type": "string"}]}, {"$ref": "https://example.com/s"}):
        assert compile_check(schema) is None, schema


def test_local_refs_and_recursive_schemas() -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    check = compile_check(tree)
    assert check is not None
    assert check({"kids": [{"kids": []}, {}]})
    assert not check({"kids": [{"kids": 3}]})
