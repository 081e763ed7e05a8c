"""`celldialog serve` under many Server-Sent Events clients, beside a bare sse-starlette floor.

    python bench/web.py            # 100, 500 and 1,000 clients, then 1,000 across 100 sessions
    python bench/web.py --quick    # 50 and 200 clients, fewer blocks (a smoke run)

What runs. The benchmark starts its servers as subprocesses (uvicorn, one worker, on free
loopback ports, access log off, log level warning, the asyncio loop and h11 as installed):

- **ours**: ``celldialog serve bench/web.py:web_bench --store memory --max-connections N``
  (run as ``python -m runtime.cli``) serving the pattern below: a session-scoped cell
  ``last`` and a handler ``put`` that writes the event into it. One event POSTed to
  ``/api/sessions/{s}/streams/put`` is one commit, and one ``replace /last`` patch to every
  tab of the session. It runs twice: with the default coalescing window (``coalesce``
  0.03 s, what users get: the targets are judged on it) and with ``--coalesce 0``, the fair
  peer of the floor. ``--via app`` starts it instead through ``create_app`` under
  ``uvicorn.run`` (this file's ``--serve`` mode), with no event rate limit.
- **floor**: ``bench/_web_floor.py``, a bare Starlette app: one sse-starlette
  ``EventSourceResponse`` per client over its own ``asyncio.Queue``, and a POST that frames
  its body once as a patch and puts the same bytes on every queue of the group. The body is
  the very patch text ours sent for the same kind of event (captured from ours at the start,
  the nonce swapped), so both push the same bytes per client.

Identity: ours mints a signed cookie on ``GET /`` (a 303 to ``/c/{session}``); all the clients
of a session are tabs of one user (one runtime instance, one patch fanned out). The server
caps connections per user (``--max-connections``), so ours is started with a cap above the
largest size. It also caps a session's events (5/s, burst 20, with no flag to change it), so
every stream, the floor's too, is paced here to a little under that budget (untimed: the wait
is before the clock starts).

Clients: all in this process (a process apart from every server, so their CPU is not the
server's): asyncio protocols speaking HTTP/1.1 on raw sockets, each reading its SSE byte
stream for the marker (a nonce) of the event in flight. Latency of a receipt = the time from
just before the triggering POST is written (on an open keep-alive connection) to when that
client's socket delivered the bytes holding the marker. One event at a time: the next is
posted when every client has its patch (or after a timeout: ``missed``) and a short gap.

Timing: per size, the clients of every server connect (idle), then memory is read; then one
warm-up block per server and ``--blocks`` timed blocks, the servers in a rotating order in
every round. A block is ``--events`` events (at least 10, and 1,000 receipts); its p50 and
p99 are over all its receipts (nearest rank); the table gives the median over blocks, and the
spread of the block p99s. Server CPU per event is from /proc/<pid>/stat over the blocks (clock
ticks of 10 ms, so read it at 500 clients and more).

Memory per idle connection: the server's RSS (VmRSS; Pss beside it) once N clients hold
their stream open and got their snapshot, minus the RSS with the 10 warm-up clients (which
stay connected and count in N), divided by the clients added.

Many sessions: the clients are closed, then 1,000 connect across 100 sessions (10 tabs
each, one user per session); each event goes to one session (10 receipts), a block posts
once to every session in turn.

Targets: p99 of ours (default coalescing) within 3x the floor's at 1,000 clients; memory per
idle connection under 50 KB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime import cell, handler, pattern

# ---------------------------------------------------------------------------- the pattern served


@handler
def put(event: dict, last) -> None:
    """Write the event, as is, into the session's cell: one commit, one patch."""
    last.set(event)


@pattern(name="bench-web")
def web_bench():
    last = cell({}, scope="session", name="last")
    return {"last": last, "put": put(last=last)}


# ---------------------------------------------------------------------------- settings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LATENCY_TARGET = 3.0  # ours' p99 / the floor's, at the largest size, at most
MEMORY_TARGET = 50 * 1024  # bytes per idle connection, under
WARM_CLIENTS = 10  # connected before the memory baseline; they stay and count in N
EVENT_TIMEOUT = 10.0  # seconds an event may take to reach every client
GAP = 0.01  # seconds between events (after the last receipt and the POST's answer)
TAIL = 64  # bytes of a stream kept to find a marker split across two reads
SNAPSHOT = b"event: snapshot"


def wall() -> float:
    return time.perf_counter()


# ---------------------------------------------------------------------------- HTTP on raw sockets


class Http:
    """One keep-alive HTTP/1.1 connection for the setup requests and the benchmark's POSTs."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Http:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def encode(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    async def response(self) -> tuple[int, list[tuple[str, str]], bytes]:
        assert self.reader is not None
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        headers = [(k.strip().lower(), v.strip()) for k, _, v in
                   (h.partition(":") for h in header_lines if h)]
        found = dict(headers)
        if "content-length" in found:
            body = await self.reader.readexactly(int(found["content-length"]))
        elif found.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                body += await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            body = b""
        return status, headers, body

    async def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                      body: bytes = b"") -> tuple[int, list[tuple[str, str]], bytes]:
        assert self.writer is not None
        self.writer.write(self.encode(method, path, headers or {}, body))
        return await self.response()


# ---------------------------------------------------------------------------- SSE clients


class Round:
    """One event in flight on one stream: its marker, when it was posted, the receipts."""

    __slots__ = ("done", "left", "marker", "t0", "times")

    def __init__(self, marker: bytes, expected: int) -> None:
        self.marker = marker
        self.t0 = 0.0
        self.times: list[float] = []
        self.left = expected
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if expected == 0:
            self.done.set_result(None)


class Hub:
    """The clients of one stream (a session of ours, a group of the floor)."""

    def __init__(self) -> None:
        self.clients: list[Client] = []
        self.ready = 0
        self.lost = 0
        self.round: Round | None = None
        self.failures: list[str] = []
        self.changed = asyncio.Event()

    def live(self) -> int:
        return sum(1 for c in self.clients if c.ready and c.alive)


class Client(asyncio.Protocol):
    """One tab: an SSE stream read as bytes. Cheap on purpose: 1,000 of them share this process."""

    def __init__(self, hub: Hub, request: bytes, record: bool = False) -> None:
        self.hub = hub
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.tail = b""
        self.status_ok = False
        self.ready = False
        self.alive = True
        self.seen: Round | None = None
        self.recorded: bytearray | None = bytearray() if record else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = wall()
        buf = self.tail + data
        if self.recorded is not None:
            self.recorded += data
        if not self.ready:
            if not self.status_ok:
                if buf.startswith(b"HTTP/1.1 200"):
                    self.status_ok = True
                elif len(buf) >= 12:
                    self.hub.failures.append(buf[:400].decode("latin-1", "replace"))
                    self.hub.changed.set()
                    assert self.transport is not None
                    self.transport.close()
                    return
            if SNAPSHOT in buf:
                self.ready = True
                self.hub.ready += 1
                self.hub.changed.set()
        r = self.hub.round
        if r is not None and self.seen is not r and r.marker in buf:
            self.seen = r
            r.times.append(now - r.t0)
            r.left -= 1
            if r.left == 0 and not r.done.done():
                r.done.set_result(None)
        self.tail = buf[-TAIL:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.hub.lost += 1
        self.hub.changed.set()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


# ---------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess, its streams and the clients this process holds on it."""

    def __init__(self, label: str, argv: list[str], port: int, logdir: Path) -> None:
        self.label = label
        self.argv = argv
        self.port = port
        self.log_path = logdir / f"{label.replace(' ', '_').replace(',', '')}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http: Http | None = None
        self.clients: list[Client] = []  # every client this process opened on it
        self.n_clients = 0  # those of the single-session part

    @property
    def is_floor(self) -> bool:
        return self.label == "floor"

    def start(self) -> None:
        log = open(self.log_path, "wb")
        # a throwaway cookie secret: the server never reads or writes the user's data directory
        env = {**os.environ, "CELLDIALOG_WEB_SECRET": secrets.token_urlsafe(48)}
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=ROOT, env=env, start_new_session=True)
        log.close()

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    async def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.proc is not None
        deadline = wall() + timeout
        while wall() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label}: the server exited with {self.proc.returncode}:"
                                   f"\n{self.log_tail()}")
            try:
                self.http = await Http(self.port).open()
                return
            except OSError:
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.label}: no server on port {self.port} after {timeout:.0f} s:"
                           f"\n{self.log_tail()}")

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.label}: the server exited with {self.proc.returncode}:"
                               f"\n{self.log_tail()}")

    def rss(self) -> tuple[int, int]:
        """(VmRSS, Pss) in bytes."""
        assert self.proc is not None
        rss = pss = 0
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
        with contextlib.suppress(OSError), open(f"/proc/{self.proc.pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
        return rss, pss

    def cpu(self) -> float:
        """CPU seconds (user + system) of the server process so far."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


class Pacer:
    """The server's per-session token bucket, kept on this side (a little under it): an event
    waits here, untimed, instead of being refused with 429 there."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate * 0.9
        self.burst = max(1.0, burst - 2.0)
        self.tokens = self.burst
        self.then = wall()

    async def take(self) -> None:
        if math.isinf(self.rate):
            return
        now = wall()
        self.tokens = min(self.burst, self.tokens + (now - self.then) * self.rate)
        self.then = now
        if self.tokens < 1.0:
            await asyncio.sleep((1.0 - self.tokens) / self.rate)
            self.tokens, self.then = 1.0, wall()
        self.tokens -= 1.0


PACE: tuple[float, int] = (math.inf, 0)  # the per-session event budget: (rate, burst)


@dataclass
class Stream:
    """One stream clients subscribe to, and how to post an event to it."""

    server: Server
    sse_path: str
    post_path: str
    headers: dict[str, str]  # of both requests (identity)
    body: Callable[[str], bytes]  # the POST body for a marker
    hub: Hub = field(default_factory=Hub)
    pacer: Pacer = field(default_factory=lambda: Pacer(*PACE))

    def sse_request(self) -> bytes:
        http = Http(self.server.port)
        return http.encode("GET", self.sse_path, {**self.headers, "Accept": "text/event-stream",
                                                  "Cache-Control": "no-cache"})

    def post_request(self, marker: str) -> bytes:
        http = Http(self.server.port)
        return http.encode("POST", self.post_path, {
            **self.headers, "Origin": f"http://127.0.0.1:{self.server.port}",
            "Content-Type": "application/json"}, self.body(marker))


async def identity(server: Server) -> tuple[str, str]:
    """A new user of ours: (the cookie header value, their session id), as a browser gets
    them: ``GET /`` mints the cookie and sends it back to ``/``, which (with the cookie)
    sends it to ``/c/{session}``."""
    cookies: list[str] = []
    location = ""
    http = await Http(server.port).open()
    try:
        for _ in range(2):
            headers = {"Cookie": "; ".join(cookies)} if cookies else {}
            status, got, body = await http.request("GET", "/", headers)
            if status != 303:
                raise RuntimeError(f"{server.label}: GET / answered {status}, not 303: "
                                   f"{body[:300]!r}")
            location = dict(got).get("location", "")
            cookies += [v.split(";", 1)[0] for k, v in got if k == "set-cookie"]
            if "/c/" in location:
                break
    finally:
        http.close()
    if "/c/" not in location or not cookies:
        raise RuntimeError(f"{server.label}: GET / gave location {location!r}, "
                           f"cookies {cookies!r}")
    return "; ".join(cookies), location.rsplit("/c/", 1)[1].split("?")[0]


def pad_value(payload: int) -> str:
    return "x" * payload


async def ours_stream(server: Server, payload: int) -> Stream:
    cookie, session = await identity(server)
    pad = pad_value(payload)
    return Stream(server, f"/api/sessions/{session}/events",
                  f"/api/sessions/{session}/streams/put", {"Cookie": cookie},
                  lambda m: json.dumps({"nonce": m, "pad": pad}).encode())


def floor_stream(server: Server, group: str, template: list[str]) -> Stream:
    return Stream(server, f"/events/{group}", f"/broadcast/{group}", {},
                  lambda m: template[0].replace("{marker}", m).encode())


# ---------------------------------------------------------------------------- driving


class Markers:
    def __init__(self) -> None:
        self.n = 0
        self.salt = os.urandom(3).hex()

    def next(self) -> str:
        self.n += 1
        return f"mk{self.salt}{self.n:09d}"  # fixed width: every event is the same size


async def connect(stream: Stream, n: int, batch: int = 100, record: bool = False,
                  timeout: float = 60.0) -> list[Client]:
    """``n`` more clients on ``stream``, each holding its stream open with its snapshot."""
    loop = asyncio.get_running_loop()
    hub = stream.hub
    request = stream.sse_request()
    want = hub.ready + n
    made: list[Client] = []
    for start in range(0, n, batch):
        k = min(batch, n - start)
        results = await asyncio.gather(*(loop.create_connection(
            lambda: Client(hub, request, record), "127.0.0.1", stream.server.port)
            for _ in range(k)))
        made += [proto for _, proto in results]
    hub.clients += made
    stream.server.clients += made
    deadline = wall() + timeout
    while hub.ready < want:
        if hub.failures:
            raise RuntimeError(f"{stream.server.label}: a stream was refused "
                               f"({len(hub.failures)} of {n}); first answer:\n"
                               f"{hub.failures[0]}")
        if hub.lost:
            raise RuntimeError(f"{stream.server.label}: {hub.lost} streams closed while "
                               f"connecting\n{stream.server.log_tail()}")
        left = deadline - wall()
        if left <= 0:
            raise RuntimeError(f"{stream.server.label}: {want - hub.ready} of {n} clients "
                               f"got no snapshot in {timeout:.0f} s")
        hub.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(hub.changed.wait(), min(left, 1.0))
        stream.server.check_alive()
    return made


async def fire(stream: Stream, marker: str) -> tuple[list[float], int]:
    """Post one event and wait for every live client of the stream to get it."""
    server = stream.server
    assert server.http is not None and server.http.writer is not None
    hub = stream.hub
    await stream.pacer.take()
    r = Round(marker.encode(), hub.live())
    request = stream.post_request(marker)
    hub.round = r
    r.t0 = wall()
    server.http.writer.write(request)
    status, _, body = await server.http.response()
    if status != 202:
        hub.round = None
        raise RuntimeError(f"{server.label}: POST {stream.post_path} answered {status}: "
                           f"{body[:300]!r}")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(r.done), EVENT_TIMEOUT)
    hub.round = None
    return r.times, r.left


@dataclass
class Block:
    p50: float
    p99: float
    worst: float
    receipts: int
    missed: int
    server_cpu: float  # seconds per event
    client_cpu: float  # seconds per event, this process
    events: int


def nearest_rank(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


async def block(streams: list[Stream], events: int, markers: Markers) -> Block:
    """``events`` events, one at a time, round-robin over ``streams`` (all of one server)."""
    server = streams[0].server
    assert server.http is not None
    server.http.close()  # a fresh keep-alive connection (uvicorn drops one idle for 5 s)
    await server.http.open()
    times: list[float] = []
    missed = 0
    cpu0, pcpu0 = server.cpu(), time.process_time()
    for i in range(events):
        t, m = await fire(streams[i % len(streams)], markers.next())
        times += t
        missed += m
        await asyncio.sleep(GAP)
    cpu, pcpu = server.cpu() - cpu0, time.process_time() - pcpu0
    server.check_alive()
    if not times:
        return Block(math.nan, math.nan, math.nan, 0, missed, cpu / events, pcpu / events, events)
    return Block(nearest_rank(times, 0.5), nearest_rank(times, 0.99), max(times), len(times),
                 missed, cpu / events, pcpu / events, events)


@dataclass
class Latency:
    label: str
    blocks: list[Block] = field(default_factory=list)

    def med(self, attr: str) -> float:
        return statistics.median(getattr(b, attr) for b in self.blocks)

    @property
    def missed(self) -> int:
        return sum(b.missed for b in self.blocks)

    @property
    def receipts(self) -> int:
        return sum(b.receipts for b in self.blocks)


async def measure(groups: dict[str, list[Stream]], events: int, blocks: int,
                  markers: Markers) -> dict[str, Latency]:
    """A warm-up block per server, then ``blocks`` rounds, the servers in a rotating order."""
    labels = list(groups)
    for label in labels:
        await block(groups[label], max(3, events // 3), markers)
    out = {label: Latency(label) for label in labels}
    for b in range(blocks):
        order = labels[b % len(labels):] + labels[:b % len(labels)]
        for label in order:
            out[label].blocks.append(await block(groups[label], events, markers))
    return out


# ---------------------------------------------------------------------------- the template


def captured_patch(recorded: bytes, marker: str) -> str:
    """The data of the SSE message whose bytes hold ``marker``, from a raw HTTP stream."""
    raw = bytes(recorded)
    body = raw.split(b"\r\n\r\n", 1)[1]
    if b"chunked" in raw.split(b"\r\n\r\n", 1)[0].lower():  # undo the chunked framing
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    text = body.decode()
    at = text.index(marker)
    for sep in ("\r\n\r\n", "\n\n", "\r\r"):
        start = text.rfind(sep, 0, at)
        end = text.find(sep, at)
        if end != -1:
            break
    message = text[start + len(sep) if start != -1 else 0:end]
    lines = message.replace("\r\n", "\n").split("\n")
    if not any(line.startswith("event: patch") for line in lines):
        raise RuntimeError(f"the message holding the marker is not a patch: {message!r}")
    return "\n".join(line[6:] if line.startswith("data: ") else line[5:]
                     for line in lines if line.startswith("data:"))


def synthetic_patch(payload: int) -> str:
    value = {"nonce": "{marker}", "pad": pad_value(payload)}
    return json.dumps([{"op": "replace", "path": "/last", "value": value}])


def message_bytes(patch_data: str) -> int:
    """The bytes of one SSE patch message as both servers frame it."""
    return len(f"event: patch\ndata: {patch_data}\n\n".encode())


# ---------------------------------------------------------------------------- the run


def raise_nofile(want: int) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return f"open files {soft} (hard {hard})"


def uvicorn_args(port: int) -> list[str]:
    return ["--host", "127.0.0.1", "--port", str(port)]


def floor_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "_web_floor:app", "--app-dir", str(HERE),
            *uvicorn_args(port), "--workers", "1", "--no-access-log", "--log-level", "warning"]


def ours_argv(port: int, coalesce: float | None, limit: int, via: str,
              extra: list[str]) -> list[str]:
    """How ours is started: ``celldialog serve`` (``via="cli"``), or this file's ``--serve``
    mode, ``create_app(web_bench, store="memory", limits=Limits(...))`` under ``uvicorn.run``
    with the same uvicorn settings (``via="app"``: the limits the CLI does not expose)."""
    if via == "cli":
        argv = [sys.executable, "-m", "runtime.cli", "serve", "bench/web.py:web_bench",
                "--store", "memory", *uvicorn_args(port), "--max-connections", str(limit),
                # a thousand tabs of one user connect at once; a hundred users from one
                # address: the storm limits are not what is measured
                "--limit", "connects_per_second=1e6", "--limit", "new_users_per_second=1e6"]
        if coalesce is not None:
            argv += ["--coalesce", str(coalesce)]
    else:
        argv = [sys.executable, str(HERE / "web.py"), "--serve", str(port),
                "--max-connections", str(limit)]
        if coalesce is not None:
            argv += ["--coalesce", str(coalesce)]
    return argv + extra


def serve(argv: list[str]) -> None:
    """``python bench/web.py --serve PORT [...]``: ours through ``create_app``, on uvicorn as
    ``celldialog serve`` runs it (one worker, access log off, log level warning)."""
    parser = argparse.ArgumentParser(prog="web.py --serve")
    parser.add_argument("--serve", type=int, required=True, metavar="PORT")
    parser.add_argument("--max-connections", type=int, required=True)
    parser.add_argument("--coalesce", type=float)
    parser.add_argument("--events-per-second", type=float, default=1e5)
    args = parser.parse_args(argv)
    import uvicorn

    from runtime.web import Limits, create_app

    limits = {"max_connections": args.max_connections,
              "events_per_second": args.events_per_second, "burst": 100_000,
              "connects_per_second": 1e6, "new_users_per_second": 1e6}
    if args.coalesce is not None:
        limits["coalesce"] = args.coalesce
    app = create_app(web_bench, store="memory", limits=Limits(**limits))
    uvicorn.run(app, host="127.0.0.1", port=args.serve, access_log=False, log_level="warning")


def latency_cells(label: str, r: Any, floor: Any) -> tuple[str, ...]:
    """A latency row's common cells: server, p50, p99, p99 spread, max, the ratios to the
    floor (``floor`` None: this is the floor) and server CPU per event."""
    p99s = [b.p99 for b in r.blocks]

    def ratio(key: str) -> str:
        return "-" if floor is None else f"{r.med(key) / floor.med(key):.2f}x"

    return (label, ms(r.med("p50")), ms(r.med("p99")),
            f"{min(p99s) * 1e3:,.1f}-{max(p99s) * 1e3:,.1f}",
            ms(max(b.worst for b in r.blocks)), ratio("p50"), ratio("p99"),
            ms(r.med("server_cpu")))


def kb(x: float) -> str:
    return f"{x / 1024:,.1f}"


def ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:,.2f}"


def table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def events_for(n: int, quick: bool) -> int:
    return max(6 if quick else 10, math.ceil((500 if quick else 1000) / n))


async def run(args: argparse.Namespace, servers: list[Server]) -> None:
    try:
        await _run(args, servers)
    finally:
        for s in servers:
            for c in s.clients:
                c.close()
            if s.http is not None:
                s.http.close()
        await asyncio.sleep(0.2)


async def _run(args: argparse.Namespace, servers: list[Server]) -> None:
    from _common import load

    quick = args.quick
    sizes = args.sizes or ([50, 200] if quick else [100, 500, 1000])
    blocks = args.blocks or (3 if quick else 5)
    t_all = wall()
    markers = Markers()
    for s in servers:
        s.start()
    for s in servers:
        await s.wait_ready()
    floor = next(s for s in servers if s.is_floor)
    ours = [s for s in servers if not s.is_floor]

    # one stream per server; ours' first recorded patch is the floor's template
    template = [synthetic_patch(args.payload)]
    main: dict[str, Stream] = {}
    for s in ours:
        main[s.label] = await ours_stream(s, args.payload)
    main[floor.label] = floor_stream(floor, "all", template)
    origin = "synthetic (no server of ours)"
    for s in servers:  # warm-up clients: they stay, and count in N
        await connect(main[s.label], 1, record=bool(ours) and s is ours[0])
        await connect(main[s.label], WARM_CLIENTS - 1)
        s.n_clients = WARM_CLIENTS
    if ours:
        first = ours[0]
        recorder = main[first.label].hub.clients[0]
        marker = markers.next()
        await fire(main[first.label], marker)
        assert recorder.recorded is not None
        template[0] = captured_patch(recorder.recorded, marker).replace(marker, "{marker}")
        recorder.recorded = None
        origin = f"captured from {first.label}"
    for s in servers:
        await block([main[s.label]], 20, markers)
    await asyncio.sleep(0.5)
    base = {s.label: s.rss() for s in servers}

    print(f"patch message per client: {message_bytes(template[0])} bytes of SSE "
          f"({len(template[0].encode())} bytes of data, {origin}): {template[0][:120]}"
          + ("..." if len(template[0]) > 120 else ""))
    print(f"servers' RSS with the {WARM_CLIENTS} warm-up clients: "
          + ", ".join(f"{s.label} {base[s.label][0] / 2**20:,.1f} MB" for s in servers) + "\n")

    lat: dict[int, dict[str, Latency]] = {}
    mem: dict[int, dict[str, tuple[float, float, int]]] = {}
    for n in sizes:
        mem[n] = {}
        for s in servers:
            await connect(main[s.label], n - s.n_clients)
            s.n_clients = n
        await asyncio.sleep(1.0)
        for s in servers:
            rss, pss = s.rss()
            added = s.n_clients - WARM_CLIENTS
            mem[n][s.label] = ((rss - base[s.label][0]) / added, (pss - base[s.label][1]) / added,
                               rss)
        ev = args.events or events_for(n, quick)
        lat[n] = await measure({s.label: [main[s.label]] for s in servers}, ev, blocks, markers)
        print(f"  {n:,} clients: {ev} events x {blocks} blocks per server done "
              f"({wall() - t_all:.0f} s)", flush=True)

    # ------------------------------------------------------------------ report
    print(f"\nlatency: POST to every client's receipt of its patch, one event at a time; "
          f"median over {blocks} blocks of each block's p50 / p99 (nearest rank, all receipts "
          f"of the block); p99 spread = min-max of the block p99s:\n")
    rows = [("clients", "server", "p50 ms", "p99 ms", "p99 spread", "max ms", "p50/floor",
             "p99/floor", "srv CPU ms/ev", "CPU/floor", "srv CPU us/client", "cli CPU ms/ev",
             "receipts", "missed")]
    for n in sizes:
        fl = lat[n][floor.label]
        for s in servers:
            r = lat[n][s.label]
            rows.append((f"{n:,}", *latency_cells(s.label, r, None if s is floor else fl),
                         "-" if s is floor
                         else f"{r.med('server_cpu') / fl.med('server_cpu'):.2f}x",
                         f"{r.med('server_cpu') / n * 1e6:,.1f}",
                         ms(r.med("client_cpu")), f"{r.receipts:,}", f"{r.missed}"))
    table(rows)
    first, last = sizes[0], sizes[-1]
    if last > first:
        def growth(s: Server) -> str:
            a, b = lat[first][s.label], lat[last][s.label]
            return (f"{s.label} p99 x{b.med('p99') / a.med('p99'):.1f}, server CPU per client "
                    f"{a.med('server_cpu') / first * 1e6:,.0f} -> "
                    f"{b.med('server_cpu') / last * 1e6:,.0f} us")

        print(f"growth {first:,} -> {last:,} clients ({last / first:g}x): "
              + "; ".join(growth(s) for s in servers))

    print("\nmemory per idle connection: (server RSS with N clients holding their stream - RSS "
          f"with the {WARM_CLIENTS} warm-up clients) / (N - {WARM_CLIENTS}); Pss likewise:\n")
    head: tuple[str, ...] = ("clients", "")
    for s in servers:
        head += (f"{s.label} KB/conn", "Pss KB", "RSS MB")
    head += tuple(f"{s.label}/floor" for s in ours)
    rows = [head]
    for n in sizes:
        row: tuple[str, ...] = (f"{n:,}", "")
        for s in servers:
            per, pper, rss = mem[n][s.label]
            row += (kb(per), kb(pper), f"{rss / 2**20:,.1f}")
        row += tuple(f"{mem[n][s.label][0] / mem[n][floor.label][0]:.2f}x" for s in ours)
        rows.append(row)
    table(rows)

    # ------------------------------------------------------------------ many sessions
    many: dict[str, Latency] | None = None
    if args.sessions and ours:
        n_sessions, per = (20, 10) if quick else (args.sessions, args.tabs)
        for s in servers:
            for c in main[s.label].hub.clients:
                c.close()
        await asyncio.sleep(1.0)
        groups: dict[str, list[Stream]] = {}
        for s in servers:
            if s is floor:
                groups[s.label] = [floor_stream(s, f"g{i}", template) for i in range(n_sessions)]
            else:
                groups[s.label] = [await ours_stream(s, args.payload) for _ in range(n_sessions)]
            for st in groups[s.label]:
                await connect(st, per)
        await asyncio.sleep(0.5)
        many = await measure(groups, n_sessions, blocks, markers)
        print(f"\nmany sessions: {n_sessions * per:,} clients across {n_sessions} sessions "
              f"({per} tabs each, one user per session); each event goes to one session "
              f"({per} receipts), a block posts once to every session in turn:\n")
        rows = [("sessions", "server", "p50 ms", "p99 ms", "p99 spread", "max ms", "p50/floor",
                 "p99/floor", "srv CPU ms/ev", "receipts", "missed")]
        fl = many[floor.label]
        for s in servers:
            r = many[s.label]
            rows.append((f"{n_sessions} x {per}",
                         *latency_cells(s.label, r, None if s is floor else fl),
                         f"{r.receipts:,}", f"{r.missed}"))
        table(rows)

    # ------------------------------------------------------------------ targets
    big = sizes[-1]
    print()
    passes: list[bool] = []
    if ours:
        judged = ours[0]
        ratio = lat[big][judged.label].med("p99") / lat[big][floor.label].med("p99")
        ok = ratio <= LATENCY_TARGET and lat[big][judged.label].missed == 0
        passes.append(ok)
        print(f"target latency: p99 of {judged.label} / floor at {big:,} clients <= "
              f"{LATENCY_TARGET:.0f}x: {ms(lat[big][judged.label].med('p99'))} / "
              f"{ms(lat[big][floor.label].med('p99'))} ms = {ratio:.2f}x   {verdict(ok)}")
        for other in ours[1:]:
            r2 = lat[big][other.label].med("p99") / lat[big][floor.label].med("p99")
            print(f"  (not judged) {other.label}: {r2:.2f}x")
        per_conn = mem[big][judged.label][0]
        ok = per_conn < MEMORY_TARGET
        passes.append(ok)
        print(f"target memory: per idle connection of {judged.label} at {big:,} clients < "
              f"{MEMORY_TARGET // 1024} KB: {per_conn / 1024:,.2f} KB (floor "
              f"{kb(mem[big][floor.label][0])}"
              f" KB)   {verdict(ok)}")
    else:
        print("floor only (--floor-only): no targets judged")
    print(f"\ntargets: {sum(passes)}/{len(passes)} met; run took {wall() - t_all:.0f} s; "
          f"{load()}.")


def main() -> None:
    if "--serve" in sys.argv[1:]:
        serve(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--sizes", type=int, nargs="+", help="client counts (default 100 500 1000)")
    parser.add_argument("--blocks", type=int, help="timed blocks per size and server (default 5)")
    parser.add_argument("--events", type=int,
                        help="events per block (default: >= 10 and 1,000 receipts)")
    parser.add_argument("--payload", type=int, default=100, help="bytes of padding in an event")
    parser.add_argument("--sessions", type=int, default=100,
                        help="sessions of the many-sessions part (0: skip it)")
    parser.add_argument("--tabs", type=int, default=10, help="clients per session there")
    parser.add_argument("--floor-only", action="store_true",
                        help="no server of ours (proves the harness against the floor)")
    parser.add_argument("--no-coalesce-off", action="store_true",
                        help="skip ours with coalescing off")
    parser.add_argument("--ours-arg", action="append", default=[],
                        help="one more argument for ours' command line (repeatable)")
    parser.add_argument("--via", choices=("cli", "app"), default="cli",
                        help="start ours with `celldialog serve` (default), or with create_app "
                             "+ uvicorn and no event rate limit (app)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from _common import load, source_state

    sizes = args.sizes or ([50, 200] if args.quick else [100, 500, 1000])
    limits = raise_nofile(65536)
    global PACE
    if args.via == "cli" and not args.floor_only:  # the CLI has no flag for the event rate
        from runtime.web import Limits

        PACE = (Limits().events_per_second, Limits().burst)
    import h11
    import sse_starlette
    import starlette
    import uvicorn

    print(f"celldialog serve: Python {platform.python_version()}, uvicorn {uvicorn.__version__} "
          f"(asyncio loop, h11 {h11.__version__}), starlette {starlette.__version__}, "
          f"sse-starlette {getattr(sse_starlette, '__version__', '?')}; "
          f"nproc {os.cpu_count()}, {load()}; {limits}; source {source_state()}")
    print(f"settings: sizes {', '.join(f'{n:,}' for n in sizes)} clients on one session; "
          f"blocks {args.blocks or (3 if args.quick else 5)} (+1 warm-up) per size and server; "
          f"events per block {args.events or 'max(10, 1000/N)'}; gap {GAP * 1e3:.0f} ms"
          + (f", and every stream (the floor's too) paced to ours' per-session event budget "
             f"({PACE[0]:g}/s, burst {PACE[1]})" if not math.isinf(PACE[0]) else "") + "; "
          f"event timeout {EVENT_TIMEOUT:.0f} s; payload pad {args.payload} B; clients: this "
          "process (asyncio protocols on raw sockets), servers: one subprocess each")

    servers: list[Server] = []
    limit = max(sizes) + WARM_CLIENTS + 50
    with tempfile.TemporaryDirectory(prefix="celldialog-web-") as d:
        logdir = Path(d)
        fp = free_port()
        servers.append(Server("floor", floor_argv(fp), fp, logdir))
        if not args.floor_only:
            p = free_port()
            servers.append(Server("ours", ours_argv(p, None, limit, args.via, args.ours_arg),
                                  p, logdir))
            if not args.no_coalesce_off:
                p = free_port()
                servers.append(Server("ours, coalesce 0",
                                      ours_argv(p, 0, limit, args.via, args.ours_arg), p, logdir))
        for s in servers:
            shown = " ".join(Path(a).name if a == sys.executable else a for a in s.argv)
            print(f"  {s.label}: {shown}")
        print(flush=True)

        def on_signal(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_signal)
        try:
            asyncio.run(run(args, servers))
        finally:
            for s in servers:  # every one, whatever happened to the others
                try:
                    s.stop()
                except Exception as e:
                    print(f"stopping {s.label} (pid {s.proc.pid if s.proc else '-'}): {e!r}",
                          file=sys.stderr)


if __name__ == "__main__":
    main()
