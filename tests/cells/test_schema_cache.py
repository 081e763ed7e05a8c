"""The compiled-schema cache: equal schemas share one compiled form (every instance of a
pattern makes its schema dicts afresh), and the cache stays bounded, so nothing of a
closed runtime stays behind in it."""

from __future__ import annotations

import copy

import pytest

from runtime.cells import schema as schema_module
from runtime.cells.schema import compile_schema
from runtime.errors import SchemaError

TODO = {"type": "array", "items": {"type": "object", "required": ["title"],
                                    "properties": {"title": {"type": "string"}}}}


def test_equal_schemas_share_one_compiled_form() -> None:
    one, two = copy.deepcopy(TODO), copy.deepcopy(TODO)
    assert one is not two
    assert compile_schema(one) is compile_schema(two)
    compiled = compile_schema(two)
    compiled.validate([{"title": "milk"}], lambda: "the list")
    with pytest.raises(SchemaError, match="title"):
        compiled.validate([{"name": "milk"}], lambda: "the list")
    assert compile_schema({"type": "string"}) is not compiled  # another content


def test_the_caches_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_module, "CACHED_SCHEMAS", 8)
    for n in range(100):
        compile_schema({"type": "integer", "minimum": n})
    assert len(schema_module._BY_ID) <= 8 and len(schema_module._BY_CONTENT) <= 8
    # an evicted schema is compiled again, and still right
    again = compile_schema({"type": "integer", "minimum": 0})
    with pytest.raises(SchemaError):
        again.validate(-1, lambda: "n")


def test_a_schema_that_is_not_plain_json_is_compiled_for_itself() -> None:
    odd = {"type": "integer", "const": 3, "description": object()}
    compiled = compile_schema(odd)
    assert compile_schema(odd) is compiled
    with pytest.raises(SchemaError):
        compiled.validate(4, lambda: "n")
