"""The server: a Starlette app that serves one pattern, one instance per user and session.

A request passes the checks in order, each in one place: the ``Host`` (``guards.HostGuard``,
against DNS rebinding), then for anything but a read its ``Origin`` (``guards.OriginGuard``:
a POST from another site or without an ``Origin`` is refused), then who is asking
(``identity``: the signed cookie, or the application's ``authenticate`` hook), then what
they may still ask (``limits``: a body is read under its cap and deadline before anything
else), then whether the session is theirs (``sessions``). Only then does a request
touch the runtime, through its public front: ``rt.run`` finds or starts the instance and
``inst.send`` runs the event under the stream's schema, in its own transaction.

What the page sees is the instance's cells (``hub``): a snapshot when a tab (re)connects,
then coalesced patches (``wire``). Stop is an event like any other (the dialog's
``cancel_generation``), so cancelling is state, not a killed task.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..builtins import DialogSurface, dialog_surface
from ..cells import Instance, Pattern, Runtime
from ..errors import CelldialogError, ClosedError, StorageError
from .errors import WebConfigError
from .guards import LOOPBACK_HOSTS, HostGuard, OriginGuard, SecurityHeaders
from .hub import Broadcaster, Hub, Tab
from .identity import (
    Authenticate,
    CookieSigner,
    check_user_id,
    cookie_name,
    is_minted_id,
    load_secret,
    new_id,
    read_cookie,
)
from .limits import ConnectionCounter, Limits, RateLimiter
from .sessions import sessions_index, title_of

__all__ = ["create_app"]

log = logging.getLogger("celldialog.web")

STATIC = Path(__file__).parent / "static"
RETRY_MS = 1000  # how long a browser waits before it reconnects a dropped stream
SEND_TIMEOUT = 10  # seconds a tab may read nothing while bytes wait for it before it is closed
COOKIE_AGE = 400 * 24 * 3600  # the longest browsers keep a cookie
UNAVAILABLE = (StorageError, ClosedError)
"""What ``inst.send`` raises when the server cannot take the event now (the store busy or
in conflict past its retries, the runtime closing): 503, try again."""
REFUSED_EVENTS = (CelldialogError, ValueError, TypeError, LookupError)
"""What ``inst.send`` raises for an event that was wrong (its schema, its links, a handler's
refusal, which a handler says by raising): the client is told why (400). Anything else is
the server's fault (500, logged)."""


def create_app(pattern: Pattern, *, runtime: Runtime | None = None,
               store: str = "memory", model: Any = None, args: dict[str, Any] | None = None,
               space: str = "default", secret: str | bytes | None = None,
               authenticate: Authenticate | None = None, limits: Limits | None = None,
               allowed_hosts: list[str] | None = None,
               allowed_origins: list[str] | None = None,
               freeze_gc: bool = False) -> Starlette:
    """The app serving ``pattern`` to many users at once.

    ``runtime``: a running ``Runtime`` to serve from (its owner opens and closes it);
    without one, the app opens ``Runtime(store, model=model)`` for its lifespan. ``args``:
    the pattern's arguments, the same for every session. ``secret`` signs the identity
    cookie (default: ``CELLDIALOG_WEB_SECRET``, else a secret kept in the user data
    directory). ``authenticate(request)`` returns the user's id (or None: 401) from the
    application's own login; with it no cookie is minted. ``allowed_hosts``: the ``Host``
    names served (default: the loopback names; ``["*"]`` for any); ``allowed_origins``:
    origins besides the page's own that may POST (a page served under another name by a
    proxy). ``freeze_gc``: the runtime the app opens keeps the garbage collector's cost
    flat with many sessions (``Runtime(freeze_gc=True)``; process-wide, so for a process
    the app owns, as ``celldialog serve``'s).
    """
    if not isinstance(pattern, Pattern):
        raise WebConfigError(f"create_app() serves a @pattern, got {pattern!r}")
    if args is not None and not isinstance(args, dict):
        raise WebConfigError(f"the pattern's args must be a dict, got {type(args).__name__}")
    server = _Server(pattern, args, space, limits or Limits(), authenticate,
                     None if authenticate else CookieSigner(load_secret(secret)))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            if runtime is not None:
                server.rt = runtime
                await server.start(tg)
                try:
                    yield
                finally:
                    server.close(stop_instances=True)  # the runtime lives on: free it
            else:
                async with Runtime(store, model=model, freeze_gc=freeze_gc) as rt:
                    server.rt = rt
                    await server.start(tg)
                    try:
                        yield
                    finally:
                        server.close(stop_instances=False)  # the runtime stops them
            tg.cancel_scope.cancel()

    routes = [
        Route("/", server.home, methods=["GET"]),
        Route("/c/{session}", server.page, methods=["GET"]),
        Route("/api/sessions", server.list_sessions, methods=["GET"]),
        Route("/api/sessions", server.new_session, methods=["POST"]),
        Route("/api/sessions/{session}/events", server.events, methods=["GET"]),
        Route("/api/sessions/{session}/streams/{name:path}", server.post_event,
              methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(HostGuard, allowed=allowed_hosts or LOOPBACK_HOSTS),
        Middleware(OriginGuard, allowed=allowed_origins or []),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.celldialog = server
    return app


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers=headers or None)


class _Refused(Exception):
    """A request answered with an error response (raised where the check is made)."""

    def __init__(self, response: Response) -> None:
        self.response = response


def _answering(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    async def endpoint(self: _Server, request: Request) -> Response:
        try:
            return await fn(self, request)
        except _Refused as r:
            return r.response
    endpoint.__name__ = fn.__name__
    endpoint.__doc__ = fn.__doc__
    return endpoint


@dataclass(eq=False)
class _Session:
    """A (user, session) being served: its instance, what of it the page shows (the
    snapshot's fixed part: pattern, session, streams, chat parts, state), and, while tabs
    watch, its hub."""

    inst: Instance
    surface: DialogSurface
    hub: Hub | None = None
    titled: bool = False

    @property
    def describe(self) -> dict[str, Any]:
        found = self.surface
        return {"pattern": self.inst.pattern.key, "session": self.inst.session,
                "streams": found.streams, "chat": found.parts, "state": found.state,
                "edit": _editors(self.inst, found.state)}


def _editors(inst: Instance, state: tuple[str, ...]) -> dict[str, str]:
    """State cells the page may edit: a text cell ``x`` whose pattern also returns a stream
    ``set_x`` taking a string (the chatbot's ``notes`` and ``set_notes``). Everything else
    beside the chat is read-only; the model changes it through its tools."""
    editors = {}
    for name in state:
        stream = f"set_{name}"
        if stream in inst.streams and (inst.stream(stream).event_schema or {}).get(
                "type") == "string":
            editors[name] = stream
    return editors


@dataclass(eq=False)
class _Server:
    pattern: Pattern
    args: dict[str, Any] | None
    space: str
    limits: Limits
    authenticate: Authenticate | None
    signer: CookieSigner | None
    rt: Runtime | None = None
    broadcaster: Broadcaster = field(init=False)
    served: OrderedDict[tuple[str, str], _Session] = field(default_factory=OrderedDict)
    events_rate: RateLimiter = field(init=False)
    sessions_rate: RateLimiter = field(init=False)
    connects_rate: RateLimiter = field(init=False)
    minting_rate: RateLimiter = field(init=False)
    connections: ConnectionCounter = field(init=False)
    indexes: OrderedDict[str, Instance] = field(default_factory=OrderedDict)
    # evicted and parked (Runtime.park): their documents left memory; rt.run brings one
    # back. The least recently parked past Limits.max_parked are stopped.
    parked: OrderedDict[tuple[str, str], Instance] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        lim = self.limits
        self.broadcaster = Broadcaster(lim.coalesce)
        self.events_rate = RateLimiter(lim.events_per_second, lim.burst)
        self.sessions_rate = RateLimiter(1.0, 10)  # "New chat": a person's pace
        self.connects_rate = RateLimiter(lim.connects_per_second, 20)
        self.minting_rate = RateLimiter(lim.new_users_per_second, 20)
        self.connections = ConnectionCounter(lim.max_connections)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        await tg.start(self.broadcaster.run)

    def close(self, stop_instances: bool) -> None:
        """The server stops: every tab's stream ends; with ``stop_instances``, the instances
        it started in a runtime that outlives it are stopped too."""
        for served in self.served.values():
            if served.hub is not None:
                served.hub.close()
        instances = [s.inst for s in self.served.values()] + list(self.indexes.values()) \
            + list(self.parked.values())
        self.served.clear()
        self.indexes.clear()
        self.parked.clear()
        if stop_instances and self.rt is not None:
            for inst in instances:
                self.rt.stop(inst)

    # -- who is asking ------------------------------------------------------------------

    async def user_of(self, request: Request) -> str | None:
        if self.authenticate is not None:
            user = self.authenticate(request)
            if isinstance(user, Awaitable):
                user = await user
            return None if user is None else check_user_id(user)
        assert self.signer is not None
        name = cookie_name(request.url.scheme)
        return self.signer.unsign(read_cookie(request.headers.get("cookie", ""), name))

    async def require_user(self, request: Request) -> str:
        user = await self.user_of(request)
        if user is None:
            raise _Refused(_error(401, "no identity: open the page (GET /) first, which "
                                       "gives this browser its cookie"
                                  if self.authenticate is None else "not signed in"))
        return user

    # -- sessions -------------------------------------------------------------------------

    def runtime(self) -> Runtime:
        if self.rt is None:
            raise _Refused(_error(503, "the server is starting: try again"))
        return self.rt

    def index(self, user: str) -> Instance:
        """The user's session list, running; the least recently used past
        ``max_instances`` are stopped (their documents stay)."""
        inst = self.indexes.get(user)
        if inst is not None:
            self.indexes.move_to_end(user)
            return inst
        inst = self.indexes[user] = self.runtime().run(sessions_index, space=self.space,
                                                        user=user)
        self.parked.pop(("", user), None)
        if len(self.indexes) > self.limits.max_instances:
            old_user, oldest = self.indexes.popitem(last=False)
            self.put_away(("", old_user), oldest)
        return inst

    def sessions(self, user: str) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = self.index(user).result.key("sessions").get()
        return value

    async def make_session(self, user: str) -> str:
        if len(self.sessions(user)) >= self.limits.max_sessions:
            raise _Refused(_error(429, f"this user has {self.limits.max_sessions} sessions, "
                                       "the most the server keeps"))
        sid = new_id()
        await self.index(user).send("add", {"id": sid, "created": time.time()})
        return sid

    def owned(self, user: str, sid: str) -> bool:
        if not is_minted_id(sid):
            return False
        if any(s["id"] == sid for s in self.sessions(user)):
            return True
        # made a moment ago by another process on the same store? Its commit may not have
        # reached this copy through the change feed yet: ask the store (only on a miss)
        self.index(user).result.key("sessions").refresh()
        return any(s["id"] == sid for s in self.sessions(user))

    def session(self, user: str, sid: str) -> _Session:
        """The user's session ``sid``, running (404 if it is not theirs)."""
        served = self.served.get((user, sid))
        if served is not None:
            self.served.move_to_end((user, sid))
            return served
        if not self.owned(user, sid):
            raise _Refused(_error(404, "no such session for this user: open / for yours, or "
                                       "POST /api/sessions for a new one"))
        inst = self.runtime().run(self.pattern, self.args, space=self.space, user=user,
                                  session=sid)
        self.parked.pop((user, sid), None)
        served = self.served[(user, sid)] = _Session(inst, dialog_surface(inst))
        self.evict()
        return served

    def put_away(self, key: tuple[str, str], inst: Instance) -> None:
        """An instance the server no longer keeps running: parked (its documents leave
        memory; ``rt.run`` brings it back), or stopped if it is busy."""
        rt = self.runtime()
        if not rt.park(inst):
            rt.stop(inst)
            return
        self.parked[key] = inst
        self.parked.move_to_end(key)
        while len(self.parked) > self.limits.max_parked:
            _, oldest = self.parked.popitem(last=False)
            rt.stop(oldest)

    def evict(self) -> None:
        """Past ``max_instances`` running, park the least recently used that no tab watches
        and no reply runs in (``put_away``). Its documents stay in the store: the next
        request for it brings it back from them."""
        over = len(self.served) - self.limits.max_instances
        if over <= 0:
            return
        for key in list(self.served)[:-1]:  # oldest first; never the one just asked for
            served = self.served[key]
            pending = served.surface.cell("pending")
            if served.hub is None and not (pending is not None and pending.get()):
                del self.served[key]
                self.put_away(key, served.inst)
                over -= 1
                if not over:
                    return

    def hub(self, served: _Session) -> Hub:
        if served.hub is None or served.hub.closed:
            served.hub = Hub(served.inst, served.surface.cells, served.describe, self.limits.queue,
                             self.limits.queue_bytes, self.broadcaster.mark)
        return served.hub

    # -- the page -------------------------------------------------------------------------

    async def identify_page(self, request: Request) -> tuple[str | None, str | None]:
        """The page's user, minting one (returned second, for the cookie) if there is none.
        None, None: a cross-site navigation without the cookie (``SameSite=Strict`` kept it
        back), answered with a reload from this site, which sends it."""
        user = await self.user_of(request)
        if user is not None or self.authenticate is not None:
            return user, None
        if request.headers.get("sec-fetch-site") == "cross-site":
            return None, None
        address = request.client.host if request.client is not None else ""
        _take(self.minting_rate, address, "new visitors from this address")
        user = new_id()
        return user, user

    def with_cookie(self, response: Response, request: Request, minted: str | None
                    ) -> Response:
        if minted is not None:
            assert self.signer is not None
            https = request.url.scheme == "https"
            response.set_cookie(cookie_name(request.url.scheme), self.signer.sign(minted),
                                max_age=COOKIE_AGE, path="/", httponly=True,
                                samesite="strict", secure=https)
        return response

    @_answering
    async def home(self, request: Request) -> Response:
        """``/``: the newest session (a new one if there is none)."""
        user, minted = await self.identify_page(request)
        if user is None:
            return _reload_page() if self.authenticate is None else _error(401, "not signed in")
        if minted is not None:  # a first visit: no state until the browser shows it keeps
            return self.with_cookie(RedirectResponse("/", 303), request, minted)  # the cookie
        listed = self.sessions(user)
        sid = listed[0]["id"] if listed else await self.make_session(user)
        return RedirectResponse(f"/c/{sid}", 303)

    @_answering
    async def page(self, request: Request) -> Response:
        """``/c/{session}``: the page (the same static shell for every session)."""
        user, minted = await self.identify_page(request)
        if user is None:
            return _reload_page() if self.authenticate is None else _error(401, "not signed in")
        if minted is not None:  # a first visit owns no session yet
            return self.with_cookie(_not_found_page(), request, minted)
        if not self.owned(user, request.path_params["session"]):
            return _not_found_page()
        return FileResponse(STATIC / "index.html")

    # -- the API --------------------------------------------------------------------------

    @_answering
    async def list_sessions(self, request: Request) -> Response:
        user = await self.require_user(request)
        return JSONResponse({"pattern": self.pattern.key, "sessions": self.sessions(user)})

    @_answering
    async def new_session(self, request: Request) -> Response:
        user = await self.require_user(request)
        _take(self.sessions_rate, user, "new sessions")
        return JSONResponse({"id": await self.make_session(user)}, 201)

    @_answering
    async def events(self, request: Request) -> Response:
        """The session's event stream: a snapshot, then patches."""
        user = await self.require_user(request)
        _take(self.connects_rate, user, "new event streams")
        if not self.connections.acquire(user):
            raise _Refused(_error(429, f"this user has {self.limits.max_connections} event "
                                       "streams open, the most allowed: close a tab",
                                  **{"Retry-After": "5"}))
        try:  # limits first: a refused request runs nothing
            served = self.session(user, request.path_params["session"])
            hub = self.hub(served)
            tab = hub.join(RETRY_MS)
        except BaseException:
            self.connections.release(user)
            raise
        return _TabStream(self, user, served, hub, tab, ping=self.limits.ping,
                          send_timeout=SEND_TIMEOUT, headers={"Cache-Control": "no-store"})

    def left(self, user: str, served: _Session, hub: Hub, tab: Tab) -> None:
        """A tab's stream ended: its connection slot is free, and a hub nobody watches
        stops observing the cells."""
        hub.leave(tab)
        self.connections.release(user)
        if not hub.tabs and served.hub is hub:
            hub.close()
            served.hub = None

    @_answering
    async def post_event(self, request: Request) -> Response:
        """An event for one of the instance's streams, checked by the stream's schema."""
        user = await self.require_user(request)
        sid = request.path_params["session"]
        name = request.path_params["name"]
        # the body first: no instance is held (nor evicted) while a client trickles it in
        event = _parse_event(await _read_body(request, self.limits.max_body,
                                              self.limits.body_seconds))
        served = self.session(user, sid)
        inst = served.inst
        if name not in inst.streams:
            known = ", ".join(sorted(inst.streams)) or "none"
            raise _Refused(_error(404, f"this pattern has no stream {name!r}; its streams: "
                                       f"{known}"))
        chat = served.surface.parts
        if name != chat["cancel"]:  # Stop is never refused for the events before it
            _take(self.events_rate, (user, sid), "events in this session")
        dropped_cell = served.surface.cell("dropped")
        before = dropped_cell.get() if dropped_cell is not None else None
        try:
            await inst.send(name, event)
        except UNAVAILABLE as e:
            log.warning("stream %r of %s could not take an event: %s", name,
                        inst.pattern.name, e)
            raise _Refused(_error(503, "the server cannot take this event now: try again",
                                  **{"Retry-After": "1"})) from None
        except REFUSED_EVENTS as e:
            raise _Refused(_error(400, f"event refused by stream {name!r}: {e}")) from None
        except Exception:
            log.exception("stream %r of %s failed on an event", name, inst.pattern.name)
            raise _Refused(_error(500, f"stream {name!r} failed on this event (the server "
                                       "logged why)")) from None
        answer: dict[str, Any] = {"ok": True}
        if dropped_cell is not None and dropped_cell.get() != before:
            answer["dropped"] = True  # a reply was still running: the dialog ignored it
        elif not served.titled and name == chat["send"]:
            await self.name_session(user, sid, served, event)
        return JSONResponse(answer, 202)

    async def name_session(self, user: str, sid: str, served: _Session, event: Any) -> None:
        """The session's title from its first message. The message is in: a title that
        cannot be written is logged, never the answer to the message."""
        served.titled = True
        title = title_of(event)
        if title:
            try:
                await self.index(user).send("name", {"id": sid, "title": title})
            except Exception:
                log.exception("the title of a session could not be written")


class _TabStream(EventSourceResponse):
    """A tab's event stream (the tab is its body); when it ends, however it ends (the
    client left, the tab was dropped, the server stops), the tab leaves its hub."""

    def __init__(self, server: _Server, user: str, served: _Session, hub: Hub, tab: Tab,
                 **kwargs: Any) -> None:
        super().__init__(tab, **kwargs)
        self._tab = (server, user, served, hub, tab)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:  # a client that stopped reading: one line, not a traceback
            log.info("an event stream was closed: its client read nothing for %d s",
                     SEND_TIMEOUT)
        finally:
            server, user, served, hub, tab = self._tab
            server.left(user, served, hub, tab)


def _take(limiter: RateLimiter, key: object, what: str) -> None:
    """A token of ``limiter`` for ``key``, or a 429 saying when to try again."""
    wait = limiter.take(key)
    if wait:
        raise _Refused(_too_many(what, wait))


def _too_many(what: str, wait: float) -> JSONResponse:
    seconds = max(1, math.ceil(wait))
    return _error(429, f"too many {what}: try again in {seconds} s",
                  **{"Retry-After": str(seconds)})


async def _read_body(request: Request, cap: int, seconds: float) -> bytes:
    """The body, refused (413) as soon as it passes ``cap`` bytes (never read whole), or
    (408) if it has not arrived within ``seconds``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise _Refused(_error(413, f"the event is {declared} bytes; the most is {cap}"))
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(seconds) as deadline:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise _Refused(_error(413, f"the event is over {cap} bytes, the most allowed"))
            chunks.append(chunk)
    if deadline.cancelled_caught:
        raise _Refused(_error(408, f"the event did not arrive within {seconds:g} s"))
    return b"".join(chunks)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_event(body: bytes) -> Any:
    if not body:
        raise _Refused(_error(400, "the body is empty: send the event as JSON (null for none)"))
    try:
        return json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        why = (e.msg if isinstance(e, json.JSONDecodeError) else
               "nested too deeply" if isinstance(e, RecursionError) else str(e))
        raise _Refused(_error(400, f"the body is not JSON ({why}): send the event as "
                                   "JSON, a string in quotes")) from None


_RELOAD = """<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0">
<link rel="icon" href="data:,"><title>celldialog</title><p>Opening…</p>"""

_NOT_FOUND = """<!doctype html><meta charset="utf-8"><title>No such conversation</title>
<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/app.css">
<main class="notfound"><h1>No such conversation</h1>
<p>It is not one of yours, or it never existed.</p>
<p><a href="/">Open your conversations</a></p></main>"""


def _reload_page() -> Response:
    """A link from another site arrives without the ``SameSite=Strict`` cookie; reloading
    from this site sends it, so the user keeps their identity instead of getting a new
    one."""
    return HTMLResponse(_RELOAD, headers={"Cache-Control": "no-store"})


def _not_found_page() -> Response:
    return HTMLResponse(_NOT_FOUND, 404)
