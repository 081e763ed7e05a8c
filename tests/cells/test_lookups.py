"""The cell graph's front for builtins: what runs where, by document (issue 14).

``Runtime.instance_of``, ``Runtime.stream_at`` and ``Runtime.pattern_at`` answer from indexes
kept by ``run`` and ``stop``; these tests check each against what is running (also after
stops and re-runs of many instances in several scopes), and that a pattern reference is a
capability found by where a pattern's output placed it: the same ``{"$pattern": key}`` shape
written anywhere else runs nothing (defect 5)."""

from __future__ import annotations

import random

import pytest

from runtime.cells import (
    PATTERN_REF,
    BuiltinNode,
    Cell,
    DocKey,
    Instance,
    Runtime,
    Stream,
    cell,
    handler,
    pattern,
)

pytestmark = pytest.mark.anyio


@pattern(name="tests.admin_only")
def admin_only(target="x"):
    return {"done": cell(target, name="done")}


@handler
def put(event, box):
    box.set(event)


def echo(source: Cell) -> tuple[Stream, Cell]:
    """A minimal builtin node over ``source``: its state and its stream take its scope."""
    node = BuiltinNode("echo", [source])
    out = node.state("out", None)

    def on_event(event):
        out.set(event)

    return node.stream("in", on_event), out


@pattern(name="tests.board")
def board(title="t"):
    box = cell(None, name="box")
    shared = cell(0, name="shared")  # space-scoped: one document for every user's run
    node_in, node_out = echo(shared)
    return {"box": box, "put": put(box=box), "make": admin_only, "tools": [1, admin_only],
            "node_in": node_in, "node_out": node_out}


@pattern(name="tests.mine")
def mine():
    own = cell(None, scope="session", name="own")
    node_in, _ = echo(own)
    return {"own": own, "put": put(box=own), "node_in": node_in}


def _streams_of(inst) -> list[Stream]:
    return [inst.stream("put"), inst.stream("node_in")]


async def test_instance_of_finds_the_result_and_the_argument_only_while_running():
    async with Runtime() as rt:
        inst = rt.run(board, user="alice")
        assert rt.instance_of(inst.result.doc_key) is inst
        assert rt.instance_of(inst.argument.doc_key) is inst
        assert rt.instance_of(inst.result.key("box").resolve().doc_key) is None  # a cell
        assert rt.instance_of(DocKey("default", "", "nothing")) is None
        rt.stop(inst)
        assert rt.instance_of(inst.result.doc_key) is None
        again = rt.run(board, user="alice")
        assert again is not inst and rt.instance_of(again.result.doc_key) is again


async def test_stream_at_finds_pattern_and_builtin_streams_and_forgets_stopped_ones():
    async with Runtime() as rt:
        inst = rt.run(mine, user="alice", session="s1")
        put_stream, node_in = _streams_of(inst)
        assert rt.stream_at(put_stream.key) is put_stream
        assert rt.stream_at(node_in.key) is node_in
        # the stream's document, as the result links to it
        assert inst.result.raw()["put"] == {"@link": f"/{put_stream.id}",
                                            "scope": put_stream.scope}
        assert put_stream.scope == inst.scope.key == "session:alice:s1"
        assert node_in.scope == "session:alice:s1"  # the narrowest scope of its input
        assert rt.stream_at(inst.result.doc_key) is None  # a document that is no stream
        rt.stop(inst)
        assert rt.stream_at(put_stream.key) is None and rt.stream_at(node_in.key) is None


async def test_two_instances_binding_one_stream_document_answer_for_the_live_one():
    async with Runtime() as rt:
        a = rt.run(board, user="alice")
        b = rt.run(board, user="bob")
        # the echo node reads a shared cell: both runs file its stream under shared scope
        assert a.stream("node_in").key == b.stream("node_in").key
        assert a.stream("node_in").scope == ""
        assert rt.stream_at(a.stream("node_in").key) is a.stream("node_in")
        rt.stop(a)
        assert rt.stream_at(b.stream("node_in").key) is b.stream("node_in")
        rt.stop(b)
        assert rt.stream_at(b.stream("node_in").key) is None


async def test_pattern_at_answers_where_a_result_placed_a_pattern():
    async with Runtime() as rt:
        inst = rt.run(board)
        key = inst.result.doc_key
        assert inst.result.key("make").get() == {PATTERN_REF: "tests.admin_only"}
        assert rt.pattern_at(key, ("make",)) is admin_only
        assert rt.pattern_at(key, ("tools", 1)) is admin_only
        assert rt.pattern_at(key, ("tools", "1")) is admin_only  # as a link's path spells it
        assert rt.pattern_at(key, ("tools", 0)) is None
        assert rt.pattern_at(key, ()) is None
        rt.stop(inst)
        assert rt.pattern_at(key, ("make",)) is None


async def test_a_forged_pattern_reference_is_data():
    async with Runtime() as rt:
        inst = rt.run(board)
        forged = {PATTERN_REF: "tests.admin_only"}  # the very shape of the real placement
        box = inst.result.key("box")
        box.set(forged)  # code writing it
        await inst.send("put", forged)  # a handler writing it (as a model's tool call would)
        where = box.resolve()
        assert box.get() == inst.result.key("make").get()
        assert rt.pattern_at(where.doc_key, where.path) is None
        assert rt.pattern_at(where.doc_key, ()) is None
        # the real placement still answers, and so does a link that leads to it
        real = inst.result.key("make")
        assert rt.pattern_at(real.doc_key, real.path) is admin_only
        via = rt.docs.resolve(key := inst.result.doc_key, ("make",))
        assert via[0] == key and rt.pattern_at(via[0], via[1]) is admin_only


async def test_pattern_at_needs_the_value_there_to_still_name_the_pattern(tmp_path):
    url = f"sqlite:///{tmp_path / 'app.db'}"

    @pattern(name="tests.board")
    def board_v2(title="t"):  # the same identity, a later version that offers nothing
        return {"make": 1}

    async with Runtime(store=url) as one, Runtime(store=url) as two:
        inst = one.run(board)
        key = inst.result.doc_key
        assert one.pattern_at(key, ("make",)) is admin_only
        two.run(board_v2)  # another process rewrites the result document
        one.docs.reload([key])  # this one catches up with the store
        assert inst.result.key("make").get() == 1
        assert one.pattern_at(key, ("make",)) is None


async def test_the_indexes_agree_with_what_runs_through_many_runs_and_stops():
    rng = random.Random(14)
    async with Runtime() as rt:
        running: dict[tuple[str, str], Instance] = {}
        stopped: list[tuple[tuple[str, str], Instance]] = []
        people = [(f"u{i}", f"s{j}") for i in range(6) for j in range(4)]
        for _ in range(200):
            who = rng.choice(people)
            if who in running and rng.random() < 0.4:
                inst = running.pop(who)
                rt.stop(inst)
                stopped.append((who, inst))
            else:
                inst = rt.run(mine, user=who[0], session=who[1])
                assert running.setdefault(who, inst) is inst  # the same identity: the same one
        assert stopped and repr(rt).endswith(f"{len(running)} instances)")
        for inst in running.values():
            assert rt.instance_of(inst.result.doc_key) is inst
            assert rt.instance_of(inst.argument.doc_key) is inst
            for stream in _streams_of(inst):
                assert rt.stream_at(stream.key) is stream
        for who, inst in stopped:  # its documents answer for the run of the same identity
            now = running.get(who)
            assert rt.instance_of(inst.result.doc_key) is now
            for old, new in zip(_streams_of(inst), _streams_of(now) if now else (None, None),
                                strict=True):
                assert rt.stream_at(old.key) is new


async def test_there_is_no_lookup_of_a_pattern_by_name():
    """A name is not a capability: the old registry lookup is gone."""
    async with Runtime() as rt:
        rt.run(board)
        assert not hasattr(rt, "pattern_named")
