"""The reactive kernel (runtime/cells/_kernel.py, through its front runtime/cells/signals.py):
properties against a naive oracle, and examples.

The property test builds random DAGs of signals and computeds (some with dynamic branches,
some with value cutoffs), observes random subsets with effects, and applies random writes,
batches, new effects and disposals. After every commit it recomputes every node from scratch
(the oracle) and checks: (a) what observers saw is the oracle's value at that commit, (b) no
computed runs twice in one commit, (c) nothing runs that no effect needs, (d) an effect runs
exactly when something it read changed, (e) reading any node gives the oracle's value.
It runs again with a tiny MAX_DEPTH (every first evaluation goes through the depth driver),
and a variant adds effects that write (mirrors), checked at rest.
"""

from __future__ import annotations

import signal as os_signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.cells import _kernel as kernel  # the one the front chose: compiled or pure
from runtime.cells import signals
from runtime.cells.signals import (
    Computed,
    CycleError,
    Effect,
    Signal,
    WriteInComputationError,
    batch,
    untracked,
)


@pytest.fixture(autouse=True)
def kernel_state_is_clean_after_each_test() -> Iterator[None]:
    yield
    g = kernel._G
    state = (g.active, g.depth, g.batch, g.flushing, g.pos)
    queued = [e for e in g.queue if e.flags & kernel._QUEUED]
    g.active, g.depth, g.batch, g.flushing, g.pos = None, 0, 0, False, 0  # don't fail the next
    g.queue.clear()
    assert state == (None, 0, 0, False, 0)
    assert not queued, f"effects left queued: {queued}"


class TimeLimitExceeded(BaseException):  # not an Exception: computeds must not catch it
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Turn a hang (a kernel spinning on a cycle) into a failure."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeLimitExceeded(f"still running after {seconds} s")

    previous = os_signal.signal(os_signal.SIGALRM, expire)
    os_signal.setitimer(os_signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        os_signal.setitimer(os_signal.ITIMER_REAL, 0)
        os_signal.signal(os_signal.SIGALRM, previous)


# ------------------------------------------------------------------------------ the model

# A node spec is (kind, inputs, k); inputs index earlier nodes. One function evaluates a spec
# for both the kernel (read = node.get) and the oracle (read = the oracle's value list), so
# dynamic branches read the same nodes in the same order in both.
Spec = tuple[str, tuple[int, ...], int]
EffectSpec = tuple[int, tuple[int, ...], tuple[int, ...]]
Read = Callable[[int], int]


def evaluate(spec: Spec, read: Read) -> int:
    kind, ins, k = spec
    if kind == "add":
        return sum(read(j) for j in ins) + k
    if kind == "mod":  # value cutoff: many input values, few output values
        return read(ins[0]) % k
    if kind == "branch":  # dynamic: reads one of two nodes depending on a third
        return read(ins[1]) if read(ins[0]) % 2 == 0 else read(ins[2])
    if kind == "guard":  # dynamic, different number of reads per branch
        v = read(ins[0])
        if v % 3 == 0:
            return v + read(ins[1])
        if v % 3 == 1:
            return 2 * read(ins[2])
        return v
    if kind == "max":
        return max(read(ins[0]), read(ins[1]))
    if kind == "mirror":  # a signal an effect keeps equal to this (the oracle's view)
        return read(ins[0]) % k
    raise AssertionError(kind)


def observe(espec: EffectSpec, read: Read) -> list[tuple[int, int]]:
    """What an effect reads: a condition node, then one of two lists depending on it."""
    cond, even, odd = espec
    v = read(cond)
    seen = [(cond, v)]
    for j in even if v % 2 == 0 else odd:
        seen.append((j, read(j)))
    return seen


def oracle(n_src: int, specs: list[Spec], src: list[int]) -> tuple[list[int], list[list[int]]]:
    """Every node's value and dependencies, recomputed from scratch from the source values."""
    vals = list(src)
    deps: list[list[int]] = [[] for _ in src]
    for spec in specs:
        read_log: list[int] = []
        vals.append(evaluate(spec, _logging_reader(vals, read_log)))
        deps.append(read_log)
    return vals, deps


def _logging_reader(vals: list[int], log: list[int]) -> Read:
    def read(j: int) -> int:
        log.append(j)
        return vals[j]

    return read


def demanded(vals: list[int], deps: list[list[int]], effects: list[EffectSpec]) -> set[int]:
    """Nodes some effect depends on, transitively, under the oracle's current values."""
    todo = [j for e in effects for j, _ in observe(e, vals.__getitem__)]
    seen: set[int] = set()
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo.extend(deps[j])
    return seen


@st.composite
def graphs(draw: st.DrawFn, mirrors: bool = False) -> tuple[int, list[Spec]]:
    n_src = draw(st.integers(1, 4))
    n_comp = draw(st.integers(1, 12))
    kinds = ["add", "add", "mod", "branch", "guard", "max"] + ["mirror"] * (2 * mirrors)
    specs: list[Spec] = []
    for idx in range(n_src, n_src + n_comp):
        earlier = st.integers(0, idx - 1)
        kind = draw(st.sampled_from(kinds))
        if kind == "mirror":
            # (source, any node the writer also reads, even one downstream of the mirror)
            also = draw(st.integers(0, n_src + n_comp - 1))
            specs.append((kind, (draw(earlier), also), draw(st.integers(2, 4))))
        elif kind == "add":
            ins = tuple(draw(st.lists(earlier, min_size=1, max_size=3)))
            specs.append((kind, ins, draw(st.integers(0, 2))))
        elif kind == "mod":
            specs.append((kind, (draw(earlier),), draw(st.integers(2, 3))))
        elif kind in ("branch", "guard"):
            specs.append((kind, (draw(earlier), draw(earlier), draw(earlier)), 0))
        else:
            specs.append((kind, (draw(earlier), draw(earlier)), 0))
    return n_src, specs


def effect_specs(n: int) -> st.SearchStrategy[EffectSpec]:
    node = st.integers(0, n - 1)
    few = st.lists(node, max_size=3).map(tuple)
    return st.tuples(node, few, few)


@st.composite
def scenarios(
    draw: st.DrawFn, mirrors: bool = False
) -> tuple[int, list[Spec], list[EffectSpec], list[Any]]:
    n_src, specs = draw(graphs(mirrors))
    n = n_src + len(specs)
    effects = draw(st.lists(effect_specs(n), min_size=1, max_size=4))
    src = st.integers(0, n_src - 1)
    val = st.integers(0, 3)  # few values: equal writes and cutoffs are common
    step = st.one_of(
        st.tuples(st.just("write"), src, val),
        st.tuples(st.just("write"), src, val),
        st.tuples(st.just("batch"), st.lists(st.tuples(src, val), min_size=1, max_size=6)),
        st.tuples(st.just("batch"), st.lists(st.tuples(src, val), min_size=1, max_size=6)),
        st.tuples(st.just("effect"), effect_specs(n)),
        st.tuples(st.just("dispose"), st.integers(0, 7)),
    )
    # after each step, read all nodes or a random subset (leaving some lazy nodes unread)
    reads = st.one_of(st.none(), st.lists(st.integers(0, n - 1), max_size=n))
    steps = draw(st.lists(st.tuples(step, reads), min_size=1, max_size=12))
    return n_src, specs, effects, steps


@contextmanager
def max_depth(depth: int) -> Iterator[None]:
    g = kernel._G
    saved = g.max_depth
    g.max_depth = depth
    try:
        yield
    finally:
        g.max_depth = saved


class Observer:
    """One effect of the scenario, with what it saw."""

    def __init__(self, spec: EffectSpec, nodes: list[Any]) -> None:
        self.spec = spec
        self.runs: list[list[tuple[int, int]]] = []  # what each run read, this commit
        self.last: list[tuple[int, int]] = []
        self.alive = True

        def run() -> None:
            self.last = observe(spec, lambda j: nodes[j].get())
            self.runs.append(self.last)

        self.effect = Effect(run, label=f"e{spec}")


class Harness:
    def __init__(self, n_src: int, specs: list[Spec]) -> None:
        self.n_src = n_src
        self.specs = specs
        self.src = [0] * n_src
        n = n_src + len(specs)
        self.started = [0] * n  # calls of each computed's function
        self.finished = [0] * n  # calls that returned (not suspended by the depth driver)
        self.nodes: list[Any] = [Signal(0, f"s{i}") for i in range(n_src)]
        for idx, spec in enumerate(specs, start=n_src):
            if spec[0] == "mirror":
                self.nodes.append(Signal(-1, f"m{idx}"))
            else:
                self.nodes.append(Computed(self._fn(idx, spec), f"c{idx}"))
        self.observers: list[Observer] = []
        self.writers: list[Effect] = []

    def add_writer(self, idx: int) -> None:
        """The effect that keeps mirror ``idx`` equal to its source (mod k)."""
        _, (src, also), k = self.specs[idx - self.n_src]
        nodes = self.nodes

        def write() -> None:
            v = nodes[src].get()
            nodes[also].get()  # may depend on what it writes: it then reruns, equal, once
            nodes[idx].set(v % k)

        self.writers.append(Effect(write, label=f"w{idx}"))

    def _fn(self, idx: int, spec: Spec) -> Callable[[], int]:
        nodes, started, finished = self.nodes, self.started, self.finished

        def fn() -> int:
            started[idx] += 1
            v = evaluate(spec, lambda j: nodes[j].get())
            finished[idx] += 1
            return v

        return fn

    def reset(self) -> None:
        for i in range(len(self.started)):
            self.started[i] = self.finished[i] = 0
        for o in self.observers:
            o.runs = []

    def apply(self, step: Any) -> None:
        """Carry out one step: a write, a batch of writes, a new effect or a disposal."""
        kind = step[0]
        if kind == "write":
            _, i, v = step
            self.nodes[i].set(v)
            self.src[i] = v
        elif kind == "batch":
            with batch():
                for i, v in step[1]:
                    self.nodes[i].set(v)
                    self.src[i] = v
        elif kind == "effect":
            self.observers.append(Observer(step[1], self.nodes))
        else:
            live = self.live()
            if live:
                o = live[step[1] % len(live)]
                o.effect.dispose()
                o.alive = False

    def live(self) -> list[Observer]:
        return [o for o in self.observers if o.alive]

    def check(self, step: Any, before: dict[Observer, list[tuple[int, int]]]) -> None:
        vals, deps = oracle(self.n_src, self.specs, self.src)
        need = demanded(vals, deps, [o.spec for o in self.live()])
        kind = step[0]
        # (runs cut short by the depth driver don't count, when it can cut anything short)
        runs = self.started if kernel._G.max_depth > len(self.nodes) else self.finished
        for idx in range(self.n_src, len(self.nodes)):
            name = f"c{idx} {self.specs[idx - self.n_src]}"
            # (b) at most once per commit
            assert runs[idx] <= 1, f"{name} ran {runs[idx]} times"
            # (c) demand-driven: only what a live effect depends on runs at all
            if self.started[idx]:
                assert kind != "dispose", f"{name} ran on a dispose"
                assert idx in need, f"{name} ran but no effect needs it"
        for o in self.observers:
            if not o.alive:
                assert not o.runs, f"disposed effect {o.spec} ran"
                continue
            if kind == "effect" and o is self.observers[-1]:
                assert len(o.runs) == 1, "a new effect runs once"
            else:
                # (d) value gating, both ways: it runs iff something it read changed
                changed = [(j, v, vals[j]) for j, v in before[o] if vals[j] != v]
                assert len(o.runs) == (1 if changed else 0), (
                    f"effect {o.spec} ran {len(o.runs)} times; changed: {changed}"
                )
            # (a) every value it saw is the oracle's value at this commit
            for seen in o.runs:
                assert seen == observe(o.spec, vals.__getitem__), f"effect {o.spec} saw {seen}"

    def check_reads(self, reads: list[int] | None) -> None:
        vals, deps = oracle(self.n_src, self.specs, self.src)
        need = demanded(vals, deps, [o.spec for o in self.live()])
        self.reset()
        for j in range(len(self.nodes)) if reads is None else reads:
            assert self.nodes[j].get() == vals[j], f"node {j} read stale"  # (e)
        for idx in range(self.n_src, len(self.nodes)):
            if idx in need:  # live: already fresh after the flush
                assert self.started[idx] == 0, f"live c{idx} recomputed on a read"
            assert self.finished[idx] <= 1, f"lazy c{idx} ran {self.finished[idx]} times"
        assert not any(o.runs for o in self.observers), "an effect ran on a read"


def run_scenario(scenario: tuple[int, list[Spec], list[EffectSpec], list[Any]]) -> None:
    n_src, specs, effects, steps = scenario
    h = Harness(n_src, specs)
    for e in effects:
        h.observers.append(Observer(e, h.nodes))
    h.check_reads(None)
    for step, reads in steps:
        before = {o: o.last for o in h.observers}
        h.reset()
        h.apply(step)
        h.check(step, before)
        h.check_reads(reads)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_random_graphs_match_the_oracle(scenario: Any) -> None:
    run_scenario(scenario)


@settings(max_examples=200, deadline=None)
@given(scenarios(mirrors=True), st.randoms(use_true_random=False))
def test_random_graphs_with_writing_effects_settle_on_the_oracle(scenario: Any, rnd: Any) -> None:
    # Effects that write (mirrors of other nodes) make one user write several propagations,
    # so intermediate runs may see intermediate states; at rest, after every step, every
    # observer's last view, every node and every mirror must match the oracle: nothing
    # missed, e.g. a node read by an effect that then wrote (or flushed a write to) its input.
    n_src, specs, effects, steps = scenario
    h = Harness(n_src, specs)
    mirrors = [i for i, spec in enumerate(specs, start=n_src) if spec[0] == "mirror"]
    order = list(range(len(effects) + len(mirrors)))
    rnd.shuffle(order)
    for k in order:  # writers and observers created interleaved
        if k < len(effects):
            h.observers.append(Observer(effects[k], h.nodes))
        else:
            h.add_writer(mirrors[k - len(effects)])

    def settled() -> None:
        vals, _ = oracle(n_src, specs, h.src)
        for o in h.live():
            assert o.last == observe(o.spec, vals.__getitem__), f"effect {o.spec} is stale"
        for j in mirrors:
            assert h.nodes[j].peek() == vals[j], f"mirror {j} is stale"
        for j, node in enumerate(h.nodes):
            assert node.get() == vals[j], f"node {j} read stale"

    settled()
    for step, _ in steps:
        h.apply(step)
        settled()


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.sampled_from([1, 2, 3]))
def test_random_graphs_match_the_oracle_through_the_depth_driver(scenario: Any, depth: int) -> None:
    # A tiny MAX_DEPTH makes nearly every first evaluation go through suspend-and-drive.
    with max_depth(depth):
        run_scenario(scenario)


# ------------------------------------------------------------------------------ glitches


def test_diamond_never_shows_a_stale_pair() -> None:
    a = Signal(1, "a")
    b = Computed(lambda: a.get() + 1, "b")
    c = Computed(lambda: 2 * a.get(), "c")
    pairs: list[tuple[int, int]] = []

    def d_fn() -> int:
        pairs.append((b.get(), c.get()))
        return pairs[-1][0] + pairs[-1][1]

    d = Computed(d_fn, "d")
    seen: list[tuple[int, int, int]] = []
    Effect(lambda: seen.append((a.get(), d.get(), b.get())))
    for v in [2, 5, 5, -3, 10]:
        a.set(v)
    with batch():
        a.set(100)
        a.set(7)
    for x, dv, bv in seen:
        assert dv == (x + 1) + 2 * x and bv == x + 1
    for bv, cv in pairs:
        assert bv - 1 == cv // 2, f"d saw b={bv} with c={cv}"
    assert [s[0] for s in seen] == [1, 2, 5, -3, 10, 7]
    assert len(pairs) == 6  # once per commit that changed a


def test_triangle_reads_consistent_values() -> None:
    a = Signal(1, "a")
    b = Computed(lambda: a.get() * 10, "b")
    seen: list[tuple[int, int]] = []

    def c_fn() -> int:
        seen.append((a.get(), b.get()))
        return seen[-1][0] + seen[-1][1]

    c = Computed(c_fn, "c")
    out: list[int] = []
    Effect(lambda: out.append(c.get()))
    for v in range(2, 8):
        a.set(v)
    assert all(bv == 10 * av for av, bv in seen)
    assert out == [11 * v for v in range(1, 8)]
    assert len(seen) == 7


# ------------------------------------------------------------------------------ depth

CHAIN = 100_000


def _chain(n: int, root: Signal[int]) -> tuple[Any, list[int]]:
    calls = [0]
    node: Any = root
    for _ in range(n):

        def step(p: Any = node) -> int:
            calls[0] += 1
            return p.get() + 1

        node = Computed(step)
    return node, calls


def test_long_chain_observed_by_an_effect() -> None:
    root = Signal(0, "root")
    tail, calls = _chain(CHAIN, root)
    seen: list[int] = []
    e = Effect(lambda: seen.append(tail.get()))
    assert seen == [CHAIN]
    calls[0] = 0
    root.set(1)
    assert seen == [CHAIN, CHAIN + 1]
    assert calls[0] == CHAIN  # each link once
    root.set(5)
    assert seen[-1] == CHAIN + 5
    e.dispose()  # releases 100,000 subscriptions without recursion
    calls[0] = 0
    root.set(6)
    assert calls[0] == 0 and seen[-1] == CHAIN + 5
    assert tail.get() == CHAIN + 6


def test_long_chain_read_lazily() -> None:
    root = Signal(0, "root")
    tail, _ = _chain(CHAIN, root)
    assert tail.get() == CHAIN
    root.set(3)
    assert tail.get() == CHAIN + 3
    assert tail.get() == CHAIN + 3


def test_long_chain_with_a_cutoff_in_the_middle() -> None:
    root = Signal(0, "root")
    mid, _ = _chain(CHAIN // 2, root)
    parity = Computed(lambda: mid.get() % 2, "parity")
    tail, calls = _chain(CHAIN // 2, parity)  # type: ignore[arg-type]
    seen: list[int] = []
    Effect(lambda: seen.append(tail.get()))
    calls[0] = 0
    root.set(2)  # parity unchanged: the upper half never runs
    assert calls[0] == 0 and seen == [CHAIN // 2]
    root.set(3)
    assert calls[0] == CHAIN // 2 and seen == [CHAIN // 2, CHAIN // 2 + 1]


def test_deep_chain_is_not_swallowed_by_except_exception() -> None:
    # A computed that recovers from its input's errors with `except Exception` must not
    # swallow the depth driver's internal suspension (it would compute a wrong value).
    root = Signal(0, "root")
    node: Any = root
    for i in range(300):
        if i == 250:

            def guarded(p: Any = node) -> int:
                try:
                    return p.get() + 1
                except Exception:
                    return -1_000_000

            node = Computed(guarded)
        else:
            node = Computed(lambda p=node: p.get() + 1)
    assert node.get() == 300
    out: list[int] = []
    Effect(lambda: out.append(node.get()))
    root.set(1)
    assert out == [300, 301]


@pytest.mark.parametrize("length", range(8))
def test_a_flush_inside_a_computation_past_max_depth_does_not_hang(length: int) -> None:
    # Regression: a computation at the depth limit creates an effect that writes; the flush
    # that write starts runs at that depth, where no computation can start. The flush used
    # to drive the stale node it found itself, there: every attempt suspended at once and
    # the driver spun forever. It now suspends up to depth 0 like every other path.
    with max_depth(4), time_limit(5):
        t = Signal(0, "t")
        mid = Computed(lambda: t.get() * 10, "mid")
        top = Computed(lambda: mid.get() + 1, "top")
        seen: list[int] = []
        obs = Effect(lambda: seen.append(top.get()), "obs")
        writers: list[Effect] = []

        def make_writer() -> int:
            writers.append(Effect(lambda: t.set(1), "writer"))
            return 0

        node: Any = Computed(make_writer, "w")
        for _ in range(length):  # puts w (and its flush) `length` computations deep
            node = Computed(lambda p=node: p.get() + 1)
        assert node.get() == length
        assert seen[-1] == 11 and top.get() == 11
        obs.dispose()
        for w in writers:
            w.dispose()


# ------------------------------------------------------------------------------ dependencies


def test_dynamic_dependencies_drop_abandoned_cells() -> None:
    flag = Signal(True, "flag")
    x = Signal(1, "x")
    y = Signal(2, "y")
    runs = [0]

    def pick() -> int:
        runs[0] += 1
        return x.get() if flag.get() else y.get()

    c = Computed(pick, "c")
    seen: list[int] = []
    Effect(lambda: seen.append(c.get()))
    x.set(10)
    assert seen == [1, 10]
    flag.set(False)
    assert seen == [1, 10, 2]
    runs[0] = 0
    x.set(11)
    x.set(12)
    assert runs[0] == 0 and seen == [1, 10, 2]
    assert x.subs == []
    y.set(3)
    assert runs[0] == 1 and seen[-1] == 3


def test_a_dirty_node_does_not_pull_inputs_it_will_not_read() -> None:
    # p reads `sel` first; when sel's new value makes p skip `x`, x must not be computed even
    # though x's input changed in the same batch (p recomputes, it is not scanned further).
    s = Signal(0, "s")
    t = Signal(0, "t")
    sel0 = Computed(lambda: s.get() > 0, "sel0")
    sel = Computed(lambda: sel0.get(), "sel")  # PENDING (not DIRTY) when s changes
    x_runs = [0]

    def x_fn() -> int:
        x_runs[0] += 1
        return t.get() * 2

    x = Computed(x_fn, "x")
    p = Computed(lambda: 0 if sel.get() else x.get(), "p")
    out: list[int] = []
    Effect(lambda: out.append(p.get()))
    x_runs[0] = 0
    with batch():
        s.set(1)
        t.set(1)
    assert out == [0]
    assert x_runs[0] == 0, "x ran although p no longer reads it"


def test_equal_writes_notify_no_one() -> None:
    s = Signal([1, 2], "s")
    runs = [0, 0]

    def c_fn() -> int:
        runs[0] += 1
        return len(s.get())

    c = Computed(c_fn, "c")

    def e_fn() -> None:
        runs[1] += 1
        s.get()
        c.get()

    Effect(e_fn)
    s.set([1, 2])  # equal, not identical
    s.set(s.peek())
    with batch():
        s.set([1, 2])
    assert runs == [1, 1]
    s.set([1, 2, 3])
    assert runs == [2, 2]


def test_writes_that_cancel_out_in_a_batch_notify_no_one() -> None:
    s = Signal(0, "s")
    runs = [0, 0]

    def c_fn() -> int:
        runs[0] += 1
        return s.get() + 1

    c = Computed(c_fn, "c")

    def e_fn() -> None:
        runs[1] += 1
        s.get()
        c.get()

    Effect(e_fn)
    with batch():
        s.set(1)
        s.set(2)
        s.set(0)
    assert runs == [1, 1]
    with batch():
        s.set(1)
    assert runs == [2, 2]


def test_a_thousand_writes_in_a_batch_run_the_effect_once() -> None:
    s = Signal(0, "s")
    doubled_runs = [0]

    def doubled_fn() -> int:
        doubled_runs[0] += 1
        return s.get() * 2

    doubled = Computed(doubled_fn, "doubled")
    seen: list[tuple[int, int]] = []
    Effect(lambda: seen.append((s.get(), doubled.get())))
    doubled_runs[0] = 0
    with batch():
        for i in range(1, 1001):
            s.set(i)
        with batch():  # nested: only the outermost batch flushes
            s.set(1001)
        assert len(seen) == 1
        assert doubled.get() == 2002  # a read inside the batch is fresh
    assert seen == [(0, 0), (1001, 2002)]
    assert doubled_runs[0] == 1


def test_untracked_reads_do_not_subscribe() -> None:
    a = Signal(1, "a")
    b = Signal(10, "b")
    c = Computed(lambda: b.get() * 2, "c")
    seen: list[tuple[int, int, int]] = []

    def e_fn() -> None:
        with untracked():
            bv = b.get()
        seen.append((a.get(), bv, c.peek()))

    Effect(e_fn)
    b.set(20)
    assert seen == [(1, 10, 20)]
    assert b.subs == [] and c.subs == []
    a.set(2)
    assert seen == [(1, 10, 20), (2, 20, 40)]


# ------------------------------------------------------------------------------ cycles


def _nodes_of(node: Any) -> Any:
    try:
        return node.get()
    except CycleError as e:
        return e.nodes


def test_self_cycle() -> None:
    a: Any = Computed(lambda: a.get() + 1, "a")
    with pytest.raises(CycleError) as info:
        a.get()
    assert info.value.nodes == [a, a]


def test_two_cycle() -> None:
    a: Any = Computed(lambda: b.get() + 1, "a")
    b: Any = Computed(lambda: a.get() + 1, "b")
    with pytest.raises(CycleError) as info:
        a.get()
    assert info.value.nodes == [a, b, a]
    seen: list[Any] = []

    def watch() -> None:
        try:
            seen.append(b.get())
        except CycleError as e:
            seen.append(e.nodes)

    Effect(watch)  # b's error is cached: nothing was written since
    assert seen == [[a, b, a]]
    c: Any = Computed(lambda: d.get() + 1, "c")
    d: Any = Computed(lambda: c.get() + 1, "d")
    Effect(watch2 := lambda: seen.append(_nodes_of(d)))
    assert seen[-1] == [d, c, d] and watch2


def test_a_cycle_longer_than_max_depth_is_reported() -> None:
    n = 3 * signals.MAX_DEPTH
    nodes: list[Any] = []
    for i in range(n):
        nodes.append(Computed(lambda i=i: nodes[(i + 1) % n].get() + 1, f"c{i}"))
    with time_limit(5), pytest.raises(CycleError) as info:
        nodes[0].get()
    assert info.value.nodes == [*nodes, nodes[0]]


def test_a_cycle_made_by_an_update_is_reported() -> None:
    s = Signal(False, "s")
    a: Any = Computed(lambda: b.get() if s.get() else 0, "a")
    b: Any = Computed(lambda: a.get() + 1, "b")
    seen: list[Any] = []

    def watch() -> None:
        try:
            seen.append(b.get())
        except CycleError as e:
            seen.append(e)

    Effect(watch)
    assert seen == [1]
    with time_limit(5):
        s.set(True)  # a now reads b: the cycle is found while propagating, not at first read
    err = seen[-1]
    assert isinstance(err, CycleError)
    assert set(err.nodes) == {a, b} and err.nodes[0] is err.nodes[-1]
    with pytest.raises(CycleError):
        b.get()
    s.set(False)  # broken again: everything recovers
    assert seen[-1] == 1 and b.get() == 1


def test_a_longer_cycle_made_by_an_update_names_every_node() -> None:
    s = Signal(False, "s")
    a: Any = Computed(lambda: x.get() if s.get() else 0, "a")
    x: Any = Computed(lambda: y.get() + 1, "x")
    y: Any = Computed(lambda: z.get() + 1, "y")
    z: Any = Computed(lambda: a.get() + 1, "z")
    seen: list[Any] = []

    def watch() -> None:
        try:
            seen.append(x.get())
        except CycleError as e:
            seen.append(e)

    Effect(watch)
    assert seen == [3]
    with time_limit(5):
        s.set(True)
    err = seen[-1]
    assert isinstance(err, CycleError)
    assert err.nodes[0] is err.nodes[-1]
    assert set(err.nodes) == {a, x, y, z}
    assert len(err.nodes) == 5
    s.set(False)
    assert seen[-1] == 3


def test_effects_that_retrigger_each_other_raise_cycle_error() -> None:
    a = Signal(0, "a")
    b = Signal(0, "b")
    e1 = Effect(lambda: b.set(a.get() + 1), "ping")

    def pong() -> None:
        v = b.get()
        if v > 100:
            a.set(v + 1)

    e2 = Effect(pong, "pong")
    assert (a.peek(), b.peek()) == (0, 1)
    with time_limit(10), pytest.raises(CycleError) as info:
        a.set(200)
    assert set(info.value.nodes) == {e1, e2}
    # breaking the loop leaves the survivor working (it was not dropped, deaf, mid-cycle)
    e2.dispose()
    a.set(-5)
    assert b.peek() == -4


def test_an_effect_feeding_itself_raises_cycle_error() -> None:
    s = Signal(0, "s")

    def feeder() -> None:
        v = s.get()
        if v >= 100:
            s.set(v + 1)

    e = Effect(feeder, "feeder")
    with time_limit(10), pytest.raises(CycleError) as info:
        s.set(100)
    assert info.value.nodes == [e]
    e.dispose()
    # created feeding itself: the constructor raises, and leaves nothing live behind
    with time_limit(10), pytest.raises(CycleError) as info:
        Effect(lambda: s.set(s.get() + 1), "born looping")
    assert [repr(n) for n in info.value.nodes] == ["Effect(born looping)"]
    assert s.subs == []


def test_an_effect_that_converges_on_its_own_writes_settles() -> None:
    s = Signal(0, "s")
    seen: list[int] = []

    def clamp() -> None:
        v = s.get()
        seen.append(v)
        if v < 3:
            s.set(v + 1)

    Effect(clamp)
    assert s.peek() == 3 and seen == [0, 1, 2, 3]
    s.set(-1)
    assert s.peek() == 3 and seen[-1] == 3


# ------------------------------------------------------------------------------ purity


def test_writing_inside_a_computed_raises_and_changes_nothing() -> None:
    s = Signal(1, "s")
    src = Signal(0, "src")
    c = Computed(lambda: s.set(src.get() + 5), "writer")
    with pytest.raises(WriteInComputationError):
        c.get()
    assert s.peek() == 1
    seen: list[Any] = []

    def watch() -> None:
        try:
            seen.append(c.get())
        except WriteInComputationError as e:
            seen.append(type(e))

    Effect(watch)
    src.set(1)
    assert seen == [WriteInComputationError, WriteInComputationError] and s.peek() == 1


def test_writing_inside_a_computed_raises_even_untracked() -> None:
    s = Signal(1, "s")

    def sneaky() -> int:
        with untracked():
            s.set(2)
        return 0

    other = Computed(lambda: s.set(3) or 0, "other")

    def via_peek() -> int:
        return other.peek()

    with pytest.raises(WriteInComputationError):
        Computed(sneaky).get()
    with pytest.raises(WriteInComputationError):
        Computed(via_peek).get()
    assert s.peek() == 1


def test_effects_may_write() -> None:
    a = Signal(1, "a")
    b = Signal(0, "b")
    Effect(lambda: b.set(a.get() * 3))
    a.set(2)
    assert b.peek() == 6


# ------------------------------------------------------------------------------ in place


def test_mutated_reruns_an_effect_that_sees_the_new_length() -> None:
    items = Signal([1, 2], "items")
    seen: list[int] = []
    Effect(lambda: seen.append(len(items.get())))
    items.peek().append(3)  # an equal-by-identity value: set() would see no change
    items.set(items.peek())
    assert seen == [2]
    items.mutated()
    assert seen == [2, 3]
    items.mutated()  # no equality check: it always notifies
    assert seen == [2, 3, 3]


def test_mutated_in_a_batch_notifies_once_after_it() -> None:
    items = Signal([0], "items")
    seen: list[list[int]] = []
    Effect(lambda: seen.append(list(items.get())))
    with batch():
        items.peek().append(1)
        items.mutated()
        items.peek().append(2)
        items.mutated()
        assert seen == [[0]]
    assert seen == [[0], [0, 1, 2]]
    # a write and a write back in the same batch cancel out; a mutation in between doesn't
    lst = items.peek()
    with batch():
        items.set([9])
        lst.append(3)
        items.mutated()
        items.set(lst)
    assert seen == [[0], [0, 1, 2], [0, 1, 2, 3]]


def test_mutated_through_a_computed_gated_on_len() -> None:
    items = Signal([1], "items")
    runs = [0]

    def length() -> int:
        runs[0] += 1
        return len(items.get())

    n = Computed(length, "n")
    seen: list[int] = []
    Effect(lambda: seen.append(n.get()))
    items.peek().append(2)
    items.mutated()
    assert seen == [1, 2] and runs[0] == 2
    items.peek()[0] = 7  # same length: n recomputes, equal, and stops the change there
    items.mutated()
    assert seen == [1, 2] and runs[0] == 3
    lazy = Computed(lambda: sum(items.get()), "lazy")  # not live: read after the mutation
    assert lazy.get() == 9
    items.peek().append(1)
    items.mutated()
    assert lazy.get() == 10 and seen == [1, 2, 3]


def test_mutated_inside_a_computation_raises() -> None:
    items = Signal([1], "items")
    bad = Computed(lambda: items.mutated() or 0, "bad")
    with pytest.raises(WriteInComputationError):
        bad.get()

    def sneaky() -> int:
        with untracked():
            items.mutated()
        return 0

    with pytest.raises(WriteInComputationError):
        Computed(sneaky).get()
    seen: list[int] = []
    Effect(lambda: seen.append(len(items.get())))
    Effect(lambda: items.mutated() if len(items.peek()) == 1 else None, "effects may")
    assert seen == [1, 1]


# ------------------------------------------------------------------------------ errors


def test_a_computed_error_propagates_and_recovers() -> None:
    d = Signal(1, "d")
    ratio = Computed(lambda: 10 // d.get(), "ratio")
    plus = Computed(lambda: ratio.get() + 1, "plus")
    seen: list[Any] = []

    def watch() -> None:
        try:
            seen.append(plus.get())
        except ZeroDivisionError:
            seen.append("error")

    Effect(watch)
    d.set(0)
    with pytest.raises(ZeroDivisionError):
        plus.get()
    with pytest.raises(ZeroDivisionError):
        ratio.get()
    d.set(2)
    assert seen == [11, "error", 6]
    assert plus.get() == 6
    lazy = Computed(lambda: 1 // d.get(), "lazy")
    d.set(0)
    with pytest.raises(ZeroDivisionError):
        lazy.get()
    d.set(1)
    assert lazy.get() == 1


def test_a_failing_effect_does_not_starve_the_others() -> None:
    s = Signal(0, "s")
    seen: list[tuple[str, int]] = []

    def first() -> None:
        seen.append(("first", s.get()))

    def boom() -> None:
        if s.get() == 1:
            raise ValueError("boom")

    def last() -> None:
        seen.append(("last", s.get()))

    Effect(first)
    Effect(boom)
    Effect(lambda: (_ for _ in ()).throw(KeyError("x")) if s.get() == 1 else None)
    Effect(last)
    seen.clear()
    with pytest.raises(ValueError, match="boom"):  # the first error, after the flush
        s.set(1)
    assert seen == [("first", 1), ("last", 1)]
    s.set(2)  # all of them still subscribed
    assert seen[-2:] == [("first", 2), ("last", 2)]


def test_an_effect_failing_on_creation_is_not_left_live() -> None:
    s = Signal(0, "s")
    runs = [0]

    def bad() -> None:
        runs[0] += 1
        s.get()
        raise RuntimeError("first run fails")

    with pytest.raises(RuntimeError):
        Effect(bad)
    assert s.subs == []
    s.set(1)
    assert runs == [1]


# ------------------------------------------------------------------------------ lifetime


def test_dispose_stops_updates_and_releases_subscriptions() -> None:
    s = Signal(1, "s")
    runs = [0]

    def sq_fn() -> int:
        runs[0] += 1
        return s.get() ** 2

    sq = Computed(sq_fn, "sq")
    plus = Computed(lambda: sq.get() + 1, "plus")
    seen: list[int] = []
    e = Effect(lambda: seen.append(plus.get()))
    s.set(2)
    assert seen == [2, 5] and runs[0] == 2
    e.dispose()
    assert s.subs == [] and sq.subs == [] and plus.subs == []
    s.set(3)
    s.set(4)
    assert seen == [2, 5] and runs[0] == 2  # lazy now: nothing runs on writes
    assert plus.get() == 17 and runs[0] == 3
    e.dispose()  # twice is fine


def test_an_effect_can_dispose_itself() -> None:
    s = Signal(0, "s")
    other = Signal(0, "other")
    box: dict[str, Effect] = {}
    runs = [0]

    def once_past_one() -> None:
        runs[0] += 1
        if s.get() >= 1:
            other.get()  # a new dependency, not subscribed yet when it disposes
            box["e"].dispose()

    box["e"] = Effect(once_past_one)
    s.set(1)
    assert runs[0] == 2
    assert s.subs == [] and other.subs == []
    s.set(2)
    other.set(1)
    assert runs[0] == 2


def test_a_disposed_queued_effect_does_not_run() -> None:
    s = Signal(0, "s")
    seen: list[int] = []
    box: dict[str, Effect] = {}
    Effect(lambda: box["victim"].dispose() if s.get() == 1 else None)
    box["victim"] = Effect(lambda: seen.append(s.get()))
    s.set(1)
    assert seen == [0]


def test_a_lazily_computed_node_going_live_after_a_write_gets_the_new_value() -> None:
    s = Signal(1, "s")
    c = Computed(lambda: s.get() * 10, "c")
    assert c.get() == 10
    s.set(2)  # c is not live: no one tells it
    seen: list[int] = []
    Effect(lambda: seen.append(c.get()))
    assert seen == [20]
    s.set(3)
    assert seen == [20, 30]


def test_an_effect_reading_a_lazy_node_then_writing_its_input_sees_the_new_value() -> None:
    b = Signal(1, "b")
    y = Computed(lambda: b.get() * 10, "y")
    seen: list[int] = []

    def fn() -> None:
        v = y.get()
        seen.append(v)
        if v == 10:
            b.set(2)

    Effect(fn)
    assert seen == [10, 20]  # once stale (its own write), then current; not three times
    assert y.get() == 20


def test_an_unrelated_write_does_not_rerun_an_effect_that_made_a_node_live() -> None:
    a = Signal(1, "a")
    log = Signal(0, "log")
    x = Computed(lambda: a.get() * 10, "x")
    runs: list[int] = []

    def fn() -> None:
        runs.append(x.get())
        log.set(log.peek() + 1)

    Effect(fn)
    assert runs == [10] and log.peek() == 1
    a.set(2)
    assert runs == [10, 20] and log.peek() == 2


def test_a_write_flushed_inside_a_new_effect_is_not_missed() -> None:
    # Creating `reader` runs it outside any flush; its write to `a` flushes `doubler`, which
    # changes `b` after reader read it, before reader is subscribed. It must still see it.
    a = Signal(1, "a")
    b = Signal(0, "b")
    Effect(lambda: b.set(a.get() * 2), "doubler")
    seen: list[int] = []

    def reader() -> None:
        seen.append(b.get())
        a.set(5)

    Effect(reader, "reader")
    assert b.peek() == 10
    assert seen[-1] == 10


@pytest.mark.parametrize("where", ["alone", "in a batch", "in a flush"])
def test_a_write_inside_an_effect_to_a_live_node_it_just_read_reruns_it(where: str) -> None:
    # fn starts reading x (kept live by another effect), then writes x's input. fn was not
    # subscribed to x when x went stale, so only the end of its run can notice.
    a = Signal(1, "a")
    x = Computed(lambda: a.get() + 100, "x")
    Effect(lambda: x.get(), "keeps x live")
    go = Signal(where != "in a flush", "go")
    seen: list[int] = []

    def fn() -> None:
        if go.get():
            seen.append(x.get())
            if a.peek() == 1:
                a.set(2)

    if where == "in a batch":
        with batch():
            Effect(fn)
    else:
        Effect(fn)
        go.set(True)
    assert seen == [101, 102]


def test_a_node_dropped_and_picked_up_in_one_propagation_runs_once() -> None:
    # `pick` stops reading `parity` (its last subscriber: parity goes lazy) and `watch`, in
    # the same propagation, starts reading it: parity is fresh, it must not run again.
    s = Signal(0, "s")
    runs = [0]

    def parity_fn() -> int:
        runs[0] += 1
        return s.get() % 2

    parity = Computed(parity_fn, "parity")
    pick = Computed(lambda: parity.get() if s.get() % 2 == 0 else s.get(), "pick")
    Effect(lambda: pick.get(), "keeps pick live")
    seen: list[tuple[int, ...]] = []

    def watch() -> None:
        v = s.get()
        seen.append((v, parity.get(), pick.get()) if v % 2 else (v,))

    Effect(watch, "watch")
    runs[0] = 0
    s.set(1)
    assert seen == [(0,), (1, 1, 1)]
    assert runs[0] == 1


def test_nodes_nobody_reads_share_one_empty_list_and_never_fill_it() -> None:
    """A signal or computed gets a subscriber list of its own only once something reads it
    (most documents' signals never are); the shared empty one stays empty throughout."""
    a, b = Signal(1, "a"), Signal(2, "b")
    total = Computed(lambda: a.get() + b.get(), "total")
    assert a.subs is b.subs is total.subs  # nobody reads them yet: nothing allocated
    seen: list[int] = []
    e = Effect(lambda: seen.append(total.get()))
    assert a.subs == [total] and b.subs == [total] and total.subs == [e]
    assert a.subs is not b.subs
    a.set(10)
    e.dispose()
    assert seen == [3, 12]
    assert a.subs == [] and total.subs == []
    fresh = Signal(0)
    assert fresh.subs == [] and fresh.subs is kernel._NO_SUBS and kernel._NO_SUBS == []
