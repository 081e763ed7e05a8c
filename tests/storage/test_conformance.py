"""Storage conformance: every backend passes this one module.

Each backend is an entry in ``BACKENDS``: a function that opens (or reopens) the store kept
under a directory. A new backend (PostgreSQL) is one more entry; a backend whose data
outlives ``close()`` is also listed in ``DURABLE`` and gets the reopen tests (and, opened
twice at once, the tests of two stores sharing one database). What only one backend has
(SQLite's patch log, its locking, its processes) is tested at the end, by name.

Leases are timed for real: short TTLs, and every wait is the time ``lease_remaining``
reported (``wait_out``), so no test guesses how long something takes.
"""

from __future__ import annotations

import json
import math
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime.errors
from runtime import (
    MemoryStore,
    PostgresStore,
    Runtime,
    SQLiteStore,
    Store,
    cell,
    handler,
    pattern,
)
from runtime.errors import StoreConfigError
from runtime.storage import (
    ConflictError,
    DocKey,
    StorageError,
    StoreBusyError,
    StoreClosedError,
    Stored,
    Write,
    open_store,
)
from runtime.storage.base import LEASE_COLLECT_AFTER, LEASE_HOLDER_MAX, LEASE_TTL_MAX

Opener = Callable[[Any], Store]  # takes where the store lives: a directory, or a database URL

BACKENDS: dict[str, Opener] = {
    "memory": lambda where: MemoryStore(),
    "sqlite": lambda where: SQLiteStore(where / "docs.db"),
    "postgres": lambda url: PostgresStore(url),
}
DURABLE: dict[str, Opener] = {
    "sqlite": BACKENDS["sqlite"],
    "postgres": BACKENDS["postgres"],
}


def where(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Where a backend's store lives: a fresh database of the run's throwaway PostgreSQL
    cluster (``tests/postgres.py``), else the test's directory."""
    return request.getfixturevalue("pg_url") if name == "postgres" else tmp_path


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = BACKENDS[request.param](where(request.param, request, tmp_path))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=sorted(DURABLE))
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the durable backend's store in one place (call it again to reopen)."""
    opener = DURABLE[request.param]
    place = where(request.param, request, tmp_path)
    return lambda: opener(place)


A = DocKey("space-a", "", "doc-1")
B = DocKey("space-a", "", "doc-2")
C = DocKey("space-a", "user:alice", "doc-1")


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON, with types compared strictly (1 != 1.0 != True)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(same_json(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# ------------------------------------------------------------------------- basic contract


def test_load_missing_is_none(store: Store) -> None:
    assert store.load(A) is None
    assert list(store.keys("space-a")) == []


def test_commit_then_load(store: Store) -> None:
    versions = store.commit([Write(A, {"title": "milk", "done": False})])
    assert versions == {A: 1}
    got = store.load(A)
    assert got == Stored({"title": "milk", "done": False}, 1)
    assert got is not None and got.version == 1


def test_versions_increase_by_one_per_write(store: Store) -> None:
    for n in range(1, 6):
        assert store.commit([Write(A, n)]) == {A: n}
        assert store.load(A) == Stored(n, n)
    # another document has its own version count
    assert store.commit([Write(B, "x"), Write(A, 99)]) == {B: 1, A: 6}
    assert store.load(B) == Stored("x", 1)
    assert store.load(A) == Stored(99, 6)


def test_writing_an_equal_value_is_still_a_new_version(store: Store) -> None:
    store.commit([Write(A, [1, 2])])
    assert store.commit([Write(A, [1, 2])]) == {A: 2}
    assert store.load(A) == Stored([1, 2], 2)


def test_multi_write_commit_applies_every_write(store: Store) -> None:
    store.commit([Write(A, "a0")])
    versions = store.commit([Write(A, "a1", expect=1), Write(B, "b1", expect=0), Write(C, 3)])
    assert versions == {A: 2, B: 1, C: 1}
    assert [store.load(k) for k in (A, B, C)] == [Stored("a1", 2), Stored("b1", 1), Stored(3, 1)]


# ------------------------------------------------------------------- optimistic concurrency


def test_expect_matching_version_commits(store: Store) -> None:
    assert store.commit([Write(A, "first", expect=0)]) == {A: 1}
    assert store.commit([Write(A, "second", expect=1)]) == {A: 2}
    assert store.load(A) == Stored("second", 2)


@pytest.mark.parametrize("expect", [1, 3, 7])
def test_expect_on_a_missing_document_conflicts(store: Store, expect: int) -> None:
    with pytest.raises(ConflictError, match=r"version 0.*expected " + str(expect)):
        store.commit([Write(A, "x", expect=expect)])
    assert store.load(A) is None


@pytest.mark.parametrize("expect", [0, 1, 3])
def test_expect_stale_version_conflicts_and_keeps_the_value(store: Store, expect: int) -> None:
    store.commit([Write(A, "v1")])
    store.commit([Write(A, "v2")])
    with pytest.raises(ConflictError) as info:
        store.commit([Write(A, "lost", expect=expect)])
    assert "version 2" in str(info.value) and f"expected {expect}" in str(info.value)
    assert store.load(A) == Stored("v2", 2)
    # and the next unconditional write continues from the real version
    assert store.commit([Write(A, "v3")]) == {A: 3}


@pytest.mark.parametrize("bad", [0, 1, 2], ids=["first", "middle", "last"])
def test_a_conflict_on_one_write_commits_none_of_them(store: Store, bad: int) -> None:
    store.commit([Write(A, "a1"), Write(B, "b1")])
    before = {k: store.load(k) for k in (A, B, C)}
    keys = [A, B, C]
    expects = {A: 1, B: 1, C: 0}  # the right versions; one write gets a wrong one
    writes = [
        Write(k, f"new-{i}", expect=(99 if i == bad else expects[k])) for i, k in enumerate(keys)
    ]
    with pytest.raises(ConflictError):
        store.commit(writes)
    assert {k: store.load(k) for k in (A, B, C)} == before
    assert sorted(store.keys("space-a")) == sorted([A, B])
    # the same batch with the right expectations commits as a whole
    fixed = [Write(k, f"new-{i}", expect=expects[k]) for i, k in enumerate(keys)]
    assert store.commit(fixed) == {A: 2, B: 2, C: 1}


def test_empty_commit_changes_nothing(store: Store) -> None:
    store.commit([Write(A, 1)])
    assert store.commit([]) == {}
    assert store.load(A) == Stored(1, 1)


# --------------------------------------------------------------------- spaces and scopes


def test_keys_are_isolated_between_spaces(store: Store) -> None:
    other = DocKey("space-b", "", "doc-1")  # same id, other space
    store.commit([Write(A, "in a"), Write(B, "also a"), Write(other, "in b")])
    assert sorted(store.keys("space-a")) == sorted([A, B])
    assert list(store.keys("space-b")) == [other]
    assert list(store.keys("space-c")) == []
    assert store.load(A) == Stored("in a", 1)
    assert store.load(other) == Stored("in b", 1)


def test_scopes_are_separate_documents(store: Store) -> None:
    bob = DocKey("space-a", "user:bob", "doc-1")
    session = DocKey("space-a", "session:s1", "doc-1")
    store.commit([Write(A, "shared")])
    assert store.load(C) is None and store.load(bob) is None
    store.commit([Write(C, "alice's"), Write(bob, "bob's")])
    store.commit([Write(C, "alice's again")])
    assert store.load(A) == Stored("shared", 1)
    assert store.load(C) == Stored("alice's again", 2)
    assert store.load(bob) == Stored("bob's", 1)
    assert store.load(session) is None
    assert sorted(store.keys("space-a")) == sorted([A, C, bob])
    # an expect on one scope is checked against that scope's version only
    with pytest.raises(ConflictError):
        store.commit([Write(bob, "x", expect=2)])
    assert store.commit([Write(bob, "x", expect=1)]) == {bob: 2}


def test_keys_returns_doc_keys(store: Store) -> None:
    store.commit([Write(C, 1)])
    (key,) = list(store.keys("space-a"))
    assert isinstance(key, DocKey)
    assert (key.space, key.scope, key.id) == ("space-a", "user:alice", "doc-1")


# ------------------------------------------------------------------------ JSON round trip

ROUND_TRIP = {
    "nested": {"a": {"b": {"c": [1, [2, [3, {"d": None}]], {}], "e": []}}, "z": "last"},
    "unicode": {"naïve ☕": "日本語 — \u00e9\u0301 🎉", "quote\"back\\slash": "tab\tnl\n\u0000"},
    "floats": [0.1, -0.0, 1.0, 1e308, 5e-324, 2.5e-10, 123456789.123456789, -3.75],
    "ints_and_bools": [0, -1, 2**63, -(2**70), True, False, 1],
    "nulls": [None, {"k": None}],
    "scalars_str": "just a string",
    "scalar_int": 42,
    "scalar_float": 4.0,
    "scalar_null": None,
    "scalar_bool": False,
    "key_order": {"z": 1, "a": 2, "m": 3},
    "pointer_chars": {"a/b": {"c~d": 1}, "": "empty key"},
    "link_like": {"@link": "/abc/x~1y", "scope": "user:alice"},
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIP))
def test_json_round_trip(store: Store, name: str) -> None:
    value = ROUND_TRIP[name]
    store.commit([Write(A, value)])
    got = store.load(A)
    assert got is not None
    assert same_json(got.value, value), (got.value, value)
    if type(value) is dict:
        assert list(got.value) == list(value)  # key order survives


def test_negative_zero_and_float_ints_keep_their_type(store: Store) -> None:
    store.commit([Write(A, {"f": 1.0, "i": 1, "b": True, "nz": -0.0})])
    got = store.load(A)
    assert got is not None
    v = got.value
    assert type(v["f"]) is float and type(v["i"]) is int and type(v["b"]) is bool
    assert str(v["nz"]) == "-0.0"


# -------------------------------------------------------------------------- durability


def test_reopen_finds_committed_data(reopen: Callable[[], Store]) -> None:
    s = reopen()
    s.commit([Write(A, {"items": ["milk"]})])
    s.commit([Write(A, {"items": ["milk", "eggs"]}, expect=1), Write(C, "alice")])
    with pytest.raises(ConflictError):
        s.commit([Write(B, "never", expect=5)])
    s.close()

    s = reopen()
    try:
        assert s.load(A) == Stored({"items": ["milk", "eggs"]}, 2)
        assert s.load(C) == Stored("alice", 1)
        assert s.load(B) is None
        assert sorted(s.keys("space-a")) == sorted([A, C])
        # versions continue where they were
        assert s.commit([Write(A, "next", expect=2)]) == {A: 3}
    finally:
        s.close()
    s = reopen()
    try:
        assert s.load(A) == Stored("next", 3)
    finally:
        s.close()


def test_reopen_round_trips_every_json_sample(reopen: Callable[[], Store]) -> None:
    s = reopen()
    s.commit([Write(DocKey("rt", "", name), value) for name, value in ROUND_TRIP.items()])
    s.close()
    s = reopen()
    try:
        for name, value in ROUND_TRIP.items():
            got = s.load(DocKey("rt", "", name))
            assert got is not None and same_json(got.value, value), name
    finally:
        s.close()


@handler
def _add(event: Any, items: Any) -> None:
    items.push(event["title"])


@pattern
def _todo(title: Any) -> dict[str, Any]:
    items = cell([], schema={"type": "array", "items": {"type": "string"}}, name="items")
    mine = cell({"seen": 0}, scope="user", name="mine")
    return {"title": title, "items": items, "mine": mine, "add": _add(items=items)}


@pytest.mark.anyio
async def test_runtime_on_sqlite_resumes_the_same_documents(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with Runtime(store=url) as rt:
        inst = rt.run(_todo, {"title": "Groceries"}, space="home", user="alice")
        await inst.send("add", {"title": "milk"})
        inst.result.key("mine").update({"seen": 3})
        keys = sorted(rt.store.keys("home"))
        stored = {k: rt.store.load(k) for k in keys}
    async with Runtime(store=url) as rt:
        assert sorted(rt.store.keys("home")) == keys
        inst = rt.run(_todo, {"title": "Groceries"}, space="home", user="alice")
        assert inst.result.key("items").get() == ["milk"]
        assert inst.result.key("mine").get() == {"seen": 3}
        assert inst.result.key("title").get() == "Groceries"
        # re-running declared nothing new and found the same versions of the state
        items_key = inst.result.key("items").resolve()
        assert rt.store.load(DocKey("home", items_key.scope, items_key.id)) == stored[
            DocKey("home", items_key.scope, items_key.id)
        ]
        await inst.send("add", {"title": "eggs"})
        assert inst.result.key("items").get() == ["milk", "eggs"]
        # another user sees the shared items but their own copy of the user cell
        bob = rt.run(_todo, {"title": "Groceries"}, space="home", user="bob")
        assert bob.result.key("items").get() == ["milk", "eggs"]
        assert bob.result.key("mine").get() == {"seen": 0}


def test_sqlite_file_holds_plain_json(tmp_path: Path) -> None:
    """The file is a real SQLite database holding JSON text (readable by other tools)."""
    import sqlite3

    s = SQLiteStore(tmp_path / "x.db")
    s.commit([Write(A, {"k": ["v", 1.5, None]})])
    s.close()
    db = sqlite3.connect(tmp_path / "x.db")
    try:
        ((text, version),) = db.execute("SELECT value, version FROM docs").fetchall()
    finally:
        db.close()
    assert json.loads(text) == {"k": ["v", 1.5, None]} and version == 1


# -------------------------------------------------------------------------- open_store


def test_open_store_memory() -> None:
    s = open_store("memory")
    assert isinstance(s, MemoryStore)
    assert s.load(A) is None


def test_open_store_sqlite_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "sub.db"
    s = open_store(f"sqlite:///{path}")
    try:
        assert isinstance(s, SQLiteStore)
        s.commit([Write(A, 1)])
    finally:
        s.close()
    assert path.exists()
    s = SQLiteStore(path)
    try:
        assert s.load(A) == Stored(1, 1)
    finally:
        s.close()


def test_open_store_sqlite_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = open_store("sqlite:///rel.db")
    s.close()
    assert (tmp_path / "rel.db").exists()


def test_open_store_passes_a_store_through(store: Store) -> None:
    assert open_store(store) is store


class _DocumentsOnly:
    """A store from before leases: documents, no leases."""

    def load(self, key: DocKey) -> None: ...
    def commit(self, writes: Any) -> dict[DocKey, int]: return {}
    def keys(self, space: str) -> list[DocKey]: return []
    def close(self) -> None: ...


def test_open_store_names_what_a_store_lacks() -> None:
    with pytest.raises(StoreConfigError) as info:
        open_store(_DocumentsOnly())  # type: ignore[arg-type]
    message = str(info.value)
    for words in ("_DocumentsOnly is not a Store", "lacks renew_lease, lease_remaining, "
                  "release_lease", "runtime.storage.base.Store"):
        assert words in message, (words, message)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("sqlite:///", ["needs a path", "sqlite:///"]),
        ("mysql://db/app", ["unknown store", "mysql://db/app", "memory", "sqlite:///",
                            "postgresql://"]),
        ("sqlite://app.db", ["unknown store", "sqlite://app.db", "sqlite:///"]),
        ("Memory", ["unknown store", "'Memory'", "memory"]),
        ("", ["unknown store", "memory"]),
    ],
)
def test_open_store_rejects_bad_specs_clearly(spec: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        open_store(spec)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_open_store_a_postgres_server_it_cannot_reach_is_named_without_the_password(
    tmp_path: Path,
) -> None:
    url = f"postgresql://app:s3cret-pw@/app?host={tmp_path}&port=1&connect_timeout=2"
    with pytest.raises(StorageError) as info:
        open_store(url)
    message = str(info.value)
    assert "cannot open PostgreSQL store" in message and str(tmp_path) in message
    assert "s3cret-pw" not in message and "app:***@" in message
    assert "s3cret-pw" not in repr(info.value.__cause__ or "")


@pytest.mark.parametrize(("query", "words"), [
    ("pool_size=0", ["pool_size", "1 to 100", "got 0"]),
    ("pool_size=x", ["pool_size", "'x'"]),
    ("prepare=maybe", ["prepare", "on or off", "PgBouncer"]),
    ("busy_timeout=-1", ["busy_timeout", ">= 0"]),
    ("busy_timeout=nan", ["busy_timeout"]),
])
def test_open_store_rejects_bad_postgres_options_clearly(query: str, words: list[str]) -> None:
    with pytest.raises(StoreConfigError) as info:
        open_store(f"postgresql://me:pw@localhost/db?{query}")
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert ":pw@" not in str(info.value)


def test_postgres_options_reach_the_store(pg_url: str) -> None:
    s = open_store(f"{pg_url}&pool_size=2&prepare=off&busy_timeout=1.5")
    try:
        assert isinstance(s, PostgresStore)
        assert (s.options.pool_size, s.options.prepare, s.options.busy_timeout) == (
            2, False, 1.5)
        s.commit([Write(A, 1)])
        assert s.load(A) == Stored(1, 1)
    finally:
        s.close()


def test_the_storage_errors_are_the_runtime_errors() -> None:
    for name in ("StorageError", "ConflictError", "StoreBusyError", "StoreClosedError"):
        assert getattr(runtime.storage, name) is getattr(runtime.errors, name)
    assert issubclass(ConflictError, runtime.errors.CelldialogError)


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("timeout=2", ["unknown option 'timeout'", "busy_timeout"]),
        ("busy_timeout=soon", ["busy_timeout", "'soon'", ">= 0"]),
        ("busy_timeout=-1", ["busy_timeout", "'-1'"]),
        ("busy_timeout", ["busy_timeout", "''"]),
    ],
)
def test_open_store_rejects_bad_sqlite_options_clearly(
    tmp_path: Path, query: str, words: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        open_store(f"sqlite:///{tmp_path / 'o.db'}?{query}")
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert not (tmp_path / "o.db").exists()


def test_open_store_takes_the_busy_timeout_from_the_url(tmp_path: Path) -> None:
    s = open_store(f"sqlite:///{tmp_path / 'o.db'}?busy_timeout=2.5")
    try:
        assert isinstance(s, SQLiteStore) and s.busy_timeout == 2.5
        assert s.path == str(tmp_path / "o.db")
    finally:
        s.close()
    s = open_store(f"sqlite:///{tmp_path / 'o.db'}")
    try:
        assert isinstance(s, SQLiteStore) and s.busy_timeout == 5.0
    finally:
        s.close()


# ---------------------------------------------------------------- create-if-absent, conflicts


def test_create_if_absent_on_an_existing_document_conflicts_and_commits_nothing(
    store: Store,
) -> None:
    store.commit([Write(A, "mine")])
    with pytest.raises(ConflictError, match=r"already exists at version 1.*expected 0"):
        store.commit([Write(B, "b", expect=0), Write(A, "theirs", expect=0), Write(C, 1)])
    assert store.load(A) == Stored("mine", 1)
    assert store.load(B) is None and store.load(C) is None
    assert list(store.keys("space-a")) == [A]
    assert store.commit([Write(B, "b", expect=0)]) == {B: 1}


def test_a_conflict_says_another_writer_changed_it_and_how_to_retry(store: Store) -> None:
    store.commit([Write(C, 1), Write(C, 2)])  # two writes of one key: version 2
    with pytest.raises(ConflictError) as info:
        store.commit([Write(C, 3, expect=1)])
    message = str(info.value)
    for words in ("another writer", "'doc-1'", "'space-a'", "'user:alice'", "version 2",
                  "expected 1", "nothing was committed", "Re-read", "apply your change again"):
        assert words in message, (words, message)


def test_writes_of_one_key_in_one_commit_apply_in_order(store: Store) -> None:
    assert store.commit([Write(A, "one", expect=0), Write(A, "two", expect=1)]) == {A: 2}
    assert store.load(A) == Stored("two", 2)
    with pytest.raises(ConflictError):
        store.commit([Write(A, "three", expect=2), Write(A, "four", expect=2)])
    assert store.load(A) == Stored("two", 2)


# ----------------------------------------------------------------------------- patches


def push(key: DocKey, version: int, path: tuple[Any, ...], value: Any) -> Write:
    return Write(key, None, expect=version, patch=((path, value),))


def test_a_patch_assigns_appends_and_replaces(store: Store) -> None:
    store.commit([Write(A, {"items": ["milk"], "meta": {"n": 1}})])
    steps = (
        (("items", 1), "eggs"),             # index == len appends
        (("items", 0), "oat milk"),         # an index < len replaces
        (("meta", "n"), 2),                 # an existing key
        (("meta", "tags"), []),             # a new key
        (("meta", "tags", 0), {"t": "x"}),  # into what an earlier step made
        (("meta", "tags", 0, "t"), "y"),
    )
    assert store.commit([Write(A, None, expect=1, patch=steps)]) == {A: 2}
    want = {"items": ["oat milk", "eggs"], "meta": {"n": 2, "tags": [{"t": "y"}]}}
    got = store.load(A)
    assert got is not None and got.version == 2 and same_json(got.value, want)
    assert store.commit([Write(A, None, expect=2, patch=(((), [1.0]), ((1,), True)))]) == {A: 3}
    got = store.load(A)
    assert got is not None and same_json(got.value, [1.0, True])


def test_a_patch_creates_a_document_from_the_empty_path(store: Store) -> None:
    steps = (((), {"items": []}), (("items", 0), "first"))
    assert store.commit([Write(A, None, expect=0, patch=steps)]) == {A: 1}
    assert store.load(A) == Stored({"items": ["first"]}, 1)
    with pytest.raises(StorageError, match="empty path"):
        store.commit([Write(B, None, expect=0, patch=((("items",), []),))])
    assert store.load(B) is None


def test_a_patch_without_expect_is_refused() -> None:
    with pytest.raises(TypeError, match=r"patch needs expect.*expect=<the version"):
        Write(A, None, patch=((("x",), 1),))
    made = Write(A, None, 3, ((("x",), 1),))
    with pytest.raises(TypeError, match=r"patch needs expect"):  # a copy is checked too
        made._replace(expect=None)
    with pytest.raises(TypeError, match=r"patch needs expect"):
        Write._make((A, None, None, ((("x",), 1),), False))
    assert made._replace(expect=4).expect == 4 and made._replace(expect=4).patch == made.patch


@pytest.mark.parametrize(
    ("path", "where"),
    [
        (("nope", "x"), r"/nope/x does not exist \(no key 'nope' at /\)"),
        (("items", 3), r"/items/3 does not exist \(no index 3 in a list of 2 at /items\)"),
        (("items", -1), r"/items/-1 does not exist"),
        (("items", "0"), r"/items/0 does not exist"),
        (("meta", 0), r"/meta/0 does not exist \(an object's keys are strings"),
        (("items", 0, "x"), r"/items/0/x does not exist \(str has no children at /items/0\)"),
        (("meta", "n", "deeper", "still"), r"/meta/n/deeper/still does not exist"),
    ],
)
def test_a_patch_to_a_path_that_does_not_exist_commits_nothing(
    store: Store, path: tuple[Any, ...], where: str
) -> None:
    store.commit([Write(A, {"items": ["milk"], "meta": {"n": 1}}), Write(B, [0])])
    before = {k: store.load(k) for k in (A, B)}
    good = ((("items", 1), "eggs"), (("meta", "n"), 5))  # applied in place, then undone
    writes = [push(B, 1, (1,), 1), Write(A, None, expect=1, patch=(*good, (path, "v")))]
    with pytest.raises(StorageError, match=where) as info:
        store.commit(writes)
    assert "nothing was committed" in str(info.value)
    assert {k: store.load(k) for k in (A, B)} == before
    # the store is not left half-patched: the good steps apply to the old value
    assert store.commit([Write(A, None, expect=1, patch=good)]) == {A: 2}
    assert store.load(A) == Stored({"items": ["milk", "eggs"], "meta": {"n": 5}}, 2)


def test_a_patch_applies_to_the_version_it_expects(store: Store) -> None:
    store.commit([Write(A, [1])])
    store.commit([push(A, 1, (1,), 2)])
    with pytest.raises(ConflictError, match=r"version 2.*expected 1"):
        store.commit([push(A, 1, (1,), "stale")])
    assert store.load(A) == Stored([1, 2], 2)


def test_a_stale_patch_is_a_conflict_even_where_its_path_no_longer_exists(
    store: Store,
) -> None:
    store.commit([Write(A, {"sub": {"x": 1}})])
    store.commit([push(A, 1, ("sub", "x"), 2)])
    store.commit([Write(A, {"other": True}, expect=2)])  # another writer: /sub is gone
    with pytest.raises(ConflictError, match=r"version 3.*expected 2"):
        store.commit([push(A, 2, ("sub", "x"), 3)])
    assert store.load(A) == Stored({"other": True}, 3)


def test_patches_of_one_key_in_one_commit_apply_in_order_through_a_compaction(
    store: Store,
) -> None:
    """The log outgrows the small base at the first patch (a compaction), and the second
    patch of the same commit changes the value the first produced."""
    store.commit([Write(A, {"a": {}})])
    writes = [Write(A, None, expect=1, patch=((("big",), "x" * 200),)),
              # replayed on a value that already had it, this patch could not apply
              Write(A, None, expect=2, patch=((("a", "b"), 1), (("a",), 5)))]
    assert store.commit(writes) == {A: 3}
    want = {"a": 5, "big": "x" * 200}
    assert store.load(A) == Stored(want, 3)
    assert store.commit([push(A, 3, ("c",), [1])]) == {A: 4}
    assert store.load(A) == Stored({**want, "c": [1]}, 4)


def test_a_document_created_by_a_patch_can_be_patched_in_the_same_commit(
    store: Store,
) -> None:
    writes = [Write(A, None, expect=0, patch=(((), {"a": 0}),)),
              Write(A, None, expect=1, patch=((("a",), 1),))]
    assert store.commit(writes) == {A: 2}
    assert store.load(A) == Stored({"a": 1}, 2)


def test_values_go_in_and_out_as_copies(store: Store) -> None:
    """The runtime changes its own copy in place after a commit; the store's must not."""
    value = {"items": [{"t": "milk"}]}
    store.commit([Write(A, value)])
    value["items"].append({"t": "leaked"})
    value["items"][0]["t"] = "leaked"
    pushed = {"t": "eggs", "tags": []}
    store.commit([push(A, 1, ("items", 1), pushed)])
    pushed["tags"].append("leaked")
    got = store.load(A)
    assert got == Stored({"items": [{"t": "milk"}, {"t": "eggs", "tags": []}]}, 2)
    assert got is not None
    got.value["items"].clear()
    store.commit([push(A, 2, ("items", 2), "bread")])  # after a patch too
    again = store.load(A)
    assert again is not None and again.value["items"][0] == {"t": "milk"}
    assert len(again.value["items"]) == 3


_SAMPLES = ['0', '7', '"s"', 'null', 'true', '1.5', '[]', '{}', '[1, 2]', '{"a": [], "b": {}}']


Steps = tuple[tuple[tuple[Any, ...], Any], ...]


def _random_patch(rng: random.Random, doc: Any) -> tuple[Steps, Any]:
    """Valid steps against ``doc``, and the value they make (``doc`` is changed in place)."""
    steps = []
    for _ in range(rng.randint(1, 4)):
        value = json.loads(rng.choice(_SAMPLES))  # a fresh object each time
        path: tuple[Any, ...] = ()
        node = doc
        while type(node) in (dict, list) and node and rng.random() < 0.7:
            k = rng.choice(list(node)) if type(node) is dict else rng.randrange(len(node))
            if type(node[k]) not in (dict, list):
                break
            path, node = (*path, k), node[k]
        if rng.random() < 0.03 or type(node) not in (dict, list):
            path, doc = (), json.loads(json.dumps(value))
        elif type(node) is dict:
            k = rng.choice([*node, f"k{rng.randrange(6)}"])
            path = (*path, k)
            node[k] = json.loads(json.dumps(value))
        else:
            i = rng.randrange(len(node) + 1)
            path = (*path, i)
            if i == len(node):
                node.append(json.loads(json.dumps(value)))
            else:
                node[i] = json.loads(json.dumps(value))
        steps.append((path, value))
    return tuple(steps), doc


@pytest.mark.parametrize("seed", range(3))
def test_random_patches_load_as_the_values_they_make(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    model: Any = {"items": [f"item-{i}" for i in range(30)], "meta": {}}
    store.commit([Write(A, model)])
    model = json.loads(json.dumps(model))
    version = 1
    for n in range(150):
        if n % 50 == 49:
            model = {"restart": [n]}
            store.commit([Write(A, model, expect=version)])
            model = json.loads(json.dumps(model))
        else:
            steps, model = _random_patch(rng, model)
            store.commit([Write(A, None, expect=version, patch=steps)])
        version += 1
        got = store.load(A)
        assert got is not None and got.version == version
        assert same_json(got.value, model), (n, got.value, model)


def test_reopen_replays_the_patches(reopen: Callable[[], Store]) -> None:
    rng = random.Random(7)
    s = reopen()
    model: Any = {"items": [f"item-{i}" for i in range(200)]}
    s.commit([Write(A, model)])
    model = json.loads(json.dumps(model))
    for version in range(1, 60):
        steps, model = _random_patch(rng, model)
        s.commit([Write(A, None, expect=version, patch=steps)])
    s.close()
    s = reopen()
    try:
        got = s.load(A)
        assert got is not None and got.version == 60 and same_json(got.value, model)
        s.commit([push(A, 60, (), "whole")])
    finally:
        s.close()
    s = reopen()
    try:
        assert s.load(A) == Stored("whole", 61)
    finally:
        s.close()


# ------------------------------------------------------------------------------- leases


def wait_out(store: Store, holder: str, bound: float = 10.0) -> float:
    """Sleep until ``store`` says ``holder``'s lease has expired, each time for as long as
    it says is left; return the (zero or negative) time left then."""
    give_up = time.monotonic() + bound
    while True:
        left = store.lease_remaining(holder)
        assert left is not None, f"the lease of {holder!r} vanished before it expired"
        if left <= 0:
            return left
        assert time.monotonic() < give_up, f"the lease of {holder!r} never expired ({left} s)"
        time.sleep(left)


def test_a_lease_is_taken_extended_and_released(store: Store) -> None:
    assert store.lease_remaining("proc-1") is None  # never taken
    assert store.renew_lease("proc-1", 30) is True
    left = store.lease_remaining("proc-1")
    assert left is not None and 29 < left <= 30
    assert store.renew_lease("proc-1", 60) is True  # extended to now + ttl
    left = store.lease_remaining("proc-1")
    assert left is not None and 59 < left <= 60
    assert store.renew_lease("proc-1", 5) is True  # a shorter ttl shortens it
    left = store.lease_remaining("proc-1")
    assert left is not None and 4 < left <= 5
    store.release_lease("proc-1")
    assert store.lease_remaining("proc-1") is None
    store.release_lease("proc-1")  # released twice, or never taken: nothing happens
    store.release_lease("never-taken")
    assert store.renew_lease("proc-1", 30) is True  # a released lease is absent: taken anew


def test_a_lease_expires_after_its_ttl_not_before(store: Store) -> None:
    started = time.monotonic()
    assert store.renew_lease("short", 0.2) is True
    left = store.lease_remaining("short")
    assert left is not None and 0 < left <= 0.2
    assert wait_out(store, "short") <= 0
    assert time.monotonic() - started >= 0.2 * 0.95  # it lasted its ttl (clocks differ a hair)
    left = store.lease_remaining("short")
    assert left is not None and left <= 0  # expired, and still known as expired


def test_an_expired_lease_is_lost_not_revived(store: Store) -> None:
    assert store.renew_lease("lost", 0.2) is True
    before = wait_out(store, "lost")
    assert store.renew_lease("lost", 30) is False
    assert store.renew_lease("lost", 30) is False  # and stays lost
    after = store.lease_remaining("lost")
    assert after is not None and after <= before <= 0  # not extended: it only ages


def test_holders_are_independent(store: Store) -> None:
    assert store.renew_lease("one", 0.2) and store.renew_lease("two", 30)
    wait_out(store, "one")
    assert store.renew_lease("one", 30) is False
    assert store.renew_lease("two", 30) is True  # one's loss is not two's
    store.release_lease("two")
    assert store.lease_remaining("two") is None
    left = store.lease_remaining("one")
    assert left is not None and left <= 0  # releasing two left one as it was
    assert store.renew_lease("three", 30)
    store.release_lease("one")
    left = store.lease_remaining("three")
    assert left is not None and left > 29


def test_every_allowed_holder_character_and_the_longest_holder_work(store: Store) -> None:
    for holder in ("A-Za-z0-9_.", "x" * LEASE_HOLDER_MAX, "0", "3f2a" * 8):
        assert store.renew_lease(holder, LEASE_TTL_MAX) is True
        left = store.lease_remaining(holder)
        assert left is not None and left > LEASE_TTL_MAX - 1
        store.release_lease(holder)
        assert store.lease_remaining(holder) is None


BAD_HOLDERS: dict[str, tuple[Any, str]] = {
    "empty": ("", "empty string"),
    "slash": ("space/proc", "'/' (at index 5)"),
    "colon": ("host:1234", "':' (at index 4)"),
    "space": ("my proc", "' ' (at index 2)"),
    "newline": ("proc\n", "'\\n' (at index 4)"),
    "nul": ("proc\x00x", "'\\x00' (at index 4)"),
    "non-ascii": ("café", "'é' (at index 3)"),
    "too long": ("x" * (LEASE_HOLDER_MAX + 1), f"{LEASE_HOLDER_MAX + 1} characters"),
    "1 MB": ("x" * 1_000_000, "1000000 characters"),
    "None": (None, "NoneType"),
    "int": (7, "int 7"),
    "bytes": (b"proc", "bytes"),
}
LEASE_CALLS: dict[str, Callable[[Store, Any], Any]] = {
    "renew_lease": lambda s, holder: s.renew_lease(holder, 30),
    "lease_remaining": lambda s, holder: s.lease_remaining(holder),
    "release_lease": lambda s, holder: s.release_lease(holder),
}


@pytest.mark.parametrize("call", sorted(LEASE_CALLS))
@pytest.mark.parametrize("bad", sorted(BAD_HOLDERS))
def test_a_bad_holder_is_refused_naming_what_is_wrong(store: Store, call: str,
                                                      bad: str) -> None:
    holder, words = BAD_HOLDERS[bad]
    with pytest.raises(StoreConfigError) as info:
        LEASE_CALLS[call](store, holder)
    message = str(info.value)
    for expected in (f"{call}()", "lease holder", "A-Z a-z 0-9 - _ .", words):
        assert expected in message, (expected, message)
    assert len(message) < 400  # a megabyte of input is not quoted back


BAD_TTLS: dict[str, tuple[Any, str]] = {
    "zero": (0, "int 0"),
    "negative": (-1.5, "float -1.5"),
    "nan": (math.nan, "float nan"),
    "inf": (math.inf, "float inf"),
    "over the cap": (LEASE_TTL_MAX + 1, "3601"),
    "huge": (1e300, "1e+300"),
    "a bool": (True, "bool True"),
    "a string": ("5", "str '5'"),
    "None": (None, "NoneType"),
}


@pytest.mark.parametrize("bad", sorted(BAD_TTLS))
def test_a_bad_ttl_is_refused_before_anything_is_written(store: Store, bad: str) -> None:
    ttl, words = BAD_TTLS[bad]
    with pytest.raises(StoreConfigError) as info:
        store.renew_lease("proc-1", ttl)
    message = str(info.value)
    for expected in ("renew_lease()", "ttl", "> 0", f"<= {LEASE_TTL_MAX:g}", words):
        assert expected in message, (expected, message)
    assert store.lease_remaining("proc-1") is None


def test_two_stores_on_one_database_share_its_leases(reopen: Callable[[], Store]) -> None:
    one, two = reopen(), reopen()
    try:
        assert one.renew_lease("proc-a", 30) is True
        left = two.lease_remaining("proc-a")
        assert left is not None and 29 < left <= 30
        assert two.renew_lease("proc-a", 60) is True  # a lease is its holder's, not a store's
        left = one.lease_remaining("proc-a")
        assert left is not None and left > 59
        assert two.renew_lease("short", 0.2) is True
        wait_out(one, "short")
        assert one.renew_lease("short", 30) is False and two.renew_lease("short", 30) is False
        one.release_lease("proc-a")
        assert two.lease_remaining("proc-a") is None
    finally:
        one.close()
        two.close()


def test_a_lease_outlives_the_store_that_took_it(reopen: Callable[[], Store]) -> None:
    """A process that dies without releasing leaves its lease to expire: closing (or losing)
    the store object is not a release."""
    first = reopen()
    assert first.renew_lease("crashed", 30) is True
    first.close()
    again = reopen()
    try:
        left = again.lease_remaining("crashed")
        assert left is not None and 28 < left <= 30
    finally:
        again.close()


# ------------------------------------------------------------------------------ closing


def test_a_closed_store_refuses_every_call(store: Store) -> None:
    store.commit([Write(A, 1)])
    store.close()
    for call in (lambda: store.load(A), lambda: store.commit([Write(A, 2)]),
                 lambda: store.commit([]), lambda: store.keys("space-a"),
                 lambda: store.renew_lease("proc-1", 30),
                 lambda: store.lease_remaining("proc-1"),
                 lambda: store.release_lease("proc-1")):
        with pytest.raises(StoreClosedError, match=r"after close\(\)|closed"):
            call()
    store.close()  # twice is fine


# ------------------------------------------------------------------ SQLite: the patch log


def _raw(path: Path, sql: str, *args: Any) -> list[Any]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def test_sqlite_appends_patches_and_compacts_when_the_log_outgrows_the_base(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    s = SQLiteStore(path)
    try:
        items = [f"item-{i}" for i in range(1000)]
        s.commit([Write(A, {"items": items})])
        ((base,),) = _raw(path, "SELECT value FROM docs")
        version = 1
        for n in range(1000, 1010):
            s.commit([push(A, version, ("items", n), f"item-{n}")])
            version += 1
        # ten pushes appended ten log rows; the base was not rewritten
        assert _raw(path, "SELECT value, version FROM docs") == [(base, 1)]
        assert _raw(path, "SELECT version FROM heads") == [(11,)]
        assert _raw(path, "SELECT version FROM patches ORDER BY version") == [
            (v,) for v in range(2, 12)
        ]
        got = s.load(A)
        assert got is not None and got.value == {"items": [f"item-{i}" for i in range(1010)]}
        pushes = 10
        while _raw(path, "SELECT count(*) FROM patches") != [(0,)]:
            s.commit([push(A, version, ("items", 1000 + pushes), f"item-{1000 + pushes}")])
            version += 1
            pushes += 1
            assert pushes < 2000, "the log was never compacted"
        # compacted once the log's size passed the base's: hundreds of pushes, not every one
        patch_size = len(json.dumps([[["items", 1000], "item-1000"]], separators=(",", ":")))
        assert pushes >= len(base) // patch_size
        ((text, stored_version),) = _raw(path, "SELECT value, version FROM docs")
        assert stored_version == version and _raw(path, "SELECT * FROM heads") == []
        assert json.loads(text) == {"items": [f"item-{i}" for i in range(1000 + pushes)]}
    finally:
        s.close()


def test_sqlite_patches_from_another_connection_are_seen(tmp_path: Path) -> None:
    one, two = SQLiteStore(tmp_path / "x.db"), SQLiteStore(tmp_path / "x.db")
    try:
        one.commit([Write(A, {"n": [0]})])
        one.commit([push(A, 1, ("n", 1), 1)])  # one keeps version 2
        two.commit([push(A, 2, ("n", 2), 2)])
        with pytest.raises(ConflictError):
            one.commit([push(A, 2, ("n", 2), "lost")])
        one.commit([push(A, 3, ("n", 3), 3)])  # patches what two wrote, not its own copy
        two.commit([push(A, 4, ("other",), True)])
        for s in (one, two):
            assert s.load(A) == Stored({"n": [0, 1, 2, 3], "other": True}, 5)
        with pytest.raises(StorageError, match="does not exist"):
            two.commit([push(A, 5, ("n", 9), "gap")])
        assert one.load(A) == Stored({"n": [0, 1, 2, 3], "other": True}, 5)
    finally:
        one.close()
        two.close()


_OLD_SCHEMA = """
CREATE TABLE docs (
    space   TEXT NOT NULL,
    scope   TEXT NOT NULL,
    id      TEXT NOT NULL,
    value   TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (space, scope, id)
) WITHOUT ROWID
"""


def test_sqlite_opens_a_file_from_before_the_patch_log(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(_OLD_SCHEMA)
    db.execute("INSERT INTO docs VALUES (?,?,?,?,?)", (*A, '{"items":["milk"]}', 3))
    db.execute("INSERT INTO docs VALUES (?,?,?,?,?)", (*C, '"alice"', 1))
    db.commit()
    db.close()
    s = SQLiteStore(path)
    try:
        assert s.load(A) == Stored({"items": ["milk"]}, 3)
        assert sorted(s.keys("space-a")) == sorted([A, C])
        assert s.commit([push(A, 3, ("items", 1), "eggs")]) == {A: 4}
        assert s.commit([Write(C, "alice 2", expect=1)]) == {C: 2}
    finally:
        s.close()
    s = SQLiteStore(path)  # and again, now that it is migrated
    try:
        assert s.load(A) == Stored({"items": ["milk", "eggs"]}, 4)
        assert s.load(C) == Stored("alice 2", 2)
    finally:
        s.close()


def test_sqlite_refuses_a_value_that_is_not_json(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "x.db")
    try:
        s.commit([Write(A, [1])])
        with pytest.raises(StorageError, match=r"'doc-1'.*not JSON"):
            s.commit([Write(B, 1), push(A, 1, (1,), {1, 2})])
        assert s.load(A) == Stored([1], 1) and s.load(B) is None
        assert s.commit([push(A, 1, (1,), 2)]) == {A: 2}
        assert s.load(A) == Stored([1, 2], 2)
    finally:
        s.close()


# ---------------------------------------------------------- SQLite: locks and its errors


def test_sqlite_a_locked_database_waits_then_raises_store_busy(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    s = SQLiteStore(path, busy_timeout=0.3)
    try:
        s.commit([Write(A, 1)])
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        try:
            with pytest.raises(StoreBusyError) as info:
                s.commit([Write(A, 2, expect=1)])
            message = str(info.value)
            for words in (str(path), "0.3 s", "busy_timeout", "nothing was committed",
                          "busy_timeout=30"):
                assert words in message, (words, message)
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert s.load(A) == Stored(1, 1)  # readers are not blocked by a writer
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert s.commit([Write(A, 2, expect=1)]) == {A: 2}
    finally:
        s.close()


def test_sqlite_a_lock_released_within_the_timeout_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "wait.db"
    s = SQLiteStore(path)
    try:
        s.commit([Write(A, 1)])
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
        release.start()
        started = time.monotonic()
        try:
            assert s.commit([Write(A, 2, expect=1)]) == {A: 2}
        finally:
            release.join()
            holder.close()
        assert time.monotonic() - started >= 0.2  # it did wait for the other writer
        assert s.load(A) == Stored(2, 2)
    finally:
        s.close()


def test_sqlite_open_waits_for_a_locked_file_then_raises_store_busy(tmp_path: Path) -> None:
    path = tmp_path / "exclusive.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # blocks readers too, so open must wait
    try:
        with pytest.raises(StoreBusyError) as info:
            SQLiteStore(path, busy_timeout=0.2)
        assert str(path) in str(info.value) and "0.2 s" in str(info.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    s = SQLiteStore(path, busy_timeout=0.2)
    try:
        assert s.commit([Write(A, 1)]) == {A: 1}
    finally:
        s.close()


def test_sqlite_a_missing_directory_is_named_not_created(tmp_path: Path) -> None:
    where = tmp_path / "no" / "such" / "app.db"
    with pytest.raises(StorageError) as info:
        SQLiteStore(where)
    assert str(where) in str(info.value)
    assert f"the directory '{where.parent}' does not exist" in str(info.value)
    assert not (tmp_path / "no").exists()


def test_sqlite_a_file_that_is_not_a_database_is_a_storage_error(tmp_path: Path) -> None:
    where = tmp_path / "notes.txt"
    where.write_bytes(b"this is not an SQLite database, just text " * 100)
    with pytest.raises(StorageError) as info:
        SQLiteStore(where)
    assert str(where) in str(info.value) and "not a database" in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


def test_sqlite_errors_in_use_are_storage_errors_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    s = SQLiteStore(path)
    try:
        s.commit([Write(A, 1)])
        _raw(path, "DROP TABLE docs")
        for call in (lambda: s.load(A), lambda: s.commit([Write(A, 2)]),
                     lambda: s.keys("space-a")):
            with pytest.raises(StorageError) as info:
                call()
            assert str(path) in str(info.value) and "no such table" in str(info.value)
            assert isinstance(info.value.__cause__, sqlite3.Error)
            assert not isinstance(info.value, sqlite3.Error)
    finally:
        s.close()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "5", True])
def test_sqlite_busy_timeout_must_be_seconds(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="busy_timeout"):
        SQLiteStore(tmp_path / "x.db", busy_timeout=bad)



def test_sqlite_open_waits_while_another_connection_writes_a_new_file(tmp_path: Path) -> None:
    """Switching a file to WAL while another connection writes it makes SQLite answer
    "database is locked" at once, without calling the busy handler (so several processes
    opening a new file together failed): the store retries within busy_timeout instead."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE other (x)")  # a rollback-journal file, as new files are
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        s = SQLiteStore(path)
    finally:
        release.join()
        holder.close()
    try:
        assert _raw(path, "PRAGMA journal_mode") == [("wal",)]
        assert s.commit([Write(A, 1, expect=0)]) == {A: 1}
    finally:
        s.close()


def test_two_connections_alternating_patches_see_each_others_versions(tmp_path: Path) -> None:
    """A connection remembers the heads of what it wrote only while no other connection has
    committed (PRAGMA data_version): alternating writers never reuse a stale version."""
    path = tmp_path / "two.db"
    a, b = SQLiteStore(path), SQLiteStore(path)
    key = DocKey("s", "", "doc")
    try:
        assert a.commit([Write(key, [], 0)]) == {key: 1}
        for i in range(12):  # a, b, a, b...: each write's base is the other's last
            writer = (a, b)[i % 2]
            assert writer.commit([Write(key, None, i + 1, (((i,), i),))]) == {key: i + 2}
        with pytest.raises(ConflictError):  # b wrote last: a's view is one behind
            a.commit([Write(key, None, 12, (((12,), -1),))])
        for store in (a, b, SQLiteStore(path)):
            stored = store.load(key)
            assert stored is not None and stored.version == 13
            assert stored.value == list(range(12))
    finally:
        a.close()
        b.close()


# -------------------------------------------------------------------- SQLite: leases


def test_sqlite_leases_are_rows_on_the_hosts_clock(tmp_path: Path) -> None:
    """The expiry is ``time.time()`` + ttl: the clock every process on the host reads."""
    path = tmp_path / "leases.db"
    s = SQLiteStore(path)
    try:
        before = time.time()
        s.renew_lease("proc-1", 30)
        ((holder, expires),) = _raw(path, "SELECT holder, expires FROM leases")
        assert holder == "proc-1" and before + 30 <= expires <= time.time() + 30
        s.commit([Write(A, 1)])  # commits never touch a lease
        assert _raw(path, "SELECT holder, expires FROM leases") == [(holder, expires)]
    finally:
        s.close()


def test_sqlite_reading_a_lease_writes_nothing(tmp_path: Path) -> None:
    """Another connection's ``data_version`` changes with every commit to the file: lease
    reads leave it as it is, a renewal and a release change it."""
    path = tmp_path / "quiet.db"
    s = SQLiteStore(path)
    watcher = sqlite3.connect(path, isolation_level=None)
    try:
        def version() -> int:
            return watcher.execute("PRAGMA data_version").fetchone()[0]

        s.renew_lease("proc-1", 30)
        start = version()
        for _ in range(5):
            assert s.lease_remaining("proc-1") is not None
            assert s.lease_remaining("other") is None
        assert version() == start
        s.renew_lease("proc-1", 30)
        assert version() != start
        renewed = version()
        s.release_lease("proc-1")
        assert version() != renewed
    finally:
        watcher.close()
        s.close()


def test_sqlite_a_file_without_the_leases_table_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "before-leases.db"
    s = SQLiteStore(path)
    s.commit([Write(A, {"items": ["milk"]})])
    s.commit([push(A, 1, ("items", 1), "eggs")])
    s.close()
    _raw(path, "DROP TABLE leases")  # a file written before leases existed
    assert _raw(path, "SELECT name FROM sqlite_master WHERE name='leases'") == []
    s = SQLiteStore(path)
    try:
        assert s.lease_remaining("proc-1") is None
        assert s.renew_lease("proc-1", 30) is True
        assert s.load(A) == Stored({"items": ["milk", "eggs"]}, 2)
    finally:
        s.close()


def test_sqlite_a_file_from_before_the_log_gets_leases_too(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(_OLD_SCHEMA)
    db.commit()
    db.close()
    s = SQLiteStore(path)
    try:
        assert s.renew_lease("proc-1", 30) is True
        left = s.lease_remaining("proc-1")
        assert left is not None and left > 29
    finally:
        s.close()


def test_sqlite_a_renewal_waits_for_a_locked_file_then_raises_store_busy(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.db"
    s = SQLiteStore(path, busy_timeout=0.2)
    try:
        assert s.renew_lease("proc-1", 30) is True
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            for call, what in ((lambda: s.renew_lease("proc-1", 30), "renew_lease()"),
                               (lambda: s.release_lease("proc-1"), "release_lease()")):
                with pytest.raises(StoreBusyError) as info:
                    call()
                assert what in str(info.value) and "0.2 s" in str(info.value)
            left = s.lease_remaining("proc-1")  # a read does not wait for a writer
            assert left is not None and left > 29
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert s.renew_lease("proc-1", 30) is True
    finally:
        s.close()


def test_sqlite_a_release_collects_long_expired_leases(tmp_path: Path) -> None:
    path = tmp_path / "old-leases.db"
    s = SQLiteStore(path)
    try:
        now = time.time()
        db = sqlite3.connect(path)
        db.executemany("INSERT INTO leases (holder, expires) VALUES (?, ?)", [
            ("long-dead", now - LEASE_COLLECT_AFTER - 60),
            ("just-expired", now - 1),
        ])
        db.commit()
        db.close()
        s.renew_lease("live", 30)
        s.release_lease("someone-else")  # any release collects
        assert s.lease_remaining("long-dead") is None
        left = s.lease_remaining("just-expired")
        assert left is not None and left <= 0  # kept: renewing it must still say lost
        assert s.renew_lease("just-expired", 30) is False
        assert s.renew_lease("live", 30) is True
    finally:
        s.close()


_LEASE_CHILD = """
import sys, time
from runtime.storage import SQLiteStore

path, holder, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = SQLiteStore(path)
while True:  # a live process: it renews well before each deadline, until it is killed
    assert store.renew_lease(holder, ttl), "the child's lease was lost"
    print(store.lease_remaining(holder), flush=True)
    time.sleep(ttl / 4)
"""


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The child's stdout lines, read in a thread, so every wait for one has a timeout."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_sqlite_a_killed_processs_lease_expires_within_its_ttl(tmp_path: Path) -> None:
    """A real second process takes a lease and renews it; while it lives, the lease outlasts
    its first TTL; after SIGKILL nobody renews it and it expires within the TTL."""
    path, ttl = tmp_path / "two-processes.db", 1.0
    store = SQLiteStore(path)  # the file and its tables exist before the child opens it
    proc = subprocess.Popen([sys.executable, "-c", _LEASE_CHILD, str(path), "child", str(ttl)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _lines(proc)
        try:
            lines.get(timeout=30)  # the child holds the lease
        except queue.Empty:
            pytest.fail(f"the child never took its lease: {proc.stderr and proc.stderr.read()}")
        taken = time.monotonic()
        first = store.lease_remaining("child")
        assert first is not None and 0 < first <= ttl
        # wait out the first lease's deadline: the child's renewals pushed it back
        time.sleep(first)
        while time.monotonic() - taken < ttl:  # the clocks differ a hair: past it for sure
            # the clock moves between the test and the subtraction: never a negative sleep
            time.sleep(max(0.0, ttl - (time.monotonic() - taken)))
        left = store.lease_remaining("child")
        assert left is not None and left > 0, "the live child's lease was not renewed"
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        killed = time.monotonic()
        assert proc.returncode == -signal.SIGKILL
        left = store.lease_remaining("child")
        assert left is not None and left <= ttl  # nobody can have renewed it since
        assert wait_out(store, "child") <= 0
        assert time.monotonic() - killed <= ttl + 0.5  # expired within the ttl (+ scheduling)
        assert store.renew_lease("child", ttl) is False  # lost: a new holder must start over
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        store.close()
