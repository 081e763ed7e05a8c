"""Propagation benchmark: our reactive kernel against reaktiv and reactivex, same run.

    python bench/reactive.py            # every scenario, every library
    python bench/reactive.py --quick    # fewer writes (a smoke run)

Each (scenario, library) cell runs in a fresh subprocess, so a peer that overflows the stack
on a deep graph reports it instead of taking the run down, and no library warms another's
caches. Every observer checks each value it sees against an oracle that recomputes the
scenario from scratch; a value the oracle does not produce for the current inputs counts as
inconsistent (a glitch). Peers are driven the way ``../shared/anchors/reactive_peers.py``
drives them. Output: microseconds per write, the peer/ours ratio (> 1: we are faster), and
inconsistent values per library.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LIBS = ("ours", "reaktiv", "reactivex", "cells")
TIMEOUT = 60  # seconds per (scenario, library); reaktiv on cellx-1000 runs for many minutes


# ---------------------------------------------------------------------------- adapters
# Each adapter exposes: signal(v) -> (get, set); computed(fn) -> get; effect(fn) -> handle;
# batch() -> context manager. reactivex is driven with operators instead (see RX_BUILDERS).


class Ours:
    def __init__(self) -> None:
        from runtime.cells import signals

        self.s = signals

    def signal(self, v):
        sig = self.s.Signal(v)
        return sig.get, sig.set

    def computed(self, fn):
        return self.s.Computed(fn).get

    def effect(self, fn):
        return self.s.Effect(fn)

    def batch(self):
        return self.s.batch()


class OursCells:
    """The same scenarios through the cell layer: stored cells, computed cells, commits.

    Each write is a committed transaction (schema check, store write, kernel batch), so the
    gap to ``Ours`` is the price of documents and durability on top of the kernel."""

    def __init__(self) -> None:
        from runtime import Runtime, cell, computed
        from runtime.cells import signals
        from runtime.cells.cell import writing

        self.rt = Runtime()
        self._cell, self._computed, self._signals, self._writing = cell, computed, signals, writing

    def build(self, scenario_builder):
        from runtime import pattern

        out = {}

        @pattern
        def scenario():
            out["built"] = scenario_builder(self)
            return {}

        self.rt.run(scenario)
        return out["built"]

    def signal(self, v):
        c = self._cell(v)
        return c.get, c.set

    def computed(self, fn):
        return self._computed(fn).get

    def effect(self, fn):
        return self._signals.Effect(fn)

    def batch(self):
        return self._writing(self.rt.docs)


class Reaktiv:
    def __init__(self) -> None:
        import reaktiv

        self.r = reaktiv

    def signal(self, v):
        sig = self.r.Signal(v)
        return sig, sig.set

    def computed(self, fn):
        return self.r.Computed(fn)

    def effect(self, fn):
        return self.r.Effect(fn)

    def batch(self):
        return self.r.batch()


# ---------------------------------------------------------------------------- scenarios
# A scenario builder takes a library adapter and returns (write(i), final_check(), observed)
# where observed is a list of (seen value, expected value) pairs filled in by observers.


def chain(n):
    def build(lib):
        get, set_ = lib.signal(0)
        node = get
        for _ in range(n):
            node = (lambda prev: lib.computed(lambda: prev() + 1))(node)
        seen = []
        state = {"a": 0}
        keep = lib.effect(lambda: seen.append((node(), state["a"] + n)))

        def write(i):
            state["a"] = i + 1
            set_(i + 1)

        return write, seen, keep

    return build


def fanout(n):
    def build(lib):
        get, set_ = lib.signal(0)
        seen = []
        state = {"a": 0}
        keep = []
        for k in range(n):
            c = (lambda k: lib.computed(lambda: get() + k))(k)
            keep.append(lib.effect((lambda c, k: lambda: seen.append((c(), state["a"] + k)))(c, k)))

        def write(i):
            state["a"] = i + 1
            set_(i + 1)

        return write, seen, keep

    return build


def diamond(width):
    def build(lib):
        get, set_ = lib.signal(0)
        mids = [(lambda k: lib.computed(lambda: get() + k))(k) for k in range(width)]
        total = lib.computed(lambda: sum(m() for m in mids))
        seen = []
        state = {"a": 0}
        keep = lib.effect(lambda: seen.append((total(), width * state["a"] + sum(range(width)))))

        def write(i):
            state["a"] = i + 1
            set_(i + 1)

        return write, seen, keep

    return build


def triangle(lib):
    get, set_ = lib.signal(0)
    b = lib.computed(lambda: get() + 1)
    c = lib.computed(lambda: get() + b())
    seen = []
    state = {"a": 0}
    keep = lib.effect(lambda: seen.append((c(), 2 * state["a"] + 1)))

    def write(i):
        state["a"] = i + 1
        set_(i + 1)

    return write, seen, keep


def _cellx_expected(start, layers):
    a, b, c, d = start
    for _ in range(layers):
        a, b, c, d = b, a - c, b + d, c
    return [a, b, c, d]


def cellx(layers):
    def build(lib):
        srcs = [lib.signal(v) for v in (1, 2, 3, 4)]
        prev = [g for g, _ in srcs]
        for _ in range(layers):
            a, b, c, d = prev
            prev = [
                (lambda b=b: lib.computed(lambda: b()))(),
                (lambda a=a, c=c: lib.computed(lambda: a() - c()))(),
                (lambda b=b, d=d: lib.computed(lambda: b() + d()))(),
                (lambda c=c: lib.computed(lambda: c()))(),
            ]
        seen = []
        state = {"in": (1, 2, 3, 4)}
        keep = [
            lib.effect(
                (lambda k, node: lambda: seen.append(
                    (node(), _cellx_expected(state["in"], layers)[k])))(k, node)
            )
            for k, node in enumerate(prev)
        ]
        before = [p() for p in prev]

        def write(i):
            vals = (4, 3, 2, 1) if i % 2 == 0 else (1, 2, 3, 4)
            state["in"] = vals
            with lib.batch():
                for (_, set_), v in zip(srcs, vals, strict=True):
                    set_(v)

        def ends():
            return before, [p() for p in prev]

        return write, seen, (keep, ends)

    return build


def unstable(lib):
    get, set_ = lib.signal(0)
    ks = [(lambda k: lib.computed(lambda: get() + k))(k) for k in range(5)]
    branch = lib.computed(lambda: sum(k() for k in ks) if get() % 2 == 0 else ks[0]())
    seen = []
    state = {"a": 0}

    def expect():
        a = state["a"]
        return sum(a + k for k in range(5)) if a % 2 == 0 else a

    keep = lib.effect(lambda: seen.append((branch(), expect())))

    def write(i):
        state["a"] = i + 1
        set_(i + 1)

    return write, seen, keep


def cutoff(lib):
    """A write that leaves ``parity`` equal must not reach the 100-node tail."""
    get, set_ = lib.signal(0)
    parity = lib.computed(lambda: get() % 2)
    runs = [0]

    def tail_fn(prev):
        def f():
            runs[0] += 1
            return prev() + 1

        return f

    node = parity
    for _ in range(100):
        node = lib.computed(tail_fn(node))
    seen = []
    state = {"a": 0}
    keep = lib.effect(lambda: seen.append((node(), state["a"] % 2 + 100)))
    runs[0] = 0

    def write(i):
        state["a"] = 2 * (i + 1)  # always even: parity never changes
        set_(2 * (i + 1))

    return write, seen, (keep, runs)


def batch1000(lib):
    get, set_ = lib.signal(0)
    double = lib.computed(lambda: get() * 2)
    seen = []
    state = {"a": 0}
    keep = lib.effect(lambda: seen.append((double(), 2 * state["a"])))

    def write(i):  # one "write" here is a batch of 1,000 writes
        with lib.batch():
            for k in range(1000):
                state["a"] = i * 1000 + k
                set_(i * 1000 + k)

    return write, seen, keep


# ---------------------------------------------------------------------------- reactivex


def rx_builders():
    import reactivex as rx
    from reactivex import operators as ops
    from reactivex.subject import BehaviorSubject

    def rx_chain(n):
        def build():
            s = BehaviorSubject(0)
            obs = s
            for _ in range(n):
                obs = obs.pipe(ops.map(lambda x: x + 1))
            seen, state = [], {"a": 0}
            obs.subscribe(lambda v: seen.append((v, state["a"] + n)))

            def write(i):
                state["a"] = i + 1
                s.on_next(i + 1)

            return write, seen, None

        return build

    def rx_fan(n):
        def build():
            s = BehaviorSubject(0)
            seen, state = [], {"a": 0}
            for k in range(n):
                s.pipe(ops.map(lambda x, k=k: x + k)).subscribe(
                    lambda v, k=k: seen.append((v, state["a"] + k)))

            def write(i):
                state["a"] = i + 1
                s.on_next(i + 1)

            return write, seen, None

        return build

    def rx_diamond(width):
        def build():
            s = BehaviorSubject(0)
            mids = [s.pipe(ops.map(lambda x, k=k: x + k)) for k in range(width)]
            seen, state = [], {"a": 0}
            rx.combine_latest(*mids).pipe(ops.map(sum)).subscribe(
                lambda v: seen.append((v, width * state["a"] + sum(range(width)))))

            def write(i):
                state["a"] = i + 1
                s.on_next(i + 1)

            return write, seen, None

        return build

    def rx_triangle():
        s = BehaviorSubject(0)
        b = s.pipe(ops.map(lambda x: x + 1))
        seen, state = [], {"a": 0}
        rx.combine_latest(s, b).pipe(ops.map(lambda ab: ab[0] + ab[1])).subscribe(
            lambda v: seen.append((v, 2 * state["a"] + 1)))

        def write(i):
            state["a"] = i + 1
            s.on_next(i + 1)

        return write, seen, None

    def rx_cellx(layers):
        def build():
            srcs = [BehaviorSubject(v) for v in (1, 2, 3, 4)]
            prev = list(srcs)
            for _ in range(layers):
                a, b, c, d = prev
                prev = [
                    b,
                    rx.combine_latest(a, c).pipe(ops.map(lambda t: t[0] - t[1])),
                    rx.combine_latest(b, d).pipe(ops.map(lambda t: t[0] + t[1])),
                    c,
                ]
            seen, state = [], {"in": (1, 2, 3, 4)}
            last = [None] * 4
            for k, node in enumerate(prev):
                node.subscribe(lambda v, k=k: (last.__setitem__(k, v), seen.append(
                    (v, _cellx_expected(state["in"], layers)[k]))))
            before = list(last)

            def write(i):
                vals = (4, 3, 2, 1) if i % 2 == 0 else (1, 2, 3, 4)
                state["in"] = vals
                for src, v in zip(srcs, vals, strict=True):
                    src.on_next(v)

            return write, seen, (None, lambda: (before, list(last)))

        return build

    def rx_cutoff():
        s = BehaviorSubject(0)
        runs = [0]
        obs = s.pipe(ops.map(lambda x: x % 2), ops.distinct_until_changed())

        def step(x):
            runs[0] += 1
            return x + 1

        for _ in range(100):
            obs = obs.pipe(ops.map(step))
        seen, state = [], {"a": 0}
        obs.subscribe(lambda v: seen.append((v, state["a"] % 2 + 100)))
        runs[0] = 0

        def write(i):
            state["a"] = 2 * (i + 1)
            s.on_next(2 * (i + 1))

        return write, seen, (None, runs)

    def rx_batch():
        s = BehaviorSubject(0)
        seen, state = [], {"a": 0}
        s.pipe(ops.map(lambda x: x * 2)).subscribe(lambda v: seen.append((v, 2 * state["a"])))

        def write(i):  # no batches in Rx: every write propagates
            for k in range(1000):
                state["a"] = i * 1000 + k
                s.on_next(i * 1000 + k)

        return write, seen, None

    return {
        "chain-100": rx_chain(100),
        "chain-10000": rx_chain(10_000),
        "fanout-1000": rx_fan(1000),
        "diamond-5": rx_diamond(5),
        "diamond-100": rx_diamond(100),
        "triangle": rx_triangle,
        "cellx-1000": rx_cellx(1000),
        "cutoff": rx_cutoff,
        "batch-1000": rx_batch,
        # unstable dependencies: a branch that changes what it reads has no Rx operator form
    }


SCENARIOS: dict[str, tuple[Callable, int]] = {
    # name: (builder, writes)
    "chain-100": (chain(100), 2000),
    "chain-10000": (chain(10_000), 20),
    "fanout-1000": (fanout(1000), 200),
    "diamond-5": (diamond(5), 5000),
    "diamond-100": (diamond(100), 500),
    "triangle": (triangle, 20000),
    "cellx-1000": (cellx(1000), 20),
    "unstable": (unstable, 5000),
    "cutoff": (cutoff, 5000),
    "batch-1000": (batch1000, 20),
}

# Values each observer must see per write when nothing is missed (a glitch-free library sees
# exactly this many; one that glitches sees more). Fewer means updates were lost.
EXPECTED_EMISSIONS = {"fanout-1000": 1000, "cellx-1000": 4, "cutoff": 0}


def run_one(lib_name: str, scenario: str, writes: int) -> dict:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    if scenario == "cellx-1000" and writes % 2 == 0:
        writes += 1  # end on the (4, 3, 2, 1) inputs, whose end values are known
    try:
        if lib_name == "reactivex":
            builders = rx_builders()
            if scenario not in builders:
                return {"status": "n/a"}
            write, seen, extra = builders[scenario]()
        elif lib_name == "cells":
            write, seen, extra = OursCells().build(SCENARIOS[scenario][0])
        else:
            lib = Ours() if lib_name == "ours" else Reaktiv()
            write, seen, extra = SCENARIOS[scenario][0](lib)
        seen.clear()
        if isinstance(extra, tuple) and len(extra) == 2 and isinstance(extra[1], list):
            extra[1][0] = 0
        t = time.perf_counter()
        for i in range(writes):
            write(i)
        dt = time.perf_counter() - t
    except RecursionError:
        return {"status": "RecursionError"}
    bad = sum(1 for v, want in seen if v != want)
    out = {"status": "ok", "us": dt / writes * 1e6, "emissions": len(seen), "inconsistent": bad,
           "missed": max(EXPECTED_EMISSIONS.get(scenario, 1) * writes - len(seen), 0)}
    if scenario == "cellx-1000":
        before, after = extra[1]()
        out["ends"] = [before, after]
    if scenario == "cutoff":
        out["tail_runs"] = extra[1][0]
    return out


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--one":
        print(json.dumps(run_one(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return
    quick = "--quick" in sys.argv
    results: dict[str, dict[str, dict]] = {}
    for scenario, (_, writes) in SCENARIOS.items():
        if quick:
            writes = max(writes // 20, 2)
        results[scenario] = {}
        for lib in LIBS:
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--one", lib, scenario, str(writes)],
                    capture_output=True, text=True, timeout=TIMEOUT,
                )
            except subprocess.TimeoutExpired:
                results[scenario][lib] = {"status": f"timeout>{TIMEOUT}s"}
                continue
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["crashed"])[-1]
                results[scenario][lib] = {"status": f"failed: {err[:40]}"}
            else:
                results[scenario][lib] = json.loads(proc.stdout)
    print_table(results)


def _fmt(r: dict) -> str:
    return f"{r['us']:.1f}" if r.get("status") == "ok" else r.get("status", "?")


def _glitches(r: dict) -> str:
    missed = f" (missed {r['missed']})" if r.get("missed") else ""
    return str(r.get("inconsistent", "-")) + missed


def _ratio(ours: dict, peer: dict) -> str:
    if ours.get("status") != "ok" or peer.get("status") != "ok":
        return "-"
    if ours.get("missed") or peer.get("missed"):
        return "-"  # a run that lost updates did less work: no fair ratio
    return f"{peer['us'] / ours['us']:.2f}"


def print_table(results: dict[str, dict[str, dict]]) -> None:
    head = (f"{'scenario':<13} {'ours us/w':>10} {'reaktiv':>10} {'reactivex':>10} "
            f"{'reaktiv/ours':>13} {'rx/ours':>8} {'cells':>9} {'cells/ours':>10}"
            "   inconsistent (ours/reaktiv/rx/cells)")
    print(head)
    print("-" * len(head))
    for scenario, row in results.items():
        o, k, x, c = row["ours"], row["reaktiv"], row["reactivex"], row["cells"]
        inc = "/".join(_glitches(r) for r in (o, k, x, c))
        over = _ratio(o, c)
        print(f"{scenario:<13} {_fmt(o):>10} {_fmt(k):>10} {_fmt(x):>10} "
              f"{_ratio(o, k):>13} {_ratio(o, x):>8} {_fmt(c):>9} {over:>10}   {inc}")
    print()
    for lib in LIBS:
        r = results["cellx-1000"][lib]
        if "ends" in r:
            print(f"cellx-1000 {lib}: before {r['ends'][0]} after {r['ends'][1]} "
                  f"(known: before [-3, -6, -2, 2] after [-2, -4, 2, 3])")
    for lib in LIBS:
        r = results["cutoff"][lib]
        if "tail_runs" in r:
            print(f"cutoff {lib}: tail nodes ran {r['tail_runs']} times over all writes")
    print("inconsistent: values an observer saw that the oracle does not produce for the"
          " inputs at that moment; missed: updates an observer never saw.")
    print("us/w: microseconds per write (cellx: per batch of 4; batch-1000: per batch of 1,000)."
          " ratios: peer time / our time, > 1 means we are faster.")
    print("ours: the reactive kernel (runtime.signals); cells: the same graph as stored and"
          " computed cells, each write a committed transaction; cells/ours: its cost factor.")


if __name__ == "__main__":
    main()
