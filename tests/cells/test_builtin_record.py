"""A builtin's record (``node.record``): several stored cells as the fields of one document,
each checked against its own schema; one unit of conflict; and, with ``earlier``, created
from what an earlier layout stored as one ``state`` document per field."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from runtime import Runtime, pattern
from runtime.cells import BuiltinNode, Record
from runtime.errors import ConflictError, NotJSONError, PatternError, SchemaError
from runtime.storage import MemoryStore, SQLiteStore, Write

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"count": {"type": "integer"},
                                           "flag": {"type": "boolean"}}}
FIELDS = {"count": 0, "flag": False, "log": [], "note": None}
LAYOUT = {"version": 2}  # which layout the "tally" builtin declares (the test sets it)
RECORDS: list[Record] = []


def tally(source: Any) -> Record:
    """A builtin over ``source``: layout 1 stores each field as a document of its own, as
    builtins did before records; layout 2 one record, reading layout 1's documents."""
    node = BuiltinNode("tally", [source], name="t")
    if LAYOUT["version"] == 1:
        cells = {f: node.state(f, v, SCHEMA["properties"].get(f)) for f, v in FIELDS.items()}
        return Record(cells["count"], cells)  # only to hand the cells to the test
    record = node.record("tally", FIELDS, SCHEMA, earlier=True)
    RECORDS.append(record)
    return record


@pattern(name="tally-user")
def user() -> dict[str, Any]:
    from runtime import cell

    items = cell([], name="items", scope="session")
    record = tally(items)
    return {"items": items, **{f: record[f] for f in record}}


class CountingStore(MemoryStore):
    """A shared memory store (not one made for the runtime) that counts its reads."""

    def __init__(self) -> None:
        super().__init__()
        self.load_many_calls: list[int] = []
        self.commits: list[list[str]] = []

    def load_many(self, keys):
        self.load_many_calls.append(len(keys))
        return super().load_many(keys)

    def commit(self, writes):
        self.commits.append([w.key.id for w in writes])
        return super().commit(writes)


@pytest.fixture(autouse=True)
def _layout():
    LAYOUT["version"] = 2
    RECORDS.clear()
    yield
    LAYOUT["version"] = 2


async def test_the_fields_are_one_document_and_each_reads_and_writes_on_its_own():
    store = CountingStore()
    async with Runtime(store=store) as rt:
        inst = rt.run(user, session="s1")
        record = RECORDS[-1]
        assert sorted(record) == sorted(FIELDS) and len(record) == 4
        assert {record[f].doc_key for f in record} == {record.cell.doc_key}
        assert inst.result.get() == {"items": [], **FIELDS}
        record["count"].set(3)
        record["log"].push("a")
        assert record.cell.get() == {"count": 3, "flag": False, "log": ["a"], "note": None}
        assert inst.result.key("count").get() == 3  # the result links to the field
        assert store.load(record.cell.doc_key).value["log"] == ["a"]
        other = rt.run(user, session="s2")  # another session: a record of its own
        assert RECORDS[-1].cell.doc_key != record.cell.doc_key
        assert other.result.key("count").get() == 0


async def test_a_field_is_checked_against_its_own_schema_and_a_refused_write_changes_nothing():
    async with Runtime(store=CountingStore()) as rt:
        rt.run(user, session="s1")
        record = RECORDS[-1]
        with pytest.raises(SchemaError, match="count"):
            record["count"].set("three")
        with pytest.raises(SchemaError), rt.transaction():
            record["note"].set("kept only with the rest")
            record["flag"].set(1)
        assert record.cell.get() == FIELDS
        record["note"].set({"any": ["json"]})  # no schema there: any JSON
        with pytest.raises(NotJSONError):
            record["note"].set(float("nan"))
        assert record["note"].get() == {"any": ["json"]}


async def test_a_record_is_one_unit_of_conflict():
    """What ``record``'s docstring warns of: a transaction that read one field conflicts
    with a commit to another (so a builtin keeps apart fields others write at any time)."""
    async with Runtime(store=CountingStore()) as rt:
        rt.run(user, session="s1")
        record = RECORDS[-1]
        tx = rt.begin()
        with tx.bound():
            assert record["count"].get() == 0
            record["log"].push("mine")
        record["flag"].set(True)  # another writer, another field, meanwhile
        with pytest.raises(ConflictError):
            tx.commit()
        tx.abort()
        assert record.cell.get() == {**FIELDS, "flag": True}


async def test_bad_records_are_refused_when_declared():
    def build(fields: Any, schema: Any = None) -> None:
        @pattern(name="bad-record")
        def bad():
            node = BuiltinNode("tally", [], name="b")
            node.record("r", fields, schema)
            return {}

        return bad

    async with Runtime() as rt:
        with pytest.raises(PatternError, match="at least one field"):
            rt.run(build({}))
        with pytest.raises(PatternError, match="'@link'"):
            rt.run(build({"@link": "/x"}))
        with pytest.raises(PatternError, match="non-empty"):
            rt.run(build({"": 1}))
        with pytest.raises(SchemaError, match="initial value"):
            rt.run(build({"n": "x"}, {"type": "object", "properties": {"n": {"type": "integer"}}}))
        with pytest.raises(NotJSONError, match="initial value"):
            rt.run(build({"n": float("inf")}))


async def test_a_record_created_over_the_earlier_layout_keeps_what_it_stored(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'layout.db'}"
    LAYOUT["version"] = 1
    async with Runtime(store=url) as rt:
        inst = rt.run(user, session="s1")
        for name, value in {"count": 7, "log": ["x", {"deep": [1]}], "note": "kept"}.items():
            inst.result.key(name).resolve().set(value)
        rt.run(user, session="s2")  # stored nothing but its initial values
    LAYOUT["version"] = 2
    async with Runtime(store=url) as rt:
        inst = rt.run(user, session="s1")
        assert inst.result.get() == {"items": [], "count": 7, "flag": False,
                                     "log": ["x", {"deep": [1]}], "note": "kept"}
        record = RECORDS[-1]
        record["count"].set(8)  # the record is what is stored from now on
        assert rt.run(user, session="s2").result.key("count").get() == 0
        assert rt.run(user, session="s3").result.get() == {"items": [], **FIELDS}
    async with Runtime(store=url) as rt:  # read from the record, not from the old documents
        assert rt.run(user, session="s1").result.key("count").get() == 8


async def test_an_earlier_value_its_field_refuses_is_left_behind_with_a_warning(tmp_path,
                                                                                caplog):
    path = tmp_path / "refused.db"
    LAYOUT["version"] = 1
    async with Runtime(store=f"sqlite:///{path}") as rt:
        inst = rt.run(user, session="s1")
        key = inst.result.key("count").resolve().doc_key
        inst.result.key("note").resolve().set("kept")
    # stored by some other version, with no schema on it: the record's refuses it
    store = SQLiteStore(str(path))
    store.commit([Write(key, "not a number", store.load(key).version)])
    store.close()
    LAYOUT["version"] = 2
    with caplog.at_level(logging.WARNING, logger="celldialog"):
        async with Runtime(store=f"sqlite:///{path}") as rt:
            inst = rt.run(user, session="s1")
            assert inst.result.key("count").get() == 0
            assert inst.result.key("note").get() == "kept"
    [warning] = [r for r in caplog.records if "earlier version" in r.getMessage()]
    assert "user.t.tally.count" in warning.getMessage() and "integer" in warning.getMessage()


async def test_the_earlier_layout_is_looked_up_once_and_only_for_a_new_record():
    store = CountingStore()
    async with Runtime(store=store) as rt:
        rt.run(user, session="s1")
        assert store.load_many_calls == [len(FIELDS)]  # one read for every field
        rt.run(user, session="s1")  # the same instance again: the record is there
        rt.run(user, session="s2")
        assert store.load_many_calls == [len(FIELDS), len(FIELDS)]
    async with Runtime(store="memory") as rt:  # a store made for this runtime: nothing older
        rt.run(user, session="s1")
        assert rt.run(user, session="s1").result.key("count").get() == 0


SHAPED = {
    "type": "object",
    "$defs": {"Inner": {"type": "object", "properties": {"n": {"type": "integer"}},
                        "required": ["n"]}},
    "properties": {"good": {"$ref": "#/$defs/Inner"}, "bad": {"$ref": "#/$defs/Inner"}},
    "patternProperties": {"^odd": {"type": "string"}},
}
SHAPED_FIELDS = {"good": {"n": 0}, "bad": {"n": 0}, "odd_one": "x", "deep": None}


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"d": value}
    return value


@pattern(name="shaped-user")
def shaped_user() -> dict[str, Any]:
    from runtime import cell

    items = cell([], name="items")
    node = BuiltinNode("shaped", [items], name="s")
    if LAYOUT["version"] == 1:  # no schema then: anything was stored
        return {f: node.state(f, v) for f, v in SHAPED_FIELDS.items()}
    record = node.record("shaped", SHAPED_FIELDS, SHAPED, earlier=True)
    return {f: record[f] for f in record}


async def test_earlier_values_are_checked_by_the_whole_schema_and_one_level_down(tmp_path,
                                                                                  caplog):
    """A field's schema that is a $ref, a rule of the object's (``patternProperties``), and
    the nesting limit one level further down: what fails is left behind, the rest kept, and
    the instance runs."""
    url = f"sqlite:///{tmp_path / 'shaped.db'}"
    LAYOUT["version"] = 1
    old = {"good": {"n": 5}, "bad": {"n": "five"}, "odd_one": 3, "deep": _nested(100)}
    async with Runtime(store=url) as rt:
        inst = rt.run(shaped_user)
        for name, value in old.items():
            inst.result.key(name).resolve().set(value)
    LAYOUT["version"] = 2
    with caplog.at_level(logging.WARNING, logger="celldialog"):
        async with Runtime(store=url) as rt:
            inst = rt.run(shaped_user)
            assert inst.result.get() == {**SHAPED_FIELDS, "good": {"n": 5}}
    left = sorted(r.getMessage().split(" (/")[0].rsplit(".", 1)[-1]
                  for r in caplog.records if "earlier version" in r.getMessage())
    assert left == ["bad", "deep", "odd_one"]


GROWING: dict[str, Any] = {"fields": {"count": 0}}


@pattern(name="growing-user")
def growing_user() -> dict[str, Any]:
    node = BuiltinNode("growing", [], name="g")
    record = node.record("grow", GROWING["fields"], SCHEMA)
    RECORDS.append(record)
    return {f: record[f] for f in record}


async def test_a_field_added_by_a_newer_version_is_filled_in_and_stored(tmp_path):
    url = f"sqlite:///{tmp_path / 'grow.db'}"
    GROWING["fields"] = {"count": 0}
    try:
        async with Runtime(store=url) as rt:
            rt.run(growing_user).result.key("count").resolve().set(4)
        GROWING["fields"] = {"count": 0, "flag": False, "log": []}
        async with Runtime(store=url) as rt:
            inst = rt.run(growing_user)
            assert inst.result.get() == {"count": 4, "flag": False, "log": []}
            RECORDS[-1]["log"].push("new field, writable")
            key = RECORDS[-1].cell.doc_key
        async with Runtime(store=url) as rt:  # stored: read back as it was left
            assert rt.run(growing_user).result.get() == {"count": 4, "flag": False,
                                                         "log": ["new field, writable"]}
        store = SQLiteStore(str(tmp_path / "grow.db"))
        assert store.load(key).value == {"count": 4, "flag": False,
                                         "log": ["new field, writable"]}
        store.close()
    finally:
        GROWING["fields"] = {"count": 0}


async def test_a_field_filled_in_never_overwrites_what_another_process_wrote(tmp_path):
    """The fill is written on condition: another process's write between this one's load
    and its write stands, with the field filled in on it (an older version of the code
    writing during an upgrade writes records without it)."""
    url = f"sqlite:///{tmp_path / 'race.db'}"
    GROWING["fields"] = {"count": 0}
    try:
        async with Runtime(store=url) as rt:
            rt.run(growing_user)
            key = RECORDS[-1].cell.doc_key
        GROWING["fields"] = {"count": 0, "flag": False}

        class Racing(SQLiteStore):
            raced = False

            def load(self, k):
                got = super().load(k)
                if k == key and got is not None and not self.raced:
                    self.raced = True  # another process writes right after the first load
                    other = SQLiteStore(self.path)
                    other.commit([Write(k, {"count": 9}, got.version)])
                    other.close()
                return got

        store = Racing(str(tmp_path / "race.db"))
        async with Runtime(store=store) as rt:
            inst = rt.run(growing_user)
            assert inst.result.get() == {"count": 9, "flag": False}  # theirs, filled in
        check = SQLiteStore(str(tmp_path / "race.db"))
        assert check.load(key).value == {"count": 9, "flag": False}
        check.close()
    finally:
        GROWING["fields"] = {"count": 0}


async def test_a_fill_outside_a_build_is_written_on_condition_too(tmp_path):
    """``Documents.declare(fill=...)`` on its own (no ``declaring()`` block): the fill is
    stored at once, and made on another process's write if that came between."""
    from runtime.storage import DocKey

    path = tmp_path / "fill.db"
    quiet, raced = DocKey("default", "", "quiet"), DocKey("default", "", "raced")
    seed = SQLiteStore(str(path))
    seed.commit([Write(quiet, {"count": 1}, 0), Write(raced, {"count": 1}, 0)])
    seed.close()

    class Racing(SQLiteStore):
        done = False

        def load(self, k):
            got = super().load(k)
            if k == raced and got is not None and not self.done:
                self.done = True
                other = SQLiteStore(self.path)
                other.commit([Write(k, {"count": 5}, got.version)])
                other.close()
            return got

    def fill(stored: Any) -> Any:
        return None if "flag" in stored else {"flag": False, **stored}

    async with Runtime(store=Racing(str(path))) as rt:
        for key, count in ((quiet, 1), (raced, 5)):
            doc = rt.docs.declare(key, {"count": 0, "flag": False}, fill=fill)
            assert doc.node.peek() == {"count": count, "flag": False}
            assert rt.store.load(key).value == {"count": count, "flag": False}
