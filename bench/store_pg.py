"""The PostgreSQL store under one and several processes, beside bare psycopg floors.

    python bench/store_pg.py            # every section (about two minutes)
    python bench/store_pg.py --quick    # shorter runs, fewer repetitions (a smoke run)

It starts its own throwaway cluster (``tests/postgres.Cluster``: durability off, data on
tmpfs) and talks to it over the Unix socket. Child processes are ``bench/_store_pg_child.py``
(one mode each); latencies across processes use ``time.monotonic()`` (CLOCK_MONOTONIC is
system-wide on Linux). Every figure is a ping-pong between processes on few cores: absolute
times move between runs (on a VM, with how soon an idle vCPU wakes) more than the ratios to
a floor measured alongside, which are the figures to compare.

1. One commit, this process: ``PostgresStore.commit`` of a patch appending to a list (the
   runtime's shape of write), a whole value, and two documents at once, beside a bare
   psycopg floor doing the same the naive way: ``with conn.transaction():`` a conditional
   ``UPDATE ... WHERE id = %s AND version = %s RETURNING version`` of the whole JSON value
   and ``SELECT pg_notify('celldialog', ...)``. A list is appended to at most ``CHUNK`` times,
   then a fresh document starts (created untimed), so the floor's whole value stays small.
   After a warm-up, rounds of short blocks, each row's two sides back to back; medians
   over blocks, and the median of the paired ratios. Target: ours <= 2x the floor (wall).
2. Commits/s with N processes (kept alive across runs, each timed over the same window):
   disjoint (one document each) and contended (one document for all: read, commit the
   increment with ``expect``, re-read on ``ConflictError``). The final counters are checked
   against the increments that succeeded: no update may be lost.
3. Propagation: writer processes ``await inst.send("put", {"t": monotonic(), ...})`` into a
   ``Runtime``; a reader process's ``Runtime`` has a sink on that cell and records
   now - t. The floor: a bare psycopg writer (UPDATE + pg_notify) and an async LISTEN
   reader that fetches the row per notification. Paced at 200/s per writer, and flat out
   (then the feed coalesces: a reader sees the latest version, not each commit). "send" is
   the writer's own time per commit (ours: the whole ``await inst.send``; the floor: its
   transaction). Target: p99 ours <= 3x the floor's at 200/s, one writer.
4. Cancel across processes: A owns a dialog turn whose model streams until cancelled; this
   process (B) sends ``cancel``; latency = B's send start -> A's model stream cancelled.
5. Takeover: A owns a turn (lease TTL ``--ttl``, default 2 s; the runtime's default is 10 s)
   and is SIGKILLed at a random point of its renewal cycle; B, already running, waits for
   the lease's expiry as the store's clock tells it (``lease_remaining``), then sends
   ``add_message``; time = the kill -> B's message accepted as a new turn (the dead turn
   recovered), and beside it what the lease had left and what came after its expiry.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import math
import os
import platform
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import psycopg

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from _common import Span, clock, load, since, source_state  # noqa: E402
from _store_pg_child import dialog_agent  # noqa: E402

from runtime import Runtime  # noqa: E402
from runtime.llm import ScriptedModel  # noqa: E402
from runtime.storage import DocKey, PostgresStore, Write  # noqa: E402
from tests.postgres import Cluster  # noqa: E402

CHILD = BENCH / "_store_pg_child.py"
COMMIT_TARGET = 2.0  # one-document commit, ours / floor (median wall)
PROPAGATION_TARGET = 3.0  # propagation p99, ours / floor, at 200/s, one writer
CHUNK = 100  # appends to one list before a fresh document starts
PROCESSES = (1, 2, 4, 8)
RATE = 200.0  # commits/s per writer process when paced
WAIT = 60.0  # seconds: the bound on every wait for a child
FLOOR_TABLE = "CREATE TABLE floor_t (id text PRIMARY KEY, version bigint NOT NULL, value text)"
FLOOR_UPDATE = ("UPDATE floor_t SET version = version + 1, value = %s "
                "WHERE id = %s AND version = %s RETURNING version")
FLOOR_ONE = ("WITH u AS (UPDATE floor_t SET version = version + 1, value = %s "
             "WHERE id = %s AND version = %s RETURNING version) "
             "SELECT version, pg_notify('celldialog', %s) FROM u")
_names = itertools.count(1)


@dataclass
class Config:
    blocks: int
    block_s: float
    warmup_s: float
    run_s: float  # each commits/s window
    prop_s: float  # each propagation run
    cancels: int
    takeovers: int
    ttl: float


def fresh(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in (0, 1])."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def table(rows: list[tuple[str, ...]], left: int = 1) -> None:
    """Print ``rows`` (the first is the header) aligned; the first ``left`` columns left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  " + "  ".join(c.ljust(w) if i < left else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ---------------------------------------------------------------------------- children


class Child:
    """A ``_store_pg_child.py`` process: JSON lines out (read by a thread into a queue, so
    every wait has a timeout), command lines in."""

    def __init__(self, mode: str, **cfg: Any) -> None:
        self.mode = mode
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps({"mode": mode, **cfg})], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, key: str, timeout: float = WAIT) -> dict[str, Any]:
        """The next record carrying ``key``; TimeoutError past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{self.mode} child: no {key!r} within {timeout} s") from None
            if line is None:
                raise RuntimeError(f"{self.mode} child exited ({self.proc.wait()}) before "
                                   f"saying {key!r}")
            record = json.loads(line)
            if key in record:
                return record

    async def expect_async(self, key: str, timeout: float = WAIT) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(self.expect, key, timeout)

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """End of input; killed if it has not exited within ``WAIT``."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(WAIT)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(WAIT)


# ---------------------------------------------------------------------------- 1. one commit


class Side:
    """One side of a row: ``run(m)`` times ``m`` commits (anything untimed it needs, it
    does off the clock)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.m = 1
        self.wall: list[float] = []  # per commit, one per block
        self.cpu: list[float] = []

    def run(self, m: int) -> Span:
        raise NotImplementedError

    def close(self) -> None: ...


class OursAppend(Side):
    """``docs`` documents, each commit one patch per document appending to its list."""

    def __init__(self, label: str, url: str, docs: int) -> None:
        super().__init__(label)
        self.store = PostgresStore(url)
        self.docs = docs

    def run(self, m: int) -> Span:
        wall = cpu = 0.0
        for start in range(0, m, CHUNK):
            keys = [DocKey("bench", "", fresh("append")) for _ in range(self.docs)]
            versions = self.store.commit([Write(k, {"items": []}, expect=0) for k in keys])
            t = clock()
            for n in range(min(CHUNK, m - start)):
                versions = self.store.commit([
                    Write(k, None, expect=versions[k], patch=((("items", n), n),))
                    for k in keys])
            w, c = since(t)
            wall, cpu = wall + w, cpu + c
        return wall, cpu

    def close(self) -> None:
        self.store.close()


class FloorAppend(Side):
    """The naive way: the whole list rewritten by a conditional UPDATE per document, and one
    pg_notify of the keys and versions, in one transaction."""

    def __init__(self, label: str, url: str, docs: int) -> None:
        super().__init__(label)
        self.conn = psycopg.connect(url, autocommit=True)
        self.docs = docs

    def run(self, m: int) -> Span:
        conn = self.conn
        wall = cpu = 0.0
        for start in range(0, m, CHUNK):
            ids = [fresh("floor") for _ in range(self.docs)]
            conn.execute("INSERT INTO floor_t SELECT unnest(%s::text[]), 1, '{\"items\":[]}'",
                         (ids,))
            state: dict[str, tuple[int, list[int]]] = {i: (1, []) for i in ids}
            t = clock()
            for n in range(min(CHUNK, m - start)):
                with conn.transaction():
                    changed = []
                    for i in ids:
                        version, items = state[i]
                        items.append(n)
                        row = conn.execute(FLOOR_UPDATE, (json.dumps({"items": items}), i,
                                                          version)).fetchone()
                        if row is None:
                            raise RuntimeError(f"floor row {i} changed under the bench")
                        state[i] = (row[0], items)
                        changed.append(["bench", "", i, row[0]])
                    conn.execute("SELECT pg_notify(%s, %s)", ("celldialog", json.dumps(changed)))
            w, c = since(t)
            wall, cpu = wall + w, cpu + c
        return wall, cpu

    def close(self) -> None:
        self.conn.close()


class FloorOneStatement(Side):
    """The leanest hand-written commit: one autocommit statement, a conditional UPDATE of
    the whole JSON that also notifies (one round trip, its own transaction)."""

    def __init__(self, label: str, url: str) -> None:
        super().__init__(label)
        self.conn = psycopg.connect(url, autocommit=True)

    def run(self, m: int) -> Span:
        conn = self.conn
        wall = cpu = 0.0
        for start in range(0, m, CHUNK):
            i = fresh("floor1")
            conn.execute("INSERT INTO floor_t VALUES (%s, 1, '{\"items\":[]}')", (i,))
            version, items = 1, []
            t = clock()
            for n in range(min(CHUNK, m - start)):
                items.append(n)
                row = conn.execute(FLOOR_ONE, (json.dumps({"items": items}), i, version,
                                               json.dumps([["bench", "", i, version + 1]]))
                                   ).fetchone()
                if row is None:
                    raise RuntimeError(f"floor row {i} changed under the bench")
                version = row[0]
            w, c = since(t)
            wall, cpu = wall + w, cpu + c
        return wall, cpu

    def close(self) -> None:
        self.conn.close()


def item(i: int) -> dict[str, Any]:
    return {"title": f"item {i}", "done": i % 2 == 0, "tags": ["bench", "pg"]}


class OursWhole(Side):
    """One document, each commit its whole (small) value with ``expect``."""

    def __init__(self, label: str, url: str) -> None:
        super().__init__(label)
        self.store = PostgresStore(url)
        self.key = DocKey("bench", "", fresh("whole"))
        self.version = self.store.commit([Write(self.key, item(0), expect=0)])[self.key]

    def run(self, m: int) -> Span:
        key, commit = self.key, self.store.commit
        t = clock()
        for i in range(m):
            self.version = commit([Write(key, item(i), expect=self.version)])[key]
        return since(t)

    def close(self) -> None:
        self.store.close()


class FloorWhole(Side):
    def __init__(self, label: str, url: str) -> None:
        super().__init__(label)
        self.conn = psycopg.connect(url, autocommit=True)
        self.id = fresh("floor")
        self.conn.execute("INSERT INTO floor_t VALUES (%s, 1, %s)",
                          (self.id, json.dumps(item(0))))
        self.version = 1

    def run(self, m: int) -> Span:
        conn, id_ = self.conn, self.id
        t = clock()
        for i in range(m):
            with conn.transaction():
                row = conn.execute(FLOOR_UPDATE, (json.dumps(item(i)), id_, self.version)
                                   ).fetchone()
                if row is None:
                    raise RuntimeError(f"floor row {id_} changed under the bench")
                self.version = row[0]
                conn.execute("SELECT pg_notify(%s, %s)", (
                    "celldialog", json.dumps([["bench", "", id_, self.version]])))
        return since(t)

    def close(self) -> None:
        self.conn.close()


def warm_up(side: Side, cfg: Config) -> None:
    """Doubling rounds until ``warmup_s`` passed; then size a block to ``block_s``."""
    m, spent, n = 8, 0.0, 0
    while spent < cfg.warmup_s:
        spent += side.run(m)[0]
        n += m
        m *= 2
    side.m = max(CHUNK // 4, math.ceil(cfg.block_s / (spent / n)))


def one_commit(url: str, cfg: Config) -> list[bool]:
    sync_url = url + "&options=" + quote("-csynchronous_commit=on")
    rows: list[tuple[str, Side, Side]] = [
        ("1 doc, patch vs one statement",
         OursAppend("ours", url, 1), FloorOneStatement("floor", url)),
        ("1 doc, patch (append to a list)",
         OursAppend("ours", url, 1), FloorAppend("floor", url, 1)),
        ("1 doc, patch, synchronous_commit=on",
         OursAppend("ours", sync_url, 1), FloorAppend("floor", sync_url, 1)),
        ("1 doc, whole value (~60 B)", OursWhole("ours", url), FloorWhole("floor", url)),
        ("2 docs, a patch each", OursAppend("ours", url, 2), FloorAppend("floor", url, 2)),
    ]
    sides = [s for _, ours, floor in rows for s in (ours, floor)]
    paired: list[list[float]] = [[] for _ in rows]  # per round: ours / floor, back to back
    try:
        for side in sides:
            warm_up(side, cfg)
        for block in range(cfg.blocks):
            # rows in a rotating order, each pair back to back (which goes first
            # alternating): a burst of other work on the machine falls on both sides
            for i in [(block + j) % len(rows) for j in range(len(rows))]:
                _, ours, floor = rows[i]
                for side in (ours, floor) if block % 2 == 0 else (floor, ours):
                    gc.collect()
                    wall, cpu = side.run(side.m)
                    side.wall.append(wall / side.m)
                    side.cpu.append(cpu / side.m)
                paired[i].append(ours.wall[-1] / floor.wall[-1])
    finally:
        for side in sides:
            side.close()
    out = [("row", "ours µs", "ours CPU µs", "floor µs", "floor CPU µs", "ours/floor",
            "CPU ours/floor", "blocks x commits")]
    ratios = [statistics.median(p) for p in paired]
    for (label, ours, floor), ratio in zip(rows, ratios, strict=True):
        o, f = statistics.median(ours.wall), statistics.median(floor.wall)
        oc, fc = statistics.median(ours.cpu), statistics.median(floor.cpu)
        out.append((label, f"{o * 1e6:,.0f}", f"{oc * 1e6:,.0f}", f"{f * 1e6:,.0f}",
                    f"{fc * 1e6:,.0f}", f"{ratio:.2f}x", f"{oc / fc:.2f}x",
                    f"{cfg.blocks} x {ours.m:,}/{floor.m:,}"))
    table(out)
    print("  ours: one round trip: per document one conditional statement that also notifies "
          "(a patch: UPDATE + INSERT into its log; a patch that would make the log outgrow the "
          "base is the whole value instead); one document: the statement alone (one round "
          "trip), several: BEGIN and the writes in one pipeline, then COMMIT (two). "
          "floor, first row: one autocommit statement "
          "(a conditional UPDATE of the whole JSON that notifies); other rows: the naive way, "
          "BEGIN; a conditional UPDATE per document; pg_notify; COMMIT, a round trip each. "
          "CPU: this process's. ours/floor: the median over rounds of the ratio of the two "
          "blocks run back to back.")
    ok = ratios[0] <= COMMIT_TARGET
    print(f"  target: 1-doc patch commit <= {COMMIT_TARGET}x the one-statement floor (median "
          f"wall): {ratios[0]:.2f}x {verdict(ok)}")
    return [ok]


# ---------------------------------------------------------------------------- 2. commits/s


@dataclass
class Throughput:
    n: int
    mode: str
    reports: list[dict[str, Any]]
    finals: dict[DocKey, int]
    keys: list[DocKey]

    @property
    def done(self) -> int:
        return sum(r["done"] for r in self.reports)

    @property
    def lost(self) -> int:
        """Increments that succeeded but are not in the final counters."""
        if self.mode == "contended":
            return self.done - self.finals[self.keys[0]]
        return sum(r["done"] - self.finals[k]
                   for r, k in zip(self.reports, self.keys, strict=True))


GROWTH_SIZES = (1_000, 10_000, 100_000)
GROWTH_TARGET = 1.5  # a push to 100,000 items within 1.5x a push to 1,000


def growth(url: str, cfg: Config) -> list[bool]:
    """A push (a patch appending one item) to lists of 1,000, 10,000 and 100,000 items:
    with the patch log, what a commit costs must not grow with the list (a whole value is
    written only when the log outgrows it: amortised, not per push)."""
    store = PostgresStore(url)
    medians: list[float] = []
    try:
        for size in GROWTH_SIZES:
            key = DocKey("bench", "", fresh(f"grow{size}"))
            version = store.commit([Write(key, {"items": list(range(size))}, expect=0)])[key]
            n, per = size, []
            pushes = max(50, int(cfg.block_s * 2000))
            for block in range(cfg.blocks + 1):
                t = clock()
                for _ in range(pushes):
                    version = store.commit([Write(key, None, expect=version,
                                                  patch=((("items", n), n),))])[key]
                    n += 1
                if block:  # the first block warms up
                    per.append(since(t)[0] / pushes)
            medians.append(statistics.median(per))
            if store.load(key).value["items"][-1] != n - 1:  # type: ignore[union-attr]
                raise RuntimeError("the pushes did not all land")
    finally:
        store.close()
    table([("items", "µs per push (median)", "vs 1,000")] + [
        (f"{size:,}", f"{m * 1e6:,.0f}", f"{m / medians[0]:.2f}x")
        for size, m in zip(GROWTH_SIZES, medians, strict=True)])
    ok = medians[-1] / medians[0] <= GROWTH_TARGET
    print(f"  target: a push to {GROWTH_SIZES[-1]:,} items <= {GROWTH_TARGET}x one to "
          f"{GROWTH_SIZES[0]:,}: {medians[-1] / medians[0]:.2f}x {verdict(ok)}")
    return [ok]


def run_counters(store: PostgresStore, children: list[Child], n: int, mode: str,
                 seconds: float) -> Throughput:
    """One window: ``n`` processes from a shared start for ``seconds``."""
    shared = DocKey("bench", "", fresh("contended"))
    keys = ([shared] * n if mode == "contended"
            else [DocKey("bench", "", fresh("disjoint")) for _ in range(n)])
    store.commit([Write(k, {"n": 0}, expect=0) for k in dict.fromkeys(keys)])
    start = time.monotonic() + 0.3  # every child has read its command by then
    for child, key in zip(children, keys, strict=False):
        child.tell(json.dumps({"key": list(key), "start": start, "until": start + seconds}))
    reports = [c.expect("done", timeout=seconds + WAIT) for c in children[:n]]
    finals = {}
    for k in dict.fromkeys(keys):
        stored = store.load(k)
        assert stored is not None
        finals[k] = stored.value["n"]
    return Throughput(n, mode, reports, finals, keys)


def commits_per_second(url: str, cfg: Config) -> list[bool]:
    store = PostgresStore(url)
    children = [Child("counter", url=url) for _ in range(max(PROCESSES))]
    results: list[Throughput] = []
    try:
        for child in children:
            child.expect("ready")
        for n in PROCESSES:
            for mode in ("disjoint", "contended"):
                results.append(run_counters(store, children, n, mode, cfg.run_s))
    finally:
        for child in children:
            child.close()
        store.close()
    rows = [("processes", "documents", "commits/s total", "per process (min-max)",
             "conflicts", "conflicts/commit", "CPU µs/commit", "lost updates")]
    for r in results:
        rates = [x["done"] / x["wall"] for x in r.reports]
        conflicts = sum(x["conflicts"] for x in r.reports)
        cpu = sum(x["cpu"] for x in r.reports) / max(r.done, 1)
        rows.append((f"{r.n}", "1 each" if r.mode == "disjoint" else "1 shared",
                     f"{sum(rates):,.0f}",
                     f"{statistics.mean(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})",
                     f"{conflicts:,}", f"{conflicts / max(r.done, 1):.2f}", f"{cpu * 1e6:,.0f}",
                     f"{r.lost}"))
    table(rows, left=2)
    print("  per process: its commits / its window; CPU: the writers' own (the server's is "
          "not counted); every process shares the machine's cores with the server.")
    ok = all(r.lost == 0 for r in results)
    print(f"  lost updates: final counter == successful increments in all "
          f"{len(results)} runs: {verdict(ok)} "
          f"({sum(r.done for r in results):,} increments checked)")
    return [ok]


# ---------------------------------------------------------------------------- 3. propagation


@dataclass
class Propagation:
    kind: str  # "ours" | "floor"
    writers: int
    rate: float  # per writer; 0: flat out
    commits: list[float] = field(default_factory=list)  # each writer commit's duration
    latencies: list[float] = field(default_factory=list)
    errors: int = 0


def propagate(url: str, kind: str, writers: int, rate: float, seconds: float) -> Propagation:
    """One run: a reader process, then ``writers`` writer processes released together."""
    names = [fresh("w") for _ in range(writers)]
    prefix = "" if kind == "ours" else "floor_"
    if kind == "floor":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO floor_t SELECT unnest(%s::text[]), 1, '{}'", (names,))
    result = Propagation(kind, writers, rate)
    reader = Child(prefix + "reader", url=url, writers=names)
    senders: list[Child] = []
    try:
        reader.expect("ready")
        senders = [Child(prefix + "writer", url=url, name=n, rate=rate, seconds=seconds)
                   for n in names]
        for s in senders:
            s.expect("ready")
        for s in senders:
            s.tell("go")
        for s in senders:
            got = s.expect("sent", timeout=seconds + WAIT)
            result.commits += got["sent"]
            result.errors += got["errors"]
        got = reader.expect("latencies")
        result.latencies, result.errors = got["latencies"], result.errors + got["errors"]
    finally:
        for child in [reader, *senders]:
            child.close()
    return result


def propagation(url: str, cfg: Config) -> list[bool]:
    settings = [(1, RATE), (2, RATE), (1, 0.0), (2, 0.0)]
    results = {(k, w, r): propagate(url, k, w, r, cfg.prop_s)
               for w, r in settings for k in ("ours", "floor")}  # ours, floor alternating
    rows = [("writers x rate", "path", "commits", "send p50 ms", "seen", "p50 ms", "p99 ms",
             "max ms", "p99 ours/floor", "errors")]
    for w, r in settings:
        floor_p99 = pct(results[("floor", w, r)].latencies or [math.nan], 0.99)
        for kind in ("ours", "floor"):
            p = results[(kind, w, r)]
            lat = p.latencies or [math.nan]
            rows.append((f"{w} x {f'{r:.0f}/s' if r else 'flat out'}", kind,
                         f"{len(p.commits):,}", ms(pct(p.commits or [math.nan], 0.5)),
                         f"{len(p.latencies):,}", ms(pct(lat, 0.5)), ms(pct(lat, 0.99)),
                         ms(max(lat)),
                         f"{pct(lat, 0.99) / floor_p99:.2f}x" if kind == "ours" else "",
                         f"{p.errors}"))
    table(rows, left=2)
    ours, floor = results[("ours", 1, RATE)], results[("floor", 1, RATE)]
    ratio = pct(ours.latencies, 0.99) / pct(floor.latencies, 0.99)
    ok = ratio <= PROPAGATION_TARGET
    print(f"  target: p99 ours <= {PROPAGATION_TARGET}x the floor at {RATE:.0f}/s, one "
          f"writer: {ratio:.2f}x {verdict(ok)}")
    clean = all(p.errors == 0 and p.latencies for p in results.values())
    print(f"  every run: the reader saw the writers' commits, no runtime errors: "
          f"{verdict(clean)} (seen < commits: a reader that fell behind read a document once "
          f"for several commits: the feed coalesces them, the floor's fetch finds the newest)")
    return [ok, clean]


# ---------------------------------------------------------------------------- 4. cancel


async def cancel_latency(url: str, cfg: Config) -> list[bool]:
    """A (a child) starts a turn; B (here) cancels it; A's model timestamps the cancel."""
    a = Child("owner", url=url, session="cancel", ttl=10.0)
    latencies: list[float] = []
    sends: list[float] = []
    try:
        await a.expect_async("holder")
        async with Runtime(store=url) as rt:
            inst = rt.run(dialog_agent, user="u", session="cancel")
            for i in range(cfg.cancels + 1):  # the first is a warm-up
                a.tell(f"turn {i}")
                await a.expect_async("waiting")
                t0 = time.monotonic()
                await inst.send("cancel", None)
                sent = time.monotonic() - t0
                stopped = (await a.expect_async("cancelled"))["cancelled"] - t0
                if i:
                    latencies.append(stopped)
                    sends.append(sent)
            ok = inst.result.key("pending").get() is False and not rt.errors
    finally:
        a.close()
    print(f"  {len(latencies)} cancels: B's send start -> A's model stream cancelled: "
          f"p50 {ms(statistics.median(latencies))} ms, max {ms(max(latencies))} ms "
          f"(B's own send: p50 {ms(statistics.median(sends))} ms, "
          f"max {ms(max(sends))} ms)")
    print(f"  every turn cancelled, no turn pending after, no runtime errors: {verdict(ok)}")
    return [ok]


# ---------------------------------------------------------------------------- 5. takeover


@dataclass
class Takeover:
    took: float  # the kill -> B's message accepted as a new turn
    left: float  # lease left at the kill, on the store's clock
    late: float  # accepted - the lease's expiry
    send: float  # B's accepting add_message: its start -> its handler's commit
    tries: int  # add_message sent (the earlier ones dropped: the lease had not expired)
    ok: bool  # recovered: the dead turn answered as interrupted, B's reply stored


async def retake(rt: Runtime, inst: Any, holder: str) -> tuple[float, float, int]:
    """Send ``add_message`` once the dead holder's lease has expired on the store's clock;
    a message still dropped (our timer ran a little early) waits and tries again. Returns
    (when the accepting handler committed, its send start -> that commit, sends): the
    commit, not the send's return, which may include B's whole scripted turn."""
    commits: list[float] = []
    unsubscribe = rt.on_commit(lambda _: commits.append(time.monotonic()))
    tries = 0
    try:
        while True:
            left = rt.store.lease_remaining(holder)
            if left is not None and left > 0:
                await anyio.sleep(left)  # until the lease's own deadline: the time under test
                continue
            dropped = inst.result.key("dropped").get()
            t = time.monotonic()
            await inst.send("send", "again")
            tries += 1
            if inst.result.key("dropped").get() == dropped:
                accepted = min(c for c in commits if c >= t)
                return accepted, accepted - t, tries
    finally:
        unsubscribe()


async def takeover_once(url: str, ttl: float, rep: int) -> Takeover:
    """A starts a turn; B (here) opens its runtime and reads the dialog; at a random point
    of A's renewal cycle A is SIGKILLed and B takes over."""
    session = f"takeover-{rep}"
    a = Child("owner", url=url, session=session, ttl=ttl)
    try:
        holder = (await a.expect_async("holder"))["holder"]
        a.tell("hello")
        await a.expect_async("waiting")
        async with Runtime(store=url, model=ScriptedModel(["recovered"]), lease_ttl=ttl) as rt:
            inst = rt.run(dialog_agent, user="u", session=session)
            assert inst.result.key("pending").get() is True
            # where in A's renewal cycle (every ttl/3) the kill lands: before the clock
            await anyio.sleep(random.Random(rep).uniform(0, ttl / 3))
            killed = time.monotonic()
            a.proc.kill()
            a.proc.wait(WAIT)
            left = rt.store.lease_remaining(holder) or 0.0
            expiry = time.monotonic() + left
            with anyio.fail_after(ttl + WAIT):
                accepted, send, tries = await retake(rt, inst, holder)
                await rt.settled()
            history = json.dumps(inst.result.key("messages").get())
            ok = "recovered" in history and "interrupted" in history
    finally:
        a.close()
    return Takeover(accepted - killed, expiry - killed, accepted - expiry, send, tries, ok)


async def takeover(url: str, cfg: Config) -> list[bool]:
    runs = [await takeover_once(url, cfg.ttl, rep) for rep in range(cfg.takeovers)]
    rows = [("run", "kill -> accepted ms", "lease left at kill ms", "after expiry ms",
             "accepting handler ms", "sends", "recovered")]
    for i, r in enumerate(runs, 1):
        rows.append((f"{i}", ms(r.took), ms(r.left), ms(r.late), ms(r.send), f"{r.tries}",
                     verdict(r.ok)))
    table(rows)
    worst = max(r.took for r in runs)
    ok = all(r.ok for r in runs) and worst <= cfg.ttl + 1.0
    print(f"  lease TTL {cfg.ttl:g} s, renewed every TTL/3 while a turn is held, so a kill "
          f"leaves 2/3 to 1 TTL (the runtime's default TTL is 10 s: 6.7-10 s); worst "
          f"{ms(worst)} ms <= TTL + 1 s, dialog recovered: {verdict(ok)}")
    return [ok]


# ---------------------------------------------------------------------------- main


def server(url: str) -> str:
    with psycopg.connect(url) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s) ORDER BY name",
            (["fsync", "synchronous_commit", "full_page_writes", "shared_buffers",
              "wal_level", "max_connections"],)).fetchall()
    return f"PostgreSQL {version}; " + ", ".join(f"{k}={v}" for k, v in rows)


async def turns(url: str, cfg: Config) -> list[bool]:
    print("\n4. cancel across processes (A owns the turn, B = this process cancels it)")
    passes = await cancel_latency(url, cfg)
    print(f"\n5. takeover after SIGKILL of the owner (lease TTL {cfg.ttl:g} s)")
    return passes + await takeover(url, cfg)


def run(cfg: Config) -> None:
    started = time.perf_counter()
    passes: list[bool] = []
    with Cluster() as cluster:
        url = cluster.create_database("bench")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FLOOR_TABLE)
        PostgresStore(url).close()  # the store's tables, before any child races for them
        print(f"server: {server(url)}")
        print(f"  a throwaway cluster: durability OFF (fsync, full_page_writes, "
              f"synchronous_commit), data in {cluster.dir} "
              f"({'tmpfs' if str(cluster.dir).startswith('/dev/shm') else 'disk'}), "
              f"clients on its Unix socket. The synchronous_commit=on row of section 1 sets it "
              f"per session: each commit then waits for its WAL write, but with fsync off "
              f"no disk flush is ever measured here.")
        sections: list[tuple[str, Callable[[str, Config], list[bool]]]] = [
            ("1. one commit, this process (median per commit over blocks)", one_commit),
            ("1b. a push to a long list: cost against the list's length", growth),
            (f"2. commits/s, N processes, {cfg.run_s:g} s each (store-level patch with "
             f"expect; conflicts re-read)", commits_per_second),
            (f"3. propagation: writer's commit start -> reader's sink, {cfg.prop_s:g} s "
             f"per run", propagation),
        ]
        for title, section in sections:
            print(f"\n{title}", flush=True)
            passes += section(url, cfg)
        passes += anyio.run(turns, url, cfg)
    print(f"\noverall: {verdict(all(passes))} ({sum(passes)}/{len(passes)} targets and "
          f"checks met); run took {time.perf_counter() - started:.0f} s; {load()}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke run)")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease TTL of the takeover")
    args = parser.parse_args()
    quick = args.quick
    cfg = Config(blocks=7 if quick else 25, block_s=0.02 if quick else 0.05,
                 warmup_s=0.1 if quick else 0.3, run_s=1.0 if quick else 3.0,
                 prop_s=1.0 if quick else 4.0, cancels=3 if quick else 10,
                 takeovers=1 if quick else 3, ttl=args.ttl)
    logging.getLogger("celldialog").setLevel(logging.ERROR)  # a takeover's warning is expected
    print(f"celldialog PostgreSQL store: Python {platform.python_version()}, psycopg "
          f"{psycopg.__version__} ({psycopg.pq.__impl__}); nproc {os.cpu_count()}; {load()}; "
          f"source {source_state()}", flush=True)
    run(cfg)


if __name__ == "__main__":
    main()
