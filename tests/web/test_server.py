"""The server over real HTTP (uvicorn on loopback), as browsers and attackers use it:
identity, sessions, the Origin guard, the limits, snapshot and patches, cancel as state."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from runtime import Runtime
from runtime.builtins import dialog_surface
from runtime.llm import ScriptedModel
from runtime.llm.events import Stop, TextDelta
from runtime.llm.scripted import Pause
from runtime.llm.types import StopReason
from runtime.web import COOKIE, Limits, WebConfigError, create_app
from runtime.web.hub import Hub
from runtime.web.identity import CookieSigner, load_secret

from .support import Browser, serving, texts

pytestmark = pytest.mark.anyio

SECRET = "s" * 40


def app_for(model: Any, **kwargs: Any) -> Any:
    from patterns.chatbot import chatbot

    return create_app(chatbot, model=model, secret=SECRET, **kwargs)


def streamed(*pieces: str, hold: float = 0.0) -> list[Any]:
    """A streamed reply in ``pieces`` 0.3 s apart (the dialog writes ``partial`` when a
    piece comes 0.25 s after its last write), then (``hold``) a pause before its end."""
    items: list[Any] = [x for p in pieces for x in (Pause(0.3), TextDelta(index=0, text=p))]
    return [*items, *([Pause(hold)] if hold else []), Stop(stop_reason=StopReason.END_TURN)]


# -- identity -------------------------------------------------------------------------------


async def test_the_page_mints_a_signed_strict_cookie_and_the_api_never_does() -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        r = await b.http.get("/")
        cookie = r.headers["set-cookie"]
        assert r.status_code == 303 and r.headers["location"] == "/"  # no state made yet
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        r = await b.http.get("/")  # with the cookie: a session, no new cookie
        assert r.headers["location"].startswith("/c/") and "set-cookie" not in r.headers
        user = b.http.cookies[COOKIE].rpartition(".")[0]
        assert CookieSigner(SECRET.encode()).unsign(b.http.cookies[COOKIE]) == user
        async with httpx.AsyncClient(base_url=base) as stranger:
            r = await stranger.get("/api/sessions")
            assert r.status_code == 401 and "GET /" in r.json()["error"]
            assert "set-cookie" not in r.headers


async def test_a_forged_or_foreign_cookie_is_no_one() -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        sid = await b.open()
        good = b.http.cookies[COOKIE]
        user = good.rpartition(".")[0]
        other = CookieSigner(b"x" * 40).sign(user)  # another server's secret
        for forged in (other, f"{user}.", user, good + "x", "a" * 5000, "../../etc.passwd"):
            async with httpx.AsyncClient(base_url=base, cookies={COOKIE: forged}) as c:
                r = await c.get(f"/api/sessions/{sid}/events")
                assert r.status_code == 401, forged


async def test_a_cross_site_link_without_the_cookie_reloads_instead_of_minting() -> None:
    """SameSite=Strict keeps the cookie back on a link from another site: a new identity
    then would lose the user's conversations, so the page reloads from this site."""
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        r = await b.http.get("/", headers={"sec-fetch-site": "cross-site"})
        assert r.status_code == 200 and "set-cookie" not in r.headers
        assert 'http-equiv="refresh"' in r.text and "<script" not in r.text


async def test_an_authenticate_hook_names_the_user_and_no_cookie_is_minted() -> None:
    app = app_for(ScriptedModel([]), authenticate=lambda request: request.headers.get("x-user"))
    async with serving(app) as base, Browser(base) as b:
        assert (await b.http.get("/")).status_code == 401
        r = await b.http.get("/", headers={"x-user": "ada@example.com"})  # no cookie step
        assert r.status_code == 303 and "set-cookie" not in r.headers
        sid = r.headers["location"].removeprefix("/c/")
        ada = {"x-user": "ada@example.com"}
        listed = (await b.http.get("/api/sessions", headers=ada)).json()["sessions"]
        assert [s["id"] for s in listed] == [sid]
        bob = (await b.http.get("/api/sessions", headers={"x-user": "bob"})).json()
        assert bob["sessions"] == []


async def test_a_hook_that_returns_no_user_id_is_a_server_error_not_a_user() -> None:
    app = app_for(ScriptedModel([]), authenticate=lambda request: ["ada"])
    async with serving(app) as base, Browser(base) as b:
        r = await b.http.get("/api/sessions")
        assert r.status_code == 500 and "ada" not in r.text
        with pytest.raises(WebConfigError, match="must return a user id"):
            from runtime.web.identity import check_user_id
            check_user_id(["ada"])


def test_the_secret_is_made_once_private_and_shared_by_processes(tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; from runtime.web.identity import load_secret;"
            "print(load_secret(None, Path(sys.argv[1])).decode())")
    env = {k: v for k, v in os.environ.items() if k != "CELLDIALOG_WEB_SECRET"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(6)]
    secrets = {p.communicate(timeout=30)[0].strip() for p in procs}
    assert len(secrets) == 1 and len(secrets.pop()) >= 32
    assert stat.S_IMODE((tmp_path / "web-secret").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["web-secret"]  # no temporary files left
    with pytest.raises(WebConfigError, match="at least 32 bytes"):
        CookieSigner(b"short")
    signer = CookieSigner(load_secret(SECRET))
    assert SECRET not in repr(signer) and signer._key.hex() not in repr(signer)
    assert repr(signer) == "CookieSigner(<secret>)"


# -- sessions and isolation -----------------------------------------------------------------


async def test_sessions_are_the_users_own() -> None:
    model = ScriptedModel(["Hello, Ada."])
    async with serving(app_for(model)) as base, Browser(base) as ada, Browser(base) as bob:
        sid = await ada.open()
        assert (await ada.send(sid, "send", "hi")).status_code == 202
        async with ada.tab(sid) as tab:
            await tab.until(lambda d: len(d["messages"]) == 2 and not d["pending"])
        bob_sid = await bob.open()
        assert bob_sid != sid
        listed = (await bob.http.get("/api/sessions")).json()["sessions"]
        assert [s["id"] for s in listed] == [bob_sid]
        for path in (f"/api/sessions/{sid}/events", f"/c/{sid}"):
            assert (await bob.http.get(path)).status_code == 404
        r = await bob.send(sid, "send", "let me in")
        assert r.status_code == 404
        async with bob.tab(bob_sid) as tab:
            assert tab.doc["messages"] == []
        # ada's titles come from her first message; bob never saw them
        titles = [s["title"] for s in (await ada.http.get("/api/sessions")).json()["sessions"]]
        assert titles == ["hi"]


@pytest.mark.parametrize("sid", ["..", "a%2Fb", "x" * 300, "AAAAAAAAAAAAAAAAAAAAAA",
                                 "%00", "%C0%AF"])
async def test_invented_session_ids_are_not_found(sid: str) -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        await b.open()
        assert (await b.http.get(f"/api/sessions/{sid}/events")).status_code == 404
        assert (await b.send(sid, "send", "hi")).status_code == 404
        assert len((await b.http.get("/api/sessions")).json()["sessions"]) == 1


async def test_new_chat_makes_a_session_listed_first() -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        first = await b.open()
        r = await b.post("/api/sessions", None)
        assert r.status_code == 201
        second = r.json()["id"]
        listed = [s["id"] for s in (await b.http.get("/api/sessions")).json()["sessions"]]
        assert listed == [second, first]
        r = await b.http.get("/")
        assert r.headers["location"] == f"/c/{second}"


# -- the Origin guard and what a POST may carry ----------------------------------------------


async def test_posts_from_another_origin_or_without_one_are_refused() -> None:
    model = ScriptedModel([])
    async with serving(app_for(model, allowed_origins=["https://chat.example.com"])) as base, \
            Browser(base) as b:
        sid = await b.open()
        for origin in ("http://evil.example", "null", base + ".evil.example", None):
            headers = {"content-type": "application/json"}
            if origin is not None:
                headers["origin"] = origin
            r = await b.http.post(f"/api/sessions/{sid}/streams/send", content=b'"hi"',
                                  headers=headers)
            assert r.status_code == 403, origin
            assert "Origin" in r.json()["error"] or "another origin" in r.json()["error"]
        r = await b.send(sid, "set_notes", "from the proxy's name",
                         origin="https://chat.example.com")
        assert r.status_code == 202
        assert model.requests == []  # nothing refused reached the model


async def test_bad_events_get_clear_errors_and_change_nothing() -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        sid = await b.open()
        cases: list[tuple[bytes, int, str]] = [
            (b"", 400, "empty"),
            (b"{not json", 400, "not JSON"),
            (b"NaN", 400, "NaN is not JSON"),
            (b"[" * 60_000, 400, "nested too deeply"),
            (b"[" * 150 + b"]" * 150, 400, "refused"),
            (b"12", 400, "add_message takes a string"),
            (json.dumps({"@link": "/x/y"}).encode(), 400, "refused"),
            (b'"' + b"x" * (64 * 1024) + b'"', 413, "the most"),
        ]
        for body, status, says in cases:
            r = await b.post(f"/api/sessions/{sid}/streams/send", body)
            assert r.status_code == status, (body[:20], r.text)
            assert says in r.json()["error"], r.text
        r = await b.post(f"/api/sessions/{sid}/streams/nope", b"1")
        assert r.status_code == 404 and "its streams: cancel, send, set_notes" in r.text
        async with b.tab(sid) as tab:
            assert tab.doc["messages"] == [] and tab.doc["pending"] is False


async def test_a_body_without_a_length_is_cut_at_the_cap() -> None:
    async with serving(app_for(ScriptedModel([]), limits=Limits(max_body=1024))) as base, \
            Browser(base) as b:
        sid = await b.open()

        async def chunks() -> Any:
            yield b'"'
            for _ in range(100):
                yield b"x" * 1024
            yield b'"'

        r = await b.http.post(f"/api/sessions/{sid}/streams/send", content=chunks(),
                              headers={"origin": base})
        assert r.status_code == 413


async def test_a_sessions_events_are_rate_limited() -> None:
    limits = Limits(events_per_second=0.01, burst=3)
    async with serving(app_for(ScriptedModel([]), limits=limits)) as base, Browser(base) as b:
        sid = await b.open()
        codes = [(await b.send(sid, "set_notes", f"n{i}")).status_code for i in range(5)]
        assert codes == [202, 202, 202, 429, 429]
        r = await b.send(sid, "set_notes", "again")
        assert int(r.headers["retry-after"]) >= 1 and "try again" in r.json()["error"]
        other = (await b.post("/api/sessions", None)).json()["id"]  # its own bucket
        assert (await b.send(other, "set_notes", "fine")).status_code == 202


async def test_a_users_connections_are_limited() -> None:
    async with serving(app_for(ScriptedModel([]), limits=Limits(max_connections=2))) as base, \
            Browser(base) as b, Browser(base) as other:
        sid = await b.open()
        async with b.tab(sid), b.tab(sid):
            r = await b.http.get(f"/api/sessions/{sid}/events")
            assert r.status_code == 429 and "close a tab" in r.json()["error"]
            osid = await other.open()  # another user is not counted against this one
            async with other.tab(osid) as tab:
                assert tab.snapshot["session"] == osid
        async with b.tab(sid) as tab:  # closed tabs gave their slots back
            assert tab.snapshot["session"] == sid


# -- snapshot, patches, cancel --------------------------------------------------------------


async def test_a_reply_streams_as_appends_and_a_reconnect_gets_a_snapshot() -> None:
    pieces = ["Hello, ", "Ada. ", "How ", "are you?"]  # the dialog flushes 4 times a second
    script = [[*(x for p in pieces for x in (TextDelta(index=0, text=p), Pause(0.3))),
               Stop(stop_reason=StopReason.END_TURN)]]
    async with serving(app_for(ScriptedModel(script))) as base, Browser(base) as b:
        sid = await b.open()
        async with b.tab(sid) as tab:
            snap = tab.snapshot
            assert snap["v"] == 1 and snap["chat"]["send"] == "send"
            assert snap["chat"]["cancel"] == "cancel" and snap["state"] == ["notes"]
            assert snap["edit"] == {"notes": "set_notes"}  # a text cell with its setter
            assert (await b.send(sid, "send", "hi")).status_code == 202
            await tab.until(lambda d: len(d["messages"]) == 2 and not d["pending"])
        sent = [op for ops in tab.patches for op in ops
                if op["path"] == "/partial" and isinstance(op["value"], str)]
        assert len(sent) >= 2, tab.patches  # it streamed, in pieces
        assert [op["op"] for op in sent[1:]] == ["append"] * (len(sent) - 1)
        # each piece of text crossed the wire once: the patches add up to the reply
        assert "".join(op["value"] for op in sent) == "".join(pieces)
        assert texts(tab.doc["messages"], "assistant") == ["".join(pieces)]
        async with b.tab(sid) as again:
            assert again.doc["messages"] == tab.doc["messages"]
            assert again.doc["pending"] is False


async def test_stop_is_state_the_reply_ends_and_the_next_message_works() -> None:
    model = ScriptedModel([streamed("The answer", " is", hold=600), "Second reply."])
    async with serving(app_for(model)) as base, Browser(base) as b:
        sid = await b.open()
        async with b.tab(sid) as tab:
            await b.send(sid, "send", "question")
            await tab.until(lambda d: d["partial"] == "The answer is")
            assert (await b.send(sid, "cancel", None)).status_code == 202
            await tab.until(lambda d: d["pending"] is False, timeout=5)
            assert texts(tab.doc["messages"], "assistant") == []  # no partial reply kept
            await b.send(sid, "send", "again")
            await tab.until(lambda d: texts(d["messages"], "assistant") == ["Second reply."])


async def test_a_message_during_a_reply_is_answered_as_dropped() -> None:
    model = ScriptedModel([streamed("Work", "ing", hold=600)])
    async with serving(app_for(model)) as base, Browser(base) as b:
        sid = await b.open()
        async with b.tab(sid) as tab:
            await b.send(sid, "send", "first")
            await tab.until(lambda d: d["partial"] == "Working")
            r = await b.send(sid, "send", "second")
            assert r.status_code == 202 and r.json() == {"ok": True, "dropped": True}
            await b.send(sid, "cancel", None)
            await tab.until(lambda d: d["pending"] is False)


async def test_tabs_of_other_users_never_see_a_patch_of_this_one() -> None:
    model = ScriptedModel(["For Ada only."])
    async with serving(app_for(model)) as base, Browser(base) as ada, Browser(base) as bob:
        sid, bob_sid = await ada.open(), await bob.open()
        async with ada.tab(sid) as atab, bob.tab(bob_sid) as btab:
            await ada.send(sid, "send", "secret plan")
            await atab.until(lambda d: not d["pending"] and len(d["messages"]) == 2)
            await bob.send(bob_sid, "set_notes", "bob's notes")  # an event of bob's own
            await btab.until(lambda d: d["notes"] == "bob's notes")
            assert not any("secret plan" in raw or "For Ada" in raw for raw in btab.raw)


# -- the hub, without HTTP ------------------------------------------------------------------


async def test_a_tab_too_slow_for_its_queue_is_closed_and_others_go_on() -> None:
    from patterns.chatbot import chatbot

    async with Runtime(model=ScriptedModel([])) as rt:
        inst = rt.run(chatbot, user="ada", session="s")
        found = dialog_surface(inst)
        cells, describe = found.cells, {"chat": found.parts, "state": found.state}
        dirty: list[Hub] = []
        hub = Hub(inst, cells, describe, 2, 1 << 20, dirty.append)
        slow, fast = hub.join(1000), hub.join(1000)
        snapshot = await fast.__anext__()
        assert snapshot.startswith(b"retry: 1000\nevent: snapshot")
        got: list[bytes] = []
        for i in range(5):
            await inst.send("set_notes", f"note {i}")
            hub.flush()
            got.append(await fast.__anext__())  # the fast tab keeps up
        assert slow.closed and not fast.closed
        with pytest.raises(StopAsyncIteration):  # its stream ends at once: it reconnects
            await slow.__anext__()
        assert all(b'"path":"/notes"' in p for p in got) and len(set(got)) == 5
        await inst.send("set_notes", "a")
        await inst.send("set_notes", "ab")
        hub.flush()
        await inst.send("set_notes", "abc")
        hub.flush()  # two patches waiting: read as one chunk
        assert await fast.__anext__() == (b'event: patch\ndata: [{"op":"replace","path":'
                                          b'"/notes","value":"ab"}]\n\nevent: patch\ndata: '
                                          b'[{"op":"append","path":"/notes","value":"c"}]\n\n')
        hub.close()
        assert fast.closed and not hub.tabs


def key_of(server, sid):
    return next(key for key in server.parked if key[1] == sid)


async def test_idle_instances_past_the_limit_are_parked_and_come_back_whole() -> None:
    model = ScriptedModel(["First answer.", "Second answer."])
    app = app_for(model, limits=Limits(max_instances=1))
    async with serving(app) as base, Browser(base) as b:
        server = app.state.celldialog
        first = await b.open()
        async with b.tab(first) as tab:
            await b.send(first, "send", "one")
            await tab.until(lambda d: texts(d["messages"], "assistant") == ["First answer."])
        second = (await b.post("/api/sessions", None)).json()["id"]
        async with b.tab(second) as tab:  # the first, unwatched and idle, is parked
            running = [key[1] for key in server.served]
            assert running == [second]
            [(_, parked_sid)] = [key for key in server.parked if key[0]]
            assert parked_sid == first and server.parked[key_of(server, first)].parked
            async with b.tab(first) as again:  # ... and runs again from its documents
                assert texts(again.doc["messages"], "user") == ["one"]
                assert not any(key[1] == first for key in server.parked)
                await b.send(first, "send", "two")
                await again.until(lambda d: texts(d["messages"], "assistant")
                                  == ["First answer.", "Second answer."])
            assert tab.doc["messages"] == []  # a watched instance was never stopped
            assert {key[1] for key in server.served} == {first, second}


# -- what anonymous and hostile clients can make the server hold -------------------------------


async def test_anonymous_visits_make_no_state_and_are_rate_limited() -> None:
    app = app_for(ScriptedModel([]), limits=Limits(new_users_per_second=0.01))
    async with serving(app) as base:
        server = app.state.celldialog
        codes = []
        async with httpx.AsyncClient(base_url=base) as c:  # never keeps a cookie
            for path in ["/"] * 15 + ["/c/AAAAAAAAAAAAAAAAAAAAAA"] * 10:
                c.cookies.clear()
                codes.append((await c.get(path)).status_code)
        assert codes[:15] == [303] * 15 and codes[15:20] == [404] * 5
        assert codes[20:] == [429] * 5  # 20 minted from this address, then its bucket is dry
        assert len(server.indexes) == 0 and len(server.served) == 0  # nothing was run


async def test_a_tab_that_stops_reading_costs_at_most_its_byte_budget() -> None:
    from patterns.chatbot import chatbot

    async with Runtime(model=ScriptedModel([])) as rt:
        inst = rt.run(chatbot, user="ada", session="s")
        found = dialog_surface(inst)
        cells, describe = found.cells, {"chat": found.parts, "state": found.state}
        hub = Hub(inst, cells, describe, 256, 10_000, lambda hub: None)
        tab = hub.join(1000)
        assert hub.join(1000).queued[0] is tab.queued[0]  # one snapshot encoding for both
        for i in range(5):
            await inst.send("set_notes", str(i) * 3000)
            hub.flush()
        assert tab.closed and tab.queued == [] and tab.size == 0  # dropped past 10 KB


def test_host_names_are_parsed_as_browsers_send_them() -> None:
    from runtime.web.guards import host_name

    assert host_name("[::1]:8000") == "::1" and host_name("[::1]") == "::1"
    assert host_name("LocalHost:80") == "localhost" and host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("::1") == "::1"


async def test_other_host_names_are_refused_by_default_and_ipv6_loopback_is_not() -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        port = base.rsplit(":", 1)[1]
        for host, status in ((f"rebind.attacker.example:{port}", 400), (f"[::1]:{port}", 303),
                             (f"localhost:{port}", 303)):
            r = await b.http.get("/", headers={"host": host})
            assert r.status_code == status, host
    app = app_for(ScriptedModel([]), allowed_hosts=["*"])
    async with serving(app) as base, Browser(base) as b:
        r = await b.http.get("/", headers={"host": "anything.example"})
        assert r.status_code == 303


async def test_duplicated_origins_and_cookies_are_no_ones() -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        sid = await b.open()
        good = b.http.cookies[COOKIE]
        r = await b.http.post(f"/api/sessions/{sid}/streams/set_notes", content=b'"x"',
                              headers=[("origin", "http://evil.example"), ("origin", base)])
        assert r.status_code == 403 and "several Origin" in r.json()["error"]
        planted = CookieSigner(SECRET.encode()).sign("p" * 22)  # a valid cookie of another
        async with httpx.AsyncClient(base_url=base) as c:
            r = await c.get("/api/sessions",
                            headers={"cookie": f"{COOKIE}={planted}; {COOKIE}={good}"})
            assert r.status_code == 401


async def test_a_trickled_body_has_a_deadline() -> None:
    limits = Limits(body_seconds=0.5)
    async with serving(app_for(ScriptedModel([]), limits=limits)) as base, Browser(base) as b:
        sid = await b.open()

        port = int(base.rsplit(":", 1)[1])
        cookie = f"{COOKIE}={b.http.cookies[COOKIE]}"
        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with stream:  # one byte of two, then nothing: a client holding a worker
            await stream.send(
                f"POST /api/sessions/{sid}/streams/set_notes HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Origin: {base}\r\nCookie: {cookie}\r\nContent-Type: application/json\r\n"
                f"Content-Length: 2\r\n\r\n\"".encode())
            with anyio.fail_after(10):
                answer = await stream.receive()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"0.5 s" in body


async def test_over_https_the_cookie_is_host_prefixed_and_secure() -> None:
    async with serving(app_for(ScriptedModel([]))) as base, Browser(base) as b:
        https = {"x-forwarded-proto": "https"}  # from loopback: uvicorn trusts it
        r = await b.http.get("/", headers=https)
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("__Host-celldialog_user=") and "Secure" in cookie
        value = cookie.split(";")[0]  # what a browser sends back over HTTPS
        async with httpx.AsyncClient(base_url=base) as c:
            r = await c.get("/", headers={**https, "cookie": value})
            assert r.headers["location"].startswith("/c/")
            plain = value.replace("__Host-", "")  # the other scheme's name is not read
            r = await c.get("/api/sessions", headers={**https, "cookie": plain})
            assert r.status_code == 401


async def test_reconnect_storms_are_rate_limited() -> None:
    limits = Limits(connects_per_second=0.01)
    async with serving(app_for(ScriptedModel([]), limits=limits)) as base, Browser(base) as b:
        sid = await b.open()
        for _ in range(20):
            async with b.tab(sid):
                pass
        r = await b.http.get(f"/api/sessions/{sid}/events")
        assert r.status_code == 429 and "new event streams" in r.json()["error"]


def test_user_ids_from_the_hook_are_printable_text() -> None:
    from runtime.web.identity import check_user_id

    assert check_user_id("ada@example.com") == "ada@example.com"
    for bad in ("", "a" * 257, "ad\u202ea", "a\u0085b", "a\u2028b", "a\x00", "\ud800", 5):
        with pytest.raises(WebConfigError):
            check_user_id(bad)


async def test_an_app_on_the_callers_runtime_leaves_it_as_it_found_it() -> None:
    async with Runtime(model=ScriptedModel(["Hi."])) as rt:
        from patterns.chatbot import chatbot

        app = create_app(chatbot, runtime=rt, secret=SECRET)
        async with serving(app) as base, Browser(base) as b:
            sid = await b.open()
            async with b.tab(sid) as tab:
                await b.send(sid, "send", "hello")
                await tab.until(lambda d: not d["pending"] and len(d["messages"]) == 2)
            server = app.state.celldialog
            started = [s.inst for s in server.served.values()] + list(server.indexes.values())
            assert len(started) == 2  # the session and the user's session list
            assert not any(inst.stopped for inst in started)
        assert all(inst.stopped for inst in started)  # the app stopped what it started
        from patterns.chatbot import chatbot

        assert rt.run(chatbot, user="u", session="s").result.key("messages").get() == []


class _Counting:
    """A hub as the broadcaster sees it: counts its flushes (or fails them)."""

    def __init__(self, fail: bool = False) -> None:
        self.flushes: list[float] = []
        self.fail = fail
        self.closed = False
        self.inst = "a fake instance"
        self.flushed = anyio.Event()
        self.flushed_at = -float("inf")

    def flush(self) -> None:
        self.flushes.append(anyio.current_time())
        self.flushed.set()
        if self.fail:
            raise ValueError("a bad value")

    def close(self) -> None:
        self.closed = True


async def test_the_first_change_goes_at_once_and_what_follows_waits_for_the_window() -> None:
    from runtime.web.hub import Broadcaster

    broadcaster = Broadcaster(coalesce=0.3)
    hub = _Counting()
    async with anyio.create_task_group() as tg:
        await tg.start(broadcaster.run)
        start = anyio.current_time()
        broadcaster.mark(hub)  # type: ignore[arg-type]
        with anyio.fail_after(0.2):  # not the window: at once
            await hub.flushed.wait()
        hub.flushed = anyio.Event()
        for _ in range(5):  # a burst right after: one patch, when the window has passed
            broadcaster.mark(hub)  # type: ignore[arg-type]
            await anyio.lowlevel.checkpoint()
        other = _Counting()  # meanwhile another session's first change: its own window
        broadcaster.mark(other)  # type: ignore[arg-type]
        with anyio.fail_after(0.2):
            await other.flushed.wait()
        assert hub.flushes == hub.flushes[:1]  # the burst still waits
        with anyio.fail_after(2):
            await hub.flushed.wait()
        tg.cancel_scope.cancel()
    assert len(hub.flushes) == 2
    assert hub.flushes[0] - start < 0.2 and hub.flushes[1] - hub.flushes[0] >= 0.29


async def test_one_hub_failing_closes_its_tabs_and_not_the_others() -> None:
    from runtime.web.hub import Broadcaster

    broadcaster = Broadcaster(coalesce=0)
    bad, good = _Counting(fail=True), _Counting()
    async with anyio.create_task_group() as tg:
        await tg.start(broadcaster.run)
        broadcaster.mark(bad)  # type: ignore[arg-type]
        broadcaster.mark(good)  # type: ignore[arg-type]
        with anyio.fail_after(2):
            await good.flushed.wait()
        good.flushed = anyio.Event()
        broadcaster.mark(good)  # type: ignore[arg-type]
        with anyio.fail_after(2):  # the task lives on
            await good.flushed.wait()
        tg.cancel_scope.cancel()
    assert bad.closed and not good.closed and len(good.flushes) == 2


async def test_parked_sessions_past_their_limit_are_stopped(tmp_path) -> None:
    from runtime.web.app import _Server
    from tests.builtins.support import todo_agent

    async with Runtime(store=f"sqlite:///{tmp_path / 's.db'}", model=ScriptedModel([])) as rt:
        server = _Server(todo_agent, None, "default", Limits(max_instances=2, max_parked=5),
                         None, None, rt=rt)
        made = []
        for i in range(12):
            user = f"user{i}"
            sid = await server.make_session(user)
            made.append((user, sid, server.session(user, sid).inst))
        assert len(rt._running) <= 4  # two sessions and two session lists
        assert len(server.parked) == len(rt._running.all_parked()) == 5
        assert sum(inst.stopped for _, _, inst in made) >= 4  # the oldest: stopped
        user, sid, first = made[0]
        again = server.session(user, sid).inst  # asked for again: runs anew
        assert again is not first and again.result.key("messages").get() == []
