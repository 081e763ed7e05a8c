"""What only the PostgreSQL store has: its URL (options passed through byte for byte,
passwords never shown), threads sharing one store, lock waits, dead connections, and the
end of its feeds at ``close()``. The contract it shares with the others is
``test_conformance.py``; its feed, ``test_feed.py``."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

import anyio
import psycopg
import pytest

from runtime.errors import ConflictError, StorageError, StoreBusyError, StoreConfigError
from runtime.storage import DocKey, PostgresStore, Stored, Write
from runtime.storage.pg_url import parse_url, redact, scrub, secrets_of

A = DocKey("pg", "", "a")

SECRET_URLS = [
    "postgresql://app:s3cret-pw@h/db",
    "postgresql://app:pa?ss-s3cret-pw@h/db",  # an unencoded ? in the password
    "postgresql://app:pa/s#s3cret-pw@h/db",
    "postgresql://app@h/db?password=s3cret-pw&sslmode=require",
    "postgresql://app@h/db?sslpassword=s3cret-pw",
    "postgresql://app@h/db?pass%77ord=s3cret-pw",
    "postgresql://app@h/db?listen_url=" + quote("postgresql://l:s3cret-pw@h2/db", safe=""),
    "postgresql://app:s3cret%2Dpw@h/db",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_redact_hides_every_password(url: str) -> None:
    shown = redact(url)
    assert "s3cret" not in shown and "***" in shown
    assert "s3cret" not in scrub(f"the driver said: {url!r}", secrets_of(url))


def test_redact_leaves_a_url_without_secrets_as_given() -> None:
    for url in ("sqlite:////tmp/x.db", "memory", "postgresql://app@h:5432/db?sslmode=require"):
        assert redact(url) == url


def test_libpq_parameters_pass_through_byte_for_byte() -> None:
    url = ("postgresql://u@h/db?options=-c%20statement_timeout%3D4321&application_name=my+app"
           "&pool_size=2")
    conninfo, options = parse_url(url)
    assert conninfo.startswith("postgresql://u@h/db?options=-c%20statement_timeout%3D4321"
                               "&application_name=my+app&")
    assert "pool_size" not in conninfo and options.pool_size == 2
    assert "keepalives=1" in conninfo and "connect_timeout=10" in conninfo
    socket, _ = parse_url("postgresql://u@/db?host=/run/pg&connect_timeout=3")
    assert "keepalives" not in socket and socket.count("connect_timeout") == 1


def test_the_server_gets_libpq_options_as_written(pg_url: str) -> None:
    s = PostgresStore(f"{pg_url}&options=-c%20statement_timeout%3D4321"
                      f"&application_name=my%20app")
    try:
        with s._pool.connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("4321ms",)
            assert conn.execute("SHOW application_name").fetchone() == ("my app",)
    finally:
        s.close()


def test_a_url_libpq_cannot_parse_is_named_without_its_password() -> None:
    with pytest.raises(StorageError) as info:
        PostgresStore("postgresql://app:TOP%zzSECRET@localhost/db")
    text = str(info.value)
    assert "cannot open PostgreSQL store" in text and "SECRET" not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"pool_size": 0}, "pool_size"), ({"pool_size": "4"}, "pool_size"),
    ({"busy_timeout": -1}, "busy_timeout"), ({"busy_timeout": float("nan")}, "busy_timeout"),
    ({"busy_timeout": 1e7}, "busy_timeout"), ({"prepare": "off"}, "prepare"),
    ({"listen_url": "redis://x"}, "listen_url"),
])
def test_bad_keyword_options_are_refused_before_connecting(kwargs: Any, words: str) -> None:
    with pytest.raises(StoreConfigError, match=words):
        PostgresStore("postgresql://me:pw@192.0.2.1/db", **kwargs)


def test_threads_sharing_one_store_lose_no_write(pg_url: str) -> None:
    """The store may be shared by threads (its pool has several connections): a patch is
    planned against a cached value one commit owns at a time."""
    s = PostgresStore(pg_url)
    s.commit([Write(A, {"items": []})])
    errors: list[BaseException] = []

    def append(name: str) -> None:
        try:
            for n in range(60):
                while True:
                    got = s.load(A)
                    assert got is not None
                    step = (("items", len(got.value["items"])), f"{name}-{n}")
                    try:
                        s.commit([Write(A, None, expect=got.version, patch=(step,))])
                        break
                    except StorageError as e:
                        if "another writer" not in str(e):
                            raise
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=append, args=(f"t{i}",)) for i in range(5)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        items = s.load(A).value["items"]  # type: ignore[union-attr]
        assert sorted(items) == sorted(f"t{i}-{n}" for i in range(5) for n in range(60))
        fresh = PostgresStore(pg_url)
        try:
            assert fresh.load(A) == s.load(A)
        finally:
            fresh.close()
    finally:
        s.close()


def test_a_busy_timeout_of_zero_means_do_not_wait(pg_url: str) -> None:
    s = PostgresStore(f"{pg_url}&busy_timeout=0")
    s.commit([Write(A, 1)])
    with psycopg.connect(pg_url) as holder:  # a transaction holding the document's row
        holder.execute("SELECT 1 FROM celldialog_docs WHERE id = 'a' FOR UPDATE")
        try:
            with pytest.raises(StoreBusyError, match="busy_timeout"):
                s.commit([Write(A, 2, expect=1)])
        finally:
            holder.rollback()
    assert s.load(A) == Stored(1, 1)
    assert s.commit([Write(A, 2, expect=1)]) == {A: 2}
    s.close()


def test_after_every_connection_dies_the_next_call_works(pg_url: str, pg_cluster: Any) -> None:
    """A restart or a failover kills every pooled connection at once: the retry takes one
    the pool has just checked, not another dead one."""
    s = PostgresStore(f"{pg_url}&pool_size=4")
    s.commit([Write(A, 1)])
    held = [s._pool.getconn() for _ in range(4)]  # grow the pool to four
    for conn in held:
        s._pool.putconn(conn)
    pg_cluster.kill_connections(pg_url.split("/")[-1].split("?")[0])
    try:
        for _ in range(4):
            assert s.load(A) == Stored(1, 1)
        assert s.commit([Write(A, 2, expect=1)]) == {A: 2}
    finally:
        s.close()


@pytest.mark.anyio
async def test_close_ends_the_stores_feeds(pg_url: str) -> None:
    writer, reader = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        async with reader.watch() as feed:
            with anyio.fail_after(10):
                assert await feed.__anext__() is None
            reader.close()
            writer.commit([Write(A, 1)])  # wakes the feed, which sees the store closed
            with anyio.fail_after(10), pytest.raises(StopAsyncIteration):
                await feed.__anext__()
    finally:
        writer.close()
        reader.close()


class _LoseReply:
    """The connection dies around a commit (the network edge): before it reaches the
    server, or after the server committed it but before the reply came back."""

    def __init__(self, store: PostgresStore, *, after: bool, then: Any = None) -> None:
        self.store, self.after, self.then = store, after, then
        self.real = store._commit
        self.calls = 0

    def __call__(self, conn: Any, plan: Any, token: int) -> Any:
        from runtime.storage.postgres import _Lost

        self.calls += 1
        if self.calls > 1:
            return self.real(conn, plan, token)
        if self.after:
            self.real(conn, plan, token)
        if self.then is not None:
            self.then()
        raise _Lost(psycopg.OperationalError("server closed the connection unexpectedly"))


@pytest.mark.parametrize("patch", [False, True], ids=["put", "append"])
def test_a_commit_whose_reply_was_lost_is_found_landed_not_applied_twice(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, patch: bool,
) -> None:
    s = PostgresStore(pg_url)
    try:
        s.commit([Write(A, {"items": [0]})])
        lose = _LoseReply(s, after=True)
        monkeypatch.setattr(s, "_commit", lose)
        write = (Write(A, None, expect=1, patch=((("items", 1), 1),)) if patch
                 else Write(A, {"items": [0, 1]}, expect=1))
        assert s.commit([write]) == {A: 2}
        assert lose.calls == 1  # read back, not sent again
        assert s.load(A) == Stored({"items": [0, 1]}, 2)
    finally:
        s.close()


def test_a_commit_lost_before_it_reached_the_server_is_sent_once_more(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = PostgresStore(pg_url)
    try:
        s.commit([Write(A, [0])])
        lose = _LoseReply(s, after=False)
        monkeypatch.setattr(s, "_commit", lose)
        assert s.commit([Write(A, None, expect=1, patch=(((1,), 1),)),
                         Write(DocKey("pg", "", "b"), "new", expect=0)]) == {
            A: 2, DocKey("pg", "", "b"): 1}
        assert lose.calls == 2
        assert s.load(A) == Stored([0, 1], 2)
    finally:
        s.close()


def test_a_lost_commit_that_cannot_be_told_apart_says_so(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, other = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        s.commit([Write(A, [0])])
        lose = _LoseReply(s, after=True, then=lambda: other.commit([Write(A, ["theirs"])]))
        monkeypatch.setattr(s, "_commit", lose)
        with pytest.raises(StorageError, match="may or may not have been stored"):
            s.commit([Write(A, None, expect=1, patch=(((1,), 1),))])
        assert s.load(A) == Stored(["theirs"], 3)
    finally:
        s.close()
        other.close()


@pytest.mark.parametrize("patch", [False, True], ids=["put", "append"])
def test_a_lost_commit_is_never_mistaken_for_another_writers_identical_one(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, patch: bool,
) -> None:
    """Two writers increment one counter from the same version; ours is lost before it
    reaches the server and theirs lands with the very same value. Ours did not land: a
    conflict (re-read, increment again), never a success that loses an increment."""
    s, other = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        s.commit([Write(A, {"n": 0})])

        def write(store: PostgresStore) -> None:
            store.commit([Write(A, None, expect=1, patch=((("n",), 1),)) if patch
                          else Write(A, {"n": 1}, expect=1)])

        lose = _LoseReply(s, after=False, then=lambda: write(other))
        monkeypatch.setattr(s, "_commit", lose)
        with pytest.raises(ConflictError, match="version 2"):
            write(s)
        assert lose.calls == 1 and s.load(A) == Stored({"n": 1}, 2)
    finally:
        s.close()
        other.close()


def test_a_key_written_twice_with_a_wrong_second_expect_names_this_commit(
    pg_url: str,
) -> None:
    s = PostgresStore(pg_url)
    try:
        s.commit([Write(A, 1)])
        with pytest.raises(StorageError, match="written twice in this commit"):
            s.commit([Write(A, 2, expect=1), Write(A, 3, expect=1)])
        assert s.load(A) == Stored(1, 1)
    finally:
        s.close()


@pytest.mark.anyio
async def test_off_asyncio_the_feed_says_it_needs_asyncio_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psycopg's async connection runs on asyncio only: on another backend (trio) the
    runtime says so once and goes on without the feed."""
    from runtime import Runtime
    from runtime.storage import postgres

    monkeypatch.setattr(postgres, "_on_asyncio", lambda: False)  # as on trio
    async with Runtime(store=pg_url) as rt:
        await anyio.sleep(0)
        assert len(rt.errors) == 1 and "needs asyncio" in str(rt.errors[0][1])
        assert "follow=False" in str(rt.errors[0][1])


def test_commits_after_many_conflicts_keep_working_and_log_nothing(
    pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A conflict aborts the commit's pipeline in the server: every later commit still
    works (the pipelines run unprepared: psycopg took a statement of an aborted pipeline
    as prepared in the alternating-processes dialog test), and a conflict, an everyday
    answer, logs no warning."""
    caplog.set_level("WARNING")
    s = PostgresStore(pg_url)
    b = DocKey("pg", "", "b")
    try:
        s.commit([Write(A, 0), Write(b, 0)])
        for n in range(1, 15):
            with pytest.raises(ConflictError):  # the first write conflicts: the second, the
                # same statement, is skipped by the server
                s.commit([Write(A, n, expect=n + 100), Write(b, n, expect=n)])
            assert s.commit([Write(A, n, expect=n), Write(b, n, expect=n)]) == {A: n + 1,
                                                                                  b: n + 1}
    finally:
        s.close()
    assert [r.getMessage() for r in caplog.records] == []
