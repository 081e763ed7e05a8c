"""The processes ``bench/store_pg.py`` starts: one mode each, JSON lines on stdout, commands
on stdin. Also imported by the bench itself, so the patterns here name the same documents
in every process.

    python bench/_store_pg_child.py '{"mode": "counter", "url": "postgresql://..."}'

Modes: ``counter`` (store-level read-increment-commit, for commits/s), ``writer`` /
``reader`` (a ``Runtime`` committing a cell / a ``Runtime`` whose sink sees it, for
propagation), ``floor_writer`` / ``floor_reader`` (the same with bare psycopg), ``owner``
(a ``Runtime`` owning a dialog turn whose model streams until cancelled). Every timestamp
is ``time.monotonic()``: CLOCK_MONOTONIC is system-wide on Linux, so the bench compares
them across processes.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg

from runtime import Runtime, cell, handler, llm_dialog, pattern
from runtime.errors import ConflictError
from runtime.llm import Request, TextDelta
from runtime.storage import DocKey, PostgresStore, Write

FLOOR_CHANNEL = "floor"  # not the store's: the runtime readers never see the floor's traffic
FLOOR_UPDATE = ("UPDATE floor_t SET version = version + 1, value = %s "
                "WHERE id = %s AND version = %s RETURNING version")
WARM_EVENTS = 50  # commits a writer makes before it says ready (connections, caches, JIT-less)
WAIT = 60.0  # seconds: the bound on every wait of a child


def say(**record: Any) -> None:
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------- patterns


@handler
def put(event: Any, stamp: Any) -> None:
    stamp.set(event)


@pattern(name="store-pg-probe")
def probe(writer: Any) -> dict[str, Any]:
    """One cell per writer (the argument names its documents); ``put`` replaces it."""
    stamp = cell({"t": 0.0, "i": -3}, name="stamp")
    return {"stamp": stamp, "put": put(stamp=stamp)}


@pattern(name="store-pg-dialog")
def dialog_agent() -> dict[str, Any]:
    messages = cell([], scope="session", name="messages")
    chat = llm_dialog(messages)
    return {"messages": messages, "send": chat.add_message, "cancel": chat.cancel_generation,
            "pending": chat.pending, "dropped": chat.dropped}


class Forever:
    """A model that streams a few words, then nothing until cancelled; it says (with
    monotonic time) when it starts waiting and when its stream is cancelled."""

    provider = "scripted"
    name = "forever"

    async def generate(self, request: Request) -> Any:
        raise NotImplementedError  # streams only

    async def stream(self, request: Request):  # -> AsyncIterator[StreamEvent]
        yield TextDelta(index=0, text="thinking about it")
        say(waiting=time.monotonic())
        try:
            await anyio.sleep_forever()
        finally:
            say(cancelled=time.monotonic())
        yield TextDelta(index=0, text="never")  # never reached


# ---------------------------------------------------------------------------- commits/s


def counter(cfg: dict[str, Any]) -> None:
    """Kept alive across runs: each stdin line is one run on the key it names, timed
    between a shared start and end (monotonic), so every process runs the same window."""
    store = PostgresStore(cfg["url"])
    say(ready=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("stop"):
            break
        say(**bump_until(store, DocKey(*cmd["key"]), cmd["start"], cmd["until"]))
    store.close()


def bump_until(store: PostgresStore, key: DocKey, start: float, until: float) -> dict[str, Any]:
    """Read-increment-commit (a patch with ``expect``, as the runtime writes a cell) until
    ``until``; a conflict re-reads the document and tries again."""
    stored = store.load(key)
    assert stored is not None, key
    n, version = stored.value["n"], stored.version
    time.sleep(max(0.0, start - time.monotonic()))  # the shared start: outside the window
    done = conflicts = 0
    cpu = time.process_time()
    while time.monotonic() < until:
        try:
            version = store.commit([Write(key, None, expect=version,
                                          patch=((("n",), n + 1),))])[key]
        except ConflictError:
            conflicts += 1
            stored = store.load(key)
            assert stored is not None
            n, version = stored.value["n"], stored.version
            continue
        n += 1
        done += 1
    return {"done": done, "conflicts": conflicts, "cpu": time.process_time() - cpu,
            "wall": time.monotonic() - start}


# ---------------------------------------------------------------------------- propagation


async def paced(send: Callable[[int, float], Awaitable[None]], rate: float,
                seconds: float) -> list[float]:
    """Call ``send(i, start time)`` at ``rate`` per second (0: flat out) for ``seconds``;
    the time passed to it is taken just before it starts. Returns how long each took."""
    start = time.monotonic()
    took: list[float] = []
    while (now := time.monotonic()) < start + seconds:
        if rate:
            due = start + len(took) / rate
            if due > now:
                await anyio.sleep(due - now)  # pacing the rate, not waiting for anything
        t = time.monotonic()
        await send(len(took), t)
        took.append(time.monotonic() - t)
    return took


async def writer(cfg: dict[str, Any]) -> None:
    """A runtime writing its probe cell through a handler: warm up, say ready, wait for
    ``go``, send at the rate, then an end marker."""
    async with Runtime(store=cfg["url"]) as rt:
        inst = rt.run(probe, {"writer": cfg["name"]})
        for _ in range(WARM_EVENTS):
            await inst.send("put", {"t": time.monotonic(), "i": -2})
        say(ready=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)

        async def send(i: int, t: float) -> None:
            await inst.send("put", {"t": t, "i": i})

        took = await paced(send, cfg["rate"], cfg["seconds"])
        await inst.send("put", {"t": time.monotonic(), "i": -1, "end": True})
        say(sent=took, errors=len(rt.errors))


async def reader(cfg: dict[str, Any]) -> None:
    """A runtime that never writes: a sink on each writer's cell takes now - the writer's
    start time, until every writer's end marker arrived."""
    names = cfg["writers"]
    latencies: list[float] = []
    ended: set[str] = set()
    done = anyio.Event()

    def sink_for(name: str) -> Callable[[Any], None]:
        def sink(value: Any) -> None:
            now = time.monotonic()
            if not isinstance(value, dict):
                return
            if value.get("end"):
                ended.add(name)
                if len(ended) == len(names):
                    done.set()
            elif value.get("i", -1) >= 0:
                latencies.append(now - value["t"])
        return sink

    async with Runtime(store=cfg["url"]) as rt:
        for name in names:
            rt.run(probe, {"writer": name}).result.key("stamp").sink(sink_for(name))
        say(ready=True)
        with anyio.fail_after(WAIT):
            await done.wait()
        say(latencies=latencies, errors=len(rt.errors))


def floor_writer(cfg: dict[str, Any]) -> None:
    """The floor's writer: one transaction of a conditional UPDATE and a pg_notify per
    commit, on one autocommit connection, paced as ``writer``."""
    with psycopg.connect(cfg["url"], autocommit=True) as conn:
        row = cfg["name"]
        version = conn.execute("SELECT version FROM floor_t WHERE id = %s", (row,)).fetchone()[0]

        def commit(value: dict[str, Any]) -> None:
            nonlocal version
            with conn.transaction():
                found = conn.execute(FLOOR_UPDATE, (json.dumps(value), row, version)).fetchone()
                assert found is not None, "the floor's row changed under it"
                version = found[0]
                conn.execute("SELECT pg_notify(%s, %s)",
                             (FLOOR_CHANNEL, json.dumps([row, version])))

        for _ in range(WARM_EVENTS):
            commit({"t": time.monotonic(), "i": -2})
        say(ready=True)
        sys.stdin.readline()

        async def send(i: int, t: float) -> None:
            commit({"t": t, "i": i})

        took = anyio.run(paced, send, cfg["rate"], cfg["seconds"])
        commit({"t": time.monotonic(), "i": -1, "end": True})
        say(sent=took, errors=0)


async def floor_reader(cfg: dict[str, Any]) -> None:
    """The floor's reader: an async LISTEN connection; each notification's row fetched on
    a second connection, then now - the writer's start time (once per commit: a fetch
    that fell behind finds a newer commit, which the next notification's fetch repeats)."""
    names = set(cfg["writers"])
    latencies: list[float] = []
    ended: set[str] = set()
    last = dict.fromkeys(names, -1)  # a row fetched late holds a newer commit: count it once
    url = cfg["url"]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as listen, \
            await psycopg.AsyncConnection.connect(url, autocommit=True) as fetch:
        await listen.execute(f"LISTEN {FLOOR_CHANNEL}")
        say(ready=True)
        with anyio.fail_after(WAIT):
            async for note in listen.notifies():
                row = json.loads(note.payload)[0]
                cur = await fetch.execute("SELECT value FROM floor_t WHERE id = %s", (row,))
                value = json.loads((await cur.fetchone())[0])
                now = time.monotonic()
                if value.get("end"):
                    ended.add(row)
                    if ended == names:
                        break
                elif value["i"] > last[row]:
                    last[row] = value["i"]
                    latencies.append(now - value["t"])
    say(latencies=latencies, errors=0)


# ---------------------------------------------------------------------------- turns


async def owner(cfg: dict[str, Any]) -> None:
    """Process A: owns the dialog's turns; each stdin line is a message (a new turn whose
    model waits until cancelled). Says its lease holder, then each turn's start."""
    async with Runtime(store=cfg["url"], model=Forever(), lease_ttl=cfg["ttl"]) as rt:
        inst = rt.run(dialog_agent, user="u", session=cfg["session"])
        say(holder=rt.lease.holder)
        while (line := await anyio.to_thread.run_sync(sys.stdin.readline)).strip():
            await inst.send("send", line.strip())


def main() -> None:
    logging.getLogger("celldialog").setLevel(logging.ERROR)  # expected warnings: not output
    cfg = json.loads(sys.argv[1])
    mode = cfg["mode"]
    if mode in ("counter", "floor_writer"):
        {"counter": counter, "floor_writer": floor_writer}[mode](cfg)
    else:
        modes = {"writer": writer, "reader": reader, "floor_reader": floor_reader,
                 "owner": owner}
        anyio.run(modes[mode], cfg)


if __name__ == "__main__":
    main()
