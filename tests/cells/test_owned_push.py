"""``Cell.push(..., owned=True)`` (``own_json``): a fresh value from outside is checked and
stored in one pass, without a copy, its link-shaped objects stored as their JSON text. It
must store exactly what the two passes it replaces stored (``inert``, then a push), and
refuse exactly what they refused, with nothing written."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import NotJSONError, Runtime, cell, pattern
from runtime.builtins.dialog_input import inert
from runtime.cells import is_link, own_json

LINKISH = st.one_of(
    st.fixed_dictionaries({"@link": st.text(max_size=8)}),
    st.fixed_dictionaries({"@link": st.text(max_size=8), "scope": st.text(max_size=8)}),
    st.fixed_dictionaries({"@link": st.integers()}),  # not a link: plain data
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
                    st.floats(allow_nan=True, allow_infinity=True))
VALUES = st.recursive(
    st.one_of(SCALARS, LINKISH),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4),
        LINKISH,
        # "@link" (or "scope") holding a link: link-shaped once the inner one is text
        st.fixed_dictionaries({"@link": inner}),
        st.fixed_dictionaries({"@link": st.text(max_size=4), "scope": inner})),
    max_leaves=20,
)


def _links_in(value: Any) -> bool:
    if isinstance(value, dict):
        return is_link(value) or any(_links_in(v) for v in value.values())
    if isinstance(value, list):
        return any(_links_in(v) for v in value)
    return False


@pattern(name="owned-lists")
def lists():
    return {"a": cell([], name="a"), "b": cell([], name="b"),
            "deep": cell({"x": {"y": []}}, name="deep")}


def _outcome(push: Any) -> Any:
    try:
        push()
    except NotJSONError:
        return "refused"
    return "stored"


def _deep(n: int) -> Any:
    value: Any = "bottom"
    for _ in range(n):
        value = {"d": value}
    return value




@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(VALUES)
def test_an_owned_push_stores_what_inert_then_push_stored(value: Any) -> None:
    import anyio

    async def main() -> None:
        async with Runtime() as rt:
            inst = rt.run(lists)
            a, b = inst.result.key("a"), inst.result.key("b")
            old = _outcome(lambda: b.push(inert(copy.deepcopy(value))))
            new = _outcome(lambda: a.push(copy.deepcopy(value), owned=True))
            assert new == old
            assert json.dumps(a.get(), sort_keys=True) == json.dumps(b.get(), sort_keys=True)
            assert not _links_in(a.raw(copy=False))  # no link the data made up is stored

    anyio.run(main)


@pytest.mark.parametrize("bad", [
    {"text": "lone \ud800"},
    {"k\udfff": 1},
    {"n": float("nan")},
    [float("inf")],
    {"big": 10**5000},
    {"set": {1, 2}},
    {"ok": 1, "bytes": b"x"},
], ids=["surrogate", "surrogate-key", "nan", "inf", "huge-int", "set", "bytes"])
def test_an_owned_push_of_what_is_not_json_is_refused_and_writes_nothing(bad: Any) -> None:
    import anyio

    async def main() -> None:
        async with Runtime() as rt:
            inst = rt.run(lists)
            a = inst.result.key("a")
            a.push({"before": True})
            with pytest.raises(NotJSONError, match="pushed to"):
                a.push({"@link": "/x"}, bad, owned=True)  # the first alone would do
            assert a.get() == [{"before": True}]

    anyio.run(main)


def test_an_owned_push_counts_the_depth_where_the_item_lands() -> None:
    """The document may nest 100 deep: an item pushed two levels down may nest 97 more
    (its list is at depth 2, the item at 3), as a push that copies allows."""
    import anyio

    async def main() -> None:
        async with Runtime() as rt:
            inst = rt.run(lists)
            deep = inst.result.key("deep").key("x").key("y")
            copying, owned = _outcome(lambda: deep.push(_deep(97))), _outcome(
                lambda: deep.push(_deep(97), owned=True))
            assert copying == owned == "stored"
            copying, owned = _outcome(lambda: deep.push(_deep(98))), _outcome(
                lambda: deep.push(_deep(98), owned=True))
            assert copying == owned == "refused"
            assert len(deep.get()) == 2

    anyio.run(main)


def test_an_owned_item_is_stored_as_it_is_and_links_in_it_stay_text() -> None:
    import anyio

    async def main() -> None:
        async with Runtime() as rt:
            inst = rt.run(lists)
            a = inst.result.key("a")
            item = {"input": {"target": {"@link": "/b"}, "list": [{"@link": "/b", "scope": ""}]}}
            a.push(item, owned=True)
            assert a.raw(copy=False)[0] is item  # not copied
            assert a.get()[0] == {"input": {"target": '{"@link": "/b"}', "list": [
                '{"@link": "/b", "scope": ""}']}}
            assert inst.result.key("b").get() == []  # nothing was followed or written there
            # a tuple or a model is converted (the slow pass), its links inert all the same
            a.push(({"@link": "/b"}, 1), owned=True)
            assert a.get()[1] == ['{"@link": "/b"}', 1]

    anyio.run(main)


def test_own_json_of_a_link_shaped_root_is_its_text() -> None:
    assert own_json({"@link": "/a"}) == '{"@link": "/a"}'
    # link-shaped once its inner link is text: text too (so is inert's)
    nested = {"@link": {"@link": "/x"}}
    assert own_json(copy.deepcopy(nested)) == inert(nested) == json.dumps(
        {"@link": '{"@link": "/x"}'}, sort_keys=True)
    value = {"a": [1, {"@link": "/z"}]}
    assert own_json(value) is value and value == {"a": [1, '{"@link": "/z"}']}
