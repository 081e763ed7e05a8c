"""ReactiveX at the edge (runtime.cells.rx): ``cell.observe()`` and ``stream.feed(source)``
with a real runtime and real Rx operators. Time is virtual (``reactivex.testing``) wherever
it matters; waiting is on events, never on sleeps."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import anyio
import pytest
import reactivex
from reactivex import operators as ops
from reactivex.scheduler.eventloop import AsyncIOScheduler
from reactivex.subject import Subject
from reactivex.testing import ReactiveTest, TestScheduler

from runtime import Runtime, StreamError, cell, handler, lift, pattern
from runtime.cells import rx

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parents[2] / "docs" / "reactivex.md"


class Boom(Exception):
    pass


runs = {"shout": 0}


def shout(text):
    runs["shout"] += 1
    if text == "boom":
        raise Boom("no shouting boom")
    return text.upper()


@handler
def type_text(event, text):
    text.set(event["text"])


@handler
def set_query(event, query):
    query.set(event["q"])


@handler(event={"type": "object", "required": ["q"],
                "properties": {"q": {"type": "string"}}})
def record(event, log):
    log.push(event["q"])


@pattern
def search():
    text = cell("", schema=str, name="text")
    query = cell("", schema=str, name="query")
    log = cell([], schema={"type": "array", "items": {"type": "string"}}, name="log")
    loud = lift(shout)(text)
    return {"text": text, "query": query, "log": log, "loud": loud,
            "type": type_text(text=text), "set_query": set_query(query=query),
            "record": record(log=log)}


def as_query(q):
    return {"q": q}


# ---------------------------------------------------------------------------- observe


async def test_observe_emits_the_current_value_then_changes_only():
    async with Runtime() as rt:
        inst = rt.run(search)
        text, seen = inst.result.key("text"), []
        sub = text.observe().subscribe(seen.append)
        text.set("c")
        text.set("c")  # unchanged: not emitted
        inst.result.key("query").set("elsewhere")  # another cell: not emitted
        await inst.send("type", {"text": "ca"})  # a handler's commit
        assert seen == ["", "c", "ca"]
        sub.dispose()
        assert rt.errors == []


async def test_observe_is_cold_each_subscriber_has_its_own_sink():
    async with Runtime() as rt:
        inst = rt.run(search)
        text, a, b = inst.result.key("text"), [], []
        obs = text.observe()
        sub_a = obs.subscribe(a.append)
        text.set("x")
        sub_b = obs.subscribe(b.append)  # starts from the value now
        text.set("y")
        sub_a.dispose()
        text.set("z")
        assert a == ["", "x", "y"]
        assert b == ["x", "y", "z"]
        sub_b.dispose()


async def test_observe_values_are_copies():
    async with Runtime() as rt:
        inst = rt.run(search)
        log, seen = inst.result.key("log"), []
        sub = log.observe().subscribe(seen.append)
        seen[0].append("mutated")
        assert log.get() == []
        sub.dispose()


async def test_observe_dispose_removes_the_sink():
    async with Runtime() as rt:
        inst = rt.run(search)
        text, loud, seen = inst.result.key("text"), inst.result.key("loud"), []
        sub = loud.observe().subscribe(seen.append)
        text.set("a")
        before = runs["shout"]
        sub.dispose()
        text.set("b")
        text.set("c")
        # nothing live needs `loud` any more: it is not recomputed, nothing is emitted
        assert runs["shout"] == before
        assert seen == ["", "A"]
        assert loud.get() == "C"  # a read still computes it on demand


async def test_observe_take_disposes_from_inside_an_emission():
    async with Runtime() as rt:
        inst = rt.run(search)
        text, first, two = inst.result.key("text"), [], []
        done = []
        text.observe().pipe(ops.take(1)).subscribe(first.append)  # during the subscribe
        text.observe().pipe(ops.take(2)).subscribe(two.append,
                                                   on_completed=lambda: done.append(1))
        text.set("a")  # during a commit
        text.set("b")
        assert first == [""]
        assert two == ["", "a"]
        assert done == [1]
        assert rt.errors == []


async def test_observe_computation_errors():
    async with Runtime() as rt:
        inst = rt.run(search)
        text, loud = inst.result.key("text"), inst.result.key("loud")
        # failing when the subscription starts: there is no value, on_error says why
        text.set("boom")
        errors, values = [], []
        loud.observe().subscribe(values.append, errors.append)
        assert values == [] and len(errors) == 1 and isinstance(errors[0], Boom)
        # failing later: reported like any sink's, and the observable stays live
        text.set("ok")
        values, errors = [], []
        sub = loud.observe().subscribe(values.append, errors.append)
        text.set("boom")
        assert errors == []
        assert [type(e) for _, e in rt.errors] == [Boom]
        text.set("fine")
        assert values == ["OK", "FINE"]
        sub.dispose()


async def test_observe_a_failing_subscriber_is_reported_and_stays_subscribed():
    async with Runtime() as rt:
        inst = rt.run(search)
        text, seen = inst.result.key("text"), []

        def fussy(value):
            seen.append(value)
            if value == "bad":
                raise Boom("subscriber bug")

        sub = text.observe().subscribe(fussy)
        text.set("bad")  # the commit stands
        text.set("good")
        assert seen == ["", "bad", "good"]
        assert text.get() == "good"
        [(where, error)] = rt.errors
        assert isinstance(error, Boom) and where.startswith("sink on")
        sub.dispose()


async def test_observe_subscribed_and_disposed_from_another_thread():
    async with Runtime() as rt:
        inst = rt.run(search)
        text, seen, threads = inst.result.key("text"), [], set()
        got = anyio.Event()

        def on_next(value):
            threads.add(threading.get_ident())
            seen.append(value)
            got.set()

        obs = text.observe()  # captures the loop
        sub = await anyio.to_thread.run_sync(lambda: obs.subscribe(on_next))
        with anyio.fail_after(5):
            await got.wait()  # the sink was installed on the loop thread
        text.set("a")
        # the dispose is handed to the loop before the worker's result is (FIFO callbacks)
        await anyio.to_thread.run_sync(sub.dispose)
        text.set("b")
        assert seen == ["", "a"]
        assert threads == {threading.get_ident()}


# ---------------------------------------------------------------------------- feed


async def test_feed_with_map_filter_distinct_until_changed():
    async with Runtime() as rt:
        inst = rt.run(search)
        words = reactivex.from_iterable(["  cat ", "", "cat", "cat", "dog", " ", "dog", "cat"])
        f = inst.stream("record").feed(words.pipe(
            ops.map(str.strip), ops.filter(bool), ops.distinct_until_changed(),
            ops.map(as_query)))
        assert f.done  # a synchronous source: all sent, completed
        assert inst.result.key("log").get() == []  # queued, not yet run
        await rt.idle()
        assert inst.result.key("log").get() == ["cat", "dog", "cat"]
        assert rt.errors == []


async def test_feed_debounce_in_virtual_time():
    async with Runtime() as rt:
        inst = rt.run(search)
        ts = TestScheduler()
        on_next, on_completed = ReactiveTest.on_next, ReactiveTest.on_completed
        keys = ts.create_hot_observable(
            on_next(210, "c"), on_next(220, "ca"), on_next(230, "cat"),
            on_next(400, "cats"), on_completed(500))
        f = inst.stream("record").feed(
            keys.pipe(ops.debounce(50, scheduler=ts), ops.map(as_query)))
        ts.advance_to(300)  # "cat" went out at 280, after a 50 tick pause
        await rt.idle()
        assert inst.result.key("log").get() == ["cat"]
        assert not f.done
        ts.advance_to(1000)
        await rt.idle()
        assert inst.result.key("log").get() == ["cat", "cats"]
        assert f.done


async def test_feed_default_scheduler_reaches_time_operators():
    async with Runtime() as rt:
        inst = rt.run(search)
        ts, keys = TestScheduler(), Subject()
        # debounce was given no scheduler: it uses the subscription's, passed by rx.feed
        f = rx.feed(keys.pipe(ops.debounce(0.3), ops.map(as_query)), inst.stream("record"),
                    scheduler=ts)
        for t, typed in ((0.1, "c"), (0.2, "ca"), (1.0, "cat")):
            ts.advance_to(t)
            keys.on_next(typed)
        ts.advance_to(2.0)
        await rt.idle()
        assert inst.result.key("log").get() == ["ca", "cat"]
        f.dispose()


async def test_feed_switch_map_drops_stale_searches():
    async with Runtime() as rt:
        inst = rt.run(search)
        ts = TestScheduler()
        query = inst.result.key("query")

        def slow_search(q):  # answers after 100 ticks, unless a newer query came first
            return reactivex.timer(100, scheduler=ts).pipe(
                ops.map(lambda _: {"q": f"results for {q}"}))

        f = inst.stream("record").feed(query.observe().pipe(
            ops.filter(bool), ops.switch_map(slow_search)))
        ts.advance_to(10)
        query.set("c")
        ts.advance_to(50)
        query.set("cat")  # "c" is still searching: switched away from, never answers
        ts.advance_to(300)
        query.set("dog")
        ts.advance_to(500)
        await rt.idle()
        assert inst.result.key("log").get() == ["results for cat", "results for dog"]
        f.dispose()


async def test_feed_items_from_another_thread_arrive_in_order_on_the_loop():
    async with Runtime() as rt:
        inst = rt.run(search)
        loop_thread, senders = threading.get_ident(), set()
        enqueue = rt.scheduler.enqueue

        def watched(stream, payload):
            senders.add(threading.get_ident())
            return enqueue(stream, payload)

        rt.scheduler.enqueue = watched
        keys = Subject()
        f = inst.stream("record").feed(keys.pipe(ops.map(as_query)))

        def produce():
            for i in range(300):
                keys.on_next(f"k{i}")
            keys.on_completed()

        await anyio.to_thread.run_sync(produce)
        with anyio.fail_after(5):
            await f.wait()  # the completion came after every item, in order
        await rt.idle()
        assert inst.result.key("log").get() == [f"k{i}" for i in range(300)]
        assert senders == {loop_thread}


async def test_feed_real_timers_deliver_on_the_loop():
    async with Runtime() as rt:
        inst = rt.run(search)
        loop_thread, senders = threading.get_ident(), set()
        enqueue = rt.scheduler.enqueue

        def watched(stream, payload):
            senders.add(threading.get_ident())
            return enqueue(stream, payload)

        rt.scheduler.enqueue = watched
        timer_threads = set()
        # Rx's default scheduler for delay: a timer thread per item
        source = reactivex.from_iterable(["a", "b", "c"]).pipe(
            ops.delay(0.01), ops.do_action(lambda _: timer_threads.add(threading.get_ident())),
            ops.map(as_query))
        f = inst.stream("record").feed(source)
        with anyio.fail_after(5):
            await f.wait()
        await rt.idle()
        assert inst.result.key("log").get() == ["a", "b", "c"]
        assert loop_thread not in timer_threads
        assert senders == {loop_thread}


async def test_feed_asyncio_scheduler_keeps_timers_on_the_loop():
    async with Runtime() as rt:
        inst = rt.run(search)
        loop_thread, timer_threads = threading.get_ident(), set()
        source = reactivex.from_iterable(["a", "b"]).pipe(
            ops.delay(0.01), ops.do_action(lambda _: timer_threads.add(threading.get_ident())),
            ops.map(as_query))
        f = rx.feed(source, inst.stream("record"),
                    scheduler=AsyncIOScheduler(asyncio.get_running_loop()))
        with anyio.fail_after(5):
            await f.wait()
        await rt.idle()
        assert inst.result.key("log").get() == ["a", "b"]
        assert timer_threads == {loop_thread}


async def test_feed_bad_items_are_reported_and_later_items_still_arrive():
    async with Runtime() as rt:
        inst = rt.run(search)
        items = [{"q": "a"}, {"x": 1}, {"q": {1, 2}}, {"q": float("nan")}, {"q": "b"}]
        keys = Subject()
        f = inst.stream("record").feed(keys)
        for item in items:
            keys.on_next(item)
        await rt.idle()
        assert inst.result.key("log").get() == ["a", "b"]
        assert len(rt.errors) == 3
        assert all(where.startswith("feed into Stream(record") for where, _ in rt.errors)
        assert not f.done and keys.observers  # still subscribed
        keys.on_next({"q": "c"})
        await rt.idle()
        assert inst.result.key("log").get() == ["a", "b", "c"]
        f.dispose()


async def test_feed_source_error_is_reported_and_ends_the_feed():
    async with Runtime() as rt:
        inst = rt.run(search)
        source = reactivex.concat(reactivex.of({"q": "a"}), reactivex.throw(Boom("upstream")))
        f = inst.stream("record").feed(source)
        assert f.done
        await f.wait()
        await rt.idle()
        assert inst.result.key("log").get() == ["a"]
        [(where, error)] = rt.errors
        assert isinstance(error, Boom) and "source failed" in where


async def test_feed_dispose_stops_and_unsubscribes():
    async with Runtime() as rt:
        inst = rt.run(search)
        keys = Subject()
        f = inst.stream("record").feed(keys)
        keys.on_next({"q": "a"})
        f.dispose()
        keys.on_next({"q": "b"})
        await f.wait()
        await rt.idle()
        assert inst.result.key("log").get() == ["a"]
        assert f.done and not keys.observers


async def test_feed_dispose_from_another_thread_drops_what_is_queued():
    async with Runtime() as rt:
        inst = rt.run(search)
        keys = Subject()
        f = inst.stream("record").feed(keys)

        def produce_then_dispose():
            keys.on_next({"q": "a"})  # handed to the loop, not yet delivered
            f.dispose()
            keys.on_next({"q": "b"})

        # joined from the loop thread, which runs nothing meanwhile: "a" is still waiting
        # for the loop when the dispose comes
        worker = threading.Thread(target=produce_then_dispose)
        worker.start()
        worker.join()
        assert not f.done  # the end, too, waits for the loop
        with anyio.fail_after(5):
            await f.wait()
        await rt.idle()
        assert inst.result.key("log").get() == []
        assert not keys.observers


async def test_feed_into_a_stopped_stream_ends_without_raising():
    async with Runtime() as rt:
        inst = rt.run(search)
        stream, keys = inst.stream("record"), Subject()
        f = stream.feed(keys)
        rt.stop(inst)
        keys.on_next({"q": "a"})  # nothing raised inside Rx
        assert f.done and not keys.observers
        assert rt.errors == []
        with pytest.raises(StreamError, match="stopped"):
            stream.feed(reactivex.of({"q": "b"}))


def test_feed_needs_the_runtimes_loop():
    rt = Runtime()
    inst = rt.run(search)
    with pytest.raises(RuntimeError, match="event loop"):
        inst.stream("record").feed(reactivex.of({"q": "a"}))


# ---------------------------------------------------------------------------- composed


async def test_search_box_debounced_into_the_query():
    """observe -> operators -> feed between two cells of one pattern: what the user types
    becomes the query once they pause."""
    async with Runtime() as rt:
        inst = rt.run(search)
        ts = TestScheduler()
        text, query = inst.result.key("text"), inst.result.key("query")
        queries = []
        watch = query.observe().subscribe(queries.append)
        f = inst.stream("set_query").feed(text.observe().pipe(
            ops.debounce(0.3, scheduler=ts), ops.map(str.strip), ops.filter(bool),
            ops.distinct_until_changed(), ops.map(as_query)))
        # "cat" goes out at 0.6 (a 0.3 pause), "cat " at 1.3 is "cat" again, "cats" at 1.8
        for t, typed in ((0.1, "c"), (0.2, "ca"), (0.3, "cat"), (1.0, "cat "), (1.5, "cats")):
            ts.advance_to(t)
            await inst.send("type", {"text": typed})  # keystrokes arrive as events
        ts.advance_to(3.0)
        await rt.idle()
        assert queries == ["", "cat", "cats"]
        assert query.get() == "cats"
        f.dispose()
        watch.dispose()
        assert rt.errors == []


async def test_observe_into_feed_without_time_follows_the_causing_commit():
    """No time operator: the item is sent while the handler's commit is applied, so it is
    queued after that commit, in the same drain (like any event a sink sends)."""
    async with Runtime() as rt:
        inst = rt.run(search)
        f = inst.stream("set_query").feed(inst.result.key("text").observe().pipe(
            ops.map(str.upper), ops.map(as_query)))
        await rt.idle()  # the initial "" went out at once
        await inst.send("type", {"text": "cat"})
        assert inst.result.key("query").get() == "CAT"
        f.dispose()
        await inst.send("type", {"text": "dog"})
        assert inst.result.key("query").get() == "CAT"


# ---------------------------------------------------------------------------- the docs


def test_doc_examples_run():
    """Every ```python block of docs/reactivex.md, in order, in one namespace."""
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "docs_reactivex"}
    for i, code in enumerate(blocks, 1):
        exec(compile(code, f"{DOC.name} python block {i}", "exec"), namespace)
