"""The cell graph end to end: cells, links, schemas, streams, patterns, scopes, lifecycle."""

from __future__ import annotations

import anyio
import pytest
from pydantic import BaseModel

from runtime import (
    Cell,
    PathError,
    Runtime,
    SchemaError,
    StreamError,
    cell,
    computed,
    handler,
    lift,
    pattern,
)
from runtime.storage import DocKey

pytestmark = pytest.mark.anyio


@handler
def add(event, items):
    items.push(event["title"])


@pattern
def todo(title):
    items = cell([], schema={"type": "array", "items": {"type": "string"}}, name="items")
    count = lift(len)(items)
    label = computed(lambda: f"{title.get()}: {count.get()} items")
    return {"items": items, "count": count, "label": label, "add": add(items=items)}


async def test_issue_example_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with Runtime(store=url) as rt:
        inst = rt.run(todo, {"title": "Groceries"}, space="home", user="alice")
        await inst.send("add", {"title": "milk"})
        await rt.settled()
        assert inst.result.key("label").get() == "Groceries: 1 items"
        assert inst.result.key("items").get() == ["milk"]
        assert inst.result.key("count").get() == 1


async def test_reopen_finds_same_documents(tmp_path):
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with Runtime(store=url) as rt:
        inst = rt.run(todo, {"title": "Groceries"}, space="home")
        await inst.send("add", {"title": "milk"})
        await inst.send("add", {"title": "eggs"})
        first_items_id = inst.result.key("items").resolve().id
    async with Runtime(store=url) as rt:
        inst = rt.run(todo, {"title": "Groceries"}, space="home")
        assert inst.result.key("items").resolve().id == first_items_id
        assert inst.result.key("items").get() == ["milk", "eggs"]
        assert inst.result.key("label").get() == "Groceries: 2 items"
        # a different cause names different documents
        other = rt.run(todo, {"title": "Work"}, space="home")
        assert other.result.key("items").get() == []


async def test_sink_sees_each_commit_once_and_unsubscribes():
    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "T"})
        seen: list[str] = []
        stop = inst.result.key("label").sink(seen.append)
        await inst.send("add", {"title": "a"})
        await inst.send("add", {"title": "b"})
        stop()
        await inst.send("add", {"title": "c"})
        assert seen == ["T: 0 items", "T: 1 items", "T: 2 items"]


async def test_argument_update_reruns_dependents():
    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "Groceries"})
        seen: list[str] = []
        inst.result.key("label").sink(seen.append)
        inst.argument.key("title").set("Shopping")
        assert seen[-1] == "Shopping: 0 items"
        assert inst.argument.get() == {"title": "Shopping"}


async def test_cell_operations_and_links():
    @pattern
    def doc():
        profile = cell({"name": "Ada", "tags": []}, name="profile")
        pointer = cell(profile.key("name").link(), name="pointer")
        return {"profile": profile, "pointer": pointer}

    async with Runtime() as rt:
        inst = rt.run(doc)
        profile = inst.result.key("profile")
        profile.update({"age": 36})
        profile.key("tags").push("math", "poetry")
        assert profile.get() == {"name": "Ada", "tags": ["math", "poetry"], "age": 36}
        # reads follow links, also through the result document
        pointer = inst.result.key("pointer")
        assert pointer.get() == "Ada"
        # the target of a link is written through resolve() ...
        pointer.resolve().set("Ada Lovelace")
        assert profile.key("name").get() == "Ada Lovelace"
        assert pointer.raw() == "Ada Lovelace"
        # ... while a write exactly at a link replaces the link, never writes through it
        pointer.set("Grace")
        assert pointer.get() == "Grace" and profile.key("name").get() == "Ada Lovelace"
        pointer.set(profile.key("name"))  # a Cell as the value is stored as its link
        assert pointer.get() == "Ada Lovelace"
        link = profile.key("name").link()
        assert link == {"@link": f"/{profile.resolve().id}/name"}
        # get() returns a copy: mutating it changes nothing
        value = profile.get()
        value["tags"].append("chess")
        assert profile.key("tags").get() == ["math", "poetry"]


async def test_json_pointer_escaping_in_links():
    @pattern
    def odd():
        data = cell({"a/b": {"c~d": 1}}, name="data")
        return {"data": data, "via": cell(data.key("a/b", "c~d").link(), name="via")}

    async with Runtime() as rt:
        inst = rt.run(odd)
        data = inst.result.key("data")
        assert data.key("a/b", "c~d").link()["@link"].endswith("/a~1b/c~0d")
        assert inst.result.key("via").get() == 1


async def test_pydantic_schema_and_type_schema():
    class Item(BaseModel):
        title: str
        done: bool = False

    @pattern
    def typed():
        item = cell({"title": "x", "done": False}, schema=Item, name="item")
        n = cell(0, schema=int, name="n")
        return {"item": item, "n": n}

    async with Runtime() as rt:
        inst = rt.run(typed)
        inst.result.key("n").set(3)
        with pytest.raises(SchemaError) as e:
            inst.result.key("n").set("three")
        assert "type" in str(e.value)
        assert inst.result.key("n").get() == 3
        with pytest.raises(SchemaError) as e:
            inst.result.key("item").key("done").set("yes")
        assert e.value.path == "/done"
        assert inst.result.key("item").get() == {"title": "x", "done": False}


async def test_failed_handler_commits_nothing_and_later_events_run():
    @handler
    def risky(event, items, count):
        items.push(event["title"])
        count.set(count.get() + 1)
        if event.get("fail"):
            raise RuntimeError("boom")

    @pattern
    def p():
        items = cell([], name="items")
        count = cell(0, name="count")
        return {"items": items, "count": count, "go": risky(items=items, count=count)}

    async with Runtime() as rt:
        inst = rt.run(p)
        await inst.send("go", {"title": "a"})
        with pytest.raises(RuntimeError, match="boom"):
            await inst.send("go", {"title": "b", "fail": True})
        await inst.send("go", {"title": "c"})
        assert inst.result.get()["items"] == ["a", "c"]
        assert inst.result.key("count").get() == 2


async def test_handler_reads_see_own_writes_and_up_to_date_computeds():
    seen = {}

    @handler
    def check(event, n, doubled):
        seen["before"] = doubled.get()
        n.set(n.get() + 1)
        seen["own"] = n.get()

    @pattern
    def p():
        n = cell(1, name="n")
        doubled = lift(lambda v: v * 2)(n)
        return {"n": n, "doubled": doubled, "go": check(n=n, doubled=doubled)}

    async with Runtime() as rt:
        inst = rt.run(p)
        inst.result.key("n").set(5)
        await inst.send("go", {})
        assert seen == {"before": 10, "own": 6}
        assert inst.result.key("doubled").get() == 12


async def test_events_sent_from_a_handler_run_after_it_commits_in_fifo_order():
    log: list[str] = []

    @handler
    def first(event, out, second_stream):
        log.append(f"first {event['n']}")
        second_stream.send({"n": event["n"]})
        out.push(f"first {event['n']}")

    @handler
    def second(event, out):
        log.append(f"second {event['n']}")
        out.push(f"second {event['n']}")

    @pattern
    def p():
        out = cell([], name="out")
        s2 = second(out=out)
        return {"out": out, "first": first(out=out, second_stream=s2), "second": s2}

    async with Runtime() as rt:
        inst = rt.run(p)
        inst.stream("first").send({"n": 1})
        inst.stream("first").send({"n": 2})
        await rt.idle()
        assert log == ["first 1", "first 2", "second 1", "second 2"]
        assert inst.result.key("out").get() == log


async def test_scopes_give_one_copy_per_user_and_session():
    @handler
    def note(event, mine, shared):
        mine.push(event["text"])
        shared.push(event["text"])

    @pattern
    def notes():
        mine = cell([], scope="session", name="mine")
        shared = cell([], name="shared")
        return {"mine": mine, "shared": shared, "note": note(mine=mine, shared=shared)}

    async with Runtime() as rt:
        a = rt.run(notes, space="s", user="u1", session="one")
        b = rt.run(notes, space="s", user="u1", session="two")
        await a.send("note", {"text": "from one"})
        await b.send("note", {"text": "from two"})
        assert a.result.key("mine").get() == ["from one"]
        assert b.result.key("mine").get() == ["from two"]
        assert a.result.key("shared").get() == ["from one", "from two"]
        assert a.result.key("mine").resolve().scope == "session:u1:one"
        # spaces are isolated: the same pattern in another space starts empty
        c = rt.run(notes, space="other", user="u1", session="one")
        assert c.result.key("shared").get() == []


async def test_run_is_idempotent_and_stop_closes_streams():
    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "x"})
        assert rt.run(todo, {"title": "x"}) is inst
        rt.stop(inst)
        with pytest.raises(StreamError):
            await inst.send("add", {"title": "late"})
        again = rt.run(todo, {"title": "x"})
        assert again is not inst
        await again.send("add", {"title": "fresh"})
        assert again.result.key("items").get() == ["fresh"]


async def test_settled_waits_for_async_work_and_idle_does_not():
    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "x"})
        release = anyio.Event()

        async def turn():
            await release.wait()
            await inst.send("add", {"title": "from a turn"})

        rt.spawn(turn, owner=inst, name="turn")
        await rt.idle()
        assert inst.result.key("items").get() == []

        async def let_go():
            await anyio.lowlevel.checkpoint()
            release.set()

        rt.spawn(let_go)
        await rt.settled()
        assert inst.result.key("items").get() == ["from a turn"]


async def test_stop_cancels_owned_async_work():
    async with Runtime() as rt:
        inst = rt.run(todo, {"title": "x"})
        finished = []

        async def forever():
            try:
                await anyio.sleep_forever()
            finally:
                finished.append("cancelled")

        rt.spawn(forever, owner=inst)
        await anyio.lowlevel.checkpoint()
        rt.stop(inst)
        await rt.settled()
        assert finished == ["cancelled"]


async def test_change_records_describe_each_commit():
    async with Runtime() as rt:
        records = []
        rt.on_commit(records.append)
        inst = rt.run(todo, {"title": "x"})
        await inst.send("add", {"title": "milk"})
        (change,) = records[-1]
        assert change.path == "/0"
        assert change.before is None or change.before != "milk"
        assert change.after == "milk"
        assert change.id == inst.result.key("items").resolve().id


async def test_missing_document_link_is_a_clear_error():
    async with Runtime() as rt:
        ghost = Cell(rt.docs, DocKey("default", "", "nope"))
        with pytest.raises(PathError, match="no document /nope"):
            ghost.get()
        assert ghost.get("fallback") == "fallback"


async def test_sends_from_sinks_during_a_commit_queue_after_the_handlers_own_sends():
    log: list[str] = []

    @handler
    def write(event, n, b):
        b.send({"from": "handler"})
        n.set(event["n"])

    @handler
    def record(event, out):
        log.append(event["from"])

    @pattern
    def p():
        n = cell(0, name="n")
        out = cell([], name="out")
        b = record(out=out)
        return {"n": n, "b": b, "write": write(n=n, b=b)}

    async with Runtime() as rt:
        inst = rt.run(p)
        stream_b = inst.stream("b")
        inst.result.key("n").sink(lambda v: v and stream_b.send({"from": "sink"}))
        await inst.send("write", {"n": 1})
        await rt.idle()
        assert log == ["handler", "sink"]


async def test_event_chain_limit_is_configurable():
    from runtime import CycleError

    @pattern
    def p():
        n = cell(0, name="n")
        holder = {}

        @handler
        def bounce(event, n):
            n.set(event["k"])
            if event["k"] < 30:
                holder["s"].send({"k": event["k"] + 1})

        holder["s"] = bounce(n=n)
        return {"n": n, "go": holder["s"]}

    async with Runtime(max_event_chain=10) as rt:
        inst = rt.run(p)
        await inst.send("go", {"k": 0})
        assert inst.result.key("n").get() == 10  # the 11th event in the chain was refused
        assert any(isinstance(e, CycleError) and "bounce" in str(e) for _, e in rt.errors)
    async with Runtime() as rt:
        inst = rt.run(p)
        await inst.send("go", {"k": 0})
        assert inst.result.key("n").get() == 30


async def test_a_computation_cannot_write_even_untracked():
    from runtime import WriteInComputationError
    from runtime.cells import signals

    @pattern
    def p():
        n = cell(0, name="n")

        def sneaky():
            with signals.untracked():
                n.set(5)
            return 1

        return {"n": n, "bad": computed(sneaky)}

    async with Runtime() as rt:
        inst = rt.run(p)
        with pytest.raises(WriteInComputationError, match="untracked"):
            inst.result.key("bad").get()
        assert inst.result.key("n").get() == 0
