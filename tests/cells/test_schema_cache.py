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


# -- to_json_schema: what every rt.run of a pattern passes again ------------------------


def test_a_checked_schema_is_checked_again_once_changed() -> None:
    from runtime.cells.schema import to_json_schema

    s = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert to_json_schema(s) is s
    assert to_json_schema(copy.deepcopy(s)) is not None  # equal content: found valid
    s["properties"]["n"]["type"] = "no such type"  # the same dict, now invalid
    with pytest.raises(SchemaError, match="no such type"):
        to_json_schema(s)
    with pytest.raises(SchemaError):  # an invalid schema is never remembered as valid
        to_json_schema(s)


def test_a_checked_schema_changed_from_true_to_one_is_checked_again() -> None:
    # Python's == says True == 1; a schema's ``true`` and ``1`` differ (1 is no schema)
    from runtime.cells.schema import to_json_schema

    s = {"type": "object", "additionalProperties": True}
    assert to_json_schema(s) is s
    s["additionalProperties"] = 1
    with pytest.raises(SchemaError, match="additionalProperties"):
        to_json_schema(s)


def test_a_types_schema_is_made_once_and_shared() -> None:
    from pydantic import BaseModel

    from runtime.cells.schema import to_json_schema

    class Item(BaseModel):
        title: str

    one, two = to_json_schema(Item), to_json_schema(Item)
    assert one is two and one["properties"]["title"]["type"] == "string"
    assert to_json_schema(list[int]) == {"type": "array", "items": {"type": "integer"}}
    with pytest.raises(SchemaError, match="cannot derive"):
        to_json_schema(object())  # not a type pydantic understands: a clear error each time


def test_the_checked_caches_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.cells.schema import to_json_schema

    monkeypatch.setattr(schema_module, "CACHED_SCHEMAS", 8)
    monkeypatch.setattr(schema_module._CHECKED_BY_ID, "size", 4)
    for n in range(50):
        to_json_schema({"type": "integer", "minimum": n})
    assert len(schema_module._CHECKED) <= 8
    assert len(schema_module._CHECKED_BY_ID) <= 4


def test_a_schema_of_a_dict_subclass_changed_from_one_to_true_is_checked_again() -> None:
    # a dict subclass compares with Python's == (1 == True): it is never taken as unchanged
    from collections import OrderedDict

    from runtime.cells.schema import to_json_schema

    s = OrderedDict(type="array", maxItems=1)
    assert to_json_schema(s) is s
    s["maxItems"] = True
    with pytest.raises(SchemaError, match="maxItems"):
        to_json_schema(s)
