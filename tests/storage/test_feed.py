"""The change feed (``runtime.storage.feed``), on every backend that has one.

Each test has a writer and a reader on one database: for memory, one store object (its
feed is in process); for SQLite, two stores on one file; for PostgreSQL, two stores on one
database of the run's throwaway cluster. Nothing is timed: every wait is for the batch
itself, bounded so a lost notification fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from runtime import Runtime, cell, pattern
from runtime.errors import StorageError, StoreConfigError
from runtime.storage import (
    RECHECK,
    DocKey,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    Store,
    Stored,
    Write,
    can_watch,
    pg_feed,
)
from runtime.storage import sqlite as sqlite_module
from runtime.storage.pg_feed import _NOT_OURS, parse_payload, payload

from .counter_agent import counter

pytestmark = pytest.mark.anyio
WAIT = 10.0
A = DocKey("feed", "", "a")
B = DocKey("feed", "user:u", "b")


def _memory(place: Any) -> tuple[Store, Store]:
    s = MemoryStore()
    return s, s


Pair = Callable[[Any], tuple[Store, Store]]
PAIRS: dict[str, Pair] = {
    "memory": _memory,
    "sqlite": lambda d: (SQLiteStore(d / "f.db"), SQLiteStore(d / "f.db", feed_interval=0.01)),
    "postgres": lambda url: (PostgresStore(url), PostgresStore(url)),
}


@pytest.fixture(params=sorted(PAIRS))
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    place = request.getfixturevalue("pg_url") if request.param == "postgres" else tmp_path
    writer, reader = PAIRS[request.param](place)
    try:
        yield writer, reader
    finally:
        writer.close()
        reader.close()


async def batch(feed: AsyncIterator[Any]) -> Any:
    with anyio.fail_after(WAIT):
        return await feed.__anext__()


async def until(feed: AsyncIterator[Any], want: dict[DocKey, int]) -> dict[DocKey, int]:
    """Batches merged until every key in ``want`` reached its version (a backend may split
    one commit's keys, or join several commits, into batches as it likes)."""
    seen: dict[DocKey, int] = {}
    while any(seen.get(k, 0) < v for k, v in want.items()):
        got = await batch(feed)
        assert got is not RECHECK, "no recheck expected here"
        for k, v in got.items():
            seen[k] = max(seen.get(k, 0), v)
    return seen


async def test_every_store_has_a_feed_and_it_starts_with_a_recheck(pair: Any) -> None:
    _, reader = pair
    assert can_watch(reader)
    async with reader.watch() as feed:
        assert await batch(feed) is RECHECK


async def test_another_writers_commit_arrives_as_keys_and_versions(pair: Any) -> None:
    writer, reader = pair
    async with reader.watch() as feed:
        assert await batch(feed) is RECHECK
        writer.commit([Write(A, {"n": 1}), Write(B, [1])])
        assert await until(feed, {A: 1, B: 1}) == {A: 1, B: 1}
        writer.commit([Write(A, None, expect=1, patch=((("n",), 2),))])
        assert await until(feed, {A: 2}) == {A: 2}
        assert reader.load_many([A, B]) == {A: Stored({"n": 2}, 2), B: Stored([1], 1)}


async def test_commits_made_while_the_reader_is_busy_come_as_their_highest_versions(
    pair: Any,
) -> None:
    writer, reader = pair
    async with reader.watch() as feed:
        assert await batch(feed) is RECHECK
        writer.commit([Write(A, 0)])
        for n in range(1, 20):
            writer.commit([Write(A, n, expect=n)])
        got = await until(feed, {A: 20})
        assert got == {A: 20}


async def test_a_failed_commit_sends_nothing(pair: Any) -> None:
    writer, reader = pair
    writer.commit([Write(A, "mine")])
    async with reader.watch() as feed:
        assert await batch(feed) is RECHECK
        with pytest.raises(Exception, match="another writer"):
            writer.commit([Write(B, "b", expect=0), Write(A, "theirs", expect=0)])
        writer.commit([Write(DocKey("feed", "", "marker"), 1)])
        got = await until(feed, {DocKey("feed", "", "marker"): 1})
        assert A not in got and B not in got


async def test_versions_and_load_many_read_only_what_exists(pair: Any) -> None:
    writer, reader = pair
    writer.commit([Write(A, {"x": [1]}), Write(A, {"x": [1, 2]})])
    writer.commit([Write(A, None, expect=2, patch=((("x", 2), 3),))])
    missing = DocKey("feed", "", "nope")
    assert reader.versions([A, missing, B]) == {A: 3}
    assert reader.load_many([missing, A]) == {A: Stored({"x": [1, 2, 3]}, 3)}
    assert reader.versions([]) == {} and reader.load_many([]) == {}


async def test_versions_follow_every_writer_between_reads(pair: Any) -> None:
    """Asked again and again (a dialog asks before every step), versions stay exact: after
    the other store's commits, after the asking store's own, and for a key created since
    it was missing. (SQLite answers from what it last read while no other connection has
    committed: this is what that must never get wrong.)"""
    writer, reader = pair
    missing = DocKey("feed", "", "later")
    writer.commit([Write(A, {"n": 0})])
    assert reader.versions([A, missing]) == {A: 1}
    assert reader.versions([A, missing]) == {A: 1}
    writer.commit([Write(A, {"n": 1}, expect=1)])
    assert reader.versions([A, missing]) == {A: 2}
    reader.commit([Write(A, {"n": 2}, expect=2)])  # the asking store's own commit
    assert reader.versions([A]) == {A: 3}
    reader.commit([Write(A, None, expect=3, patch=((("n",), 3),)), Write(B, [], expect=0)])
    assert reader.versions([A, B, missing]) == {A: 4, B: 1}
    writer.commit([Write(missing, "here", expect=0)])
    assert reader.versions([missing, A]) == {missing: 1, A: 4}
    assert reader.versions([missing]) == {missing: 1}
    writer.commit([Write(B, [1], expect=1)])
    assert reader.versions([B]) == {B: 2}
    assert reader.load_many([B]) == {B: Stored([1], 2)}


async def test_load_many_takes_a_key_twice_as_once(pair: Any) -> None:
    writer, reader = pair
    writer.commit([Write(A, {"x": []})])
    writer.commit([Write(A, None, expect=1, patch=((("x", 0), 1),))])
    assert reader.load_many([A, A]) == {A: Stored({"x": [1]}, 2)}
    assert reader.versions([A, A]) == {A: 2}


async def test_a_closed_store_ends_its_feed_or_refuses_it(pair: Any) -> None:
    _, reader = pair
    reader.close()
    with pytest.raises(Exception, match="close"):
        async with reader.watch():
            pass


# ---------------------------------------------------------------- through the runtime


async def test_a_commit_in_one_runtime_recomputes_a_computed_in_another(pair: Any) -> None:
    writer, reader = pair
    async with Runtime(store=reader) as b_rt, Runtime(store=writer) as a_rt:
        a = a_rt.run(counter)
        b = b_rt.run(counter)
        seen: list[Any] = []
        arrived = anyio.Event()

        def sink(value: Any) -> None:
            seen.append(value)
            if value == 6:
                arrived.set()

        b.result.key("doubled").sink(sink)
        for _ in range(3):
            await a.send("bump", None)
        with anyio.fail_after(WAIT):
            await arrived.wait()  # B committed nothing: the feed brought A's commits
        assert b.result.key("count").get() == 3
        assert seen[0] == 0 and seen[-1] == 6 and seen == sorted(seen)
        await b.send("bump", None)  # and B writes on top of them, no conflict
        assert b.result.key("count").get() == 4
    assert a_rt.errors == [] and b_rt.errors == []


@pattern(name="poisonable")
def _poisonable() -> dict[str, Any]:
    """A counter and one more document, which a test damages."""
    return {"count": cell(0, name="count"), "other": cell("intact", name="other")}


async def test_follow_false_opens_no_feed(pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, reader = pair
    opened: list[Any] = []
    real = reader.watch
    monkeypatch.setattr(reader, "watch", lambda: opened.append(1) or real())
    async with Runtime(store=reader, follow=False) as rt:
        rt.run(counter)
        await rt.settled()
    assert opened == []  # (the default opens one: every other test here)


# ----------------------------------------------------------------- SQLite specifics


async def test_sqlite_a_reader_that_fell_behind_the_kept_changes_rechecks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqlite_module, "CHANGES_KEPT", 5)
    monkeypatch.setattr(sqlite_module, "PRUNE_EVERY", 10)
    writer = SQLiteStore(tmp_path / "gap.db")
    reader = SQLiteStore(tmp_path / "gap.db", feed_interval=0.01)
    try:
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            for n in range(30):  # pruned twice before the reader looks
                writer.commit([Write(A, n)])
            assert await batch(feed) is RECHECK
            writer.commit([Write(A, "next")])
            assert await until(feed, {A: 31}) == {A: 31}
    finally:
        writer.close()
        reader.close()


def test_sqlite_changes_stay_bounded_however_short_lived_the_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sqlite_module, "CHANGES_KEPT", 50)
    monkeypatch.setattr(sqlite_module, "PRUNE_EVERY", 20)
    path = tmp_path / "bounded.db"
    for n in range(40):  # each store (a process) commits fewer than PRUNE_EVERY times
        s = SQLiteStore(path)
        for i in range(19):
            s.commit([Write(DocKey("feed", "", f"d{n}"), i)])
        s.close()
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT count(*) FROM changes").fetchone()[0]
    finally:
        db.close()
    assert rows <= 50 + 20, rows


async def test_sqlite_a_changes_table_emptied_behind_the_reader_is_a_recheck(
    tmp_path: Path,
) -> None:
    writer = SQLiteStore(tmp_path / "reset.db")
    reader = SQLiteStore(tmp_path / "reset.db", feed_interval=0.01)
    try:
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            for n in range(5):  # watched: each commit adds its row
                writer.commit([Write(A, n)])
            assert await until(feed, {A: 5}) == {A: 5}
            db = sqlite3.connect(tmp_path / "reset.db")
            db.execute("DELETE FROM changes")  # a restored backup, an operator's cleanup
            db.commit()
            db.close()
            assert await batch(feed) is RECHECK
            writer.commit([Write(A, "after")])
            assert await until(feed, {A: 6}) == {A: 6}
    finally:
        writer.close()
        reader.close()


async def test_one_unreadable_document_does_not_stop_the_others_catching_up(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'poison.db'}"
    async with Runtime(store=url) as b_rt:
        b = b_rt.run(_poisonable)
        await b_rt.settled()
        other = b.result.key("other").resolve().doc_key
        count = b.result.key("count").resolve().doc_key
        arrived = anyio.Event()
        b.result.key("count").sink(lambda v: arrived.set() if v == 1 else None)
        db = sqlite3.connect(tmp_path / "poison.db")  # one commit: one batch of the feed
        db.execute("UPDATE docs SET value='{not json', version=version+1 WHERE id=?",
                   (other.id,))
        db.execute("UPDATE docs SET value='1', version=version+1 WHERE id=?", (count.id,))
        db.execute("INSERT INTO changes (origin, space, scope, id, version) SELECT 0, space, "
                   "scope, id, version FROM docs WHERE id IN (?, ?)", (other.id, count.id))
        db.commit()
        db.close()
        with anyio.fail_after(WAIT):
            await arrived.wait()  # the counter caught up beside the damaged document
        assert b.result.key("other").get() == "intact"  # left as it was
        assert len(b_rt.errors) == 1 and "not JSON" in str(b_rt.errors[0][1])


def test_sqlite_feed_interval_is_checked(tmp_path: Path) -> None:
    for bad in (0, -1, float("nan"), 61, "1"):
        with pytest.raises(StoreConfigError, match="poll interval"):
            SQLiteStore(tmp_path / "x.db", feed_interval=bad)  # type: ignore[arg-type]


async def test_sqlite_in_memory_has_a_feed_that_only_rechecks_once() -> None:
    s = SQLiteStore(":memory:")
    try:
        async with s.watch() as feed:
            assert await batch(feed) is RECHECK
            s.commit([Write(A, 1)])
            with anyio.move_on_after(0.2) as waited:
                await feed.__anext__()
            assert waited.cancelled_caught  # one connection: nobody else can write
    finally:
        s.close()


# ------------------------------------------------------------- PostgreSQL specifics


def test_a_payload_round_trips_and_a_key_too_long_to_send_is_a_recheck() -> None:
    key = DocKey("s" * 50, "user:é", "d" * 60)
    assert parse_payload(payload(key, 7)) == {key: 7}
    assert payload(key, None) is None  # the server writes it, knowing the version
    huge = DocKey("s", "", "x" * 9000)
    assert payload(huge, 1) == "*" and payload(huge, None) == "*"
    assert parse_payload("*") is RECHECK


@pytest.mark.parametrize("hostile", [
    "", "null", "{}", "[1]", '[["a","b","c"]]', '[["a","b","c","1"]]', '[["a","b",3,1]]',
    '[["a","b","c",1.5]]', '[["a","b","c",true]]', "[" * 5000, "\u0000", "**",
])
def test_a_payload_that_is_not_ours_is_ignored_never_an_error(hostile: str) -> None:
    assert parse_payload(hostile) is _NOT_OURS


async def test_postgres_every_key_of_a_large_commit_arrives(pg_url: str) -> None:
    writer, reader = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        keys = [DocKey("feed", f"user:{'u' * 40}{i}", "x" * 40) for i in range(300)]
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            writer.commit([Write(k, i) for i, k in enumerate(keys)])
            assert await until(feed, dict.fromkeys(keys, 1)) == dict.fromkeys(keys, 1)
    finally:
        writer.close()
        reader.close()


async def test_postgres_a_key_too_large_for_a_notification_reaches_readers_as_a_recheck(
    pg_url: str,
) -> None:
    writer, reader = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            huge = DocKey("feed", "", "k" * 9000)  # compresses into the index; not into NOTIFY
            writer.commit([Write(huge, 1), Write(A, 1)])
            assert await batch(feed) is RECHECK
            assert reader.versions([huge, A]) == {huge: 1, A: 1}
    finally:
        writer.close()
        reader.close()


def test_postgres_a_key_too_long_for_the_index_is_named(pg_url: str) -> None:
    s = PostgresStore(pg_url)
    try:
        random_text = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(3000))
        with pytest.raises(StorageError, match="key is too long") as info:
            s.commit([Write(A, 1), Write(DocKey("feed", "", random_text), 1)])
        assert "nothing was committed" in str(info.value)
        assert s.load(A) is None
    finally:
        s.close()


async def test_postgres_garbage_on_the_channel_is_ignored_and_rechecks_are_rate_limited(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anyone who may connect may NOTIFY: what is not ours is dropped, and a flood of "*"
    cannot make readers re-read everything more often than ``RECHECK_EVERY``."""
    monkeypatch.setattr(pg_feed, "RECHECK_EVERY", 0.3)
    writer, reader = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            with psycopg.connect(pg_url, autocommit=True) as other:
                other.execute("SELECT pg_notify('celldialog', %s)",
                              (json.dumps([["a", "b"]]),))
                writer.commit([Write(A, 1)])
                assert await batch(feed) == {A: 1}  # the garbage before it was dropped
                other.execute("SELECT pg_notify('celldialog', '*')")
                first = anyio.current_time()
                assert await batch(feed) is RECHECK
                other.execute("SELECT pg_notify('celldialog', '*')")
                assert await batch(feed) is RECHECK
                assert anyio.current_time() - first >= 0.3 * 0.99
    finally:
        writer.close()
        reader.close()


async def test_postgres_the_feed_reconnects_and_rechecks_after_its_connection_dies(
    pg_url: str, pg_cluster: Any,
) -> None:
    writer, reader = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            dbname = pg_url.split("/")[-1].split("?")[0]
            pg_cluster.kill_connections(dbname)  # every connection of the database
            assert await batch(feed) is RECHECK  # NOTIFY is not durable: compare all
            writer.commit([Write(A, 1)])  # the store's pool found its connection dead too
            assert await until(feed, {A: 1}) == {A: 1}
    finally:
        writer.close()
        reader.close()


def test_postgres_a_key_with_nul_is_refused_by_name_and_never_found(pg_url: str) -> None:
    s = PostgresStore(pg_url)
    try:
        bad = DocKey("feed", "user:a\x00b", "doc")
        with pytest.raises(StoreConfigError, match="NUL"):
            s.commit([Write(A, 1), Write(bad, 1)])
        assert s.load(A) is None and s.load(bad) is None
        assert s.versions([bad]) == {} and list(s.keys("a\x00")) == []
    finally:
        s.close()


async def test_postgres_the_feed_can_listen_on_another_route(pg_url: str, pg_cluster: Any) -> None:
    """A store whose URL is a transaction-mode pooler listens through ``listen_url``: here
    the same database over TCP while the store itself uses the socket."""
    from urllib.parse import quote

    dbname = pg_url.split("/")[-1].split("?")[0]
    tcp = pg_cluster.tcp_url.rsplit("/", 1)[0] + "/" + dbname
    writer = PostgresStore(pg_url)
    reader = PostgresStore(f"{pg_url}&listen_url={quote(tcp, safe='')}")
    try:
        assert reader._listen.startswith(tcp)
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            writer.commit([Write(A, 1)])
            assert await until(feed, {A: 1}) == {A: 1}
    finally:
        writer.close()
        reader.close()


def test_postgres_a_listen_url_that_is_not_one_is_refused() -> None:
    with pytest.raises(StoreConfigError, match=r"listen_url.*libpq URL"):
        PostgresStore("postgresql://me:pw@localhost/db?listen_url=redis%3A%2F%2Fx")


async def test_sqlite_a_store_does_not_hear_its_own_commits_but_its_neighbour_does(
    tmp_path: Path,
) -> None:
    """Rows the watching store wrote itself are skipped in SQL (its runtime has them);
    another store on the same file, even in this process, hears them."""
    one = SQLiteStore(tmp_path / "own.db", feed_interval=0.01)
    two = SQLiteStore(tmp_path / "own.db", feed_interval=0.01)
    try:
        async with one.watch() as mine, two.watch() as theirs:
            assert await batch(mine) is RECHECK and await batch(theirs) is RECHECK
            one.commit([Write(A, 1)])
            two.commit([Write(B, 1)])
            assert await until(theirs, {A: 1}) == {A: 1}  # not its own B
            assert await batch(mine) == {B: 1}  # only the neighbour's
    finally:
        one.close()
        two.close()


async def test_a_runtime_on_a_memory_store_of_its_own_follows_nothing() -> None:
    async with Runtime() as rt:
        assert rt.follow is False  # no other writer can exist
    shared = MemoryStore()
    async with Runtime(store=shared) as rt:
        assert rt.follow is True  # another runtime may share this object


def _change_rows(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT count(*) FROM changes").fetchone()[0])
    finally:
        db.close()


async def test_sqlite_a_store_alone_on_its_file_writes_nothing_for_a_feed(
    tmp_path: Path,
) -> None:
    """Rows in ``changes`` cost a page per commit: they are written only while another
    store watches the file, and stop once it stops watching."""
    path = tmp_path / "alone.db"
    writer = SQLiteStore(path, feed_interval=0.01)
    reader = SQLiteStore(path, feed_interval=0.01)
    try:
        async with writer.watch() as own:  # its own runtime's feed does not count
            assert await batch(own) is RECHECK
            for n in range(20):
                writer.commit([Write(A, n)])
            assert _change_rows(path) == 0
            async with reader.watch() as feed:
                assert await batch(feed) is RECHECK
                writer.commit([Write(A, "seen")])
                assert await until(feed, {A: 21}) == {A: 21}
                assert _change_rows(path) == 1
            writer.commit([Write(A, "unwatched again")])
            assert _change_rows(path) == 1
    finally:
        writer.close()
        reader.close()


async def test_sqlite_a_watcher_whose_row_expired_rechecks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process paused past its watcher row's life: writers stopped adding rows for it,
    so on waking it compares everything instead of trusting the rows."""
    monkeypatch.setattr(sqlite_module, "WATCH_TTL", 0.3)
    path = tmp_path / "expired.db"
    writer, reader = SQLiteStore(path), SQLiteStore(path, feed_interval=0.01)
    try:
        async with reader.watch() as feed:
            assert await batch(feed) is RECHECK
            db = sqlite3.connect(path)
            db.execute("UPDATE watchers SET expires = 0")  # as if it had slept through it
            db.commit()
            db.close()
            writer.commit([Write(A, "missed")])  # no row: nobody is watching
            assert _change_rows(path) == 0
            assert await batch(feed) is RECHECK  # at its next renewal
            writer.commit([Write(A, "seen")])
            assert await until(feed, {A: 2}) == {A: 2}
    finally:
        writer.close()
        reader.close()


async def test_a_read_that_failed_once_is_tried_again_at_the_next_recheck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transient failure (a locked file, a lost connection) leaves nothing stale for
    good: the next batch or recheck that names the document reads it again."""
    url = f"sqlite:///{tmp_path / 'flaky.db'}"
    async with Runtime(store=url, follow=False) as b_rt, Runtime(store=url) as a_rt:
        a, b = a_rt.run(counter), b_rt.run(counter)
        await a.send("bump", None)
        store = b_rt.store
        real_many, real_load = store.load_many, store.load
        failing = [True]

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if failing[0]:
                raise StorageError("the database is locked (a test's transient failure)")
            return real_many(*args, **kwargs)

        def flaky_load(*args: Any, **kwargs: Any) -> Any:
            if failing[0]:
                raise StorageError("the database is locked (a test's transient failure)")
            return real_load(*args, **kwargs)

        monkeypatch.setattr(store, "load_many", flaky)
        monkeypatch.setattr(store, "load", flaky_load)
        assert b_rt.docs.catch_up(None) == 0  # the read failed: reported, nothing changed
        assert b.result.key("count").get() == 0 and len(b_rt.errors) == 1
        failing[0] = False
        assert b_rt.docs.catch_up(None) == 1  # the next recheck reads it again
        assert b.result.key("count").get() == 1 and len(b_rt.errors) == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_two_runtimes_sharing_one_store_object_see_each_other(
    tmp_path: Path, kind: str,
) -> None:
    store: Store = MemoryStore() if kind == "memory" else SQLiteStore(
        tmp_path / "one.db", feed_interval=0.01)
    async with Runtime(store=store) as b_rt, Runtime(store=store) as a_rt:
        a, b = a_rt.run(counter), b_rt.run(counter)
        arrived = anyio.Event()
        b.result.key("count").sink(lambda v: arrived.set() if v == 2 else None)
        await a.send("bump", None)
        await a.send("bump", None)
        with anyio.fail_after(WAIT):
            await arrived.wait()


async def test_sqlite_a_locked_file_never_blocks_the_feeds_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another connection holds the write lock while the feed opens and renews: the feed
    waits for its next poll instead of blocking every task of the process."""
    monkeypatch.setattr(sqlite_module, "WATCH_TTL", 0.3)
    path = tmp_path / "locked.db"
    reader = SQLiteStore(path, feed_interval=0.01)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # the write lock, held
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(0.01)
                ticks += 1

        async with anyio.create_task_group() as tg, reader.watch() as feed:
            tg.start_soon(tick)
            with anyio.move_on_after(0.5):
                await feed.__anext__()  # cannot register while the lock is held
            assert ticks >= 10  # the loop kept running meanwhile
            holder.execute("ROLLBACK")
            assert await batch(feed) is RECHECK  # registered once the lock is free
            tg.cancel_scope.cancel()
    finally:
        holder.close()
        reader.close()
