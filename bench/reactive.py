"""Propagation benchmark: our reactive kernel against reaktiv, reactivex and signified.

    python bench/reactive.py                 # every scenario, every library
    python bench/reactive.py --quick         # fewer writes (a smoke run)
    python bench/reactive.py --blocks 9      # more timed blocks (default 5)
    python bench/reactive.py --no-install    # never create the signified venv

Each (scenario, library) cell runs in a fresh subprocess, so a peer that overflows the stack
on a deep graph reports it instead of taking the run down, and no library warms another's
caches. In it, one block of writes warms up, then ``--blocks`` timed blocks of the same
size follow; the table shows the median per write over blocks, a second table the minimum.
Every observer checks each value it sees against an oracle that recomputes the scenario
from scratch; a value the oracle does not produce for the current inputs counts as
inconsistent (a glitch). Peers are driven the way ``../shared/anchors/reactive_peers.py``
drives them. Output: microseconds per write, the peer/ours ratio (> 1: we are faster), and
inconsistent values per library.

signified (a glitch-free library with a compiled core) needs Python 3.12+, newer than this
project requires, so its scenarios run under another interpreter: ``$SIGNIFIED_PYTHON``, or
the venv ``/tmp/celldialog-bench-py312`` (created with ``pip install signified`` from the
first Python 3.12+ found, unless ``--no-install``), or any Python 3.12+ that imports it.
Without one the peer is skipped and the table says why.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LIBS = ("ours", "reaktiv", "reactivex", "signified", "cells")
PEERS = ("reaktiv", "reactivex", "signified")
SHORT = {"ours": "ours", "reaktiv": "reaktiv", "reactivex": "rx", "signified": "sig",
         "cells": "cells"}
TIMEOUT = 30  # seconds per (scenario, library); reaktiv on cellx-1000 runs for many minutes
BLOCKS = 5  # timed blocks after the warm-up block
SIGNIFIED_VENV = Path("/tmp/celldialog-bench-py312")


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

    def doc(self, v, schema):
        """A stored document with a schema; a write sets one field of one item by path."""
        c = self._cell(v, schema=schema)

        def set_at(j, key, value):
            c.key(j, key).set(value)

        return c.get, set_at

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


class Signified:
    """signified's ``Signal`` / ``Computed`` / ``Effect`` read and written through
    ``.value``; observers are held weakly, so the closures keep the graph alive."""

    def __init__(self) -> None:
        import signified

        self.s = signified

    def signal(self, v):
        sig = self.s.Signal(v)

        def set_(value):
            sig.value = value

        return lambda: sig.value, set_

    def computed(self, fn):
        c = self.s.Computed(fn)
        return lambda: c.value

    def effect(self, fn):
        return self.s.Effect(fn)

    def batch(self):
        return self.s.batch()


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


DOC_SCHEMA = {
    "type": "array",
    "items": {"type": "object",
              "properties": {"title": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["title", "n"]},
}


def _doc_items(n):
    return [{"title": f"item {k}", "n": k} for k in range(n)]


def _immutable_doc(lib, items):
    """A list in one signal, written the way signal libraries are: a new list with one new
    item (the cell layer writes the item's field by path instead, see ``OursCells.doc``)."""
    get, set_ = lib.signal(items)
    state = {"v": items}

    def set_at(j, key, value):
        new = list(state["v"])
        new[j] = {**new[j], key: value}
        state["v"] = new
        set_(new)

    return get, set_at


def doc(n):
    """A schema'd list document of ``n`` items; each write changes one item's ``n`` and a
    computed sums them all (cells: the schema is checked on every commit)."""

    def build(lib):
        items = _doc_items(n)
        get, set_at = lib.doc(items, DOC_SCHEMA) if hasattr(lib, "doc") else _immutable_doc(
            lib, items)
        total = lib.computed(lambda: sum(item["n"] for item in get()))
        vals = list(range(n))
        state = {"sum": sum(vals)}
        seen = []
        keep = lib.effect(lambda: seen.append((total(), state["sum"])))

        def write(i):
            j = (i * 7919) % n
            v = n + i + 1  # never a value item j held before: every write changes the sum
            state["sum"] += v - vals[j]
            vals[j] = v
            set_at(j, "n", v)

        return write, seen, keep

    return build


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

    def rx_doc(n):
        def build():
            items = _doc_items(n)
            s = BehaviorSubject(items)
            vals = list(range(n))
            seen, state = [], {"sum": sum(vals), "v": items}
            s.pipe(ops.map(lambda xs: sum(item["n"] for item in xs))).subscribe(
                lambda v: seen.append((v, state["sum"])))

            def write(i):
                j = (i * 7919) % n
                v = n + i + 1
                state["sum"] += v - vals[j]
                vals[j] = v
                new = list(state["v"])
                new[j] = {**new[j], "n": v}
                state["v"] = new
                s.on_next(new)

            return write, seen, None

        return build

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
        "doc-10000": rx_doc(10_000),
        # unstable dependencies: a branch that changes what it reads has no Rx operator form
    }


SCENARIOS: dict[str, tuple[Callable, int]] = {
    # name: (builder, writes per block; the warm-up and every timed block write this many)
    "chain-100": (chain(100), 400),
    "chain-10000": (chain(10_000), 4),
    "fanout-1000": (fanout(1000), 40),
    "diamond-5": (diamond(5), 1000),
    "diamond-100": (diamond(100), 100),
    "triangle": (triangle, 4000),
    "cellx-1000": (cellx(1000), 4),
    "unstable": (unstable, 1000),
    "cutoff": (cutoff, 1000),
    "batch-1000": (batch1000, 4),
    "doc-10000": (doc(10_000), 5),
}

# Values each observer must see per write when nothing is missed (a glitch-free library sees
# exactly this many; one that glitches sees more). Fewer means updates were lost.
EXPECTED_EMISSIONS = {"fanout-1000": 1000, "cellx-1000": 4, "cutoff": 0}


def _lib_version(lib_name: str) -> str:
    dist = {"reaktiv": "reaktiv", "reactivex": "reactivex", "signified": "signified"}
    if lib_name not in dist:
        return ""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist[lib_name])
    except PackageNotFoundError:
        return "?"


def run_one(lib_name: str, scenario: str, per_block: int, blocks: int) -> dict:
    """One warm-up block, then ``blocks`` timed blocks of ``per_block`` writes each."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    info = {"python": platform.python_version(), "version": _lib_version(lib_name)}
    try:
        if lib_name == "reactivex":
            builders = rx_builders()
            if scenario not in builders:
                return {"status": "n/a", **info}
            write, seen, extra = builders[scenario]()
        elif lib_name == "cells":
            write, seen, extra = OursCells().build(SCENARIOS[scenario][0])
        else:
            lib = {"ours": Ours, "reaktiv": Reaktiv, "signified": Signified}[lib_name]()
            write, seen, extra = SCENARIOS[scenario][0](lib)
        seen.clear()
        if isinstance(extra, tuple) and len(extra) == 2 and isinstance(extra[1], list):
            extra[1][0] = 0
        times, cpus = [], []
        for block in range(blocks + 1):  # the first block is the warm-up
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            for i in range(block * per_block, (block + 1) * per_block):
                write(i)
            times.append((time.perf_counter() - t) / per_block)
            cpus.append((time.process_time() - c) / per_block)
        writes = (blocks + 1) * per_block
        if scenario == "cellx-1000" and writes % 2 == 0:
            write(writes)  # end on the (4, 3, 2, 1) inputs, whose end values are known
            writes += 1
    except RecursionError:
        return {"status": "RecursionError", **info}
    timed = times[1:]
    bad = sum(1 for v, want in seen if v != want)
    out = {"status": "ok", "us": statistics.median(timed) * 1e6, "us_min": min(timed) * 1e6,
           "cpu_us": statistics.median(cpus[1:]) * 1e6,
           "blocks": len(timed), "per_block": per_block, "writes": writes,
           "emissions": len(seen), "inconsistent": bad,
           "missed": max(EXPECTED_EMISSIONS.get(scenario, 1) * writes - len(seen), 0), **info}
    if scenario == "cellx-1000":
        before, after = extra[1]()
        out["ends"] = [before, after]
    if scenario == "cutoff":
        out["tail_runs"] = extra[1][0]
    return out


# ---------------------------------------------------------------------------- signified


def _python_version(exe: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return tuple(int(x) for x in out.stdout.split())
    except ValueError:
        return None


def _imports_signified(exe: str) -> bool:
    try:
        return subprocess.run([exe, "-c", "import signified"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _pythons_312() -> list[str]:
    """Python 3.12+ interpreters on this machine: this one, PATH, pyenv's versions."""
    found = [sys.executable]
    found += [p for n in ("python3.14", "python3.13", "python3.12") if (p := shutil.which(n))]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += sorted(glob.glob(str(pyenv / "3.1[2-9]*" / "bin" / "python")), reverse=True)
    out: list[str] = []
    for exe in found:
        if exe not in out and (_python_version(exe) or (0,)) >= (3, 12):
            out.append(exe)
    return out


def find_signified(install: bool) -> tuple[str | None, str]:
    """(interpreter that imports signified, how it was found), or (None, why not)."""
    env = os.environ.get("SIGNIFIED_PYTHON")
    if env:
        if _imports_signified(env):
            return env, f"$SIGNIFIED_PYTHON={env}"
        return None, f"$SIGNIFIED_PYTHON={env} cannot import signified"
    venv_python = SIGNIFIED_VENV / "bin" / "python"
    if venv_python.exists() and _imports_signified(str(venv_python)):
        return str(venv_python), f"venv {SIGNIFIED_VENV}"
    pythons = _pythons_312()
    for exe in pythons:
        if _imports_signified(exe):
            return exe, exe
    if not pythons:
        return None, (f"signified needs Python 3.12+; none found (this is "
                      f"{platform.python_version()}; set $SIGNIFIED_PYTHON)")
    if not install:
        return None, (f"no Python 3.12+ here imports signified (found {', '.join(pythons)}); "
                      "--no-install given")
    print(f"creating {SIGNIFIED_VENV} from {pythons[0]} and installing signified ...",
          file=sys.stderr)
    steps = ([pythons[0], "-m", "venv", str(SIGNIFIED_VENV)],
             [str(venv_python), "-m", "pip", "install", "--quiet", "signified"])
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{' '.join(cmd[1:4])} failed: {e}"
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or ["failed"])[-1]
            return None, f"{' '.join(cmd[1:4])} failed: {err[:120]}"
    if _imports_signified(str(venv_python)):
        return str(venv_python), f"venv {SIGNIFIED_VENV} (just created)"
    return None, f"installed signified into {SIGNIFIED_VENV} but it does not import"


# ---------------------------------------------------------------------------- the run


def _arg(name: str, default: int) -> int:
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


def main() -> None:
    if len(sys.argv) >= 6 and sys.argv[1] == "--one":
        print(json.dumps(run_one(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                 int(sys.argv[5]))))
        return
    quick = "--quick" in sys.argv
    blocks = _arg("--blocks", BLOCKS)
    if blocks < 5:
        sys.exit("--blocks must be at least 5")
    sig_python, sig_how = find_signified(install="--no-install" not in sys.argv)
    print(f"start: {_load()}")
    started = time.perf_counter()
    results: dict[str, dict[str, dict]] = {}
    for scenario, (_, per_block) in SCENARIOS.items():
        if quick:
            per_block = max(per_block // 20, 2)
        results[scenario] = {}
        for lib in LIBS:
            exe = sys.executable
            if lib == "signified":
                if sig_python is None:
                    results[scenario][lib] = {"status": "skipped"}
                    continue
                exe = sig_python
            try:
                proc = subprocess.run(
                    [exe, __file__, "--one", lib, scenario, str(per_block), str(blocks)],
                    capture_output=True, text=True, timeout=TIMEOUT,
                )
            except subprocess.TimeoutExpired:
                results[scenario][lib] = {"status": f"timeout>{TIMEOUT}s"}
                continue
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                results[scenario][lib] = {"status": f"failed: {err[:40]}"}
            else:
                results[scenario][lib] = json.loads(proc.stdout)
    print_table(results, blocks, sig_python, sig_how)
    print(f"run took {time.perf_counter() - started:.0f} s; {_load()}.")


def _load() -> str:
    """The machine's load average: on a shared machine, how far to trust the figures."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _fmt(r: dict, key: str = "us") -> str:
    return f"{r[key]:.1f}" if r.get("status") == "ok" else r.get("status", "?")


def _glitches(r: dict) -> str:
    missed = f" (missed {r['missed']})" if r.get("missed") else ""
    return str(r.get("inconsistent", "-")) + missed


def _ratio(ours: dict, peer: dict, key: str = "us") -> str:
    if ours.get("status") != "ok" or peer.get("status") != "ok":
        return "-"
    if ours.get("missed") or peer.get("missed"):
        return "-"  # a run that lost updates did less work: no fair ratio
    return f"{peer[key] / ours[key]:.2f}"


def _versions(results: dict[str, dict[str, dict]]) -> dict[str, tuple[str, str]]:
    """(Python version, library version) each library ran under, from its subprocesses."""
    out: dict[str, tuple[str, str]] = {}
    for row in results.values():
        for lib, r in row.items():
            if "python" in r and lib not in out:
                out[lib] = (r["python"], r.get("version", ""))
    return out


def print_table(results: dict[str, dict[str, dict]], blocks: int, sig_python: str | None,
                sig_how: str) -> None:
    versions = _versions(results)
    pys: dict[str, list[str]] = {}
    for lib in LIBS:
        if lib in versions:
            pys.setdefault(versions[lib][0], []).append(lib)
    py_line = "; ".join(f"{'/'.join(libs)} under Python {py}" for py, libs in pys.items())
    libs_line = ", ".join(f"{lib} {versions[lib][1]}" for lib in PEERS
                          if lib in versions and versions[lib][1])
    print(f"median us per write over {blocks} timed blocks after a warm-up block; "
          f"{py_line}; {libs_line}")
    if sig_python is None:
        print(f"signified: skipped: {sig_how}")
    else:
        print(f"signified: {sig_how}")
    print()
    head = (f"{'scenario':<12} {'ours us/w':>10} {'reaktiv':>10} {'reactivex':>10} "
            f"{'signified':>10} {'reaktiv/ours':>12} {'rx/ours':>8} {'sig/ours':>8} "
            f"{'cells':>9} {'cells/ours':>10}   inconsistent (ours/reaktiv/rx/sig/cells)")
    print(head)
    print("-" * len(head))
    for scenario, row in results.items():
        o, k, x, g, c = (row[lib] for lib in LIBS)
        inc = "/".join(_glitches(r) for r in (o, k, x, g, c))
        print(f"{scenario:<12} {_fmt(o):>10} {_fmt(k):>10} {_fmt(x):>10} {_fmt(g):>10} "
              f"{_ratio(o, k):>12} {_ratio(o, x):>8} {_ratio(o, g):>8} {_fmt(c):>9} "
              f"{_ratio(o, c):>10}   {inc}")
    print()
    head = (f"{'minimum':<12} " + " ".join(f"{lib:>10}" for lib in LIBS)
            + "   writes per block")
    print(head)
    print("-" * len(head))
    for scenario, row in results.items():
        per_block = next((r["per_block"] for r in row.values() if "per_block" in r), "-")
        print(f"{scenario:<12} " + " ".join(f"{_fmt(row[lib], 'us_min'):>10}" for lib in LIBS)
              + f"   {per_block}")
    print()
    head = (f"{'CPU':<12} " + " ".join(f"{lib:>10}" for lib in LIBS) + " "
            + " ".join(f"{SHORT[lib] + '/ours':>12}" for lib in (*PEERS, "cells")))
    print(head)
    print("-" * len(head))
    for scenario, row in results.items():
        print(f"{scenario:<12} " + " ".join(f"{_fmt(row[lib], 'cpu_us'):>10}" for lib in LIBS)
              + " " + " ".join(f"{_ratio(row['ours'], row[lib], 'cpu_us'):>12}"
                               for lib in (*PEERS, "cells")))
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
    print("first table: median wall time over blocks; minimum: the fastest block; CPU: median"
          " CPU time of the subprocess (steadier than wall time on a busy machine).")
    print("ours: the reactive kernel (runtime.signals); cells: the same graph as stored and"
          " computed cells, each write a committed transaction; cells/ours: its cost factor.")
    print("doc-10000: a computed sums a field over a 10,000-item list; each write changes one"
          " item (kernels and peers: a new list with one new item; cells: a path write into a"
          " document with a JSON Schema, checked at every commit).")


if __name__ == "__main__":
    main()
