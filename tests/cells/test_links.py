"""The one link-admission policy (runtime/cells/links.py): a link arriving in data lands only
where the schema asks for one (``asCell``), and reaches only the scopes its holder may see.
Every writer goes through it: cell writes, events, keys assembled into a link, pattern
arguments, and input from outside the graph (``admit_links``, the builtins' model input)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.cells import (
    LinkError,
    Runtime,
    admit_links,
    admits_link,
    as_link,
    cell,
    handler,
    make_link,
    pattern,
    reachable_scopes,
)

pytestmark = pytest.mark.anyio

ASKS = {"type": "object", "properties": {"ref": {"asCell": True}, "data": {}}}


@handler(event=ASKS)
def take(event, box):
    box.set({"data": event.get("data")})


@pattern
def holder(ref=None):
    target = cell([1, 2], name="target")
    box = cell({"ref": None, "data": None}, schema=ASKS, name="box")
    return {"target": target, "box": box, "take": take(box=box)}


def test_reach_is_decided_once():
    assert reachable_scopes("") == ("",)
    assert reachable_scopes("user:alice") == ("", "user:alice")
    assert reachable_scopes("session:alice:s1") == ("", "user:alice", "session:alice:s1")
    assert reachable_scopes("session::s1") == ("", "session::s1")
    assert reachable_scopes("not a scope") == ("",)


def test_admission_follows_the_schema_where_the_link_lands():
    assert admits_link(ASKS, ("ref",))
    assert not admits_link(ASKS, ("data",))
    assert not admits_link(None, ())
    assert admits_link({"type": "array", "items": {"asCell": True}}, (3,))


@pytest.mark.parametrize("raw, link", [
    ("/abc/items/0", {"@link": "/abc/items/0"}),
    ("  /abc ", {"@link": "/abc"}),
    ('{"@link": "/abc", "scope": "user:a"}', {"@link": "/abc", "scope": "user:a"}),
    ({"@link": "/abc"}, {"@link": "/abc"}),
    ("abc", None), ("{not json", None), ({"@link": "/a", "extra": 1}, None), (3, None),
    ({"@link": 5}, None), ({"@link": "/a", "scope": 1}, None),
])
def test_as_link_reads_each_spelling_of_a_path(raw: Any, link: Any):
    assert as_link(raw) == link


def test_admit_links_resolves_links_only_where_asked_and_normalizes_them():
    calls: list[tuple[dict[str, Any], tuple[str, ...]]] = []

    def resolve(link: dict[str, Any], scopes: tuple[str, ...]) -> dict[str, Any]:
        calls.append((link, scopes))
        return {**link, "scope": "user:alice"}

    schema = {"type": "object", "properties": {
        "ref": {"asCell": True}, "refs": {"type": "array", "items": {"asCell": True}},
        "note": {"type": "string"}}}
    out = admit_links({"ref": "/abc", "refs": [{"@link": "/d"}, "plain text"],
                       "note": "/not/a/link/here"}, schema, "user:alice", resolve)
    assert out == {"ref": {"@link": "/abc", "scope": "user:alice"},
                   "refs": [{"@link": "/d", "scope": "user:alice"}, "plain text"],
                   "note": "/not/a/link/here"}  # a string where no link is asked: a string
    assert [s for _, s in calls] == [("", "user:alice")] * 2
    with pytest.raises(LinkError, match=r"args/note is a link, and links are accepted only"):
        admit_links({"note": {"@link": "/abc"}}, schema, "", resolve, where="args")
    with pytest.raises(LinkError, match=r"updates\['x'\]/x/0 is a link"):
        admit_links([{"@link": "/abc"}], None, "", resolve, where="updates['x']", at=("x",))


def test_a_resolvers_refusal_propagates():
    def refuse(link: dict[str, Any], scopes: tuple[str, ...]) -> dict[str, Any]:
        raise LinkError(f"{link['@link']} is not reachable from {scopes}")

    with pytest.raises(LinkError, match="not reachable"):
        admit_links({"ref": "/x"}, ASKS, "", refuse)


async def test_every_writer_refuses_a_data_link_where_none_is_asked_and_takes_one_where_asked():
    async with Runtime() as rt:
        inst = rt.run(holder)
        link = inst.result.key("target").link()
        box = inst.result.key("box")
        # a cell write
        with pytest.raises(LinkError, match="asCell"):
            box.key("data").set(link)
        box.key("ref").set(link)
        assert box.key("ref").get() == [1, 2]
        # an event
        with pytest.raises(LinkError, match="links only where the handler's event schema"):
            await inst.send("take", {"data": link})
        await inst.send("take", {"ref": link, "data": 1})
        # a link assembled one key at a time
        box.key("data").set({})
        with pytest.raises(LinkError, match="turn the object there into a link"):
            box.key("data", "@link").set(link["@link"])
        # pattern arguments (the argument schema asks for no link)
        with pytest.raises(LinkError, match="asCell"):
            rt.run(holder, {"ref": link})


@pattern
def private():
    return {"own": cell([3], scope="user", name="own"),
            "box": cell({"ref": None}, schema=ASKS, scope="user", name="box")}


async def test_a_written_link_reaches_only_what_its_holder_may_see():
    async with Runtime() as rt:
        alice = rt.run(private, user="alice")
        bob = rt.run(private, user="bob")
        theirs = make_link(bob.result.key("own").resolve().doc_key, ())
        assert theirs["scope"] == "user:bob"
        with pytest.raises(LinkError, match="not reachable"):
            alice.result.key("box", "ref").set(theirs)
        shared = rt.run(holder)
        with pytest.raises(LinkError, match="not reachable"):  # shared reaches only shared
            shared.result.key("box", "ref").set(theirs)
        alice.result.key("box", "ref").set(alice.result.key("own").link())  # its own: fine
        assert alice.result.key("box", "ref").get() == [3]
