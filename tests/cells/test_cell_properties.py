"""Hypothesis properties of the cell layer.

(a) handler events run once each, in FIFO order, also when handlers send to each other;
(b) an invalid write or a failing handler leaves every document as it was;
(c) random DAGs of lift/computed nodes under random write batches: every value an observer
    (or a node) sees is what a recompute-everything oracle gives for that commit, and no node
    or sink runs twice per commit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import Cell, Runtime, cell, computed, handler, lift, pattern

pytestmark = pytest.mark.anyio

SETTINGS = settings(
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Boom(Exception):
    pass


# ============================================================================ (a) FIFO


@dataclass
class Ev:
    id: int
    to: int
    fail: bool
    children: list[Ev] = field(default_factory=list)

    def payload(self) -> dict[str, Any]:
        return {"id": self.id, "to": self.to, "fail": self.fail,
                "children": [c.payload() for c in self.children]}


N_HANDLERS = 4

_tree = st.recursive(
    st.tuples(st.integers(0, N_HANDLERS - 1), st.booleans(), st.just(())),
    lambda kids: st.tuples(
        st.integers(0, N_HANDLERS - 1), st.booleans(), st.lists(kids, max_size=3)
    ),
    max_leaves=12,
)
# a batch of events sent from outside, then drained; "await" sends each with inst.send
_batches = st.lists(
    st.tuples(st.sampled_from(["queue", "await"]), st.lists(_tree, min_size=1, max_size=4)),
    min_size=1,
    max_size=4,
)


def _number(batches: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Ev]]]:
    counter = iter(range(10**6))

    def build(t: Any) -> Ev:
        to, fail, kids = t
        ev = Ev(next(counter), to, fail)
        ev.children = [build(k) for k in kids]
        return ev

    return [(mode, [build(t) for t in trees]) for mode, trees in batches]


@SETTINGS
@given(raw=_batches, fail_often=st.booleans())
async def test_handler_events_run_in_fifo_order(raw, fail_often) -> None:
    batches = _number(raw)
    if not fail_often:  # most runs: failures are rare, so long chains happen too

        def clear(ev: Ev) -> None:
            ev.fail = ev.fail and ev.id % 5 == 0
            for c in ev.children:
                clear(c)

        for _, evs in batches:
            for ev in evs:
                clear(ev)

    streams: dict[int, Any] = {}
    ran: list[int] = []  # every handler run, in order (failed ones too)
    log_at_start: list[list[int]] = []  # the committed log each run saw when it began

    @handler
    def step(event, log, count):
        ran.append(event["id"])
        log_at_start.append(log.get())
        for child in event["children"]:
            streams[child["to"]].send(child)  # leaves only if this handler commits
        log.push(event["id"])
        count.set(count.get() + 1)
        if event["fail"]:
            raise Boom(event["id"])

    @pattern
    def fifo():
        log = cell([], schema={"type": "array", "items": {"type": "integer"}}, name="log")
        counts = [cell(0, name=f"count{i}") for i in range(N_HANDLERS)]
        out: dict[str, Any] = {"log": log, "counts": counts}
        for i in range(N_HANDLERS):
            out[f"h{i}"] = step(log=log, count=counts[i])
        return out

    # the oracle: one FIFO queue; a failed run commits nothing and sends nothing
    expected_runs: list[int] = []
    expected_log: list[int] = []
    expected_prefixes: list[list[int]] = []
    expected_counts = [0] * N_HANDLERS
    expected_failures = 0
    for mode, evs in batches:
        groups = [[ev] for ev in evs] if mode == "await" else [evs]
        for group in groups:
            q = deque(group)
            while q:
                ev = q.popleft()
                expected_runs.append(ev.id)
                expected_prefixes.append(list(expected_log))
                if ev.fail:
                    expected_failures += 1
                    continue
                expected_log.append(ev.id)
                expected_counts[ev.to] += 1
                q.extend(ev.children)

    async with Runtime() as rt:
        inst = rt.run(fifo)
        for i in range(N_HANDLERS):
            streams[i] = inst.stream(f"h{i}")
        raised = 0
        for mode, evs in batches:
            if mode == "queue":
                for ev in evs:
                    streams[ev.to].send(ev.payload())
                await rt.idle()
            else:
                for ev in evs:
                    try:
                        await inst.send(f"h{ev.to}", ev.payload())
                    except Boom as e:
                        assert e.args == (ev.id,)  # the awaited event's own failure
                        raised += 1
                    await rt.idle()
        assert ran == expected_runs
        assert log_at_start == expected_prefixes  # each ran after its sender committed
        assert inst.result.key("log").get() == expected_log
        assert [inst.result.key("counts", i).get() for i in range(N_HANDLERS)] == expected_counts
        reported = [e for _, e in rt.errors if isinstance(e, Boom)]
        assert len(reported) + raised == expected_failures
        assert not rt.scheduler.queue


# ================================================================= (b) invalid writes

PROFILE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
}

# valid operations, each as JSON (the handler applies them in order)
_valid_op = st.one_of(
    st.tuples(st.just("counter"), st.integers(0, 1000)),
    st.tuples(st.just("push"), st.text(max_size=5)),
    st.tuples(st.just("names"), st.lists(st.text(max_size=3), max_size=4)),
    st.tuples(st.just("name"), st.text(min_size=1, max_size=6)),
    st.tuples(st.just("alias"), st.text(min_size=1, max_size=6)),
    st.tuples(st.just("age"), st.integers(0, 150)),
    st.tuples(st.just("pref"), st.sampled_from(["dark", "compact", "beta"]), st.booleans()),
    st.tuples(st.just("send"), st.integers(0, 9)),
).map(list)

# operations that make the handler fail: a schema violation (found at commit), a write the
# runtime refuses at once, or the handler raising
_bad_op = st.one_of(
    st.tuples(st.just("counter"), st.integers(max_value=-1)),
    st.tuples(st.just("push"), st.integers()),
    st.tuples(st.just("names"), st.just(["ok", 3])),
    st.tuples(st.just("name"), st.just("")),
    st.tuples(st.just("alias"), st.just("")),
    st.tuples(st.just("age"), st.integers(151, 10**6)),
    st.tuples(st.just("pref"), st.just("dark"), st.just("yes")),
    st.tuples(st.just("profile"), st.just({"name": "no age"})),
    st.tuples(st.just("derived"), st.integers()),
    st.tuples(st.just("nonjson"), st.just(0)),
    st.tuples(st.just("raise"), st.just(0)),
).map(list)


@handler
def _witness(event, seen):
    seen.push(event["n"])


@handler
def _apply(event, counter, names, profile, alias, prefs, summary, witness):
    for op, *args in event["ops"]:
        if op == "counter":
            counter.set(args[0])
        elif op == "push":
            names.push(args[0])
        elif op == "names":
            names.set(args[0])
        elif op == "name":
            profile.key("name").set(args[0])
        elif op == "alias":
            alias.resolve().set(args[0])  # the target of the link: profile/name
        elif op == "age":
            profile.update({"age": args[0]})
        elif op == "pref":
            prefs.update({args[0]: args[1]})
        elif op == "send":
            witness.send({"n": args[0]})
        elif op == "profile":
            profile.set(args[0])
        elif op == "derived":
            summary.set(args[0])
        elif op == "nonjson":
            counter.set({1, 2})
        elif op == "raise":
            raise Boom("midway")


@pattern
def _state():
    counter = cell(0, schema={"type": "integer", "minimum": 0}, name="counter")
    names = cell([], schema={"type": "array", "items": {"type": "string"}}, name="names")
    profile = cell({"name": "Ada", "age": 36}, schema=PROFILE, name="profile")
    alias = cell(profile.key("name").link(), name="alias")
    prefs = cell({}, schema={"type": "object", "additionalProperties": {"type": "boolean"}},
                 scope="user", name="prefs")
    seen = cell([], name="seen")
    summary = computed(
        lambda: f"{counter.get()}|{len(names.get())}|{profile.key('name').get()}"
                f"|{sorted(prefs.get())}",
        name="summary",
    )
    w = _witness(seen=seen)
    return {
        "counter": counter, "names": names, "profile": profile, "alias": alias,
        "prefs": prefs, "seen": seen, "summary": summary,
        "witness": w,
        "apply": _apply(counter=counter, names=names, profile=profile, alias=alias,
                        prefs=prefs, summary=summary, witness=w),
    }


FAMILY = {"counter": "counter", "push": "names", "names": "names", "name": "profile",
          "alias": "profile", "age": "profile", "profile": "profile", "pref": "prefs"}
VIEWS = ["counter", "names", "profile", "alias", "prefs", "seen", "summary"]


def _model_apply(model: dict[str, Any], ops: list[list[Any]]) -> None:
    for op, *args in ops:
        if op == "counter":
            model["counter"] = args[0]
        elif op == "push":
            model["names"] = [*model["names"], args[0]]
        elif op == "names":
            model["names"] = list(args[0])
        elif op in ("name", "alias"):
            model["profile"] = {**model["profile"], "name": args[0]}
        elif op == "age":
            model["profile"] = {**model["profile"], "age": args[0]}
        elif op == "pref":
            model["prefs"] = {**model["prefs"], args[0]: args[1]}
        elif op == "send":
            model["seen"] = [*model["seen"], args[0]]
    model["alias"] = model["profile"]["name"]
    model["summary"] = (f"{model['counter']}|{len(model['names'])}|{model['profile']['name']}"
                        f"|{sorted(model['prefs'])}")


@SETTINGS
@given(
    history=st.lists(st.lists(_valid_op, min_size=1, max_size=4), max_size=5),
    before=st.lists(_valid_op, max_size=4),
    bad=_bad_op,
    after=st.lists(_valid_op, max_size=3),
    awaited=st.booleans(),
    store_kind=st.sampled_from(["memory", "sqlite"]),
)
async def test_an_invalid_write_leaves_every_document_as_it_was(
    tmp_path_factory, history, before, bad, after, awaited, store_kind
) -> None:
    store = "memory"
    if store_kind == "sqlite":
        store = f"sqlite:///{tmp_path_factory.mktemp('b') / 'state.db'}"
    model: dict[str, Any] = {"counter": 0, "names": [], "profile": {"name": "Ada", "age": 36},
                             "prefs": {}, "seen": []}
    _model_apply(model, [])
    async with Runtime(store=store) as rt:
        inst = rt.run(_state, space="s", user="u")
        sink_calls: dict[str, list[Any]] = {v: [] for v in VIEWS}
        for v in VIEWS:
            inst.result.key(v).sink(sink_calls[v].append)
        for ops in history:
            await inst.send("apply", {"ops": ops})
            _model_apply(model, ops)
        await rt.idle()
        assert {v: inst.result.key(v).get() for v in VIEWS} == model

        stored_before = {k: rt.store.load(k) for k in rt.store.keys("s")}
        cells_before = {v: inst.result.key(v).get() for v in VIEWS}
        calls_before = {v: len(c) for v, c in sink_calls.items()}
        changes: list[Any] = []
        rt.on_commit(changes.append)
        n_errors = len(rt.errors)

        # later writes to what the bad op wrote would overwrite it: keep them out
        after = [op for op in after if FAMILY.get(op[0]) != FAMILY.get(bad[0])]
        event = {"ops": [*before, bad, *after]}
        if awaited:
            with pytest.raises(Exception) as info:
                await inst.send("apply", event)
            err = info.value
        else:
            inst.stream("apply").send(event)
            await rt.idle()
            assert len(rt.errors) == n_errors + 1
            err = rt.errors[-1][1]
        assert isinstance(err, Exception) and not isinstance(err, AssertionError)
        await rt.idle()  # anything the failed handler sent would run now

        assert {k: rt.store.load(k) for k in rt.store.keys("s")} == stored_before
        assert {v: inst.result.key(v).get() for v in VIEWS} == cells_before == model
        assert {v: len(c) for v, c in sink_calls.items()} == calls_before
        assert changes == []

        # the runtime is not stuck: the same operations without the bad one commit
        await inst.send("apply", {"ops": [*before, *after]})
        _model_apply(model, [*before, *after])
        assert {v: inst.result.key(v).get() for v in VIEWS} == model
        for v in VIEWS:
            assert sink_calls[v][-1] == model[v]


# ======================================================================= (c) DAG oracle

OPS = ["sum", "diff", "max", "div3", "cond"]


@dataclass
class Node:
    op: str
    inputs: list[int]  # indexes into sources + nodes (< n_sources + own index)


@st.composite
def _dags(draw: st.DrawFn) -> tuple[int, list[Node], list[int]]:
    n_sources = draw(st.integers(1, 4))
    n_nodes = draw(st.integers(1, 9))
    nodes: list[Node] = []
    for i in range(n_nodes):
        avail = n_sources + i
        op = draw(st.sampled_from(OPS))
        arity = {"sum": draw(st.integers(1, 3)), "diff": 2, "max": 2, "div3": 1, "cond": 3}[op]
        inputs = [draw(st.integers(0, avail - 1)) for _ in range(arity)]
        nodes.append(Node(op, inputs))
    observed = draw(st.lists(st.integers(0, n_nodes - 1), min_size=1, max_size=n_nodes,
                             unique=True))
    return n_sources, nodes, observed


def _eval(op: str, v: list[int]) -> int:
    if op == "sum":
        return sum(v)
    if op == "diff":
        return v[0] - v[1]
    if op == "max":
        return max(v)
    if op == "div3":
        return v[0] // 3  # many changes stop here: value gating
    return v[1] if v[0] % 2 == 0 else v[2]  # cond


def _oracle(n_sources: int, nodes: list[Node], sources: list[int]) -> list[int]:
    vals = list(sources)
    for node in nodes:
        vals.append(_eval(node.op, [vals[i] for i in node.inputs]))
    return vals[n_sources:]


def _potential_upstream(n_sources: int, nodes: list[Node], observed: list[int]) -> set[int]:
    """Nodes some observed node may read, directly or not (any branch of a cond)."""
    need: set[int] = set()
    stack = list(observed)
    while stack:
        i = stack.pop()
        if i in need:
            continue
        need.add(i)
        stack.extend(j - n_sources for j in nodes[i].inputs if j >= n_sources)
    return need


_writes = st.lists(
    st.lists(st.tuples(st.integers(0, 3), st.integers(-6, 6)), min_size=1, max_size=5),
    min_size=1,
    max_size=8,
)


@SETTINGS
@given(dag=_dags(), batches=_writes)
async def test_random_dags_match_the_oracle_glitch_free(dag, batches) -> None:
    n_sources, nodes, observed = dag
    commit = [0]
    runs: list[tuple[int, int, int]] = []  # (commit, node, value computed)
    sink_seen: dict[int, list[tuple[int, int]]] = {i: [] for i in observed}

    def make(i: int, node: Node, cells: list[Cell]) -> Cell:
        ins = [cells[j] for j in node.inputs]

        def record(value: int) -> int:
            runs.append((commit[0], i, value))
            return value

        if node.op == "cond":
            c, a, b = ins  # dynamic: reads only the branch it takes

            def pick() -> int:
                return record(a.get() if c.get() % 2 == 0 else b.get())

            return computed(pick, name=f"n{i}")
        return lift(lambda *v: record(_eval(node.op, list(v))))(*ins)

    @handler
    def write(event, **sources):
        for j, v in event["writes"]:
            sources[f"s{j}"].set(v)

    @pattern
    def graph():
        srcs = [cell(0, schema={"type": "integer"}, name=f"s{j}") for j in range(n_sources)]
        cells: list[Cell] = list(srcs)
        for i, node in enumerate(nodes):
            cells.append(make(i, node, cells))
        return {
            "sources": srcs,
            "nodes": cells[n_sources:],
            "write": write(**{f"s{j}": s for j, s in enumerate(srcs)}),
        }

    values = [0] * n_sources
    expected = _oracle(n_sources, nodes, values)
    async with Runtime() as rt:
        inst = rt.run(graph)
        assert runs == []  # nothing observes the nodes yet: nothing ran
        for i in observed:
            inst.result.key("nodes", i).sink(lambda v, i=i: sink_seen[i].append((commit[0], v)))
        for i in observed:
            assert sink_seen[i] == [(0, expected[i])]
        assert all(v == expected[i] for _, i, v in runs)
        needed = _potential_upstream(n_sources, nodes, observed)
        assert {i for _, i, _ in runs} <= needed

        for n, batch in enumerate(batches, start=1):
            commit[0] = n
            writes = [(j % n_sources, v) for j, v in batch]
            previous, values_before = expected, list(values)
            for j, v in writes:
                values[j] = v
            expected = _oracle(n_sources, nodes, values)
            await inst.send("write", {"writes": writes})

            now = [(i, v) for c, i, v in runs if c == n]
            ran = [i for i, _ in now]
            assert len(ran) == len(set(ran)), f"a node ran twice in commit {n}: {ran}"
            for i, v in now:
                assert v == expected[i], f"node {i} computed {v}, oracle says {expected[i]}"
            assert set(ran) <= needed  # demand-driven: unobserved nodes never run
            if values == values_before:
                assert ran == []  # no source changed value: nothing to recompute
            if all(node.op != "cond" for node in nodes):
                # static dependencies: exactly the needed nodes whose inputs changed value run
                old_all, new_all = values_before + previous, values + expected
                should = {
                    i for i in needed
                    if any(old_all[j] != new_all[j] for j in nodes[i].inputs)
                }
                assert set(ran) == should
            for i in observed:
                calls = [v for c, v in sink_seen[i] if c == n]
                assert len(calls) <= 1, f"sink on node {i} called {len(calls)}x in commit {n}"
                if expected[i] != previous[i]:
                    assert calls == [expected[i]]
                else:
                    assert calls == []  # value-gated: an equal value notifies no one
        # at rest, every node (observed or not) reads as the oracle says
        commit[0] = -1
        assert inst.result.key("nodes").get() == expected
