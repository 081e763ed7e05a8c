"""Bad input gets a clear error: each test checks the message names what was wrong."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from runtime import (
    BindingError,
    Cell,
    CellError,
    CycleError,
    PathError,
    PatternError,
    Runtime,
    SchemaError,
    StreamError,
    WriteInComputationError,
    cell,
    computed,
    handler,
    lift,
    pattern,
)
from runtime.storage import DocKey, open_store

pytestmark = pytest.mark.anyio

PROFILE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name"],
}


@handler
def edit(event, profile, log):
    """Apply ``event["ops"]``: ``[path, value]`` pairs, after logging the event."""
    log.push(event["tag"])
    for path, value in event["ops"]:
        profile.key(*path).set(value)


@pattern
def people():
    profile = cell({"name": "Ada", "age": 36, "tags": []}, schema=PROFILE, name="profile")
    log = cell([], schema={"type": "array", "items": {"type": "string"}}, name="log")
    return {
        "profile": profile,
        "log": log,
        "edit": edit(profile=profile, log=log),
        "age_next_year": lift(lambda p: p["age"] + 1)(profile),
        "nums": [1, 2],
        "n": 7,
    }


def snapshot(rt: Runtime, space: str = "default") -> dict[DocKey, Any]:
    return {k: rt.store.load(k) for k in rt.store.keys(space)}


# --------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    ("ops", "path", "rule", "words"),
    [
        ([[["age"], -1]], "/age", "minimum", ["-1", "minimum"]),
        ([[["age"], "old"]], "/age", "type", ["'old'", "integer"]),
        ([[["name"], ""]], "/name", "minLength", ["minLength"]),
        ([[["tags"], ["a", 2]]], "/tags/1", "type", ["2", "string"]),
        ([[["tags"], ["a", "b", "c", "d"]]], "/tags", "maxItems", ["maxItems"]),
        ([[[], {"age": 3}]], "/", "required", ["'name'", "required"]),
        # several writes, one of them bad: the bad one is named
        ([[["name"], "Grace"], [["age"], -5], [["tags"], ["x"]]], "/age", "minimum", ["-5"]),
    ],
)
async def test_schema_violation_in_a_handler_names_path_and_rule(ops, path, rule, words):
    async with Runtime() as rt:
        inst = rt.run(people)
        await inst.send("edit", {"tag": "ok", "ops": [[["age"], 37]]})
        before = snapshot(rt)
        seen: list[Any] = []
        inst.result.key("profile").sink(seen.append)
        with pytest.raises(SchemaError) as info:
            await inst.send("edit", {"tag": "bad", "ops": ops})
        e = info.value
        msg = str(e)
        assert (e.path or "/") == path and e.rule == rule  # "" is the root's pointer
        assert f"at {path} " in msg and f"rule {rule!r}" in msg
        assert "people.profile" in msg  # which cell
        assert "nothing was committed" in msg
        for word in words:
            assert word in msg, (word, msg)
        # nothing of the transaction was committed: not the log push, not the valid writes
        assert snapshot(rt) == before
        assert inst.result.key("log").get() == ["ok"]
        assert inst.result.key("profile").get() == {"name": "Ada", "age": 37, "tags": []}
        assert len(seen) == 1


async def test_schema_violation_outside_a_handler_names_path_and_rule():
    async with Runtime() as rt:
        inst = rt.run(people)
        before = snapshot(rt)
        with pytest.raises(SchemaError, match=r"at /age .*minimum.*rule 'minimum'"):
            inst.result.key("profile", "age").set(-3)
        with pytest.raises(SchemaError, match=r"at /tags/0 .*rule 'type'"):
            inst.result.key("profile", "tags").push(5)
        with pytest.raises(SchemaError, match=r"at / .*'name' is a required property"):
            inst.result.key("profile").set({})
        with pytest.raises(SchemaError, match=r"rule 'minLength'"):
            inst.result.key("profile").update({"age": 1, "name": ""})
        assert snapshot(rt) == before


async def test_invalid_initial_value_names_the_cell_and_rule():
    @pattern
    def p():
        return {"n": cell(-1, schema={"type": "integer", "minimum": 0}, name="count")}

    async with Runtime() as rt:
        with pytest.raises(SchemaError) as info:
            rt.run(p)
    assert "p.count" in str(info.value) and "minimum" in str(info.value)


async def test_event_failing_the_handler_event_schema_names_path_and_rule():
    @handler(event={"type": "object", "properties": {"n": {"type": "integer"}},
                    "required": ["n"]})
    def take(event, out):
        out.push(event["n"])

    @pattern
    def p():
        out = cell([])
        return {"out": out, "take": take(out=out)}

    async with Runtime() as rt:
        inst = rt.run(p)
        with pytest.raises(SchemaError) as info:
            await inst.send("take", {"n": "three"})
        assert "event for take" in str(info.value)
        assert info.value.path == "/n" and info.value.rule == "type"
        with pytest.raises(SchemaError, match="'n' is a required property"):
            await inst.send("take", {})
        assert inst.result.key("out").get() == []


async def test_a_schema_that_is_not_json_schema_is_refused_when_declared():
    @pattern
    def p():
        return {"x": cell(1, schema={"type": "no-such-type"})}

    async with Runtime() as rt:
        with pytest.raises(Exception, match="no-such-type"):
            rt.run(p)


async def test_a_type_pydantic_cannot_describe_is_named():
    class Opaque:
        pass

    @pattern
    def p():
        return {"x": cell(None, schema=Opaque)}

    async with Runtime() as rt:
        with pytest.raises(SchemaError, match=r"cannot derive a JSON Schema from .*Opaque"):
            rt.run(p)


# ------------------------------------------------------------------------ missing paths


async def test_reading_a_missing_key_names_the_path_and_the_keys_there():
    async with Runtime() as rt:
        inst = rt.run(people)
        profile = inst.result.key("profile")
        pid = profile.resolve().id
        with pytest.raises(PathError) as info:
            profile.key("email").get()
        msg = str(info.value)
        assert f"/{pid}/email" in msg or "/profile/email" in msg
        assert "[age, name, tags]" in msg
        # deeper: the first missing step is named with what exists above it
        with pytest.raises(PathError, match=r"/email: the object there has keys \[age, name, "):
            profile.key("email", "domain").get()
        # a missing key of the result names the result's keys
        with pytest.raises(PathError, match=r"nope: the object there has keys \[age_next_year, "
                                            r"edit, log, n, nums, profile\]"):
            inst.result.key("nope").get()
        # default instead of an error
        assert profile.key("email").get("none") == "none"


async def test_reading_a_missing_list_index_names_the_length():
    async with Runtime() as rt:
        inst = rt.run(people)
        with pytest.raises(PathError) as info:
            inst.result.key("nums", 5).get()
        assert "/nums/5" in str(info.value) and "2 items" in str(info.value)
        with pytest.raises(PathError) as info:
            inst.result.key("nums", 5, "x").get()
        assert "/nums/5" in str(info.value) and "2 items" in str(info.value)


async def test_reading_below_a_scalar_says_it_is_not_a_container():
    async with Runtime() as rt:
        inst = rt.run(people)
        for path in (("n", "x"), ("n", "x", "y")):
            with pytest.raises(PathError) as info:
                inst.result.key(*path).get()
            assert "/n/x" in str(info.value) and "int, not a container" in str(info.value)


async def test_a_link_to_a_missing_document_names_it():
    @pattern
    def holder():
        return {"box": cell({"ref": None, "keep": 1}, name="box")}

    async with Runtime() as rt:
        box = rt.run(holder).result.key("box")
        ghost = Cell(rt.docs, DocKey("default", "", "ghost-document"), ("a",))
        with pytest.raises(PathError, match=r"no document /ghost-document in space 'default'"):
            box.key("ref").set(ghost)
        assert box.get() == {"ref": None, "keep": 1}


async def test_writing_below_a_missing_parent_names_it():
    async with Runtime() as rt:
        inst = rt.run(people)
        before = snapshot(rt)
        with pytest.raises(PathError, match=r"/missing: the object there has keys \[age, name, "):
            inst.result.key("profile", "missing", "x").set(1)
        with pytest.raises(PathError, match=r"/tags/4: the list there has 0 items"):
            inst.result.key("profile", "tags", 4, "x").set(1)
        assert snapshot(rt) == before


# ------------------------------------------------------------------------ bindings


async def test_binding_a_handler_to_a_non_cell_names_handler_parameter_and_type():
    @pattern
    def p():
        profile = cell({"name": "x"})
        return {"edit": edit(profile=profile, log=["not", "a", "cell"])}

    async with Runtime() as rt:
        with pytest.raises(BindingError) as info:
            rt.run(p)
    msg = str(info.value)
    assert "handler edit" in msg and "log=" in msg and "list" in msg
    assert "Cell or Stream" in msg and "cell(value)" in msg


@pytest.mark.parametrize("value", [3, "text", None, {"a": 1}])
async def test_binding_any_plain_value_is_refused(value):
    @pattern
    def p():
        return {"edit": edit(profile=value, log=cell([]))}

    async with Runtime() as rt:
        with pytest.raises(BindingError, match=rf"handler edit: profile= .*{type(value).__name__}"):
            rt.run(p)


async def test_missing_bindings_are_listed():
    @pattern
    def p():
        return {"edit": edit(profile=cell({"name": "x"}))}

    async with Runtime() as rt:
        with pytest.raises(BindingError, match=r"handler edit is missing bindings for \['log'\]"):
            rt.run(p)


async def test_an_unknown_binding_names_the_parameters():
    @pattern
    def p():
        c = cell({"name": "x"})
        return {"edit": edit(profile=c, log=cell([]), extra=c)}

    async with Runtime() as rt:
        with pytest.raises(BindingError, match=r"edit has no parameter 'extra'.*\['log', "
                                               r"'profile'\]"):
            rt.run(p)


def test_a_handler_without_an_event_parameter_is_refused():
    def nothing():
        pass

    with pytest.raises(PatternError, match="handler nothing must take the event"):
        handler(nothing)


# --------------------------------------------------------------------------- cycles


async def test_a_computation_cycle_lists_the_nodes():
    @pattern
    def loop():
        later: dict[str, Any] = {}
        a = computed(lambda: later["b"].get() + 1, name="a")
        b = computed(lambda: a.get() + 1, name="b")
        later["b"] = b
        return {"a": a, "b": b, "ok": cell(1)}

    async with Runtime() as rt:
        with pytest.raises(CycleError) as info:
            inst = rt.run(loop)  # building the result may already meet the cycle
            inst.result.key("a").sink(lambda v: None)
    msg = str(info.value)
    assert "loop.a" in msg and "loop.b" in msg and "reads its own output" in msg
    labels = [getattr(n, "label", "") for n in info.value.nodes]
    assert "loop.a" in labels and "loop.b" in labels


async def test_a_lift_reading_itself_is_a_cycle():
    @pattern
    def selfish():
        me: dict[str, Any] = {}
        x = cell(1, name="x")
        node = lift(lambda v: v + me["node"].get())(x)
        me["node"] = node
        return {"x": x, "node": node}

    async with Runtime() as rt:
        with pytest.raises(CycleError, match=r"selfish\..*-> .*selfish\."):
            inst = rt.run(selfish)
            inst.result.key("node").get()


@handler
def bump(event, n):
    n.set(n.get() + 1)


async def test_a_handler_sink_loop_is_a_cycle_naming_the_handlers_and_it_stops():
    @pattern
    def ping_pong():
        a = cell(0, name="a")
        b = cell(0, name="b")
        return {"a": a, "b": b, "ping": bump(n=a), "pong": bump(n=b)}

    async with Runtime() as rt:
        inst = rt.run(ping_pong)
        ping, pong = inst.stream("ping"), inst.stream("pong")
        # a's change sends to pong, b's change sends to ping: forever, unless caught
        inst.result.key("a").sink(lambda v: v and pong.send({}))
        inst.result.key("b").sink(lambda v: v and ping.send({}))
        await inst.send("ping", {})
        await rt.idle()  # terminates
        cycles = [e for _, e in rt.errors if isinstance(e, CycleError)]
        assert len(cycles) == 1
        msg = str(cycles[0])
        assert "events keep causing each other" in msg
        assert "bump" in msg and "->" in msg
        assert set(cycles[0].nodes) == {ping, pong}
        a, b = inst.result.key("a").get(), inst.result.key("b").get()
        assert 400 < a + b <= 1002  # it ran a while, then stopped
        assert not rt.scheduler.queue


async def test_a_cycle_names_distinct_handlers():
    @handler
    def tick(event, n):
        n.set(n.get() + 1)

    @handler
    def tock(event, n):
        n.set(n.get() + 1)

    @pattern
    def clock():
        a, b = cell(0, name="a"), cell(0, name="b")
        return {"a": a, "b": b, "tick": tick(n=a), "tock": tock(n=b)}

    async with Runtime() as rt:
        inst = rt.run(clock)
        tick_s, tock_s = inst.stream("tick"), inst.stream("tock")
        inst.result.key("a").sink(lambda v: v and tock_s.send({}))
        inst.result.key("b").sink(lambda v: v and tick_s.send({}))
        tick_s.send({})
        await rt.idle()
        (err, *_) = [e for _, e in rt.errors if isinstance(e, CycleError)]
        assert "tick" in str(err) and "tock" in str(err)


# -------------------------------------------------------------------------- streams


async def test_sending_to_an_unknown_stream_lists_the_known_ones():
    async with Runtime() as rt:
        inst = rt.run(people)
        with pytest.raises(StreamError) as info:
            await inst.send("edits", {})
        msg = str(info.value)
        assert "pattern people has no stream 'edits'" in msg and "its streams: edit" in msg


async def test_a_pattern_with_no_streams_says_so():
    @pattern
    def quiet():
        return {"x": cell(1)}

    async with Runtime() as rt:
        inst = rt.run(quiet)
        with pytest.raises(StreamError, match="no stream 'go'; its streams: none"):
            inst.stream("go")


async def test_sending_to_a_stopped_instance_is_refused():
    async with Runtime() as rt:
        inst = rt.run(people)
        stream = inst.stream("edit")
        rt.stop(inst)
        with pytest.raises(StreamError, match=r"Stream\(edit .*stopped instance"):
            stream.send({"tag": "t", "ops": []})


# --------------------------------------------------------------------------- purity


async def test_writing_inside_a_computed_is_refused_and_named():
    @pattern
    def impure():
        n = cell(0, name="n")
        sneaky = computed(lambda: n.set(n.get() + 1) or 1, name="sneaky")
        return {"n": n, "sneaky": {"value": sneaky}}

    async with Runtime() as rt:
        with pytest.raises(WriteInComputationError) as info:
            inst = rt.run(impure)
            inst.result.key("sneaky", "value").get()
        msg = str(info.value)
        assert "impure.sneaky" in msg and "must be pure" in msg and "handler" in msg
        n_key = [k for k in rt.store.keys("default") if rt.store.load(k).value == 0]
        assert n_key  # the cell kept its value


async def test_writing_inside_a_lift_is_refused():
    @pattern
    def impure():
        n = cell(0, name="n")
        log = cell([], name="log")
        node = lift(lambda v: log.push(v) or v)(n)
        return {"n": n, "log": log, "node": node}

    async with Runtime() as rt:
        with pytest.raises(WriteInComputationError, match="must be pure"):
            inst = rt.run(impure)
            inst.result.key("node").get()


async def test_writing_to_a_computed_cell_is_refused():
    async with Runtime() as rt:
        inst = rt.run(people)
        before = snapshot(rt)
        with pytest.raises(CellError) as info:
            inst.result.key("age_next_year").set(100)
        msg = str(info.value)
        assert "cannot write to people." in msg and "computed from other cells" in msg
        assert snapshot(rt) == before
        assert inst.result.key("age_next_year").get() == 37


async def test_writing_to_a_computed_cell_from_a_handler_commits_nothing():
    @handler
    def both(event, n, derived):
        n.set(5)
        derived.set(6)

    @pattern
    def p():
        n = cell(1, name="n")
        d = lift(lambda v: v * 10)(n)
        return {"n": n, "d": d, "go": both(n=n, derived=d)}

    async with Runtime() as rt:
        inst = rt.run(p)
        with pytest.raises(CellError, match="computed from other cells"):
            await inst.send("go", {})
        assert inst.result.key("n").get() == 1 and inst.result.key("d").get() == 10


# ------------------------------------------------------------------------ non-JSON


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({1, 2}, ["is a set", "not JSON"]),
        (object(), ["is a object", "not JSON"]),
        (math.nan, ["NaN"]),
        (math.inf, ["is inf", "JSON cannot hold"]),
        ({"x": [-math.inf]}, ["/x/0 is -inf", "JSON cannot hold"]),
        ({"ok": [1, {"deep": b"bytes"}]}, ["/ok/1/deep", "bytes"]),
        ({1: "int key"}, ["non-string key 1"]),
        ({"when": __import__("datetime").date(2024, 1, 1)}, ["/when", "date"]),
    ],
    ids=["set", "object", "nan", "inf", "nested-minus-inf", "nested-bytes", "int-key", "date"],
)
async def test_non_json_values_are_refused_naming_the_part(value, words):
    async with Runtime() as rt:
        inst = rt.run(people)
        before = snapshot(rt)
        for write in (
            lambda: inst.result.key("profile", "extra").set(value),
            lambda: inst.result.key("profile", "tags").push(value),
        ):
            with pytest.raises(TypeError) as info:
                write()
            for word in words:
                assert word in str(info.value), (word, str(info.value))
        with pytest.raises(TypeError) as info:
            await inst.send("edit", {"tag": "x", "ops": [[["extra"], value]]})
        assert words[-1] in str(info.value)
        with pytest.raises(TypeError, match="event for edit"):
            inst.stream("edit").send({"tag": "x", "ops": [], "v": value})
        assert snapshot(rt) == before


async def test_non_json_initial_value_and_arguments_are_named():
    @pattern
    def p(x=1):
        return {"c": cell({"when": {1, 2}}, name="bad")}

    async with Runtime() as rt:
        with pytest.raises(TypeError, match=r"initial value of p.bad/when is a set"):
            rt.run(p)
        with pytest.raises(TypeError, match=r"pattern arguments/x is a set"):
            rt.run(p, {"x": {1}})


async def test_update_and_push_on_the_wrong_shape_are_named():
    async with Runtime() as rt:
        inst = rt.run(people)
        with pytest.raises(TypeError, match=r"update\(\) takes a dict .*got list"):
            inst.result.key("profile").update([1])
        with pytest.raises(CellError, match=r"update\(\) needs an object at .*found str"):
            inst.result.key("profile", "name").update({"a": 1})
        with pytest.raises(CellError, match=r"push\(\) needs a list at .*found str"):
            inst.result.key("profile", "name").push("x")


# ----------------------------------------------------------------------------- stores


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("mongodb://db/app", ["unknown store 'mongodb://db/app'", "memory", "sqlite:///",
                              "postgresql://"]),
        ("postgresql://me:pw@db/app?pool_size=0", ["pool_size", "1 to 100", "me:***@"]),
        ("sqlite:///", ["needs a path"]),
        ("sqlite:/app.db", ["unknown store", "sqlite:///path"]),
    ],
)
async def test_a_bad_store_url_is_named(spec, words):
    with pytest.raises(ValueError) as info:
        Runtime(store=spec)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("spec", [42, None, ["memory"]])
def test_a_store_that_is_neither_url_nor_store_is_refused(spec):
    with pytest.raises(TypeError) as info:
        Runtime(store=spec)
    assert type(spec).__name__ in str(info.value) and "memory" in str(info.value)


def test_an_sqlite_file_that_cannot_be_opened_names_the_path(tmp_path: Path):
    where = tmp_path / "no" / "such" / "dir" / "app.db"
    with pytest.raises(Exception) as info:
        open_store(f"sqlite:///{where}")
    assert str(where) in str(info.value)


# --------------------------------------------------------------------------- patterns


def test_calling_a_pattern_directly_says_to_use_run():
    with pytest.raises(PatternError, match=r"pattern people is not called directly: use "
                                           r"rt.run\(people, args\)"):
        people()


async def test_run_takes_a_pattern():
    def plain():
        return {}

    async with Runtime() as rt:
        with pytest.raises(PatternError, match=r"rt.run\(\) takes a @pattern, got .*plain"):
            rt.run(plain)


async def test_unknown_and_missing_pattern_arguments_are_listed():
    @pattern
    def greet(name, greeting="hello"):
        return {"text": lift(lambda g, n: f"{g} {n}")(greeting, name)}

    async with Runtime() as rt:
        with pytest.raises(PatternError, match=r"greet got unknown arguments \['nmae'\]; it "
                                               r"takes \['greeting', 'name'\]"):
            rt.run(greet, {"nmae": "x"})
        with pytest.raises(PatternError, match=r"greet is missing arguments \['name'\]"):
            rt.run(greet, {})
        with pytest.raises(PatternError, match="arguments must be a dict, got list"):
            rt.run(greet, ["x"])
        assert rt.run(greet, {"name": "x"}).result.key("text").get() == "hello x"


@pytest.mark.parametrize(
    ("build", "what"),
    [
        (lambda: cell(1), "cell()"),
        (lambda: computed(lambda: 1), "computed()"),
        (lambda: lift(len)([1]), "lift(len)"),
        (lambda: bump(n=None), "binding handler bump"),
    ],
    ids=["cell", "computed", "lift", "handler"],
)
def test_builders_outside_a_pattern_say_where_they_belong(build, what):
    with pytest.raises(PatternError) as info:
        build()
    assert what in str(info.value) and "inside a @pattern function" in str(info.value)


@pytest.mark.parametrize(
    ("scope", "words"),
    [
        ("user", ["user-scoped cell", "user=..."]),
        ("session", ["session-scoped cell", "session=..."]),
        ("team", ["unknown scope 'team'", "'space', 'user' or 'session'"]),
    ],
)
async def test_a_scoped_cell_without_its_scope_key_is_named(scope, words):
    @pattern
    def p():
        return {"mine": cell(0, scope=scope)}

    async with Runtime() as rt:
        with pytest.raises(PatternError) as info:
            rt.run(p)
        for word in words:
            assert word in str(info.value)
        assert list(rt.store.keys("default")) == [] or all(
            k.scope == "" for k in rt.store.keys("default")
        )


async def test_a_cell_in_a_condition_says_to_read_it():
    @pattern
    def p():
        flag = cell(True)
        if flag:  # a mistake: the cell's value is not known while building
            return {}
        return {"flag": flag}

    async with Runtime() as rt:
        with pytest.raises(TypeError, match=r"truth value of Cell\(.*\.get\(\) inside lift"):
            rt.run(p)


def test_a_file_that_is_not_a_database_names_the_path(tmp_path: Path):
    where = tmp_path / "notes.txt"
    where.write_bytes(b"this is not an SQLite database, just text " * 100)
    with pytest.raises(Exception) as info:
        open_store(f"sqlite:///{where}")
    assert str(where) in str(info.value) and "not a database" in str(info.value)


async def test_a_failing_computation_raises_to_its_reader_not_to_run():
    runs: list[int] = []

    @pattern
    def fragile():
        d = cell(0, name="d")
        ratio = lift(lambda v: runs.append(v) or 10 // v)(d)
        return {"d": d, "ratio": ratio}

    async with Runtime() as rt:
        inst = rt.run(fragile)  # nothing observes ratio yet: it has not run
        assert runs == []
        with pytest.raises(ZeroDivisionError):
            inst.result.key("ratio").get()
        inst.result.key("d").set(5)
        assert inst.result.key("ratio").get() == 2


async def test_a_schema_error_lists_each_written_path_once():
    async with Runtime() as rt:
        inst = rt.run(people)
        with pytest.raises(SchemaError) as info:
            await inst.send("edit", {"tag": "t", "ops": [[["age"], 1], [["age"], 2],
                                                         [["name"], "B"], [["age"], -1]]})
    assert str(info.value).endswith("nothing was committed (wrote /age, /name)")


async def test_a_computation_failing_under_a_sink_is_reported_and_the_commit_stands():
    @handler
    def set_d(event, d, then):
        d.set(event["d"])
        then.send({"d": event["d"]})

    @handler
    def note(event, log):
        log.push(event["d"])

    @pattern
    def p():
        d = cell(1, name="d")
        log = cell([], name="log")
        then = note(log=log)
        return {"d": d, "log": log, "ratio": lift(lambda v: 10 // v)(d),
                "set": set_d(d=d, then=then)}

    async with Runtime() as rt:
        inst = rt.run(p)
        seen: list[Any] = []
        inst.result.key("ratio").sink(seen.append)
        records: list[Any] = []
        rt.on_commit(records.append)
        await inst.send("set", {"d": 0})  # the handler did nothing wrong: no error
        assert inst.result.key("d").get() == 0
        assert inst.result.key("log").get() == [0]  # what it sent ran
        assert len(records) == 2  # its commit and the note's were both announced
        ((where, err),) = rt.errors
        assert isinstance(err, ZeroDivisionError) and "sink on" in where and "ratio" in where
        await inst.send("set", {"d": 5})
        assert seen == [10, 2]  # the sink carries on once the value is computable again


async def test_subscribing_to_a_failing_computation_raises_to_the_subscriber():
    @pattern
    def p():
        d = cell(0, name="d")
        return {"d": d, "ratio": lift(lambda v: 10 // v)(d)}

    async with Runtime() as rt:
        inst = rt.run(p)
        with pytest.raises(ZeroDivisionError):
            inst.result.key("ratio").sink(lambda v: None)
