"""Parking (``Runtime.park``): an idle instance leaves memory and comes back, as the same
``Instance``, on whatever uses it; nothing it stored is lost or changed on the way."""

from __future__ import annotations

import math

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import Runtime, cell, computed, handler, pattern
from runtime.cells.cell import Cell
from runtime.errors import ReadOnlyError, SchemaError, StreamError

pytestmark = pytest.mark.anyio


@handler
def add(event, items, log):
    items.push(event)
    log.set(log.get() + 1)


@handler
def rename(event, title):
    title.set(event)


@pattern(name="park-list")
def todo(title: str = "untitled"):
    items = cell([], scope="session", name="items")
    log = cell(0, scope="session", name="log")
    count = computed(lambda: len(items.get()), name="count")
    return {"items": items, "log": log, "count": count,
            "add": add(items=items, log=log), "title": title, "rename": rename(title=title)}


def loaded(rt: Runtime, inst) -> int:
    """How many documents of ``inst``'s own scope are in memory (white-box)."""
    return sum(1 for k in rt.docs._docs if k.scope == inst.scope.key and k.space == inst.space)


async def test_a_parked_instance_leaves_memory_and_comes_back_on_send() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        await inst.send("add", "milk")
        assert loaded(rt, inst) > 0
        assert rt.park(inst) is True
        assert inst.parked and not inst.stopped
        assert loaded(rt, inst) == 0
        assert repr(inst).endswith("parked)")
        await inst.send("add", "eggs")
        assert not inst.parked
        assert inst.result.key("items").get() == ["milk", "eggs"]
        assert inst.result.key("count").get() == 2  # its computation runs again
        assert inst.result.key("log").get() == 2


async def test_a_read_of_its_cells_brings_it_back_with_its_values() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "groceries"}, session="s1")
        await inst.send("add", "milk")
        items = inst.result.key("items")
        assert rt.park(inst)
        assert items.get() == ["milk"]  # a Cell handed out before parking still reads
        assert not inst.parked
        assert inst.result.key("count").get() == 1
        assert inst.argument.key("title").get() == "groceries"


async def test_run_of_the_same_identity_returns_the_parked_instance() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        await inst.send("add", "milk")
        assert rt.park(inst)
        again = rt.run(todo, session="s1")
        assert again is inst and not inst.parked
        assert again.result.key("items").get() == ["milk"]
        other = rt.run(todo, session="s2")  # another session: another instance
        assert other is not inst and other.result.key("items").get() == []


async def test_a_stream_object_from_before_parking_still_sends() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        stream = inst.stream("add")
        assert rt.park(inst)
        await rt.send(stream, "milk")  # the stream stopped; the instance comes back for it
        assert inst.result.key("items").get() == ["milk"]
        stream.send("eggs")  # queued, from outside a handler
        await rt.idle()
        assert inst.result.key("items").get() == ["milk", "eggs"]
        assert rt.park(inst) and rt.park(inst)  # parking a parked instance: still parked
        await rt.send(stream, "tea")  # twice parked, still the same stream
        assert inst.result.key("items").get() == ["milk", "eggs", "tea"]


async def test_the_lookups_of_builtins_bring_it_back() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        result_key, add_key = inst.result.doc_key, inst.stream("add").key
        assert rt.park(inst)
        assert rt.instance_of(result_key) is inst and not inst.parked
        assert rt.park(inst)
        live = rt.stream_at(add_key)
        assert live is not None and live.owner is inst and not live.stopped


async def test_a_busy_instance_is_not_parked() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        release = anyio.Event()

        async def work() -> None:
            await release.wait()

        rt.spawn(work, owner=inst, name="held")
        await anyio.lowlevel.checkpoint()
        assert rt.park(inst) is False  # its own work is in flight
        release.set()
        await rt.settled()
        inst.stream("add").send("milk")  # queued, not run yet
        assert rt.park(inst) is False
        await rt.idle()
        assert rt.park(inst) is True


async def test_park_inside_a_transaction_is_refused() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        with rt.transaction(), pytest.raises(StreamError, match="open transaction"):
            rt.park(inst)
        assert not inst.parked


async def test_a_stopped_parked_instance_stays_stopped_and_its_state_stays_stored() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        await inst.send("add", "milk")
        stream = inst.stream("add")
        assert rt.park(inst)
        rt.stop(inst)
        assert inst.stopped and not inst.parked
        with pytest.raises(StreamError, match="stopped"):
            await rt.send(stream, "eggs")
        with pytest.raises(StreamError):
            rt.park(inst)
        fresh = rt.run(todo, session="s1")
        assert fresh is not inst and fresh.result.key("items").get() == ["milk"]


async def test_a_computation_another_instance_reads_keeps_it_from_parking() -> None:
    @pattern(name="park-reader")
    def reader(source: int = 0):
        seen = computed(lambda: source.get(), name="seen")
        return {"seen": seen}

    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        watcher = rt.run(reader, {"source": inst.result.key("count")}, session="s1")
        stop = watcher.result.key("seen").sink(lambda _: None)
        assert rt.park(inst) is False  # its count is read live by the other instance
        await inst.send("add", "milk")
        assert watcher.result.key("seen").get() == 1
        stop()


async def test_a_document_other_instances_declare_stays_loaded() -> None:
    @pattern(name="park-shared")
    def shared():
        board = cell([], name="board")  # space scope: every session's instance shares it
        mine = cell(0, scope="session", name="mine")
        return {"board": board, "mine": mine, "post": add(items=board, log=mine)}

    async with Runtime() as rt:
        a = rt.run(shared, session="a")
        b = rt.run(shared, session="b")
        await a.send("post", "from a")
        assert rt.park(a)
        await b.send("post", "from b")  # b still writes the board it shares with a
        assert b.result.key("board").get() == ["from a", "from b"]
        await a.send("post", "a again")
        assert a.result.key("board").get() == ["from a", "from b", "a again"]
        assert a.result.key("mine").get() == 2


async def test_a_document_another_running_instance_declares_is_kept() -> None:
    @pattern(name="park-user")
    def per_user():
        notes = cell([], scope="user", name="notes")
        return {"notes": notes, "note": add(items=notes, log=cell(0, scope="user"))}

    async with Runtime() as rt:
        mine = rt.run(per_user, user="u")  # its own scope is the user's
        tab = rt.run(per_user, user="u", session="tab")  # declares the same notes
        await mine.send("note", "one")
        assert rt.park(mine)
        await tab.send("note", "two")  # the notes stayed loaded for the running one
        assert mine.parked
        assert tab.result.key("notes").get() == ["one", "two"]
        assert mine.result.key("notes").get() == ["one", "two"]


async def test_a_write_from_an_open_transaction_lands_after_parking() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        items = inst.result.key("items")
        ready, parked = anyio.Event(), anyio.Event()

        async def writer() -> None:
            with rt.transaction():
                items.push("milk")
                ready.set()
                await parked.wait()  # parked meanwhile, by another task

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            await ready.wait()
            assert rt.park(inst)
            parked.set()
        assert items.get() == ["milk"]
        assert inst.result.key("count").get() == 1


async def test_parked_state_survives_a_restart_on_sqlite(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'park.db'}"
    async with Runtime(store=url) as rt:
        inst = rt.run(todo, session="s1")
        await inst.send("add", "milk")
        assert rt.park(inst)
        await inst.send("add", "eggs")
        assert rt.park(inst)
    async with Runtime(store=url) as rt:
        inst = rt.run(todo, session="s1")
        assert inst.result.key("items").get() == ["milk", "eggs"]


async def test_park_idle_parks_every_idle_instance() -> None:
    async with Runtime() as rt:
        insts = [rt.run(todo, session=f"s{i}") for i in range(5)]
        for inst in insts:
            await inst.send("add", inst.session)
        assert rt.park_idle() == 5
        assert all(i.parked for i in insts)
        assert rt.park_idle() == 0  # nothing running is left to park
        assert [i.result.key("items").get() for i in insts] == [[f"s{i}"] for i in range(5)]
        assert len(rt._running) == 5


async def test_a_parked_instance_after_close_says_the_runtime_closed() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        assert rt.park(inst)
    assert inst.stopped and not inst.parked  # closing stops the parked ones too
    with pytest.raises(StreamError, match="is stopped"):
        await inst.send("add", "milk")


async def test_a_failing_return_stops_the_instance_and_loses_nothing() -> None:
    fail = {"on": False}

    @pattern(name="park-fragile")
    def fragile():
        if fail["on"]:
            raise RuntimeError("the pattern cannot build now")
        items = cell([], scope="session", name="items")
        return {"items": items, "add": add(items=items, log=cell(0, scope="session"))}

    async with Runtime() as rt:
        inst = rt.run(fragile, session="s1")
        await inst.send("add", "milk")
        assert rt.park(inst)
        fail["on"] = True
        with pytest.raises(RuntimeError, match="cannot build"):
            await inst.send("add", "eggs")
        assert inst.stopped and not inst.parked
        fail["on"] = False
        again = rt.run(fragile, session="s1")
        assert again.result.key("items").get() == ["milk"]


async def test_the_ids_of_a_session_with_separators_still_park_apart() -> None:
    async with Runtime() as rt:
        a = rt.run(todo, session="a/b")
        b = rt.run(todo, user="a", session="b")
        await a.send("add", "in a/b")
        await b.send("add", "in a+b")
        assert rt.park(a) and rt.park(b)
        assert b.result.key("items").get() == ["in a+b"]
        assert not b.parked and a.parked  # only b's scope came back
        assert a.result.key("items").get() == ["in a/b"]


def _containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    _containers, max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(value=JSON)
def test_a_value_comes_back_from_parking_exactly(value) -> None:
    @pattern(name="park-value")
    def holder():
        box = cell(None, scope="session", name="box")
        return {"box": box, "put": rename(title=box)}

    async def main() -> None:
        async with Runtime() as rt:
            inst = rt.run(holder, session="v")
            await inst.send("put", value)
            assert rt.park(inst)
            assert _same_json(inst.result.key("box").get(), value)
            assert rt.park(inst)
            await inst.send("put", [value, {"v": value}])  # nested one level deeper
            assert rt.park(inst)
            assert _same_json(inst.result.key("box").get(), [value, {"v": value}])

    anyio.run(main)


def _same_json(a, b) -> bool:
    """Equal, and of the same JSON types all the way down (True is not 1, -0.0 keeps its
    sign)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    return a == b


# ---------------------------------------------------------------------------- found by review


@handler
def relay(event, out, n):
    n.set(n.get() + 1)
    out.send(event)


@pattern(name="park-relay")
def relayer():
    items = cell([], scope="session", name="items")
    sink = add(items=items, log=cell(0, scope="session", name="log"))
    return {"items": items, "add": sink,
            "relay": relay(out=sink, n=cell(0, scope="session", name="n"))}


async def test_an_event_held_in_a_transaction_reaches_the_instance_parked_meanwhile() -> None:
    async with Runtime() as rt:
        inst = rt.run(relayer, session="s1")
        stream = inst.stream("add")
        ready, parked = anyio.Event(), anyio.Event()

        async def writer() -> None:
            with rt.transaction():
                stream.send("milk")  # held until the block commits
                ready.set()
                await parked.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            await ready.wait()
            assert rt.park(inst)  # nothing queued yet
            parked.set()
        await rt.settled()
        assert rt.errors == []
        assert inst.result.key("items").get() == ["milk"]


async def test_nothing_parks_while_a_commit_is_under_way() -> None:
    async with Runtime() as rt:
        inst = rt.run(relayer, session="s1")
        tried: list[int] = []
        rt.on_commit(lambda _: tried.append(rt.park_idle()))
        await inst.send("relay", "milk")  # its send leaves after the commit's listeners
        await rt.settled()
        assert rt.errors == []
        assert tried and set(tried) == {0}
        assert inst.result.key("items").get() == ["milk"]
        assert rt.park(inst)  # once the commit is over


async def test_stop_cancels_work_started_for_a_parked_instance() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        assert rt.park(inst)
        cancelled = anyio.Event()

        async def work() -> None:
            try:
                await anyio.sleep(10)
            finally:
                cancelled.set()

        rt.spawn(work, owner=inst)  # work for it: it comes back
        assert not inst.parked
        await anyio.lowlevel.checkpoint()
        rt.stop(inst)
        with anyio.fail_after(2):
            await cancelled.wait()


async def test_an_rx_feed_goes_on_into_the_instance_brought_back() -> None:
    from reactivex.subject import Subject

    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        stream = inst.stream("add")
        subject = Subject()
        running = stream.feed(subject)
        subject.on_next("a")
        await rt.idle()
        assert rt.park(inst)
        subject.on_next("b")
        await rt.idle()
        assert not running.done
        assert rt.park(inst)
        later = Subject()
        stream.feed(later)  # a stream held from before parking still takes a feed
        later.on_next("c")
        await rt.idle()
        assert inst.result.key("items").get() == ["a", "b", "c"]


FRAGILE = {"on": False}


@pattern(name="park-fragile-neighbour")
def fragile_neighbour():
    if FRAGILE["on"]:
        raise RuntimeError("the neighbour cannot build now")
    items = cell([], scope="session", name="items")
    return {"items": items}


async def test_a_read_brings_back_only_the_instance_it_reads() -> None:
    FRAGILE["on"] = False
    try:
        async with Runtime() as rt:
            neighbour = rt.run(fragile_neighbour, session="s1")
            inst = rt.run(todo, session="s1")
            await inst.send("add", "milk")
            assert rt.park(neighbour) and rt.park(inst)
            FRAGILE["on"] = True
            assert inst.result.key("items").get() == ["milk"]
            assert neighbour.parked and not neighbour.stopped
    finally:
        FRAGILE["on"] = False


@pattern(name="park-doc")
def document(doc_id: str = ""):
    items = cell([], name="items")  # space scope: one per doc_id
    return {"items": items, "add": add(items=items, log=cell(0, name="log"))}


async def test_space_scoped_instances_come_back_one_by_one() -> None:
    async with Runtime() as rt:
        insts = [rt.run(document, {"doc_id": str(i)}) for i in range(20)]
        await insts[3].send("add", "x")
        assert rt.park_idle() == 20
        assert insts[0].result.key("items").get() == []
        assert [i for i, inst in enumerate(insts) if not inst.parked] == [0]
        await insts[3].send("add", "y")
        assert insts[3].result.key("items").get() == ["x", "y"]
        assert sum(not inst.parked for inst in insts) == 2


async def test_a_stored_cell_of_a_parked_instance_is_written_with_its_schema() -> None:
    @pattern(name="park-typed")
    def typed():
        n = cell(0, schema={"type": "integer"}, scope="session", name="n")
        return {"n": n}

    async with Runtime() as rt:
        inst = rt.run(typed, session="s1")
        n = inst.result.key("n").resolve()  # the cell's own document, not via the result
        assert rt.park(inst)
        with pytest.raises(SchemaError):
            n.set("not a number")  # the owner came back to say what the cell takes
        assert not inst.parked
        assert rt.park(inst)
        n.set(5)
        assert inst.result.key("n").get() == 5


async def test_a_parked_result_stays_read_only() -> None:
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        result = inst.result
        assert rt.park(inst)
        with pytest.raises(ReadOnlyError, match="result"):
            with rt.transaction():
                Cell(rt.docs, result.doc_key).set({"title": "mine"})
        assert inst.result.key("title").get() == "untitled"


# ---------------------------------------------------------------------------- second review


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_write_held_across_parking_is_still_checked_at_commit(store, tmp_path) -> None:
    @pattern(name="park-typed-commit")
    def typed():
        n = cell(0, schema={"type": "integer"}, scope="session", name="n")
        return {"n": n}

    url = "memory" if store == "memory" else f"sqlite:///{tmp_path / 'c.db'}"
    async with Runtime(store=url) as rt:
        inst = rt.run(typed, session="s1")
        n = inst.result.key("n").resolve()
        ready, parked = anyio.Event(), anyio.Event()
        outcome: list[object] = []

        async def writer() -> None:
            try:
                with rt.transaction():
                    n.set("not a number")  # checked when it commits, not when it is made
                    ready.set()
                    await parked.wait()
                outcome.append("committed")
            except SchemaError as e:
                outcome.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            await ready.wait()
            assert rt.park(inst)  # its document left memory meanwhile
            parked.set()
        assert isinstance(outcome[0], SchemaError)
        assert n.get() == 0


async def test_a_write_to_a_document_kept_loaded_brings_its_instance_back() -> None:
    seen: list[object] = []
    async with Runtime() as rt:
        inst = rt.run(todo, session="s1")
        items = inst.result.key("items").resolve()
        stop = items.sink(seen.append)  # read live: its document stays loaded when parked
        assert rt.park(inst)
        items.push("milk")  # nothing running declares it: its instance comes back first
        assert not inst.parked
        assert inst.result.key("count").get() == 1
        assert seen[-1] == ["milk"]
        stop()


async def test_a_write_to_a_wider_scoped_document_brings_its_instance_back() -> None:
    @pattern(name="park-wide")
    def wide():
        notes = cell([], schema={"type": "array", "items": {"type": "string"}},
                     scope="user", name="notes")  # wider than the instance's session
        return {"notes": notes, "mine": cell(0, scope="session", name="mine")}

    async with Runtime() as rt:
        inst = rt.run(wide, user="u", session="s1")
        notes = inst.result.key("notes").resolve()
        assert rt.park(inst)
        with pytest.raises(SchemaError):
            notes.push(5)  # its owner came back to say what the notes take
        assert not inst.parked


@pattern(name="park-labelled")
def labelled(title: str = "t"):
    items = cell([], scope="session", name="items")
    count = computed(lambda: len(items.get()), name="count")
    return {"items": items, "count": count, "label": f"list {title.get()}",
            "add": add(items=items, log=cell(0, scope="session", name="log"))}


async def test_a_computation_reading_a_parked_computation_brings_it_back() -> None:
    @pattern(name="park-counter-reader")
    def reader(source: int = 0):
        return {"n": computed(lambda: source.get(), name="n")}

    async with Runtime() as rt:
        a = rt.run(labelled, session="s1")
        await a.send("add", "x")
        b = rt.run(reader, {"source": a.result.key("count")}, session="s1")
        assert b.result.key("n").get() == 1
        a.argument.key("title").set("u")  # its result says "list t" until it builds again
        assert rt.park(a)
        await rt.run(labelled, session="other").send("add", "bump")  # n goes stale
        assert b.result.key("n").get() == 1  # A came back inside B's computation
        assert not a.parked and not a.stopped
        assert a.result.key("label").get() == "list t"  # kept as stored, as had it run on
        await a.send("add", "y")
        assert b.result.key("n").get() == 2


async def test_a_failed_return_from_a_feed_is_reported_and_ends_the_feed() -> None:
    from reactivex.subject import Subject

    @pattern(name="park-fed")
    def fed():
        if FRAGILE["on"]:
            raise RuntimeError("the fed one cannot build now")
        items = cell([], scope="session", name="items")
        return {"items": items, "add": add(items=items, log=cell(0, scope="session"))}

    FRAGILE["on"] = False
    try:
        async with Runtime() as rt:
            source = Subject()
            other = rt.run(todo, session="other")
            beside = other.stream("add").feed(source)
            target = rt.run(fed, session="fed")
            into = target.stream("add").feed(source)
            source.on_next("a")
            await rt.idle()
            assert rt.park(target)
            FRAGILE["on"] = True
            source.on_next("b")  # not raised into the source's on_next
            await rt.idle()
            assert any("cannot build" in str(e) for _, e in rt.errors)
            assert into.done and not beside.done
            assert other.result.key("items").get() == ["a", "b"]
    finally:
        FRAGILE["on"] = False


async def test_a_build_that_fails_half_way_leaves_nothing_running() -> None:
    seen: list[object] = []
    fail = {"on": True}

    @pattern(name="park-half-built")
    def half():
        items = cell([], scope="session", name="items")
        items.sink(seen.append)  # made before the failure
        if fail["on"]:
            raise RuntimeError("fails after its sink")
        return {"items": items}

    async with Runtime() as rt:
        with pytest.raises(RuntimeError, match="after its sink"):
            rt.run(half, session="s1")
        assert seen == [[]]
        fail["on"] = False
        inst = rt.run(half, session="s1")
        inst.result.key("items").push("milk")
        assert seen == [[], [], ["milk"]]  # the second build's sink only, not the first's


async def test_a_write_brings_back_instances_of_its_scope_only_until_its_owner() -> None:
    async with Runtime() as rt:
        insts = [rt.run(document, {"doc_id": str(i)}) for i in range(20)]
        cells = [inst.result.key("items").resolve() for inst in insts]
        assert rt.park_idle() == 20
        cells[0].push("first")  # a stored cell of the oldest parked: it alone comes back
        assert [i for i, inst in enumerate(insts) if not inst.parked] == [0]
        cells[5].push("sixth")  # the others come back in the order they parked, up to it
        assert [i for i, inst in enumerate(insts) if not inst.parked] == list(range(6))
        assert insts[5].result.key("items").get() == ["sixth"]
