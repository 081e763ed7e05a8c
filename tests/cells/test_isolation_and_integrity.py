"""Isolation and integrity of the cell graph under hostile or careless use (each test failed
on the code before issue 6 fixed it).

Isolation and integrity (scopes, per-task transactions, create-if-absent, links from
outside, commits that fail after the store, strict equality, argument and result cells,
async handlers, link fan-out), linear cost (what a commit validates and stores) and the
smaller items.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from runtime import (
    CelldialogError,
    ClosedError,
    ConflictError,
    LinkError,
    NotJSONError,
    PathError,
    PatternError,
    ReadOnlyError,
    Runtime,
    SchemaError,
    ScopeError,
    UsageError,
    cell,
    handler,
    lift,
    pattern,
)
from runtime.cells import current_instance, current_runtime
from runtime.cells.scope import Scope
from runtime.storage import MemoryStore

pytestmark = pytest.mark.anyio


@handler
def put(event, target):
    target.set(event["v"])


@handler
def push_v(event, target):
    target.push(event["v"])


@pattern(name="notes")
def notes():
    box = cell([], scope="session", name="box")
    return {"box": box, "put": put(target=box), "push": push_v(target=box)}


# ---------------------------------------------------------------- 1. scope keys collide


async def test_scope_ids_with_separators_never_meet():
    async with Runtime() as rt:
        pairs = [(None, "alice/s1"), ("alice", "s1"), ("a/b", "c"), ("a", "b/c"),
                 ("a:b", "c"), ("a", "b:c"), ("a%3Ab", "c"), (None, ":x"), ("", None)][:-1]
        for i, (user, session) in enumerate(pairs):
            await rt.run(notes, user=user, session=session).send("put", {"v": [i]})
        for i, (user, session) in enumerate(pairs):
            assert rt.run(notes, user=user, session=session).result.key("box").get() == [i]
        keys = {Scope.of(u, s).key for u, s in pairs}
        assert len(keys) == len(pairs)


@pytest.mark.parametrize(("user", "session"), [("", None), (None, ""), (5, None),
                                               (None, b"s"), ("u", 1.5)])
async def test_empty_or_non_string_ids_are_refused(user: Any, session: Any):
    async with Runtime() as rt:
        with pytest.raises(ScopeError, match="must"):
            rt.run(notes, user=user, session=session)


def test_scope_keys_round_trip_and_reach():
    for scope in (Scope(), Scope("a/b"), Scope("a", "b/c"), Scope(None, "s:1"), Scope("%", "~")):
        assert Scope.parse(scope.key) == scope
    assert Scope("u", "s").reachable == ("", Scope("u").key, Scope("u", "s").key)
    assert Scope(None, "alice/s1").reachable == ("", Scope(None, "alice/s1").key)


def test_scopes_stay_apart_across_two_processes(tmp_path):
    db = tmp_path / "s.db"
    code = textwrap.dedent(f"""
        import anyio, sys
        from tests.cells.test_isolation_and_integrity import notes
        from runtime import Runtime
        async def main(user, session, value):
            async with Runtime(store="sqlite:///{db}") as rt:
                inst = rt.run(notes, user=user or None, session=session)
                if value != "read":
                    await inst.send("put", {{"v": [value]}})
                print(inst.result.key("box").get())
        anyio.run(main, *sys.argv[1:])
    """)
    run = lambda *a: subprocess.run([sys.executable, "-c", code, *a], capture_output=True,
                                    text=True, check=True).stdout.strip()
    run("", "alice/s1", "no-user")
    run("alice", "s1", "alice")
    assert run("", "alice/s1", "read") == "['no-user']"
    assert run("alice", "s1", "read") == "['alice']"


# -------------------------------------------------- 2. a transaction belongs to its task


@pattern
def two():
    return {"a": cell(0, name="a"), "b": cell(0, name="b")}


async def test_a_write_in_another_task_does_not_join_an_open_transaction():
    async with Runtime() as rt:
        inst = rt.run(two)
        a, b = inst.result.key("a"), inst.result.key("b")
        inside, done = anyio.Event(), anyio.Event()

        async def task_a():
            with pytest.raises(RuntimeError, match="abandon"):
                with rt.transaction():
                    a.set(1)
                    inside.set()
                    await done.wait()
                    raise RuntimeError("abandon")

        async def task_b():
            await inside.wait()
            b.set(2)  # its own transaction, committed now
            assert a.get() == 0  # A's uncommitted write is A's alone
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(task_a)
            tg.start_soon(task_b)
        assert (a.get(), b.get()) == (0, 2)
        assert rt.store.load(b.resolve()._key).value == 2


async def test_concurrent_transactions_on_one_document_conflict_instead_of_losing_one():
    async with Runtime() as rt:
        a = rt.run(two).result.key("a")
        read = anyio.Event()

        async def slow():
            with pytest.raises(ConflictError, match=r"(?i)another writer"):
                with rt.transaction():
                    a.set(a.get() + 1)
                    read.set()
                    await anyio.lowlevel.checkpoint()
                    await anyio.lowlevel.checkpoint()

        async def fast():
            await read.wait()
            a.set(a.get() + 10)

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            tg.start_soon(fast)
        assert a.get() == 10  # the first commit stands, the second was refused, not merged


async def test_a_handler_transaction_is_invisible_to_a_task_and_ends_with_the_handler():
    from runtime.cells.documents import current_transaction

    seen: list[Any] = []

    @handler
    def peek(event, target):
        seen.append(current_transaction() is not None)
        target.set(1)

    @pattern
    def p():
        t = cell(0, name="t")
        return {"t": t, "go": peek(target=t)}

    async with Runtime() as rt:
        inst = rt.run(p)
        await inst.send("go", {})
        assert seen == [True] and current_transaction() is None


# ------------------------------------------- 3. first declaration never overwrites data


async def test_declaring_an_existing_document_keeps_its_committed_value(tmp_path):
    store = f"sqlite:///{tmp_path / 'd.db'}"
    async with Runtime(store=store) as rt1, Runtime(store=store) as rt2:
        c1 = rt1.run(two).result.key("a")
        c1.set(41)
        # a second process starting now finds the committed value, never writes 0 over it
        c2 = rt2.run(two).result.key("a")
        assert c2.get() == 41


_RACE = textwrap.dedent("""
    import anyio, sys, time
    from multiprocessing.connection import Client
    from runtime import ConflictError, Runtime
    from tests.cells.test_isolation_and_integrity import counter

    async def trial(db):
        committed = 0
        async with Runtime(store="sqlite:///" + db) as rt:
            inst = rt.run(counter)
            for _ in range(int(sys.argv[2])):
                while True:
                    try:
                        await inst.send("bump", {})
                        committed += 1
                        break
                    except ConflictError:
                        continue  # another process got there first: the runtime caught up
        return committed

    start = float(sys.argv[3])
    for db in sys.argv[4:]:
        while time.time() < start:  # every process opens each trial's store together
            pass
        start += 0.25
        print(anyio.run(trial, db), flush=True)
""")


@handler
def bump(event, n):
    n.set(n.get() + 1)


@pattern(name="race-counter")
def counter():
    n = cell(0, name="n")
    return {"n": n, "bump": bump(n=n)}


def test_four_processes_starting_together_lose_no_increment(tmp_path):
    import time

    trials, per = 20, 15
    dbs = [str(tmp_path / f"t{i}.db") for i in range(trials)]
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, "x", str(per), str(start), *dbs],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    committed = [[int(x) for x in out.split()] for out, _ in outs]
    assert all(len(c) == trials for c in committed)

    async def final(db: str) -> int:
        async with Runtime(store=f"sqlite:///{db}") as rt:
            return rt.run(counter).result.key("n").get()

    for t, db in enumerate(dbs):
        assert anyio.run(final, db) == sum(c[t] for c in committed) == 4 * per


# ---------------------------------------------------- 4. links injected through events


@pattern
def victim():
    secret = cell({"pin": "1234"}, name="secret")
    return {"secret": secret}


async def test_a_link_sent_in_an_event_is_refused_and_cannot_alias_another_document():
    async with Runtime() as rt:
        v = rt.run(victim)
        target_id = v.result.key("secret").resolve().id
        inst = rt.run(notes, session="s")
        for evil in ({"@link": f"/{target_id}"}, {"@link": "junk"},
                     {"@link": f"/{target_id}", "scope": ""}):
            with pytest.raises(LinkError):
                await inst.send("put", {"v": evil})
            with pytest.raises(LinkError):
                await inst.send("push", {"v": [evil]})
        assert inst.result.key("box").get() == []
        assert v.result.key("secret").get() == {"pin": "1234"}


async def test_a_link_written_by_code_where_no_schema_asks_is_refused():
    async with Runtime() as rt:
        box = rt.run(notes, session="s").result.key("box")
        with pytest.raises(LinkError, match="asCell"):
            box.set({"@link": "/anything"})
        with pytest.raises(LinkError, match="asCell"):
            box.push({"@link": "/anything"})
        assert box.get() == []


async def test_data_with_an_at_link_key_beside_others_is_plain_data():
    async with Runtime() as rt:
        box = rt.run(notes, session="s").result.key("box")
        box.set({"@link": "/x", "note": "just data"})
        assert box.get() == {"@link": "/x", "note": "just data"}


@pattern
def pointers():
    target = cell({"name": "Ada"}, name="target")
    ref = cell(None, schema={"asCell": True}, name="ref")
    return {"target": target, "ref": ref}


async def test_where_the_schema_asks_for_a_link_it_must_be_sound():
    async with Runtime() as rt:
        inst = rt.run(pointers)
        ref, target = inst.result.key("ref"), inst.result.key("target")
        ref.set(target.link())  # a link as data, where the schema asks for one
        assert ref.get() == {"name": "Ada"}
        own = inst.result.raw()["ref"]["@link"]  # the ref cell's own document
        with pytest.raises(LinkError):
            ref.set({"@link": "junk"})
        # pointing at itself would make the document unreadable: refused
        with pytest.raises(LinkError, match="itself"):
            ref.set({"@link": own})
        assert ref.get() == {"name": "Ada"}


async def test_a_document_holding_a_broken_link_stays_readable_and_writable(tmp_path):
    store = f"sqlite:///{tmp_path / 'b.db'}"
    async with Runtime(store=store) as rt:
        box = rt.run(notes, session="s").result.key("box")
        key = box.resolve()._key
        # data written before links were checked (or by another tool) holds broken links
        from runtime.storage import Write
        rt.store.commit([Write(key, [{"@link": "junk"}, {"@link": "/no-such-doc"}, 1])])
    async with Runtime(store=store) as rt:
        box = rt.run(notes, session="s").result.key("box")
        assert box.get() == [None, None, 1]
        box.set(["repaired"])
        assert box.get() == ["repaired"]


# --------------------------------------------- 5. never reported failed, yet committed


def _deep(n: int) -> Any:
    v: Any = "leaf"
    for _ in range(n):
        v = {"x": v}
    return v


async def test_a_deep_value_is_refused_before_anything_commits():
    async with Runtime() as rt:
        inst = rt.run(notes, session="s")
        before = {k: rt.store.load(k) for k in rt.store.keys("default")}
        with pytest.raises(NotJSONError, match="nests deeper than"):
            await inst.send("put", {"v": _deep(491)})
        with pytest.raises(NotJSONError, match="nests deeper than"):
            inst.result.key("box").set(_deep(491))
        assert {k: rt.store.load(k) for k in rt.store.keys("default")} == before
        await inst.send("put", {"v": _deep(50)})  # moderate depth is fine
        assert inst.result.key("box").get() == _deep(50)


async def test_a_value_that_contains_itself_is_a_clear_error():
    loop: list[Any] = []
    loop.append(loop)
    async with Runtime() as rt:
        with pytest.raises(NotJSONError, match="contains itself"):
            rt.run(notes, session="s").result.key("box").set(loop)


# ------------------------------------------------------------ 6. strict JSON equality


@pattern
def one():
    return {"v": cell([1], name="v"), "f": cell(1, name="f")}


async def test_true_is_not_one_and_one_point_oh_is_not_one():
    async with Runtime() as rt:
        inst = rt.run(one)
        v, f = inst.result.key("v"), inst.result.key("f")
        seen: list[Any] = []
        v.sink(seen.append)
        v.set([True])
        assert v.get() == [True] and type(v.get()[0]) is bool
        assert rt.store.load(v.resolve()._key).value == [True]
        assert [type(x[0]) for x in seen] == [int, bool]
        f.set(1.0)
        assert type(f.get()) is float
        assert type(rt.store.load(f.resolve()._key).value) is float


# ------------------------------------------------ 7. argument and result cells validate


@handler
def add_to(event, items):
    items.push(event["title"])


@pattern
def todo(title: str = "list"):
    items = cell([], name="items")
    return {"items": items, "add": add_to(items=items), "title": title}


async def test_the_argument_cell_refuses_what_would_brick_the_instance():
    async with Runtime() as rt:
        inst = rt.run(todo)
        with pytest.raises(SchemaError):
            inst.argument.set(5)
        assert inst.argument.get() == {"title": "list"}
        await inst.send("add", {"title": "milk"})
        assert inst.result.key("items").get() == ["milk"]


async def test_the_result_structure_is_not_writable():
    async with Runtime() as rt:
        inst = rt.run(todo)
        with pytest.raises(ReadOnlyError, match="stream"):
            inst.result.key("add").set(1)
        with pytest.raises(ReadOnlyError):
            inst.result.set({})
        await inst.send("add", {"title": "milk"})  # the stream still works
        # a write through the result's link to a cell lands on the cell
        inst.result.key("items").set(["tea"])
        assert inst.result.key("items").get() == ["tea"]


# ------------------------------------------------------------- 8. async def handlers


def test_an_async_handler_is_refused_with_what_to_do_instead():
    with pytest.raises(PatternError, match="spawn"):
        @handler
        async def fetch(event, items):  # pragma: no cover - never runs
            items.push(1)


async def test_a_handler_reaches_its_runtime_and_instance_and_spawns_work_it_owns():
    done: list[Any] = []

    async def later(items, who):
        items.push(who)
        done.append(who)

    @handler
    def start(event, items):
        rt, inst = current_runtime(), current_instance()
        rt.spawn(later, items, inst.pattern.name, owner=inst)

    @pattern
    def p():
        items = cell([], name="items")
        return {"items": items, "start": start(items=items)}

    async with Runtime() as rt:
        inst = rt.run(p)
        await inst.send("start", {})
        await rt.settled()
        assert inst.result.key("items").get() == ["p"] and done == ["p"]
    with pytest.raises(PatternError, match="only known while a handler runs"):
        current_instance()


# --------------------------------------------------------------- 9. link fan-out


async def test_links_fanning_out_cost_their_distinct_targets_not_two_to_the_n():
    @pattern
    def ladder():
        cells = [cell({"level": 0}, name="l0")]
        for i in range(1, 40):
            below = cells[-1]
            cells.append(cell({"left": below.link(), "right": below.link()}, name=f"l{i}"))
        return {"top": cells[-1]}

    async with Runtime() as rt:
        inst = rt.run(ladder)
        resolves = 0
        real = rt.docs.resolve

        def counting(*a: Any, **k: Any) -> Any:
            nonlocal resolves
            resolves += 1
            return real(*a, **k)

        rt.docs.resolve = counting  # type: ignore[method-assign]
        value = inst.result.key("top").get()
        assert resolves < 200  # 2**39 without sharing
        node = value
        for _ in range(39):
            assert node["left"] is node["right"]
            node = node["left"]
        assert node == {"level": 0}


# --------------------------------------------- 10. a commit costs what it changed


async def test_a_push_validates_the_item_and_stores_a_patch_not_the_list():
    schema = {"type": "array", "items": {"type": "object", "required": ["title"]}}

    @pattern
    def big():
        items = cell([{"title": str(i)} for i in range(10_000)], schema=schema, name="items")
        return {"items": items, "add": push_v(target=items)}

    store = MemoryStore()
    writes: list[Any] = []
    real = store.commit
    store.commit = lambda ws: (writes.extend(ws), real(ws))[1]  # type: ignore[method-assign]
    from runtime.cells import schema as schema_mod

    validated: list[Any] = []
    real_validate = schema_mod.CompiledSchema.validate

    def spy(self: Any, value: Any, *a: Any, **k: Any) -> None:
        validated.append(value)
        return real_validate(self, value, *a, **k)

    async with Runtime(store=store) as rt:
        inst = rt.run(big)
        writes.clear()
        schema_mod.CompiledSchema.validate = spy  # type: ignore[method-assign]
        try:
            await inst.send("add", {"v": {"title": "new"}})
            with pytest.raises(SchemaError, match="required"):
                await inst.send("add", {"v": {"name": "no title"}})
        finally:
            schema_mod.CompiledSchema.validate = real_validate  # type: ignore[method-assign]
        assert validated == [{"title": "new"}, {"name": "no title"}]
        [w] = writes
        assert w.patch == (((10_000,), {"title": "new"}),) and w.expect is not None
        assert inst.result.key("items").get()[-1] == {"title": "new"}
        assert len(inst.result.key("items").get()) == 10_001


async def test_container_rules_are_still_checked_on_a_push():
    @pattern
    def capped():
        items = cell([1, 2], schema={"type": "array", "maxItems": 2, "items": {"type": "integer"}},
                     name="items")
        return {"items": items, "add": push_v(target=items)}

    async with Runtime() as rt:
        inst = rt.run(capped)
        with pytest.raises(SchemaError, match="too long"):
            await inst.send("add", {"v": 3})
        assert inst.result.key("items").get() == [1, 2]


# ------------------------------------------------------------------------- smaller


async def test_the_error_list_is_bounded():
    @handler
    def fail(event, n):
        raise ValueError(f"bad {event['i']}")

    @pattern
    def p():
        n = cell(0, name="n")
        return {"n": n, "fail": fail(n=n)}

    async with Runtime() as rt:
        inst = rt.run(p)
        for i in range(1200):
            inst.stream("fail").send({"i": i})
        await rt.idle()
        assert len(rt.errors) == 1000
        assert str(rt.errors[-1][1]) == "bad 1199"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_writes_and_run_after_close_raise(tmp_path, kind):
    store = "memory" if kind == "memory" else f"sqlite:///{tmp_path / 'c.db'}"
    async with Runtime(store=store) as rt:
        inst = rt.run(todo)
        items = inst.result.key("items")
    with pytest.raises(ClosedError, match="closed"):
        items.set(["x"])
    with pytest.raises(ClosedError, match="closed"):
        rt.run(todo, {"title": "other"})
    with pytest.raises(ClosedError):
        rt.spawn(anyio.sleep, 0)


async def test_a_bad_json_schema_is_our_error():
    @pattern
    def p():
        return {"c": cell(1, schema={"type": "no-such-type"})}

    async with Runtime() as rt:
        with pytest.raises(SchemaError, match="invalid JSON Schema") as info:
            rt.run(p)
    assert isinstance(info.value, CelldialogError)


async def test_a_path_step_must_be_a_key_or_an_index():
    async with Runtime() as rt:
        items = rt.run(todo).result.key("items")
        for bad in (1.5, True, -1, None):
            with pytest.raises(PathError, match="path step"):
                items.key(bad)  # type: ignore[arg-type]


class Todo(BaseModel):
    title: str
    done: bool = False


async def test_schema_int_refuses_a_float_and_a_model_schema_takes_its_instances():
    @pattern
    def p():
        return {"n": cell(1, schema=int, name="n"), "t": cell(None, schema=Todo | None, name="t")}

    async with Runtime() as rt:
        inst = rt.run(p)
        with pytest.raises(SchemaError, match="integer"):
            inst.result.key("n").set(2.0)
        inst.result.key("t").set(Todo(title="milk"))
        assert inst.result.key("t").get() == {"title": "milk", "done": False}


def test_pattern_identity_is_the_same_run_as_a_script_or_imported(tmp_path):
    (tmp_path / "myapp.py").write_text(textwrap.dedent("""
        from runtime import pattern, cell
        @pattern
        def todo():
            return {"items": cell([])}
        if __name__ == "__main__":
            print(todo.key)
    """))
    env = {"PYTHONPATH": f"{tmp_path}:{sys.path[0]}", "PATH": "/usr/bin:/bin"}
    as_script = subprocess.run([sys.executable, str(tmp_path / "myapp.py")], env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
    imported = subprocess.run([sys.executable, "-c", "import myapp; print(myapp.todo.key)"],
                              env=env, capture_output=True, text=True, check=True).stdout.strip()
    as_module = subprocess.run([sys.executable, "-m", "myapp"], env=env, cwd=tmp_path,
                               capture_output=True, text=True, check=True).stdout.strip()
    assert as_script == imported == as_module == "myapp.todo"


def test_lift_outside_a_pattern_names_lift():
    with pytest.raises(PatternError, match=r"lift\(len\)"):
        lift(len)([1])


async def test_a_conflict_says_another_writer_changed_it_and_how_to_retry(tmp_path):
    store = f"sqlite:///{tmp_path / 'x.db'}"
    async with Runtime(store=store) as rt1, Runtime(store=store) as rt2:
        a1 = rt1.run(two).result.key("a")
        a2 = rt2.run(two).result.key("a")
        a1.set(1)
        with pytest.raises(ConflictError) as info:
            a2.set(2)  # rt2 still holds version 1 of the document
        assert "another writer" in str(info.value).lower() and "again" in str(info.value)
        a2.set(3)  # it caught up: the retry commits
        assert a1.get() in (1, 3) and a2.get() == 3


async def test_events_queued_from_outside_a_handler_run_without_anyone_draining():
    async with Runtime() as rt:
        inst = rt.run(todo)
        arrived = anyio.Event()
        inst.result.key("items").sink(lambda v: arrived.set() if v else None)
        inst.stream("add").send({"title": "from a timer"})  # queued, nobody awaits idle()
        assert inst.result.key("items").get() == []  # not run inside send()
        with anyio.fail_after(5):
            await arrived.wait()
        assert inst.result.key("items").get() == ["from a timer"]


# ------------------------------------------------- found by a hostile probe, then fixed


@handler
def set_field(event, form):
    form.key(event["field"]).set(event["value"])


@handler
def rename(event, title):
    title.key("name").set(event["name"])


@pattern(name="titled")
def titled(title):
    return {"title": title, "rename": rename(title=title)}


async def test_a_link_in_pattern_arguments_is_refused():
    async with Runtime() as rt:
        secret = rt.run(victim).result.key("secret")
        target = secret.resolve()
        for evil in ({"@link": f"/{target.id}"}, {"@link": "/nope"}):
            with pytest.raises(LinkError):
                rt.run(titled, {"title": evil})
        # a Cell passed by code is a link the runtime made: allowed, and reads through
        inst = rt.run(titled, {"title": secret})
        assert inst.result.key("title").get() == {"pin": "1234"}


async def test_a_link_cannot_be_assembled_one_key_at_a_time():
    @pattern
    def form():
        f = cell({}, name="form")
        return {"form": f, "set_field": set_field(form=f)}

    async with Runtime() as rt:
        target = rt.run(victim).result.key("secret").resolve()
        inst = rt.run(form)
        own = inst.result.raw()["form"]["@link"]
        for value in (f"/{target.id}", own):
            with pytest.raises(LinkError, match="turn the object there into a link"):
                await inst.send("set_field", {"field": "@link", "value": value})
        await inst.send("set_field", {"field": "scope", "value": ""})  # plain data so far
        with pytest.raises(LinkError, match="turn the object there into a link"):
            await inst.send("set_field", {"field": "@link", "value": f"/{target.id}"})
        assert inst.result.key("form").get() == {"scope": ""}


async def test_read_then_write_transactions_in_several_tasks_lose_no_update():
    async with Runtime() as rt:
        n = rt.run(two).result.key("a")
        outcomes: list[str] = []

        async def inc() -> None:
            try:
                with rt.transaction():
                    v = n.get()
                    await anyio.lowlevel.checkpoint()
                    await anyio.lowlevel.checkpoint()
                    n.set(v + 1)
                outcomes.append("ok")
            except ConflictError:
                outcomes.append("conflict")

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(inc)
        assert n.get() == outcomes.count("ok") >= 1
        assert outcomes.count("conflict") >= 1


async def test_writes_through_links_into_list_elements():
    @pattern
    def listy():
        items = cell([{"t": "a"}, {"t": "b"}], name="items")
        return {"items": items, "first": items.key(0),
                "ref": cell(None, schema={"asCell": True}, name="ref")}

    async with Runtime() as rt:
        inst = rt.run(listy)
        inst.result.key("first").key("t").set("X")
        inst.result.key("items").key("1").set({"t": "Y"})
        assert inst.result.key("items").get() == [{"t": "X"}, {"t": "Y"}]
        inst.result.key("ref").set(inst.result.key("items", 1))
        inst.result.key("ref").key("t").set("W")
        assert inst.result.key("items").get() == [{"t": "X"}, {"t": "W"}]
        with pytest.raises(PathError):
            inst.result.key("items").key("³").set(1)


async def test_effects_that_loop_after_a_commit_do_not_make_it_look_failed():
    @pattern
    def looping():
        return {"a": cell(0, name="a"), "b": cell(0, name="b"), "other": cell(0, name="o")}

    async with Runtime() as rt:
        inst = rt.run(looping)
        a, b, other = (inst.result.key(k) for k in ("a", "b", "other"))
        a.sink(lambda v: b.set(v + 1) if v else None)
        b.sink(lambda v: a.set(v + 1) if v else None)
        with rt.transaction():  # stored, so it must not raise
            other.set(42)
            a.set(1)
        assert other.get() == 42 and rt.store.load(other.resolve()._key).value == 42
        assert any(isinstance(e, CelldialogError) for _, e in rt.errors)


@pattern(name="owner-b")
def owner_b():
    return {"n": cell(0, schema=int, name="n")}


@pattern(name="owner-a")
def owner_a():
    return {"ref": cell(None, schema={"asCell": True}, name="ref")}


async def test_a_document_no_running_instance_declares_is_not_writable(tmp_path):
    store = f"sqlite:///{tmp_path / 'u.db'}"
    async with Runtime(store=store) as rt:
        b = rt.run(owner_b)
        rt.run(owner_a).result.key("ref").set(b.result.key("n"))
    async with Runtime(store=store) as rt:
        ref = rt.run(owner_a).result.key("ref")
        assert ref.get() == 0  # readable
        with pytest.raises(ReadOnlyError, match="no running instance declares it"):
            ref.resolve().set("not an int")
        rt.run(owner_b)  # once its owner runs, its schema applies
        with pytest.raises(SchemaError):
            ref.resolve().set("not an int")
        ref.resolve().set(7)
        assert ref.get() == 7


async def test_a_task_started_inside_a_transaction_writes_on_its_own():
    async with Runtime() as rt:
        inst = rt.run(two)
        a, b = inst.result.key("a"), inst.result.key("b")
        wrote = anyio.Event()

        async def worker() -> None:
            await anyio.lowlevel.checkpoint()
            b.set(7)
            wrote.set()

        async with anyio.create_task_group() as tg:
            with pytest.raises(RuntimeError):
                with rt.transaction():
                    a.set(1)
                    tg.start_soon(worker)
                    await wrote.wait()
                    raise RuntimeError("the parent's block fails")
        assert (a.get(), b.get()) == (0, 7)


async def test_events_sent_inside_a_transaction_leave_only_if_it_commits():
    async with Runtime() as rt:
        inst = rt.run(todo)
        with pytest.raises(RuntimeError):
            with rt.transaction():
                inst.stream("add").send({"title": "never"})
                raise RuntimeError("abandon")
        with rt.transaction():
            inst.stream("add").send({"title": "kept"})
            await rt.idle()  # not released before the commit
            assert inst.result.key("items").get() == []
        await rt.idle()
        assert inst.result.key("items").get() == ["kept"]


async def test_a_nested_block_that_raises_takes_back_only_its_own_writes():
    async with Runtime() as rt:
        inst = rt.run(two)
        a, b = inst.result.key("a"), inst.result.key("b")
        with rt.transaction():
            a.set(5)
            with pytest.raises(ValueError):
                with rt.transaction():
                    b.set(6)
                    a.set(9)
                    raise ValueError
            assert (a.get(), b.get()) == (5, 0)
        assert (a.get(), b.get()) == (5, 0)


async def test_listeners_hear_of_commits_in_the_order_they_were_stored():
    async with Runtime() as rt:
        a = rt.run(two).result.key("a")
        heard: list[Any] = []
        rt.on_commit(lambda changes: heard.extend((c.before, c.after) for c in changes))
        a.sink(lambda v: a.set(2) if v == 1 else None)
        a.set(1)
        assert heard == [(0, 1), (1, 2)] and a.get() == 2


def test_equality_of_values_that_share_parts_costs_their_distinct_parts():
    from runtime.cells.equality import same

    def dag(levels: int) -> Any:
        node: Any = {"leaf": 1}
        for _ in range(levels):
            node = {"l": node, "r": node}
        return node

    assert same(dag(80), dag(80))  # a tree walk would visit 2**80 nodes
    other = dag(80)
    node = other
    for _ in range(79):
        node = node["l"]
    node["l"] = {"leaf": 2}
    assert not same(dag(80), other)


@pytest.mark.parametrize(("schema", "path", "value"), [
    ({"properties": {"x": {"type": "string"},
                     "a": {"maxProperties": 5, "properties": {"b": {"$ref": "#/properties/x"}}}}},
     ("a", "b"), 5),
    ({"$defs": {"a b": {"type": "string"}, "a%20b": {}},
      "properties": {"v": {"$ref": "#/$defs/a%20b"}}}, ("v",), 5),
    ({"type": "object", "additionalProperties": False, "items": {}}, ("5",), 1),
    ({"type": "array", "items": {"type": "string"}, "properties": {"0": {}}}, (0,), 5),
])
async def test_a_write_never_commits_what_the_whole_schema_rejects(schema, path, value):
    initial: Any = [] if schema.get("type") == "array" else {"a": {}} if "a" in str(path) else {}

    @pattern
    def p():
        return {"c": cell(initial, schema=schema, name="c")}

    async with Runtime() as rt:
        c = rt.run(p).result.key("c")
        with pytest.raises(SchemaError):
            c.key(*path).set(value)
        assert c.get() == initial


async def test_a_handler_that_returns_an_awaitable_fails_loudly():
    async def later(items):  # pragma: no cover - never awaited
        items.push(1)

    @handler
    def sneaky(event, items):
        return later(items)

    @pattern
    def p():
        items = cell([], name="items")
        return {"go": sneaky(items=items)}

    async with Runtime() as rt:
        with pytest.raises(PatternError, match="returned an awaitable"):
            await rt.run(p).send("go", {})


async def test_a_sink_that_mutates_its_argument_misses_no_change():
    async with Runtime() as rt:
        v = rt.run(one).result.key("v")
        seen: list[Any] = []

        def mutate(x: Any) -> None:
            seen.append(list(x))
            x.append("mutated")

        v.sink(mutate)
        v.set([1, "mutated"])
        assert seen == [[1], [1, "mutated"]]


async def test_ids_and_causes_that_cannot_be_text_are_our_errors():
    async with Runtime() as rt:
        with pytest.raises(ScopeError, match="surrogate"):
            rt.run(notes, user="\ud800", session="s")
        with pytest.raises(NotJSONError, match="digits"):
            rt.run(notes, session="s", cause={"n": 10**5000})


async def test_update_and_push_at_a_data_link_do_not_pass_through_it():
    async with Runtime() as rt:
        inst = rt.run(pointers)
        ref, target = inst.result.key("ref"), inst.result.key("target")
        ref.set(target)
        with pytest.raises(UsageError, match="resolve"):
            ref.update({"y": 2})
        ref.resolve().update({"y": 2})
        assert target.get() == {"name": "Ada", "y": 2}


def test_an_open_transaction_is_its_own_tasks_alone() -> None:
    # a task or a thread started inside a transaction inherits the context variable, not
    # the transaction: it reads what is committed, and its writes are its own
    @pattern
    def one():
        return {"n": cell(0, name="n")}

    async def main() -> None:
        async with Runtime() as rt:
            n = rt.run(one).result.key("n")
            seen: dict[str, Any] = {}

            async def child() -> None:
                seen["child"] = n.get()

            with rt.transaction():
                n.set(5)
                seen["owner"] = n.get()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(child)
                seen["thread"] = await anyio.to_thread.run_sync(n.get)
                seen["owner after"] = n.get()
            assert seen == {"owner": 5, "child": 0, "thread": 0, "owner after": 5}
            assert n.get() == 5

    anyio.run(main)


def test_under_another_backend_a_transaction_is_known_by_anyios_task_id() -> None:
    # trio keeps no asyncio task: the owner is anyio's id of the task that opened it
    from runtime.cells import documents

    class Opened:
        task: object = None

    async def main() -> None:
        tx = Opened()
        tx.task = documents._task_key()
        assert type(tx.task) is int
        token = documents._tx.set(tx)  # as Transaction.bind() does
        seen: list[bool] = []

        async def child() -> None:
            seen.append(documents.current_transaction() is tx)

        try:
            seen.append(documents.current_transaction() is tx)
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
        finally:
            documents._tx.reset(token)
        assert seen == [True, False]

    anyio.run(main, backend="trio")


def test_where_asyncio_no_longer_fills_its_task_dict_the_owner_is_still_asyncios_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a Python that keeps the dict but not its tasks in it (as 3.14 may): the first
    # transaction finds that out and asks asyncio.current_task from then on
    from runtime.cells import documents

    monkeypatch.setattr(documents, "_tasks_get", {}.get)

    async def main() -> None:
        owner = documents._task_key()
        assert owner is asyncio.current_task()
        assert documents._tasks_get is documents._asyncio_current_task
        seen: list[object] = []

        async def child() -> None:
            seen.append(documents._tasks_get(asyncio.get_running_loop()))

        await asyncio.gather(child())
        assert seen and seen[0] is not owner

    asyncio.run(main())
