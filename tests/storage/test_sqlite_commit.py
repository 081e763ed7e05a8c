"""SQLite: what a commit sends, and files written by the previous format.

The statement counts are pinned (SQLite's trace callback sees every statement the store's
connection runs), so a change that adds a statement to the common commits fails here. Then
the paths a commit takes when its guesses are wrong (someone watches, another store wrote,
a log it did not know of), and files written by the code before these commits: a dump of
one (always), and the previous code itself on the same file as this one (when git can show
it): processes of both versions may share a file during an upgrade, so the previous code
must read this format right and fail, never write unseen, where it cannot.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from runtime.storage import (
    RECHECK,
    ConflictError,
    DocKey,
    SQLiteStore,
    StorageError,
    StoreBusyError,
    Stored,
    Write,
)
from runtime.storage.sqlite import _UNKNOWN, CACHED_DOCS, CURRENT_KEPT, KEEP_VALUE_UPTO

A = DocKey("s", "", "a")
B = DocKey("s", "user:u", "b")
ITEMS = [f"item {i}" for i in range(200)]
WAIT = 10.0


def _sql(store: SQLiteStore, call: Any) -> list[str]:
    """The statements ``call()`` runs on the store's connection, each as its first words."""
    seen: list[str] = []
    db = store._db
    assert db is not None
    db.set_trace_callback(seen.append)
    try:
        call()
    finally:
        db.set_trace_callback(None)
    return [" ".join(s.split()[:3]) for s in seen]


def _commit(store: SQLiteStore, *writes: Write) -> list[str]:
    return _sql(store, lambda: store.commit(list(writes)))


def _whole(key: DocKey, expect: int, value: Any) -> Write:
    """A whole value as the runtime writes one (``cell.set``): a patch of the empty path."""
    return Write(key, None, expect, (((), value),))


def _push(key: DocKey, expect: int, index: int, value: Any) -> Write:
    return Write(key, None, expect, ((("items", index), value),))


def _rows(path: Path, sql: str) -> list[Any]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "x.db")
    try:
        yield s
    finally:
        s.close()


# ----------------------------------------------------------------- statements per commit

ONE_UPDATE = ["UPDATE docs SET"]
APPEND = ["INSERT INTO patches"]
READ = "SELECT d.version, d.value"  # a document read, in one statement
REBASE = ["BEGIN IMMEDIATE", "UPDATE docs SET", "DELETE FROM patches", "COMMIT"]


def test_a_whole_value_of_one_document_is_one_statement(store: SQLiteStore) -> None:
    """No BEGIN, no PRAGMA, no read: the write is conditional on the version, on there
    being no log, and on nobody else watching, and is its own transaction."""
    assert _commit(store, Write(A, 0, 0)) == ["INSERT INTO docs"]  # create if absent
    assert _commit(store, _whole(A, 1, 1)) == ONE_UPDATE
    assert _commit(store, Write(A, 2, 2)) == ONE_UPDATE  # a value, not a patch
    assert store.load(A) == Stored(2, 3)


def test_a_patch_of_one_document_is_one_statement(store: SQLiteStore,
                                                  tmp_path: Path) -> None:
    """The patch appended if the log's newest version is the one expected (the first
    after a base: if there is no log and the base is at it), its own transaction: one row
    of one table written."""
    store.commit([_whole(A, 0, {"items": ITEMS})])
    assert _commit(store, _push(A, 1, 200, "x")) == APPEND
    assert _commit(store, _push(A, 2, 201, "y")) == APPEND
    assert store.load(A) == Stored({"items": [*ITEMS, "x", "y"]}, 3)
    assert _rows(tmp_path / "x.db", "SELECT version FROM docs") == [(1,)]
    assert _rows(tmp_path / "x.db", "SELECT version, patch FROM patches") == [
        (2, '[[["items",200],"x"]]'), (3, '[[["items",201],"y"]]')]


def test_a_patch_appended_to_a_log_reads_nothing_of_the_docs_table(
    store: SQLiteStore,
) -> None:
    """In a table WITHOUT ROWID even finding a row reads all of it, a large value's
    overflow pages too: an append checks the log's newest version, never the base row
    (SQLite's authorizer sees every column a statement reads when it is prepared)."""
    store.commit([_whole(A, 0, {"items": ITEMS})])
    store.commit([_push(A, 1, 200, "x")])  # the first since the base checks the base
    db = store._db
    assert db is not None
    read: list[str | None] = []

    def authorizer(action: int, table: str | None, *_: Any) -> int:
        if action == sqlite3.SQLITE_READ:
            read.append(table)
        return sqlite3.SQLITE_OK

    db.set_authorizer(authorizer)  # expires the prepared statements: prepared again
    try:
        assert _commit(store, _push(A, 2, 201, "y")) == APPEND
    finally:
        db.set_authorizer(None)
    assert "patches" in read and "docs" not in read
    assert store.load(A) == Stored({"items": [*ITEMS, "x", "y"]}, 3)


def test_a_patch_that_outgrows_the_log_rewrites_the_base(store: SQLiteStore) -> None:
    store.commit([_whole(A, 0, {"items": ITEMS})])
    version, sent = 1, []
    while "DELETE FROM patches" not in sent:
        sent = _commit(store, _push(A, version, 199 + version, "z" * 40))
        version += 1
        assert version < 200, "never compacted"
    assert sent == REBASE


def test_a_load_is_one_statement(store: SQLiteStore) -> None:
    store.commit([_whole(A, 0, {"items": ITEMS})])
    store.commit([_push(A, 1, 200, "x")])
    got: list[Any] = []
    assert _sql(store, lambda: got.append(store.load(A))) == [READ]
    assert got == [Stored({"items": [*ITEMS, "x"]}, 2)]


def test_another_connections_commits_cost_no_reads(tmp_path: Path) -> None:
    """What a store knows of its documents is per version, and every write checks the
    version: another connection's commits (a lease renewed, other documents written) do
    not make it read its own documents again."""
    one, two = SQLiteStore(tmp_path / "x.db"), SQLiteStore(tmp_path / "x.db")
    try:
        one.commit([_whole(A, 0, {"items": ITEMS}), _whole(B, 0, 0)])
        one.commit([_push(A, 1, 200, "x")])
        two.renew_lease("two", 60)
        two.commit([Write(DocKey("s", "", "other"), 1)])
        assert _commit(one, _whole(B, 1, 1)) == ONE_UPDATE
        assert _commit(one, _push(A, 2, 201, "y")) == APPEND
    finally:
        one.close()
        two.close()


def test_a_patch_to_what_another_store_changed_reads_it_once(tmp_path: Path) -> None:
    one, two = SQLiteStore(tmp_path / "x.db"), SQLiteStore(tmp_path / "x.db")
    try:
        one.commit([_whole(A, 0, {"items": ITEMS})])
        two.commit([_push(A, 1, 200, "two")])
        sent = _commit(one, _push(A, 2, 201, "one"))
        assert sent == [READ, *APPEND]
        assert two.load(A) == Stored({"items": [*ITEMS, "two", "one"]}, 3)
    finally:
        one.close()
        two.close()


async def _first(feed: AsyncIterator[Any]) -> Any:
    with anyio.fail_after(WAIT):
        return await feed.__anext__()


@pytest.mark.anyio
async def test_while_another_store_watches_a_commit_writes_its_feed_row(
    tmp_path: Path,
) -> None:
    """The quiet path's guard sees a watcher that arrived since the last commit: that commit
    goes the locked way and writes its row; once the watcher leaves, rows stop."""
    path = tmp_path / "x.db"
    writer, reader = SQLiteStore(path), SQLiteStore(path, feed_interval=0.01)
    try:
        assert _commit(writer, _whole(A, 0, 0)) == ["INSERT INTO docs"]  # nobody watches
        assert _commit(writer, _whole(A, 1, 1)) == ONE_UPDATE
        async with reader.watch() as feed:
            assert await _first(feed) is RECHECK
            sent = _commit(writer, _whole(A, 2, 2))  # tried quietly, refused, then locked
            assert sent[0] == "UPDATE docs SET" and "INSERT INTO changes" in sent
            assert await _first(feed) == {A: 3}
            sent = _commit(writer, _whole(A, 3, 3))
            assert sent == ["BEGIN IMMEDIATE", "PRAGMA data_version", "UPDATE docs SET",
                            "INSERT INTO changes", "COMMIT"]
            assert await _first(feed) == {A: 4}
            assert _rows(path, "SELECT count(*) FROM changes") == [(2,)]
        writer.commit([_whole(A, 4, 4)])  # notices the watcher left (a commit of its own)
        assert _commit(writer, _whole(A, 5, 5)) == ONE_UPDATE
        assert _rows(path, "SELECT count(*) FROM changes") == [(2,)]
    finally:
        writer.close()
        reader.close()


def test_a_whole_value_over_a_known_log_drops_it_in_one_transaction(
    store: SQLiteStore,
) -> None:
    """A one-write commit whose document has a log (known to the store): the base
    (checked against the log's newest version) and the log in one transaction, whether
    the value comes as a value or a patch; then the next whole value is one statement
    again."""
    store.commit([_whole(A, 0, {"items": ITEMS})])
    store.commit([_push(A, 1, 200, "x")])
    assert _commit(store, Write(A, {"items": ITEMS}, 2)) == REBASE
    store.commit([_push(A, 3, 200, "y")])
    assert _commit(store, _whole(A, 4, {"items": []})) == REBASE
    assert _commit(store, _whole(A, 5, {"items": ["z"]})) == ONE_UPDATE
    assert store.load(A) == Stored({"items": ["z"]}, 6)


def test_a_whole_value_is_copied_and_kept_so_the_next_patch_reads_nothing(
    store: SQLiteStore,
) -> None:
    """The store keeps its own copy of a whole value it wrote (the caller changes its own
    after the commit), and a patch to it is then checked against that copy, unread."""
    mine: dict[str, Any] = {"items": list(ITEMS)}
    store.commit([_whole(A, 0, mine)])
    mine["items"].clear()  # the caller's own copy: the store's is unchanged
    assert _commit(store, _push(A, 1, 200, "b")) == APPEND
    assert store.load(A) == Stored({"items": [*ITEMS, "b"]}, 2)


def test_other_spellings_of_a_whole_value_are_one_statement_too(store: SQLiteStore) -> None:
    """The empty path as a list, or a whole value followed by more steps: the same write
    as ``cell.set``'s one assignment of ``()``."""
    store.commit([Write(A, 0, 0)])
    assert _commit(store, Write(A, None, 1, (([], {"n": 1}),))) == ONE_UPDATE
    assert _commit(store, Write(A, None, 2, (((), {"n": []}), (("n", 0), 2)))) == ONE_UPDATE
    assert store.load(A) == Stored({"n": [2]}, 3)


def test_the_documents_the_store_keeps_are_bounded_oldest_out(store: SQLiteStore) -> None:
    """One-write commits keep the newest ``CACHED_DOCS`` documents: a patch to the oldest
    kept reads nothing, one to the newest left out reads it first."""
    keys = [DocKey("s", "", f"d{i}") for i in range(CACHED_DOCS + 3)]
    for key in keys:
        store.commit([_whole(key, 0, {"items": ITEMS})])
    assert _commit(store, _push(keys[3], 1, 200, "x")) == APPEND
    assert _commit(store, _push(keys[2], 1, 200, "x")) == [READ,
                                                             *APPEND]
    assert store.load(keys[2]) == Stored({"items": [*ITEMS, "x"]}, 2)


BIG = [f"item {i:05}" for i in range(KEEP_VALUE_UPTO // 10)]  # its JSON: > KEEP_VALUE_UPTO


def test_checked_writes_to_a_large_document_keep_no_value_and_read_to_rebase(
    store: SQLiteStore,
) -> None:
    """``Write.checked`` (the runtime's commits) to a document larger than
    ``KEEP_VALUE_UPTO``: a whole value or a patch is written without a copy kept to check
    later patches against, so the document is held once, by the caller; the log's sizes
    are kept. When the log would outgrow its base, the base is read once (one statement)
    to make the new one."""
    mine: dict[str, Any] = {"items": list(BIG)}
    assert _commit(store, Write(A, None, 0, (((), mine),), True)) == ["INSERT INTO docs"]
    mine["items"].clear()  # the caller's own value, changed after the commit
    assert store._cache[A].value is _UNKNOWN
    n, version, sent = len(BIG), 1, []
    while "DELETE FROM patches" not in sent:
        patch = ((("items", n + version - 1), "z" * 400),)
        sent = _commit(store, Write(A, None, version, patch, True))
        if "DELETE FROM patches" not in sent:
            assert sent == APPEND, version
            assert store._cache[A].value is _UNKNOWN
        version += 1
        assert version < 200, "never compacted"
    assert sent == [READ, *REBASE]
    assert store._cache[A].value is _UNKNOWN
    want = {"items": [*BIG, *["z" * 400] * (version - 1)]}
    assert store.load(A) == Stored(want, version)
    assert _commit(store, Write(A, None, version, ((("items", 0), "a"),), True)) == APPEND


def test_checked_writes_to_a_small_document_keep_a_copy_and_rebase_unread(
    store: SQLiteStore,
) -> None:
    """A small document's log outgrows its base soon: its value is kept (a copy), so the
    new base is made without a read."""
    mine: dict[str, Any] = {"n": [1, 2]}
    store.commit([Write(A, None, 0, (((), mine),), True)])
    mine["n"].clear()
    version, sent = 1, []
    while "DELETE FROM patches" not in sent:
        sent = _commit(store, Write(A, None, version, ((("n", 1 + version), version),), True))
        assert READ not in sent
        version += 1
        assert version < 50, "never compacted"
    assert sent == REBASE
    assert store.load(A) == Stored({"n": [1, 2, *range(1, version)]}, version)


def test_an_unchecked_patch_is_checked_even_after_checked_ones(store: SQLiteStore) -> None:
    store.commit([Write(A, None, 0, (((), {"items": ITEMS}),), True)])
    store.commit([Write(A, None, 1, ((("items", 200), "x"),), True)])
    with pytest.raises(StorageError, match="does not exist"):
        store.commit([_push(A, 2, 500, "far")])
    with pytest.raises(StorageError, match="does not exist"):
        store.commit([Write(A, None, 2, ((("nothing", 0), "x"),))])
    assert store.load(A) == Stored({"items": [*ITEMS, "x"]}, 2)


def test_stores_racing_to_append_to_one_log_lose_nothing(tmp_path: Path) -> None:
    """Three connections (a thread each) appending to one document's log, each retrying
    on a conflict after reading the document again: every append lands exactly once, in
    version order, whatever interleaving the lock gave them."""
    path = tmp_path / "race.db"
    first = SQLiteStore(path)
    first.commit([Write(A, None, 0, (((), {"items": BIG}),), True)])
    first.close()
    per_thread, errors = 40, []

    def appender(name: str) -> None:
        store = SQLiteStore(path)
        try:
            for i in range(per_thread):
                while True:
                    have = store.load(A)
                    assert have is not None
                    patch = ((("items", len(have.value["items"])), f"{name}{i}"),)
                    try:
                        store.commit([Write(A, None, have.version, patch, True)])
                        break
                    except ConflictError:
                        continue
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            store.close()

    threads = [threading.Thread(target=appender, args=(n,)) for n in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT * 6)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    store = SQLiteStore(path)
    try:
        got = store.load(A)
        assert got is not None
        pushed = got.value["items"][len(BIG):]
        assert got.version == 1 + 3 * per_thread
        assert sorted(pushed) == sorted(f"{n}{i}" for n in "abc" for i in range(per_thread))
        for n in "abc":  # each thread's own appends in its order
            assert [x for x in pushed if x[0] == n] == [f"{n}{i}" for i in range(per_thread)]
    finally:
        store.close()


# ------------------------------------------------------------ whole values, wrong guesses


def test_a_patch_of_the_whole_value_is_a_new_base_not_a_log_entry(store: SQLiteStore,
                                                                  tmp_path: Path) -> None:
    """However small the new value: appended, it would be a log entry replayed on a base
    that no longer matters."""
    store.commit([_whole(A, 0, {"items": ITEMS})])
    store.commit([_push(A, 1, 200, "x")])  # a log
    store.commit([_whole(A, 2, {"items": []})])
    assert _rows(tmp_path / "x.db", "SELECT version, value FROM docs") == [
        (3, '{"items":[]}')]
    assert _rows(tmp_path / "x.db", "SELECT count(*) FROM patches") == [(0,)]
    # the empty path later in a patch too: the steps before it apply, the rest build on it
    store.commit([Write(A, None, 3, ((("items", 0), "a"), ((), {"n": []}), (("n", 0), 1)))])
    assert _rows(tmp_path / "x.db", "SELECT version, value FROM docs") == [(4, '{"n":[1]}')]
    assert store.load(A) == Stored({"n": [1]}, 4)


def test_a_log_appended_by_another_store_at_the_same_base_is_a_conflict(
    tmp_path: Path,
) -> None:
    """Behind one store's back the base row keeps its version while another store appends:
    a whole write expecting the base's version must see the log's head, not the base."""
    one, two = SQLiteStore(tmp_path / "x.db"), SQLiteStore(tmp_path / "x.db")
    try:
        one.commit([_whole(A, 0, {"items": ITEMS})])
        two.commit([_push(A, 1, 200, "two")])
        assert _rows(tmp_path / "x.db", "SELECT version FROM docs") == [(1,)]
        with pytest.raises(ConflictError, match=r"'a'.*version 2, the write expected 1"):
            one.commit([_whole(A, 1, "lost")])
        with pytest.raises(ConflictError, match=r"'a'.*version 2, the write expected 1"):
            one.commit([_push(A, 1, 200, "lost")])
        assert one.load(A) == Stored({"items": [*ITEMS, "two"]}, 2)
    finally:
        one.close()
        two.close()


def test_a_stale_whole_write_on_the_quiet_path_is_a_conflict_naming_the_document(
    tmp_path: Path,
) -> None:
    one, two = SQLiteStore(tmp_path / "x.db"), SQLiteStore(tmp_path / "x.db")
    try:
        one.commit([_whole(B, 0, 1)])
        two.commit([_whole(B, 1, 2)])
        with pytest.raises(ConflictError) as info:
            one.commit([_whole(B, 1, "lost")])
        for words in ("'b'", "'user:u'", "version 2", "expected 1", "nothing was committed"):
            assert words in str(info.value)
        with pytest.raises(ConflictError, match=r"already exists at version 2"):
            one.commit([Write(B, "again", 0)])
        assert two.load(B) == Stored(2, 2)
    finally:
        one.close()
        two.close()


def test_a_store_that_does_not_know_of_a_log_finds_it(tmp_path: Path) -> None:
    """A store that never saw the document guesses it has no log; the quiet statement
    refuses, and the locked one drops the log and writes the base."""
    path = tmp_path / "x.db"
    one = SQLiteStore(path)
    try:
        one.commit([_whole(A, 0, {"items": ITEMS})])
        one.commit([_push(A, 1, 200, "x")])
    finally:
        one.close()
    two = SQLiteStore(path)
    try:
        sent = _commit(two, _whole(A, 2, "whole"))
        assert sent[0] == "UPDATE docs SET" and "DELETE FROM patches" in sent
        assert two.load(A) == Stored("whole", 3)
        assert _rows(path, "SELECT count(*) FROM patches") == [(0,)]
    finally:
        two.close()


def test_a_quiet_write_waits_for_a_locked_file_then_raises_store_busy(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    s = SQLiteStore(path, busy_timeout=0.2)
    try:
        s.commit([_whole(A, 0, 1)])
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreBusyError, match="nothing was committed"):
                s.commit([_whole(A, 1, 2)])
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert s.load(A) == Stored(1, 1)
        assert _commit(s, _whole(A, 1, 2)) == ONE_UPDATE
    finally:
        s.close()


# --------------------------------------------------------------- files of the old format

# ``iterdump()`` of a file the code at 5592520 (the format before these commits) wrote:
# "log" has a base and three patches, "small" was compacted, "whole" never had a log. The
# lease's expiry is moved to 2100 and an expired watcher added, both by hand.
OLD_DUMP = """
CREATE TABLE changes (seq INTEGER PRIMARY KEY, origin INTEGER NOT NULL, space TEXT NOT NULL,
    scope TEXT NOT NULL, id TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TABLE docs (space TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL,
    version INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (space, scope, id))
    WITHOUT ROWID;
INSERT INTO "docs" VALUES('app','','log',1,'{"items":["item 0","item 1","item 2","item 3",\
"item 4","item 5","item 6","item 7","item 8","item 9","item 10","item 11","item 12",\
"item 13","item 14","item 15","item 16","item 17","item 18","item 19"]}');
INSERT INTO "docs" VALUES('app','','small',4,'{"n":3}');
INSERT INTO "docs" VALUES('app','user:ann','whole',2,'["a","b"]');
CREATE TABLE heads (space TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL,
    version INTEGER NOT NULL, log_size INTEGER NOT NULL, base_size INTEGER NOT NULL,
    PRIMARY KEY (space, scope, id)) WITHOUT ROWID;
INSERT INTO "heads" VALUES('app','','log',4,72,201);
CREATE TABLE leases (holder TEXT PRIMARY KEY, expires REAL NOT NULL) WITHOUT ROWID;
INSERT INTO "leases" VALUES('holder-1',4102444800.0);
CREATE TABLE patches (space TEXT NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL,
    version INTEGER NOT NULL, patch TEXT NOT NULL, PRIMARY KEY (space, scope, id, version))
    WITHOUT ROWID;
INSERT INTO "patches" VALUES('app','','log',2,'[[["items",20],"new 0"]]');
INSERT INTO "patches" VALUES('app','','log',3,'[[["items",21],"new 1"]]');
INSERT INTO "patches" VALUES('app','','log',4,'[[["items",22],"new 2"]]');
CREATE TABLE watchers (origin INTEGER PRIMARY KEY, expires REAL NOT NULL);
INSERT INTO "watchers" VALUES(12345, 1.0);
"""
LOG, SMALL, WHOLE = (DocKey("app", "", "log"), DocKey("app", "", "small"),
                     DocKey("app", "user:ann", "whole"))
LOG_VALUE = {"items": [f"item {i}" for i in range(20)] + ["new 0", "new 1", "new 2"]}


def test_a_file_of_the_previous_format_opens_reads_and_takes_writes(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(OLD_DUMP)
    db.close()
    s = SQLiteStore(path)
    try:
        assert s.load(LOG) == Stored(LOG_VALUE, 4)
        assert s.load(SMALL) == Stored({"n": 3}, 4)
        assert s.load(WHOLE) == Stored(["a", "b"], 2)
        assert s.versions([LOG, SMALL, WHOLE]) == {LOG: 4, SMALL: 4, WHOLE: 2}
        assert sorted(s.keys("app")) == sorted([LOG, SMALL, WHOLE])
        left = s.lease_remaining("holder-1")
        assert left is not None and left > 0
        # the old log's head moves on (read once, then known; the watcher has expired,
        # so the commit is a quiet one); a whole value replaces a base; conflicts still
        assert _commit(s, _push(LOG, 4, 23, "new 3")) == [READ, *APPEND]
        assert s.commit([_whole(WHOLE, 2, ["c"])]) == {WHOLE: 3}
        assert s.commit([Write(SMALL, None, 4, ((("m",), 1),))]) == {SMALL: 5}
        with pytest.raises(ConflictError, match="version 5"):
            s.commit([_push(LOG, 4, 23, "stale")])
    finally:
        s.close()
    s = SQLiteStore(path)
    try:
        assert s.load(LOG) == Stored({"items": [*LOG_VALUE["items"], "new 3"]}, 5)
        assert s.load(WHOLE) == Stored(["c"], 3)
        assert s.load(SMALL) == Stored({"n": 3, "m": 1}, 5)
        # the log's sizes carried on from the old head's; the small document's patch, longer
        # than its base, became its base
        assert _rows(path, "SELECT id, version, log_size, base_size FROM heads") == [
            ("log", 5, 72 + len('[[["items",23],"new 3"]]'), 201)]
        assert _rows(path, "SELECT value FROM docs WHERE id = 'small'") == [('{"n":3,"m":1}',)]
    finally:
        s.close()


def test_opening_a_file_of_the_previous_format_keeps_only_its_logs(tmp_path: Path) -> None:
    """The previous format's log was the patches above the base up to the head: rows
    outside that (none of its writes left any) are dropped, not replayed, when ``heads``
    becomes a view; a second store opening the file then finds nothing to do."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(OLD_DUMP)
    db.execute("""INSERT INTO patches VALUES ('app', '', 'log', 9, '[[["items",0],"x"]]')""")
    db.execute("""INSERT INTO patches VALUES ('app', '', 'log', 1, '[[["items",0],"x"]]')""")
    db.execute("""INSERT INTO patches VALUES ('app', 'user:ann', 'whole', 3, '[[[0],"x"]]')""")
    db.commit()
    db.close()
    one, two = SQLiteStore(path), SQLiteStore(path)
    try:
        for s in (one, two):
            assert s.load(LOG) == Stored(LOG_VALUE, 4)
            assert s.load(WHOLE) == Stored(["a", "b"], 2)
        assert _rows(path, "SELECT type FROM sqlite_master WHERE name = 'heads'") == [("view",)]
        assert _rows(path, "SELECT version FROM patches ORDER BY version") == [(2,), (3,), (4,)]
        assert _commit(one, _push(LOG, 4, 23, "new 3")) == [READ, *APPEND]
        assert two.load(LOG) == Stored({"items": [*LOG_VALUE["items"], "new 3"]}, 5)
    finally:
        one.close()
        two.close()


# -------------------------------------------------- the previous code on the same file

PREVIOUS = "55925209c9c32d95ca62b61c315855a4e9d7b8c5"  # sqlite.py before these commits


@pytest.fixture
def previous(tmp_path: Path) -> ModuleType:
    """``runtime/storage/sqlite.py`` as of ``PREVIOUS``, imported beside this one (its
    imports are the package's); skipped where git cannot show it (no history)."""
    root = Path(__file__).resolve().parents[2]
    try:
        text = subprocess.run(
            ["git", "show", f"{PREVIOUS}:runtime/storage/sqlite.py"], cwd=root,
            capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"git cannot show sqlite.py at {PREVIOUS[:7]} (no history here)")
    file = tmp_path / "sqlite_previous.py"
    file.write_text(text)
    name = "runtime.storage._sqlite_previous"
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_the_previous_code_reads_this_format_and_cannot_move_a_log_unseen(
    previous: ModuleType, tmp_path: Path,
) -> None:
    """A process of the previous code on a file of this format (an upgrade under way)
    reads what this code wrote, logs and bases alike, through the ``heads`` view. It
    creates documents and writes whole values of documents without a log as before. A
    write that would move a log's head (a patch, or a whole value over a log) fails
    loudly, since a view takes no writes, and changes nothing."""
    path = tmp_path / "mixed.db"
    new = SQLiteStore(path)  # the file in this format first
    old = previous.SQLiteStore(path)
    try:
        new.commit([_whole(A, 0, {"items": ITEMS})])
        model: dict[str, Any] = {"items": list(ITEMS)}
        version = 1
        for i in range(25):  # patches, and whole values now and then
            if i % 10 == 9:
                model = {"items": [f"restart {i}"]}
                new.commit([_whole(A, version, model)])
                model = json.loads(json.dumps(model))
            else:
                new.commit([_push(A, version, len(model["items"]), f"push {i}")])
                model["items"].append(f"push {i}")
            version += 1
            for reader in (old, new):
                assert reader.load(A) == Stored(model, version), (i, reader)
        assert old.versions([A]) == {A: version}
        old.commit([Write(B, "b", 0)])
        old.commit([Write(B, {"items": ITEMS}, 1)])  # no log: the previous code's way
        assert new.load(B) == Stored({"items": ITEMS}, 2)
        with pytest.raises(StorageError, match="heads because it is a view"):
            old.commit([_push(A, version, len(model["items"]), "lost")])
        with pytest.raises(StorageError, match="heads because it is a view"):
            old.commit([_push(B, 2, 200, "lost")])  # B has no log: it would make a head
        with pytest.raises(StorageError, match="heads because it is a view"):
            old.commit([Write(A, "lost", version)])  # a whole value over A's log
        assert new.load(A) == Stored(model, version)
        assert new.load(B) == Stored({"items": ITEMS}, 2)
        new.commit([_push(A, version, len(model["items"]), "after")])
        model["items"].append("after")
        assert old.load(A) == Stored(model, version + 1)
    finally:
        old.close()
        new.close()
    later = previous.SQLiteStore(path)  # the previous code opening the file afresh
    try:
        assert later.load(A) == Stored(model, version + 1)
    finally:
        later.close()


@pytest.mark.anyio
async def test_the_previous_codes_feed_hears_this_codes_commits(previous: ModuleType,
                                                                tmp_path: Path) -> None:
    path = tmp_path / "mixed.db"
    old, new = previous.SQLiteStore(path, feed_interval=0.01), SQLiteStore(path)
    try:
        new.commit([_whole(A, 0, 0)])
        new.commit([_whole(A, 1, 1)])  # quiet: nobody watches yet
        async with old.watch() as feed:
            assert await _first(feed) is RECHECK
            new.commit([_whole(A, 2, 2)])
            assert await _first(feed) == {A: 3}
            new.commit([Write(B, "b", 0)])
            assert await _first(feed) == {B: 1}
    finally:
        old.close()
        new.close()


# ---------------------------------------------------------------- versions() while alone


def test_versions_asked_again_read_no_row_until_another_connection_commits(
        tmp_path: Path) -> None:
    """A dialog asks for its turn's version before every step. While no other connection
    has committed, the answer is what was read last, moved by this store's own commits:
    one ``PRAGMA data_version`` and no row read. Another connection's commit moves
    data_version, and the rows are read again."""
    path = tmp_path / "v.db"
    store, other = SQLiteStore(path), SQLiteStore(path)
    try:
        store.commit([Write(A, {"n": 0})])
        assert _sql(store, lambda: store.versions([A, B])) == [
            "PRAGMA data_version", "BEGIN", "SELECT version, (SELECT", "SELECT version, (SELECT",
            "ROLLBACK"]
        assert _sql(store, lambda: store.versions([A, B])) == ["PRAGMA data_version"]
        store.commit([Write(A, {"n": 1}, expect=1)])
        seen: dict[DocKey, int] = {}
        assert _sql(store, lambda: seen.update(store.versions([B, A]))) == [
            "PRAGMA data_version"]
        assert seen == {A: 2}
        other.commit([Write(B, "b", expect=0)])
        assert _sql(store, lambda: seen.update(store.versions([A, B])))[0:2] == [
            "PRAGMA data_version", "BEGIN"]
        assert seen == {A: 2, B: 1}
        # a key never asked for is read, the others still known
        c = DocKey("s", "", "c")
        assert store.versions([A, c]) == {A: 2}
        assert _sql(store, lambda: store.versions([A, B, c])) == ["PRAGMA data_version"]
    finally:
        store.close()
        other.close()


def test_versions_of_more_documents_than_it_keeps_are_read_every_time(tmp_path: Path) -> None:
    """A recheck of everything a runtime holds is not kept (it would grow with the
    documents held): the next ask of more than ``CURRENT_KEPT`` reads the rows again,
    and a small ask is still answered right."""
    store = SQLiteStore(tmp_path / "v.db")
    try:
        keys = [DocKey("s", "", f"k{i}") for i in range(CURRENT_KEPT + 1)]
        store.commit([Write(k, i, expect=0) for i, k in enumerate(keys)])
        assert store.versions(keys) == dict.fromkeys(keys, 1)
        assert "BEGIN" in _sql(store, lambda: store.versions(keys))
        assert len(store._current) <= CURRENT_KEPT
        store.commit([Write(keys[0], "x", expect=1)])
        assert store.versions(keys[:2]) == {keys[0]: 2, keys[1]: 1}
        assert store.versions(keys[:2]) == {keys[0]: 2, keys[1]: 1}
    finally:
        store.close()


# ---------------------------------------------------------------- the text of checked writes


def _deep(n: int) -> Any:
    value: Any = "bottom"
    for _ in range(n):
        value = [value]
    return value


PLAIN_VALUES = [
    "héllo wörld ✓ 😀 \u2028\u2029 \"quoted\" \\ back\tslash \x00\x1f",
    {"ключ": "значение", "": "empty key", "a\"b": [1, -0.0, 0.1, 1e308, 5e-324]},
    [2**70, -(2**70), 10**30, 1.5, True, False, None],
    {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")},
    _deep(300),  # deeper than pydantic-core writes: json's encoder does
    "lone \ud800 surrogate",  # never from the runtime (it refuses them): written all the same
]


def _same(a: Any, b: Any) -> bool:
    """Equal, counting NaN as equal to NaN (json reads "NaN" back as a new float)."""
    return json.dumps(a) == json.dumps(b)


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=range(len(PLAIN_VALUES)))
def test_checked_writes_read_back_as_written(tmp_path: Path, value: Any) -> None:
    """Checked writes (the runtime's own: plain JSON) are encoded by pydantic-core where
    it can, by json where it cannot: either way a fresh store on the file reads back what
    was written, as a whole value, an appended patch, and a new base."""
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    try:
        store.commit([Write(A, None, 0, (((), {"items": [], "pad": "x" * 4000}),), True)])
        store.commit([Write(A, None, 1, ((("items", 0), value),), True)])  # appended
        store.commit([Write(A, None, 2, ((("items", 1), value),), True),
                      Write(B, None, 0, (((), value),), True)])  # two writes: the plan
        store.commit([Write(A, None, 3, (((), {"items": [value]}),), True)])  # a new base
        store.commit([Write(A, None, 4, ((("items", 1), value),), True)])
    finally:
        store.close()
    fresh = SQLiteStore(path)
    try:
        got = fresh.load(A)
        assert got is not None and got.version == 5
        assert _same(got.value, {"items": [value, value]})
        got_b = fresh.load(B)
        assert got_b is not None and _same(got_b.value, value)
    finally:
        fresh.close()


def test_an_unchecked_write_of_what_is_not_json_is_still_refused(tmp_path: Path) -> None:
    """Only checked writes go through pydantic-core, which would write bytes or a set as
    if they were JSON; anything else still meets json's refusal, and nothing is stored."""
    store = SQLiteStore(tmp_path / "t.db")
    try:
        for bad in (b"bytes", {1, 2}, object()):
            with pytest.raises(StorageError, match="not JSON"):
                store.commit([Write(A, {"x": bad})])
            with pytest.raises(StorageError, match="not JSON"):
                store.commit([Write(A, None, 0, (((), {"x": bad}),))])
        assert store.load(A) is None
    finally:
        store.close()
