"""Isolation, atomicity and observer guarantees found missing in review."""

from __future__ import annotations

import pytest

from runtime import (
    ConflictError,
    LinkError,
    PatternError,
    Runtime,
    SchemaError,
    StreamError,
    cell,
    handler,
    pattern,
)

pytestmark = pytest.mark.anyio


@handler
def save(event, notes):
    notes.set(event["note"])


@pattern
def private_notes():
    notes = cell({"title": "mine"}, scope="user", name="notes")
    return {"notes": notes, "save": save(notes=notes)}


async def test_a_link_cannot_reach_another_users_documents():
    async with Runtime() as rt:
        alice = rt.run(private_notes, user="alice")
        bob = rt.run(private_notes, user="bob")
        stolen = alice.result.key("notes").link()
        assert stolen["scope"] == "user:alice"
        # links from outside are refused where the schema does not ask for one ...
        with pytest.raises(LinkError, match="links only where the handler's event schema"):
            await bob.send("save", {"note": stolen})
        # ... and even written by code, a link across users is refused when followed
        with pytest.raises(LinkError, match="refused"):
            bob.result.key("notes").resolve().set(alice.result.key("notes"))
        assert alice.result.key("notes").get() == {"title": "mine"}
        assert bob.result.key("notes").get() == {"title": "mine"}


async def test_sessions_of_two_users_never_share_state():
    @pattern
    def chat():
        return {"log": cell([], scope="session", name="log")}

    async with Runtime() as rt:
        a = rt.run(chat, user="alice", session="s1")
        b = rt.run(chat, user="bob", session="s1")
        assert a is not b
        a.result.key("log").push("alice-secret")
        assert b.result.key("log").get() == []
        # a session may link to its user's documents and to shared ones
        assert a.result.key("log").resolve().scope == "session:alice:s1"


async def test_a_failing_commit_listener_does_not_fail_the_handler():
    @handler
    def add(event, items, echo):
        items.push(event["t"])
        echo.send(event)

    @handler
    def record(event, seen):
        seen.push(event["t"])

    @pattern
    def p():
        items = cell([], name="items")
        seen = cell([], name="seen")
        return {"items": items, "seen": seen, "add": add(items=items, echo=record(seen=seen))}

    async with Runtime() as rt:
        inst = rt.run(p)

        def boom(changes):
            raise RuntimeError("listener boom")

        rt.on_commit(boom)
        await inst.send("add", {"t": "milk"})
        await rt.idle()
        assert inst.result.key("items").get() == ["milk"]
        assert inst.result.key("seen").get() == ["milk"]  # its event was not dropped
        assert any("listener boom" in str(e) for _, e in rt.errors)


async def test_change_records_are_copies():
    async with Runtime() as rt:
        @pattern
        def p():
            return {"items": cell([["a"]], name="items")}

        inst = rt.run(p)
        records = []
        rt.on_commit(records.extend)
        inst.result.key("items").push(["b"])
        records[0].after.append("INJECTED")
        assert inst.result.key("items").get() == [["a"], ["b"]]
        assert rt.store.load(inst.result.key("items").resolve()._key).value == [["a"], ["b"]]


async def test_async_work_a_failed_handler_started_never_starts():
    started = []

    async def turn(tag):
        started.append(tag)

    async with Runtime() as rt:

        @handler
        def go(event, n):
            n.set(n.get() + 1)
            rt.spawn(turn, event["tag"])  # starts only once the handler commits
            if event.get("fail"):
                raise RuntimeError("refused")

        @pattern
        def p():
            n = cell(0, name="n")
            return {"n": n, "go": go(n=n)}

        inst = rt.run(p)
        with pytest.raises(RuntimeError):
            await inst.send("go", {"tag": "failed", "fail": True})
        await inst.send("go", {"tag": "ok"})
        await rt.settled()
        assert started == ["ok"]
        assert inst.result.key("n").get() == 1


async def test_sink_runs_only_when_its_own_value_changes():
    @pattern
    def p():
        return {"items": cell(["a"], name="items")}

    async with Runtime() as rt:
        inst = rt.run(p)
        seen = []
        inst.result.key("items", 0).sink(seen.append)
        for x in ("b", "c", "d"):
            inst.result.key("items").push(x)
        inst.result.key("items", 0).set("z")
        assert seen == ["a", "z"]


async def test_duplicate_node_names_are_an_error():
    @pattern
    def p():
        a = cell(1, name="x")
        b = cell("s", schema=str, name="x")
        return {"a": a, "b": b}

    async with Runtime() as rt:
        with pytest.raises(PatternError, match="two nodes named 'x'"):
            rt.run(p)


async def test_argument_edits_survive_a_restart(tmp_path):
    @pattern
    def titled(title):
        return {"title": title}

    url = f"sqlite:///{tmp_path / 'a.db'}"
    async with Runtime(store=url) as rt:
        inst = rt.run(titled, {"title": "A"})
        inst.argument.key("title").set("B")
    async with Runtime(store=url) as rt:
        inst = rt.run(titled, {"title": "A"})
        assert inst.result.key("title").get() == "B"


async def test_events_queued_at_exit_still_run():
    @pattern
    def p():
        items = cell([], name="items")
        return {"items": items, "add": save_item(items=items)}

    async with Runtime() as rt:
        inst = rt.run(p)
        inst.stream("add").send({"t": "late"})  # queued, never awaited
    assert inst.result.key("items").get() == ["late"]


@handler
def save_item(event, items):
    items.push(event["t"])


async def test_transaction_groups_writes_from_async_work():
    @pattern
    def p():
        return {"a": cell(0, name="a"), "b": cell(0, schema=int, name="b")}

    async with Runtime() as rt:
        inst = rt.run(p)
        commits = []
        rt.on_commit(commits.append)
        with rt.transaction():
            inst.result.key("a").set(1)
            inst.result.key("b").set(2)
        assert len(commits) == 1
        with pytest.raises(SchemaError):
            with rt.transaction():
                inst.result.key("a").set(5)
                inst.result.key("b").set("not an int")
        with pytest.raises(RuntimeError, match="abandon"):
            with rt.transaction():
                inst.result.key("a").set(6)
                raise RuntimeError("abandon")
        assert inst.result.get() == {"a": 1, "b": 2}


async def test_a_conflict_catches_up_with_the_other_writer(tmp_path):
    @pattern
    def p():
        return {"n": cell(0, name="n")}

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    async with Runtime(store=url) as one, Runtime(store=url) as two:
        a = one.run(p)
        b = two.run(p)
        a.result.key("n").set(1)
        with pytest.raises(ConflictError):
            b.result.key("n").set(2)  # b had not seen a's write
        assert b.result.key("n").get() == 1  # ... but has now
        b.result.key("n").set(2)  # so a retry succeeds
        assert two.store.load(b.result.key("n").resolve()._key).value == 2


async def test_bad_events_are_refused_when_sent_and_messages_stay_short():
    @handler(event={"type": "object", "properties": {"n": {"type": "integer"}}})
    def setn(event, n):
        n.set(event["n"])

    @pattern
    def p():
        n = cell(0, name="n")
        return {"n": n, "set": setn(n=n)}

    async with Runtime() as rt:
        inst = rt.run(p)
        with pytest.raises(SchemaError) as e:
            inst.stream("set").send({"n": "x" * 10_000})
        assert "event for setn" in str(e.value)
        assert len(str(e.value)) < 400
        assert not rt.scheduler.queue


async def test_events_wait_for_an_open_transaction():
    @pattern
    def p():
        items = cell([], name="items")
        return {"items": items, "add": save_item(items=items), "n": cell(0, name="n")}

    async with Runtime() as rt:
        inst = rt.run(p)
        with rt.transaction():
            inst.result.key("n").set(1)
            inst.stream("add").send({"t": "queued"})
            await rt.idle()  # must not run the handler inside the open transaction
            assert inst.result.key("items").get() == []
            with pytest.raises(StreamError, match="open transaction"):
                await inst.send("add", {"t": "now"})
        await rt.idle()
        assert inst.result.get()["items"] == ["queued"]
        assert inst.result.key("n").get() == 1
