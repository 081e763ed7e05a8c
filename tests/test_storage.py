"""Storage conformance: every backend passes this one module.

Each backend is an entry in ``BACKENDS``: a function that opens (or reopens) the store kept
under a directory. A new backend (PostgreSQL) is one more entry; a backend whose data
outlives ``close()`` is also listed in ``DURABLE`` and gets the reopen tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import MemoryStore, Runtime, SQLiteStore, Store, cell, handler, pattern
from runtime.storage import ConflictError, DocKey, Stored, Write, open_store

Opener = Callable[[Path], Store]

BACKENDS: dict[str, Opener] = {
    "memory": lambda where: MemoryStore(),
    "sqlite": lambda where: SQLiteStore(where / "docs.db"),
}
DURABLE: dict[str, Opener] = {
    "sqlite": BACKENDS["sqlite"],
}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = BACKENDS[request.param](tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=sorted(DURABLE))
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the durable backend's store in ``tmp_path`` (call it again to reopen)."""
    opener = DURABLE[request.param]
    return lambda: opener(tmp_path)


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


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("sqlite:///", ["needs a path", "sqlite:///"]),
        ("postgres://db/app", ["unknown store", "postgres://db/app", "memory", "sqlite:///"]),
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
