"""Handler events per second: a counter and a push to a schema'd list, memory and SQLite.

    python bench/events.py             # every case, one run (about a minute or two)
    python bench/events.py --quick     # fewer, shorter blocks (a smoke run)
    python bench/events.py --queued    # stream.send(...) x N, then one await rt.idle()

What one event is: ``await inst.send(name, payload)``, the call an application makes and
waits for; it validates the event, runs the handler in its own transaction, commits it
(schema check, store write, kernel update) and returns. ``--queued`` measures the
throughput of events queued with ``stream.send`` and run by one ``await rt.idle()``
instead (each event is still its own transaction); the default is the honest cost of one
awaited event.

Cases:

- counter: ``count = cell(0, schema={"type": "integer"})``, handler ``count.set(count.get() + 1)``.
- push: ``items = cell(<N items>, schema=<array of {"title": string}>)`` prefilled with
  1,000, 10,000 and 100,000 items as the cell's initial value; handler
  ``items.push({"title": ...})``. A timed round pushes at most 10% of N; between rounds
  (untimed) the list is set back to its N prefilled items, so every figure is the cost
  of a push to a list of N to 1.1 N items.
- floor: a bare SQLite upsert of the same JSON an event changes (the counter's value; the
  pushed item as a row of its own), one autocommit statement (its own transaction: the
  cheapest durable commit), on a connection opened as the store opens its own (WAL,
  synchronous=NORMAL, ``isolation_level=None``), with the store's table and a JSON encoder
  made once, as the store makes its own: what any durable commit of that change costs.
  ``floor ... tx`` is the same upsert inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` (three
  statements; the floor of earlier runs), shown for comparison and not judged.

Timing: every case is opened and warmed up (the warm-up also sizes its rounds), then
``--blocks`` (7) rounds follow; in each, every case runs one timed block of at least
``--block-seconds`` (0.25), in a shuffled order, so other work on the machine falls on all
cases alike. Figures are the median and minimum over blocks of the time per event (wall
clock), with the process's CPU time per event beside them. Memory: tracemalloc over a few
extra events, after the timed blocks: the peak above the starting point during one event,
and what stays allocated per event. SQL/event: the statements an event runs on the store's
connection (SQLite's trace callback, over the same untimed events).
Correctness: the final state is compared with what the events must have produced; for
SQLite after reopening the file in a new runtime.

Targets (issue items 11 and 18): push cost per event at 100,000 items within 1.5x of that
at 1,000 items; an SQLite event within 3x of the bare upsert floor. Both judged on CPU time
(less disturbed by other work on the machine), wall time printed beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import json.encoder
import math
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import Span, clock, load, since, source_state  # noqa: E402

from runtime import Runtime, cell, handler, pattern  # noqa: E402

SIZES = (1_000, 10_000, 100_000)
GROWTH = 0.10  # a timed round grows the list by at most this share of its prefill
GROWTH_TARGET = 1.5  # per-event push cost at 100k items / at 1k items
FLOOR_TARGET = 3.0  # an SQLite event / the bare upsert-and-commit floor
SLOW_CASE_S = 20.0  # timed seconds per case before it is cut to 5 blocks

ITEM_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}},
               "required": ["title"]}
LIST_SCHEMA = {"type": "array", "items": ITEM_SCHEMA}
COUNT_SCHEMA = {"type": "integer"}


# ---------------------------------------------------------------------------- the graph


@handler
def increment(event, count):
    count.set(count.get() + 1)


@handler
def push(event, items):
    items.push({"title": event["title"]})


@pattern
def counter():
    count = cell(0, schema=COUNT_SCHEMA, name="count")
    return {"count": count, "increment": increment(count=count)}


def prefill(n: int) -> list[dict[str, str]]:
    return [{"title": f"item {i}"} for i in range(n)]


@pattern
def todo(size):
    items = cell(prefill(size.get()), schema=LIST_SCHEMA, name="items")
    return {"items": items, "push": push(items=items)}


# ---------------------------------------------------------------------------- measuring


@dataclass
class Config:
    blocks: int
    block_s: float
    warmup_s: float
    queued: bool


@dataclass
class Result:
    case: str  # "counter" | "push" | "floor counter" | "floor push" | "floor ... tx"
    store: str  # "memory" | "sqlite"
    size: int | None
    per_event: list[float] = field(default_factory=list)  # wall seconds, one per timed block
    cpu_per_event: list[float] = field(default_factory=list)  # CPU seconds of this process
    events: int = 0  # timed events in all
    setup_s: float = 0.0
    peak_kb: float | None = None
    kept_b: float | None = None
    statements: float | None = None  # SQL statements per event on the store's connection
    checked: bool = False
    problems: list[str] = field(default_factory=list)  # final state not what events produce

    @property
    def median(self) -> float:
        return statistics.median(self.per_event)

    @property
    def minimum(self) -> float:
        return min(self.per_event)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_per_event)


class Case:
    """One row of the table. ``open`` builds it, ``run_round(m)`` times m events (anything
    untimed it needs first, it does before starting the clock), ``close`` ends it and
    checks the final state."""

    cap = sys.maxsize  # most events one round may run
    blocks = 0  # timed blocks this case gets (set after its warm-up)
    per_round = 1
    estimate = 0.0  # seconds per event, from the warm-up

    def __init__(self, result: Result) -> None:
        self.result = result

    async def open(self, stack: AsyncExitStack, tmp: Path, cfg: Config) -> None: ...

    async def run_round(self, m: int) -> Span:
        raise NotImplementedError

    async def before_tracing(self) -> None:
        """Untimed preparation so the traced events are plain ones."""

    def connection(self) -> sqlite3.Connection | None:
        """The SQLite connection whose statements an event runs, if any."""
        return None

    async def close(self) -> None:
        """After every runtime has closed: check the final state."""


async def warm_up(case: Case, cfg: Config) -> None:
    """Run rounds of doubling size until ``cfg.warmup_s`` passed, then size the rounds."""
    m, spent, n = 1, 0.0, 0
    while spent < cfg.warmup_s:
        m = min(m, case.cap)
        spent += (await case.run_round(m))[0]
        n += m
        m *= 2
    case.estimate = spent / n
    case.per_round = max(1, min(case.cap, math.ceil(cfg.block_s / max(case.estimate, 1e-9))))
    # an event so slow that the blocks alone would pass SLOW_CASE_S gets the minimum of 5
    slow = case.estimate * cfg.blocks > SLOW_CASE_S
    case.blocks = min(cfg.blocks, 5) if slow else cfg.blocks


async def timed_block(case: Case, cfg: Config) -> None:
    gc.collect()
    spent, cpu, n = 0.0, 0.0, 0
    while spent < cfg.block_s or n == 0:
        wall, used = await case.run_round(case.per_round)
        spent, cpu, n = spent + wall, cpu + used, n + case.per_round
    res = case.result
    res.per_event.append(spent / n)
    res.cpu_per_event.append(cpu / n)
    res.events += n


async def traced(case: Case) -> None:
    """Allocation figures over a few events (tracemalloc slows them down; never timed)."""
    res = case.result
    slow = case.estimate > 0.2
    count = 1 if slow else max(2, min(30, int(0.3 / max(case.estimate, 1e-9))))
    await case.before_tracing()
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(1 if slow else 2):  # what these replace was allocated untraced
            await case.run_round(1)
        peaks, start = [], tracemalloc.get_traced_memory()[0]
        for _ in range(count):
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            await case.run_round(1)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        kept = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    res.peak_kb = statistics.median(peaks) / 1024
    res.kept_b = kept / count if count >= 5 else None  # fewer: freeing noise dominates
    db = case.connection()
    if db is not None:  # untimed too: the statements an event runs, counted by SQLite
        seen: list[str] = []
        db.set_trace_callback(seen.append)
        try:
            for _ in range(count):
                await case.run_round(1)
        finally:
            db.set_trace_callback(None)
        res.statements = len(seen) / count


def store_spec(store: str, tmp: Path, name: str) -> str:
    return "memory" if store == "memory" else f"sqlite:///{tmp / name}.db"


def store_connection(rt: Runtime) -> sqlite3.Connection | None:
    """The SQLite store's connection (a private attribute: the bench only counts on it)."""
    db = getattr(rt.store, "_db", None)
    return db if isinstance(db, sqlite3.Connection) else None


def sender(rt: Runtime, inst: Any, name: str, queued: bool
           ) -> Callable[[list[Any]], Awaitable[Span]]:
    """Send ``payloads`` as events the configured way; returns the time taken."""
    if queued:
        stream = inst.stream(name)

        async def run(payloads: list[Any]) -> Span:
            send = stream.send
            t = clock()
            for p in payloads:
                send(p)
            await rt.idle()
            dt = since(t)
            if rt.errors:
                raise RuntimeError(f"queued events failed: {rt.errors[:3]}")
            return dt
    else:
        async def run(payloads: list[Any]) -> Span:
            send = inst.send
            t = clock()
            for p in payloads:
                await send(name, p)
            return since(t)

    return run


class CounterCase(Case):
    def __init__(self, store: str) -> None:
        super().__init__(Result("counter", store, None))
        self.sent = 0

    async def open(self, stack: AsyncExitStack, tmp: Path, cfg: Config) -> None:
        self.spec = store_spec(self.result.store, tmp, "counter")
        t = time.perf_counter()
        self.rt = await stack.enter_async_context(Runtime(store=self.spec))
        self.inst = self.rt.run(counter)
        self.result.setup_s = time.perf_counter() - t
        self.run = sender(self.rt, self.inst, "increment", cfg.queued)
        stack.push_async_callback(self.check_open)

    async def run_round(self, m: int) -> Span:
        self.sent += m
        return await self.run([{}] * m)

    def connection(self) -> sqlite3.Connection | None:
        return store_connection(self.rt)

    async def check_open(self) -> None:  # runs just before its runtime closes
        got = self.inst.result.key("count").get()
        if got != self.sent:
            self.result.problems.append(f"counter reads {got!r} after {self.sent:,} events")

    async def close(self) -> None:
        if self.result.store == "sqlite":
            async with Runtime(store=self.spec) as rt:
                got = rt.run(counter).result.key("count").get()
            if got != self.sent:
                self.result.problems.append(
                    f"reopened, the counter reads {got!r} after {self.sent:,} events")
        self.result.checked = True


def differ(got: Any, want: list[Any]) -> str:
    if not isinstance(got, list):
        return f"a {type(got).__name__} ({got!r:.40}), not a list of {len(want):,} items"
    i = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
             min(len(got), len(want)))
    return f"{len(got):,} items, {len(want):,} expected, first difference at index {i:,}"


class PushCase(Case):
    """A round pushes at most ``GROWTH`` x size items; before a round that would pass that,
    the list is set back to its prefill (untimed)."""

    def __init__(self, store: str, size: int) -> None:
        super().__init__(Result("push", store, size))
        self.size = size
        self.cap = max(1, int(size * GROWTH))
        self.base = prefill(size)
        self.k = 0  # titles pushed so far are "new 0" .. "new {k-1}"
        self.since_reset = 0  # the list holds base + the last since_reset of them

    async def open(self, stack: AsyncExitStack, tmp: Path, cfg: Config) -> None:
        self.spec = store_spec(self.result.store, tmp, f"push-{self.size}")
        t = time.perf_counter()
        self.rt = await stack.enter_async_context(Runtime(store=self.spec))
        self.inst = self.rt.run(todo, {"size": self.size})
        self.result.setup_s = time.perf_counter() - t
        self.items = self.inst.result.key("items")
        self.run = sender(self.rt, self.inst, "push", cfg.queued)
        stack.push_async_callback(self.check_open)

    def reset(self) -> None:
        self.items.set(self.base)
        self.since_reset = 0

    async def run_round(self, m: int) -> Span:
        if self.since_reset + m > self.cap:
            self.reset()  # untimed: back to the prefilled list
        payloads = [{"title": f"new {i}"} for i in range(self.k, self.k + m)]
        self.k += m
        self.since_reset += m
        return await self.run(payloads)

    async def before_tracing(self) -> None:
        if self.since_reset + 64 > self.cap:  # no reset among the traced or counted events
            self.reset()

    def connection(self) -> sqlite3.Connection | None:
        return store_connection(self.rt)

    def want(self) -> list[Any]:
        return self.base + [{"title": f"new {i}"}
                            for i in range(self.k - self.since_reset, self.k)]

    async def check_open(self) -> None:
        got = self.items.get()
        if got != self.want():
            self.result.problems.append(f"the list holds {differ(got, self.want())}")

    async def close(self) -> None:
        if self.result.store == "sqlite":
            async with Runtime(store=self.spec) as rt:
                got = rt.run(todo, {"size": self.size}).result.key("items").get()
            if got != self.want():
                self.result.problems.append(f"reopened, the list holds {differ(got, self.want())}")
        self.result.checked = True


_TABLE = """
CREATE TABLE IF NOT EXISTS docs (
    space   TEXT NOT NULL,
    scope   TEXT NOT NULL,
    id      TEXT NOT NULL,
    version INTEGER NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (space, scope, id)
) WITHOUT ROWID
"""
_UPSERT = ("INSERT INTO docs (space, scope, id, version, value) VALUES (?,?,?,?,?) "
           "ON CONFLICT (space, scope, id) DO UPDATE SET value=excluded.value, "
           "version=excluded.version")


def compact_json() -> Callable[[Any], str]:
    """Compact JSON from an encoder made once, as the SQLite store makes its own (``json.dumps``
    builds an encoder per call, which costs more than encoding a counter): the floor must
    not pay for what the store does not."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(separators=(",", ":")).encode

    def default(value: Any) -> Any:
        raise TypeError(f"{type(value).__name__} is not JSON")

    chunks = make(None, default, json.encoder.encode_basestring_ascii, None, ":", ",",
                  False, False, True)
    return lambda value: "".join(chunks(value, 0))


class FloorCase(Case):
    """The bare SQLite cost of committing what one event changes: the counter's value
    (one row updated in place) or the pushed item (a new row per push). One autocommit
    upsert (``tx``: the same inside ``BEGIN IMMEDIATE`` ... ``COMMIT``), the JSON made by
    the store's encoder, on a connection opened as the store opens its own."""

    def __init__(self, kind: str, tx: bool = False) -> None:
        super().__init__(Result(f"floor {kind}" + (" tx" if tx else ""), "sqlite", None))
        self.kind = kind
        self.tx = tx
        self.k = 0
        self.dumps = compact_json()

    async def open(self, stack: AsyncExitStack, tmp: Path, cfg: Config) -> None:
        name = f"floor-{self.kind}{'-tx' if self.tx else ''}.db"
        # as SQLiteStore connects: timeout (its busy timeout, 5 s), autocommit, WAL, NORMAL
        db = sqlite3.connect(str(tmp / name), timeout=5.0, isolation_level=None)
        stack.callback(db.close)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(_TABLE)
        self.db = db

    async def run_round(self, m: int) -> Span:
        execute, dumps, counter_, tx = self.db.execute, self.dumps, self.kind == "counter", self.tx
        t = clock()
        for i in range(self.k, self.k + m):
            if counter_:
                key, value = "count", dumps(i + 1)
            else:
                key, value = f"items/{i}", dumps({"title": f"new {i}"})
            if tx:
                execute("BEGIN IMMEDIATE")
                execute(_UPSERT, ("bench", "", key, i + 1, value))
                execute("COMMIT")
            else:
                execute(_UPSERT, ("bench", "", key, i + 1, value))
        dt = since(t)
        self.k += m
        return dt

    def connection(self) -> sqlite3.Connection | None:
        return self.db


# ---------------------------------------------------------------------------- reporting


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"






def report(results: list[Result], cfg: Config, elapsed: float) -> None:
    rows = [("case", "store", "items", "events/s", "µs/event med", "µs/event min",
             "CPU µs/event", "SQL/event", "blocks x events", "setup s", "peak KB/event",
             "kept B/event")]
    for r in results:
        per_block = r.events // max(len(r.per_event), 1)
        rows.append((
            r.case, r.store, f"{r.size:,}" if r.size else "-",
            f"{1 / r.median:,.0f}", f"{r.median * 1e6:,.1f}", f"{r.minimum * 1e6:,.1f}",
            f"{r.cpu * 1e6:,.1f}",
            f"{r.statements:.2f}".rstrip("0").rstrip(".") if r.statements is not None else "-",
            f"{len(r.per_event)} x {per_block:,}",
            f"{r.setup_s:.2f}" if not r.case.startswith("floor") else "-",
            f"{r.peak_kb:,.1f}" if r.peak_kb is not None else "-",
            f"{r.kept_b:,.0f}" if r.kept_b is not None else "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))

    by = {(r.case, r.store, r.size): r for r in results}
    print(f"\ngrowth of the per-event push cost (median at N items / median at "
          f"{SIZES[0]:,}; target: {SIZES[-1]:,}/{SIZES[0]:,} within {GROWTH_TARGET}x; "
          "judged on CPU time, wall time beside it):")
    passes = []
    for store in ("memory", "sqlite"):
        first = by[("push", store, SIZES[0])]
        parts = [f"{n // 1000}k/{SIZES[0] // 1000}k "
                 f"CPU {by[('push', store, n)].cpu / first.cpu:.2f}x "
                 f"(wall {by[('push', store, n)].median / first.median:.2f}x)"
                 for n in SIZES[1:]]
        ok = by[("push", store, SIZES[-1])].cpu / first.cpu <= GROWTH_TARGET
        passes.append(ok)
        print(f"  {store:<7} " + "   ".join(parts) + f"   {verdict(ok)}")

    print(f"\nSQLite event / bare SQLite upsert of the same JSON, one autocommit statement "
          f"(median; target: within {FLOOR_TARGET}x; judged on CPU time, wall time beside "
          "it; the last column: CPU against the upsert inside BEGIN IMMEDIATE ... COMMIT, "
          "not judged):")
    lines = [("counter", by[("counter", "sqlite", None)], "counter")]
    lines += [(f"push {n:,}", by[("push", "sqlite", n)], "push") for n in SIZES]
    for label, ours, kind in lines:
        floor = by[(f"floor {kind}", "sqlite", None)]
        floor_tx = by[(f"floor {kind} tx", "sqlite", None)]
        ok = ours.cpu / floor.cpu <= FLOOR_TARGET
        passes.append(ok)
        print(f"  {label:<12} CPU {ours.cpu * 1e6:7,.1f} µs / {floor.cpu * 1e6:5,.1f} µs = "
              f"{ours.cpu / floor.cpu:5.2f}x (wall {ours.median / floor.median:5.2f}x)   "
              f"{verdict(ok)}   vs tx floor: CPU {ours.cpu / floor_tx.cpu:5.2f}x")

    checked = [r for r in results if r.checked]
    wrong = [r for r in checked if r.problems]
    print(f"\nfinal state checked in {len(checked)} cases (counter == events sent; list == "
          "prefill + the pushes since its last reset; SQLite also read back by a new runtime "
          f"on the same file): {verdict(not wrong)}")
    for r in wrong:
        where = f"{r.case} {r.store}" + (f" {r.size:,}" if r.size else "")
        print(f"  WRONG {where}: " + "; ".join(r.problems))
    passes.append(not wrong)
    how = ("stream.send(event) x N, then one await rt.idle()" if cfg.queued
           else "await inst.send(name, event), one awaited event at a time")
    print(f"events driven with: {how} (one handler run and one committed transaction each).")
    print(f"timing: warm-up, then {cfg.blocks} blocks of >= {cfg.block_s} s per case, the "
          "cases interleaved in a shuffled order; med/min over blocks of the time per event. "
          "push rounds grow the list by <= 10% of its prefill, then it is reset untimed.")
    print("CPU µs/event: this process's CPU time per event (median over blocks): less "
          "disturbed than wall time when other work shares the machine.")
    print("setup s: runtime start and pattern run (the list prefilled as the cell's initial "
          "value). peak KB/event: tracemalloc peak above the start of one event (median); "
          "kept B/event: still allocated after them.")
    print("floor: INSERT ... ON CONFLICT DO UPDATE of the event's JSON, one autocommit "
          "statement (counter: one row updated; push: the item as a new row), WAL, "
          "synchronous=NORMAL, the store's table, JSON from an encoder made once as the store's "
          "is; floor ... tx: the same "
          "inside BEGIN IMMEDIATE ... COMMIT. SQL/event: statements on the store's "
          "connection per event (SQLite's trace callback, untimed events).")
    print(f"overall: {verdict(all(passes))} ({sum(passes)}/{len(passes)} targets and checks met); "
          f"run took {elapsed:.0f} s; {load()}.")


async def main_async(cfg: Config, sizes: tuple[int, ...]) -> list[Result]:
    """Every case open at once, warmed up, then timed block by block in a shuffled order per
    round, so a burst of other work on the machine falls on all of them alike."""
    cases: list[Case] = []
    for store in ("memory", "sqlite"):
        cases.append(CounterCase(store))
        cases += [PushCase(store, size) for size in sizes]
    cases += [FloorCase(kind, tx) for tx in (False, True) for kind in ("counter", "push")]
    rng = random.Random(11)
    with tempfile.TemporaryDirectory(prefix="celldialog-events-") as d:
        async with AsyncExitStack() as stack:
            for case in cases:
                await case.open(stack, Path(d), cfg)
            for case in cases:
                await warm_up(case, cfg)
            for block in range(cfg.blocks):
                order = [c for c in cases if block < c.blocks]
                rng.shuffle(order)
                for case in order:
                    await timed_block(case, cfg)
            for case in cases:
                await traced(case)
        for case in cases:
            await case.close()
    return [case.result for case in cases]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks (at least 5)")
    parser.add_argument("--block-seconds", type=float, default=0.25)
    parser.add_argument("--queued", action="store_true",
                        help="stream.send x N + await rt.idle() instead of await inst.send")
    parser.add_argument("--quick", action="store_true", help="5 short blocks (a smoke run)")
    args = parser.parse_args()
    if args.blocks < 5:
        parser.error("--blocks must be at least 5")
    cfg = Config(blocks=5 if args.quick else args.blocks,
                 block_s=0.05 if args.quick else args.block_seconds,
                 warmup_s=0.05 if args.quick else 0.25, queued=args.queued)
    print(f"celldialog handler events: Python {platform.python_version()} "
          f"({platform.python_implementation()}), SQLite {sqlite3.sqlite_version}, "
          f"{load()}; source {source_state()}\n")
    t = time.perf_counter()
    results = anyio.run(main_async, cfg, SIZES)
    report(results, cfg, time.perf_counter() - t)


if __name__ == "__main__":
    main()
