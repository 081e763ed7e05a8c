"""Propagation benchmark: our reactive kernel, compiled and pure, against reaktiv, reactivex
and signified.

    python bench/reactive.py                 # every scenario, every library
    python bench/reactive.py --quick         # fewer writes (a smoke run)
    python bench/reactive.py --blocks 9      # more timed blocks (default 5)
    python bench/reactive.py --only chain-100,diamond-5   # some scenarios
    python bench/reactive.py --no-install    # never create signified's venv nor build there

Each (scenario, library) cell runs in a fresh subprocess, so a peer that overflows the stack
on a deep graph reports it instead of taking the run down, and no library warms another's
caches. In it, one block of writes warms up, then ``--blocks`` timed blocks of the same size
follow; the tables show the median per write over blocks. Targets are judged on CPU time
(the first tables); wall time follows. Every observer records what it saw and the inputs it
saw it for; after the timed blocks an oracle recomputes what it should have seen from those
inputs, and a value the oracle does not produce counts as inconsistent (a glitch). A ratio
against a peer that showed inconsistent values is marked ``!``: it times wrong results.

Our kernel runs twice: ``ours`` as installed (compiled by mypyc where the build produced it;
the header says which ran and why) and ``ours-pure`` with ``CELLDIALOG_PURE_KERNEL=1``.

signified (glitch-free, with a compiled Rust core) needs Python 3.12+ (its 0.7 wheels are
cp312-abi3 and its source uses 3.12 syntax; what ``pip install signified`` finds for 3.11 is
0.2.6, a different library with no effects or batches). Under an older interpreter it runs
under another one: ``$SIGNIFIED_PYTHON``, or the venv ``/tmp/celldialog-bench-py312``
(created from the first Python 3.12+ found, with ``pip install signified``, unless
``--no-install``), or any Python 3.12+ that imports it. Our kernel then runs under that
interpreter too (its source and setup.py copied there and compiled with mypyc, installed
there if missing), so signified is compared with ours on the same interpreter; both are
printed. Peers are driven
the way ``../shared/anchors/reactive_peers.py`` drives them, each through its leanest
callables (bound methods, C-level getters and setters: no frame of the bench's own between a
library and the code reading it).
"""

from __future__ import annotations

import functools
import gc
import glob
import hashlib
import json
import operator
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
# a run under signified's interpreter imports our kernel from its copy there (see below)
sys.path.insert(0, os.environ.get("CELLDIALOG_BENCH_ROOT", str(ROOT)))

LIBS = ("ours", "ours-pure", "reaktiv", "reactivex", "signified", "cells")
PEERS = ("reaktiv", "reactivex", "signified")
SHORT = {"ours": "ours", "ours-pure": "pure", "reaktiv": "reaktiv", "reactivex": "rx",
         "signified": "sig", "cells": "cells"}
TIMEOUT = 30  # seconds per (scenario, library); reaktiv on cellx-1000 runs for many minutes
BLOCKS = 5  # timed blocks after the warm-up block
SIGNIFIED_VENV = Path("/tmp/celldialog-bench-py312")
# what our kernel needs to run on its own (its package __init__s are left empty there)
KERNEL_FILES = ("runtime/errors.py", "runtime/cells/_kernel.py", "runtime/cells/signals.py",
                "runtime/cells/equality.py", "setup.py")


# ---------------------------------------------------------------------------- adapters
# Each adapter exposes: signal(v) -> (get, set); computed(fn) -> get; effect(fn) -> handle;
# batch() -> context manager. reactivex is driven with operators instead (see rx_builders).


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
    """signified's ``Signal`` / ``Computed`` / ``Effect`` are read and written through
    ``.value`` (a native property): here through C-level callables, not a lambda of ours.
    Observers are held weakly, so the closures keep the graph alive."""

    def __init__(self) -> None:
        import signified

        self.s = signified
        self._read = operator.attrgetter("value")

    def signal(self, v):
        sig = self.s.Signal(v)
        return functools.partial(self._read, sig), functools.partial(setattr, sig, "value")

    def computed(self, fn):
        return functools.partial(self._read, self.s.Computed(fn))

    def effect(self, fn):
        return self.s.Effect(fn)

    def batch(self):
        return self.s.batch()


# ---------------------------------------------------------------------------- scenarios
# A scenario builder takes a library adapter and returns (write(i), seen, expect, extra):
# observers append (value, inputs) to seen, where inputs is what the writer last wrote (a
# cheap reference); expect(inputs) is the oracle, applied only after the timed blocks.


def chain(n):
    def build(lib):
        get, set_ = lib.signal(0)
        node = get
        for _ in range(n):
            node = (lambda prev: lib.computed(lambda: prev() + 1))(node)
        seen = []
        cur = [0]
        keep = lib.effect(lambda: seen.append((node(), cur[0])))

        def write(i):
            cur[0] = i + 1
            set_(i + 1)

        return write, seen, lambda a: a + n, keep

    return build


def fanout(n):
    def build(lib):
        get, set_ = lib.signal(0)
        seen = []
        cur = [0]
        keep = []
        for k in range(n):
            c = (lambda k: lib.computed(lambda: get() + k))(k)
            keep.append(lib.effect((lambda c, k: lambda: seen.append((c(), (k, cur[0]))))(c, k)))

        def write(i):
            cur[0] = i + 1
            set_(i + 1)

        return write, seen, lambda ka: ka[0] + ka[1], keep

    return build


def diamond(width):
    def build(lib):
        get, set_ = lib.signal(0)
        mids = [(lambda k: lib.computed(lambda: get() + k))(k) for k in range(width)]
        total = lib.computed(lambda: sum(m() for m in mids))
        seen = []
        cur = [0]
        keep = lib.effect(lambda: seen.append((total(), cur[0])))

        def write(i):
            cur[0] = i + 1
            set_(i + 1)

        return write, seen, lambda a: width * a + sum(range(width)), keep

    return build


def triangle(lib):
    get, set_ = lib.signal(0)
    b = lib.computed(lambda: get() + 1)
    c = lib.computed(lambda: get() + b())
    seen = []
    cur = [0]
    keep = lib.effect(lambda: seen.append((c(), cur[0])))

    def write(i):
        cur[0] = i + 1
        set_(i + 1)

    return write, seen, lambda a: 2 * a + 1, keep


@functools.cache
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
        cur = [(1, 2, 3, 4)]
        keep = [
            lib.effect((lambda k, node: lambda: seen.append((node(), (k, cur[0]))))(k, node))
            for k, node in enumerate(prev)
        ]
        before = [p() for p in prev]

        def write(i):
            vals = (4, 3, 2, 1) if i % 2 == 0 else (1, 2, 3, 4)
            cur[0] = vals
            with lib.batch():
                for (_, set_), v in zip(srcs, vals, strict=True):
                    set_(v)

        def ends():
            return before, [p() for p in prev]

        return write, seen, lambda kv: _cellx_expected(kv[1], layers)[kv[0]], (keep, ends)

    return build


def _unstable_expected(a):
    return sum(a + k for k in range(5)) if a % 2 == 0 else a


def unstable(lib):
    get, set_ = lib.signal(0)
    ks = [(lambda k: lib.computed(lambda: get() + k))(k) for k in range(5)]
    branch = lib.computed(lambda: sum(k() for k in ks) if get() % 2 == 0 else ks[0]())
    seen = []
    cur = [0]
    keep = lib.effect(lambda: seen.append((branch(), cur[0])))

    def write(i):
        cur[0] = i + 1
        set_(i + 1)

    return write, seen, _unstable_expected, keep


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
    cur = [0]
    keep = lib.effect(lambda: seen.append((node(), cur[0])))
    runs[0] = 0

    def write(i):
        cur[0] = 2 * (i + 1)  # always even: parity never changes
        set_(2 * (i + 1))

    return write, seen, lambda a: a % 2 + 100, (keep, runs)


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
        cur = [sum(vals)]  # the writer keeps the sum as it writes: O(1), and the oracle
        seen = []
        keep = lib.effect(lambda: seen.append((total(), cur[0])))

        def write(i):
            j = (i * 7919) % n
            v = n + i + 1  # never a value item j held before: every write changes the sum
            cur[0] += v - vals[j]
            vals[j] = v
            set_at(j, "n", v)

        return write, seen, lambda s: s, keep

    return build


def batch1000(lib):
    get, set_ = lib.signal(0)
    double = lib.computed(lambda: get() * 2)
    seen = []
    cur = [0]
    keep = lib.effect(lambda: seen.append((double(), cur[0])))

    def write(i):  # one "write" here is a batch of 1,000 writes
        with lib.batch():
            for k in range(1000):
                cur[0] = i * 1000 + k
                set_(i * 1000 + k)

    return write, seen, lambda a: 2 * a, keep


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
            seen, cur = [], [0]
            obs.subscribe(lambda v: seen.append((v, cur[0])))

            def write(i):
                cur[0] = i + 1
                s.on_next(i + 1)

            return write, seen, lambda a: a + n, None

        return build

    def rx_fan(n):
        def build():
            s = BehaviorSubject(0)
            seen, cur = [], [0]
            for k in range(n):
                s.pipe(ops.map(lambda x, k=k: x + k)).subscribe(
                    lambda v, k=k: seen.append((v, (k, cur[0]))))

            def write(i):
                cur[0] = i + 1
                s.on_next(i + 1)

            return write, seen, lambda ka: ka[0] + ka[1], None

        return build

    def rx_diamond(width):
        def build():
            s = BehaviorSubject(0)
            mids = [s.pipe(ops.map(lambda x, k=k: x + k)) for k in range(width)]
            seen, cur = [], [0]
            rx.combine_latest(*mids).pipe(ops.map(sum)).subscribe(
                lambda v: seen.append((v, cur[0])))

            def write(i):
                cur[0] = i + 1
                s.on_next(i + 1)

            return write, seen, lambda a: width * a + sum(range(width)), None

        return build

    def rx_triangle():
        s = BehaviorSubject(0)
        b = s.pipe(ops.map(lambda x: x + 1))
        seen, cur = [], [0]
        rx.combine_latest(s, b).pipe(ops.map(lambda ab: ab[0] + ab[1])).subscribe(
            lambda v: seen.append((v, cur[0])))

        def write(i):
            cur[0] = i + 1
            s.on_next(i + 1)

        return write, seen, lambda a: 2 * a + 1, None

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
            seen, cur = [], [(1, 2, 3, 4)]
            last = [None] * 4
            for k, node in enumerate(prev):
                node.subscribe(lambda v, k=k: (last.__setitem__(k, v), seen.append(
                    (v, (k, cur[0])))))
            before = list(last)

            def write(i):
                vals = (4, 3, 2, 1) if i % 2 == 0 else (1, 2, 3, 4)
                cur[0] = vals
                for src, v in zip(srcs, vals, strict=True):
                    src.on_next(v)

            return (write, seen, lambda kv: _cellx_expected(kv[1], layers)[kv[0]],
                    (None, lambda: (before, list(last))))

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
        seen, cur = [], [0]
        obs.subscribe(lambda v: seen.append((v, cur[0])))
        runs[0] = 0

        def write(i):
            cur[0] = 2 * (i + 1)
            s.on_next(2 * (i + 1))

        return write, seen, lambda a: a % 2 + 100, (None, runs)

    def rx_doc(n):
        def build():
            items = _doc_items(n)
            s = BehaviorSubject(items)
            vals = list(range(n))
            seen, cur, state = [], [sum(vals)], {"v": items}
            s.pipe(ops.map(lambda xs: sum(item["n"] for item in xs))).subscribe(
                lambda v: seen.append((v, cur[0])))

            def write(i):
                j = (i * 7919) % n
                v = n + i + 1
                cur[0] += v - vals[j]
                vals[j] = v
                new = list(state["v"])
                new[j] = {**new[j], "n": v}
                state["v"] = new
                s.on_next(new)

            return write, seen, lambda t: t, None

        return build

    def rx_batch():
        s = BehaviorSubject(0)
        seen, cur = [], [0]
        s.pipe(ops.map(lambda x: x * 2)).subscribe(lambda v: seen.append((v, cur[0])))

        def write(i):  # no batches in Rx: every write propagates
            for k in range(1000):
                cur[0] = i * 1000 + k
                s.on_next(i * 1000 + k)

        return write, seen, lambda a: 2 * a, None

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
    """One warm-up block, then ``blocks`` timed blocks of ``per_block`` writes each; the
    oracle runs after them."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    info = {"python": platform.python_version(), "version": _lib_version(lib_name)}
    try:
        if lib_name == "reactivex":
            builders = rx_builders()
            if scenario not in builders:
                return {"status": "n/a", **info}
            write, seen, expect, extra = builders[scenario]()
        elif lib_name == "cells":
            write, seen, expect, extra = OursCells().build(SCENARIOS[scenario][0])
        else:
            lib = {"ours": Ours, "ours-pure": Ours, "reaktiv": Reaktiv,
                   "signified": Signified}[lib_name]()
            if isinstance(lib, Ours):
                info["kernel"] = lib.s.KERNEL
            write, seen, expect, extra = SCENARIOS[scenario][0](lib)
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
    bad = sum(1 for v, inputs in seen if v != expect(inputs))  # the oracle, after timing
    out = {"status": "ok", "us": statistics.median(times[1:]) * 1e6,
           "cpu_us": statistics.median(cpus[1:]) * 1e6, "cpu_us_min": min(cpus[1:]) * 1e6,
           "blocks": blocks, "per_block": per_block, "writes": writes,
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
    """Whether ``exe`` imports the signified this bench drives (effects and batches: 0.7+)."""
    try:
        return subprocess.run(
            [exe, "-c", "import signified; signified.Effect; signified.batch"],
            capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _pythons_312() -> list[str]:
    """Python 3.12+ interpreters on this machine: this one, PATH, pyenv's versions."""
    found = [sys.executable]
    found += [p for n in ("python3.14", "python3.13", "python3.12") if (p := shutil.which(n))]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += sorted(glob.glob(str(pyenv / "3.1[2-9]*" / "bin" / "python")))
    out: list[str] = []
    for exe in found:
        if exe not in out and (_python_version(exe) or (0,)) >= (3, 12):
            out.append(exe)
    return out


def _pip(python: str, *args: str) -> str | None:
    """Run pip under ``python``; None, or why it failed."""
    cmd = [python, "-m", "pip", "install", "--quiet", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return f"pip install {' '.join(args)} failed: {e}"
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return f"pip install {' '.join(args)} failed: {err[:120]}"
    return None


def find_signified(install: bool) -> tuple[str | None, str]:
    """(interpreter that imports signified, how it was found), or (None, why not)."""
    if _imports_signified(sys.executable):
        return sys.executable, "this interpreter"
    env = os.environ.get("SIGNIFIED_PYTHON")
    if env:
        if _imports_signified(env):
            return env, f"$SIGNIFIED_PYTHON={env}"
        return None, f"$SIGNIFIED_PYTHON={env} cannot import signified 0.7+"
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
    try:
        subprocess.run([pythons[0], "-m", "venv", str(SIGNIFIED_VENV)], check=True,
                       capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"python -m venv failed: {e}"
    why = _pip(str(venv_python), "signified")
    if why:
        return None, why
    if _imports_signified(str(venv_python)):
        return str(venv_python), f"venv {SIGNIFIED_VENV} (just created)"
    return None, f"installed signified into {SIGNIFIED_VENV} but it does not import"


def kernel_for(python: str, install: bool) -> tuple[str | None, str]:
    """Our kernel for another interpreter: its files copied under that interpreter's prefix
    and compiled there with this project's setup.py (rebuilt when a file changed). Returns
    (the directory to import it from, what was done), or (None, why not)."""
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, timeout=20).stdout.strip()
    if not prefix:
        return None, f"{python} does not run"
    where = Path(prefix) / "celldialog-kernel"
    digest = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in KERNEL_FILES)).hexdigest()
    stamp = where / "built-from"  # written once compiled from these files
    if stamp.exists() and stamp.read_text() == digest:
        return str(where), f"{where} (compiled earlier from the same files)"
    shutil.rmtree(where, ignore_errors=True)
    for f in KERNEL_FILES:
        (where / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, where / f)
    for package in ("runtime", "runtime/cells"):  # no package imports: only the kernel's
        (where / package / "__init__.py").write_text("")
    has_mypyc = subprocess.run([python, "-c", "import mypyc, setuptools"],
                               capture_output=True).returncode == 0
    if not has_mypyc and install:
        has_mypyc = _pip(python, "mypy>=1.11", "setuptools>=68") is None
    if not has_mypyc:
        return str(where), f"{where} (copied now; no mypyc there to compile it)"
    subprocess.run([python, "setup.py", "build_ext", "--inplace"], cwd=where,
                   capture_output=True, timeout=600)
    stamp.write_text(digest)
    return str(where), f"{where} (copied and compiled now)"


# ---------------------------------------------------------------------------- the run


def _arg(name: str, default: str) -> str:
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


def _run_cell(exe: str, lib: str, scenario: str, per_block: int, blocks: int,
              env: dict[str, str]) -> dict:
    """One (scenario, library) subprocess."""
    try:
        proc = subprocess.run(
            [exe, __file__, "--one", lib, scenario, str(per_block), str(blocks)],
            capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return {"status": f"timeout>{TIMEOUT}s"}
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"status": f"failed: {err[:40]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) >= 6 and sys.argv[1] == "--one":
        print(json.dumps(run_one(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                 int(sys.argv[5]))))
        return
    quick = "--quick" in sys.argv
    install = "--no-install" not in sys.argv
    blocks = int(_arg("--blocks", str(BLOCKS)))
    if blocks < 5:
        sys.exit("--blocks must be at least 5")
    only = [s for s in _arg("--only", "").split(",") if s]
    if unknown := [s for s in only if s not in SCENARIOS]:
        sys.exit(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    sig_python, sig_how = find_signified(install)
    foreign = sig_python is not None and sig_python != sys.executable
    kernel_dir, kernel_how = kernel_for(sig_python, install) if foreign else (None, "")
    print(f"start: {_load()}")
    started = time.perf_counter()
    pure = {"CELLDIALOG_PURE_KERNEL": "1"}
    results: dict[str, dict[str, dict]] = {}
    beside_sig: dict[str, dict[str, dict]] = {}  # ours under signified's interpreter
    for scenario, (_, per_block) in SCENARIOS.items():
        if only and scenario not in only:
            continue
        if quick:
            per_block = max(per_block // 20, 2)
        row = results[scenario] = {}
        for lib in LIBS:
            if lib == "signified" and sig_python is None:
                row[lib] = {"status": "skipped"}
                continue
            exe = sig_python if lib == "signified" else sys.executable
            env = pure if lib == "ours-pure" else {}
            row[lib] = _run_cell(exe, lib, scenario, per_block, blocks, env)
        if foreign and kernel_dir is not None:
            there = {"CELLDIALOG_BENCH_ROOT": kernel_dir}
            beside_sig[scenario] = {
                lib: _run_cell(sig_python, lib, scenario, per_block, blocks, {**there, **env})
                for lib, env in (("ours", {}), ("ours-pure", pure))}
    print_tables(results, beside_sig, blocks, sig_how if sig_python else f"skipped: {sig_how}",
                 kernel_how)
    print(f"run took {time.perf_counter() - started:.0f} s; {_load()}.")


def _load() -> str:
    """The machine's load average: on a shared machine, how far to trust the figures."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _fmt(r: dict, key: str = "cpu_us") -> str:
    return f"{r[key]:.1f}" if r.get("status") == "ok" else r.get("status", "?")


def _glitches(r: dict) -> str:
    missed = f" (missed {r['missed']})" if r.get("missed") else ""
    return str(r.get("inconsistent", "-")) + missed


def _ratio(ours: dict, peer: dict, key: str = "cpu_us") -> str:
    if ours.get("status") != "ok" or peer.get("status") != "ok":
        return "-"
    if ours.get("missed") or peer.get("missed"):
        return "-"  # a run that lost updates did less work: no fair ratio
    flag = "!" if peer.get("inconsistent") else ""  # it timed wrong results
    return f"{peer[key] / ours[key]:.2f}{flag}"


def _first(results: dict[str, dict[str, dict]], lib: str, key: str) -> str:
    return next((r[key] for row in results.values() if (r := row.get(lib, {})).get(key)), "")


def _table(title: str, head: list[tuple[str, int]], rows: list[list[str]]) -> None:
    print(title)
    line = " ".join(f"{name:>{w}}" if i else f"{name:<{w}}" for i, (name, w) in enumerate(head))
    print(line)
    print("-" * len(line))
    for row in rows:
        print(" ".join(f"{cell:>{w}}" if i else f"{cell:<{w}}"
                       for i, (cell, (_, w)) in enumerate(zip(row, head, strict=True))))
    print()


def print_tables(results: dict[str, dict[str, dict]], beside_sig: dict[str, dict[str, dict]],
                 blocks: int, sig_how: str, kernel_how: str) -> None:
    py = platform.python_version()
    versions = ", ".join(f"{lib} {v}" for lib in PEERS if (v := _first(results, lib, "version")))
    print(f"CPU microseconds per write, median over {blocks} timed blocks after a warm-up block;"
          f" Python {py}; {versions}")
    print(f"ours: {_first(results, 'ours', 'kernel') or '?'}; "
          f"ours-pure: {_first(results, 'ours-pure', 'kernel') or '?'}")
    sig_py = _first(results, "signified", "python")
    print(f"signified: {sig_how}" + (f" (Python {sig_py})" if sig_py else ""))
    if beside_sig:
        print(f"ours beside it, under Python {sig_py}: {kernel_how}; ours: "
              f"{_first(beside_sig, 'ours', 'kernel') or '?'}")
    print()
    _table(
        f"CPU, Python {py}",
        [("scenario", 12), ("ours", 9), ("ours-pure", 9), ("pure/ours", 9), ("reaktiv", 9),
         ("reactivex", 9), ("cells", 9), ("reaktiv/ours", 12), ("rx/ours", 8),
         ("cells/ours", 10)],
        [[s, _fmt(r["ours"]), _fmt(r["ours-pure"]), _ratio(r["ours"], r["ours-pure"]),
          _fmt(r["reaktiv"]), _fmt(r["reactivex"]), _fmt(r["cells"]),
          _ratio(r["ours"], r["reaktiv"]), _ratio(r["ours"], r["reactivex"]),
          _ratio(r["ours"], r["cells"])] for s, r in results.items()])
    mates = beside_sig or {s: {"ours": r["ours"], "ours-pure": r["ours-pure"]}
                           for s, r in results.items()}
    _table(
        f"CPU, signified beside ours on one interpreter (Python {sig_py or py})",
        [("scenario", 12), ("ours", 9), ("ours-pure", 9), ("signified", 10), ("sig/ours", 9),
         ("sig/pure", 9)],
        [[s, _fmt(mates[s]["ours"]), _fmt(mates[s]["ours-pure"]), _fmt(r["signified"]),
          _ratio(mates[s]["ours"], r["signified"]), _ratio(mates[s]["ours-pure"], r["signified"])]
         for s, r in results.items()])
    _table(
        "wall time, microseconds per write (median over the same blocks)",
        [("scenario", 12), *((lib, 10) for lib in LIBS)],
        [[s, *(_fmt(r[lib], "us") for lib in LIBS)] for s, r in results.items()])
    _table(
        "inconsistent values (missed updates)",
        [("scenario", 12), *((lib, 10) for lib in LIBS), ("writes/block", 12)],
        [[s, *(_glitches(r[lib]) for lib in LIBS),
          str(next((x["per_block"] for x in r.values() if "per_block" in x), "-"))]
         for s, r in results.items()])
    for lib in LIBS:
        r = results.get("cellx-1000", {}).get(lib, {})
        if "ends" in r:
            print(f"cellx-1000 {lib}: before {r['ends'][0]} after {r['ends'][1]} "
                  f"(known: before [-3, -6, -2, 2] after [-2, -4, 2, 3])")
    for lib in LIBS:
        r = results.get("cutoff", {}).get(lib, {})
        if "tail_runs" in r:
            print(f"cutoff {lib}: tail nodes ran {r['tail_runs']} times over all writes")
    print("inconsistent: values an observer saw that the oracle (run after the timed blocks)"
          " does not produce for the inputs at that moment; missed: updates never seen.")
    print("ratios: peer time / our time, > 1 means we are faster; `!`: the peer showed"
          " inconsistent values (it timed wrong results); `-`: a run missed updates or failed.")
    print("us per write: cellx per batch of 4 writes, batch-1000 per batch of 1,000.")
    print("ours: the reactive kernel (runtime.cells.signals) as installed; ours-pure: the same"
          " source as pure Python (CELLDIALOG_PURE_KERNEL=1); cells: the same graph as stored"
          " and computed cells, each write a committed transaction.")
    print("doc-10000: a computed sums a field over a 10,000-item list; each write changes one"
          " item (kernels and peers: a new list with one new item; cells: a path write into a"
          " document with a JSON Schema, checked at every commit).")


if __name__ == "__main__":
    main()
