"""Two ``celldialog serve`` processes on one database (PostgreSQL, or a SQLite file) serve
as one: a user's requests may reach either (as behind a proxy that spreads them), and what
one process commits reaches the other's cells through the store's change feed, and from
there the tabs connected to it.

Both processes are the real command in a subprocess, with the same store (a fresh database
of the throwaway cluster, or one SQLite file: ``shared_store``), the same
``CELLDIALOG_WEB_SECRET`` (so a cookie one of them signed is valid on the other) and the
same loopback fake OpenAI server (the only mock, at the network edge); only the process
that accepted a message asks the model. Every wait is on a condition, with a deadline.
"""

from __future__ import annotations

import base64
import html
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from playwright.sync_api import Browser as Chromium
from playwright.sync_api import expect, sync_playwright

from runtime.web import COOKIE
from tests.cli.conftest import clean_env
from tests.cli.fakes import Held, OpenAIServer, text
from tests.llm.fake_openai import render_chunks

from .browser import WAIT_MS, Page, Served, artifacts_dir, launch, wait_event
from .support import Browser, Tab, texts

expect.set_options(timeout=WAIT_MS)

SECRET = "two-processes-one-secret-" + "x" * 20  # CELLDIALOG_WEB_SECRET, >= 32 bytes
WAIT = 10.0  # seconds any one expectation may take

# the newest assistant element's text, once it is a part of `reply` longer than `before`
# and not all of it: a reply seen growing (as in test_browser.py)
PARTIAL = """([reply, before]) => {
  const all = document.querySelectorAll('[data-role="assistant"]');
  const t = all.length ? all[all.length - 1].textContent.trim() : '';
  return t.length > before.length && t !== reply.trim() && reply.startsWith(t) ? t : null;
}"""


@pytest.fixture
def fake() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture
def servers(tmp_path: Path, fake: OpenAIServer, shared_store: str
            ) -> Iterator[tuple[Served, Served]]:
    """Two ``celldialog serve`` processes (the chatbot) on one database (a fresh PostgreSQL
    database, or one SQLite file: the same tests on both), started together; stopped, and
    their output printed (shown if the test failed), when the test ends."""
    env = {**clean_env(tmp_path), "OPENAI_BASE_URL": fake.base_url,
           "CELLDIALOG_MODEL": "openai:gpt-4o-mini", "CELLDIALOG_WEB_SECRET": SECRET}
    pair = []
    for name in ("one", "two"):
        workdir = tmp_path / name
        workdir.mkdir()
        served = Served(env, workdir)
        served.store = shared_store
        pair.append(served)
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(Served.start, pair))
        yield pair[0], pair[1]
    finally:
        for served in pair:
            served.stop()
            print(f"--- celldialog serve ({served.workdir.name}) output:\n{served.log()}")


def base(served: Served) -> str:
    return served.url.rstrip("/")


async def same_user(one: Browser, two: Browser) -> str:
    """The user gets their cookie and a session from ``one``; ``two`` then carries the same
    cookie (one browser, another process behind the proxy). Returns the session."""
    sid = await one.open()
    two.http.cookies.set(COOKIE, one.http.cookies[COOKIE])
    return sid


async def shows(tab: Tab, holds: Callable[[dict[str, Any]], bool], what: str,
                timeout: float = WAIT) -> None:
    """Read ``tab``'s events until ``holds(doc)``; failing, say ``what`` never showed."""
    try:
        await tab.until(holds, timeout)
    except TimeoutError:
        raise AssertionError(f"the tab did not show {what} within {timeout} s; it shows "
                             f"{tab.doc}") from None


async def happened(event: threading.Event, what: str, timeout: float = WAIT) -> float:
    """Wait for a ``threading.Event`` of the fake, failing with ``what``; returns how long
    it took."""
    start = anyio.current_time()
    if not await anyio.to_thread.run_sync(event.wait, timeout, abandon_on_cancel=True):
        raise AssertionError(f"{what} did not happen within {timeout} s")
    return anyio.current_time() - start


async def eventually(read: Callable[[], Awaitable[Any]], holds: Callable[[Any], bool],
                     what: str, timeout: float = WAIT) -> None:
    """``read()`` again until ``holds`` its value (for what has no event stream: the session
    list is read by GET); a deadline, not a guess."""
    value: Any = None
    with anyio.move_on_after(timeout):
        while not holds(value := await read()):
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"{what} did not happen within {timeout} s; last read: {value}")


def head_text(reply: Held) -> str:
    """The text the fake streams before it holds: its first ``head`` chunks' content."""
    chunks = render_chunks(reply.response, include_usage=False)[: reply.head]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def replied(*replies: str) -> Callable[[dict[str, Any]], bool]:
    return lambda d: not d["pending"] and texts(d["messages"], "assistant") == list(replies)


# -- over HTTP: the event streams as a tab reads them -------------------------------------


@pytest.mark.anyio
async def test_a_reply_one_process_runs_streams_into_a_tab_of_the_other(servers, fake) -> None:
    """A message posted to process one, whose turn runs there, streams into the user's tab
    on process two as it is made (pending, then the partial reply in pieces while the model
    still holds the rest, then the reply), exactly as into a tab of process one."""
    reply = "Streamed by one process, watched through the other, piece after piece."
    held = Held(text(reply), head=9, pace=0.12)  # ~1 s of pieces, then a hold
    fake.script(held)
    one, two = servers
    async with Browser(base(one)) as b1, Browser(base(two)) as b2:
        sid = await same_user(b1, b2)
        async with b2.tab(sid) as tab2, b1.tab(sid) as tab1:
            assert tab2.doc["messages"] == [] and tab2.doc["pending"] is False
            r = await b1.send(sid, "send", "Tell me, slowly")
            assert (r.status_code, r.json()) == (202, {"ok": True})
            await shows(tab2, lambda d: d["pending"] and texts(d["messages"], "user")
                        == ["Tell me, slowly"], "the message and the pending turn")
            await happened(held.arrived, "the fake streaming the reply's head")
            head = head_text(held)
            await shows(tab2, lambda d: d["partial"] == head, "all the model sent so far")
            assert not held.release.is_set() and tab2.doc["pending"] is True
            appended = [op for ops in tab2.patches for op in ops
                        if op["path"] == "/partial" and op["op"] == "append"]
            assert len(appended) >= 2, tab2.patches  # in pieces, as they were made
            held.release.set()
            await shows(tab2, replied(reply), "the whole reply")
            await shows(tab1, replied(reply), "the whole reply")
            assert tab2.doc == tab1.doc  # the two processes show one conversation
    assert len(fake.requests) == 1  # one turn, one model call: process two never ran it


@pytest.mark.anyio
async def test_the_session_list_is_one_across_processes(servers, fake) -> None:
    """Sessions made by process one, and the title its first message gives, are on the list
    process two answers with, though process two had that list loaded before."""
    fake.script(text("Noted."))
    one, two = servers
    async with Browser(base(one)) as b1, Browser(base(two)) as b2:
        first = await same_user(b1, b2)

        async def listed() -> list[tuple[str, str]]:
            r = await b2.http.get("/api/sessions")
            assert r.status_code == 200, r.text
            return [(s["id"], s["title"]) for s in r.json()["sessions"]]

        assert await listed() == [(first, "")]  # process two now holds the list
        r = await b1.post("/api/sessions", None)  # "New chat", on process one
        assert r.status_code == 201, r.text
        second = r.json()["id"]
        await eventually(listed, lambda got: got == [(second, ""), (first, "")],
                         "the new session listed by process two")
        async with b2.tab(second) as tab2:  # process two serves it as the user's own
            await b1.send(second, "send", "Plans for the weekend")
            await shows(tab2, replied("Noted."), "the reply")
        await eventually(listed, lambda got: got == [(second, "Plans for the weekend"),
                                                     (first, "")],
                         "the title listed by process two")


@pytest.mark.anyio
async def test_stop_sent_to_the_other_process_ends_the_turn_at_once(servers, fake) -> None:
    """Stop posted to process two ends a turn process one runs: process one closes its model
    request at once (within 1 s; it takes milliseconds), the fake seeing its client leave
    mid-reply; both processes' tabs show the turn ended with no partial reply kept; and the
    next message, posted to process one, is taken (not dropped as if a turn still ran) and
    answered."""
    reply = "This reply is stopped from elsewhere, so THE UNSEEN TAIL never shows."
    held = Held(text(reply), head=5, pace=0.05)
    fake.script(held, text("A second reply, after the stop."))
    one, two = servers
    async with Browser(base(one)) as b1, Browser(base(two)) as b2:
        sid = await same_user(b1, b2)
        async with b1.tab(sid) as tab1, b2.tab(sid) as tab2:
            await b1.send(sid, "send", "Start something long")
            await happened(held.arrived, "the fake streaming the reply's head")
            await shows(tab2, lambda d: d["pending"] and d["partial"] == head_text(held),
                        "the reply streaming")
            r = await b2.send(sid, "cancel", None)
            assert (r.status_code, r.json()) == (202, {"ok": True})
            # the held reply never ends by itself: only the cancel, through the feed, ends it
            await happened(held.client_left, "process one closing the model's stream",
                           timeout=10)
            for tab in (tab2, tab1):
                await shows(tab, lambda d: d["pending"] is False, "the turn ended", timeout=5)
                assert texts(tab.doc["messages"], "assistant") == [] and not tab.doc["partial"]
            r = await b1.send(sid, "send", "And now?")
            assert (r.status_code, r.json()) == (202, {"ok": True})  # not "dropped"
            for tab in (tab1, tab2):
                await shows(tab, replied("A second reply, after the stop."), "the next reply")
                assert texts(tab.doc["messages"], "user") == ["Start something long",
                                                              "And now?"]
                assert not any("UNSEEN TAIL" in raw for raw in tab.raw)
    assert len(fake.requests) == 2


@pytest.mark.anyio
async def test_a_conversation_alternating_between_processes_loses_no_message(servers,
                                                                              fake) -> None:
    """Each message goes to the other process than the last, the moment the last reply
    showed in a tab of the process that made it (so the receiving process may not have
    heard of that reply's end yet): none is dropped as if a turn still ran, and both tabs
    show every message and reply, in order."""
    replies = [f"Reply {i}." for i in range(6)]
    fake.script(*map(text, replies))
    one, two = servers
    async with Browser(base(one)) as b1, Browser(base(two)) as b2:
        sid = await same_user(b1, b2)
        async with b1.tab(sid) as tab1, b2.tab(sid) as tab2:
            for i in range(len(replies)):
                client, tab = (b1, tab1) if i % 2 == 0 else (b2, tab2)
                r = await client.send(sid, "send", f"Message {i}")
                assert (r.status_code, r.json()) == (202, {"ok": True}), (
                    f"message {i} was not taken by the process it reached (its copy of the "
                    "dialog may still have said the last turn was running)")
                await shows(tab, replied(*replies[: i + 1]), f"reply {i}")
            for tab in (tab1, tab2):
                await shows(tab, replied(*replies), "every reply")
                assert texts(tab.doc["messages"], "user") == [f"Message {i}" for i in range(6)]


# -- in a browser: one person, two tabs, each on its own process ----------------------------


@pytest.fixture
def chromium() -> Iterator[Chromium]:
    """For one test: ``sync_playwright`` keeps an event loop running on this thread until
    it ends, and an async test run while it lasts fails ("Cannot run the event loop
    while another loop is running"), so it must end with the test that uses it."""
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            yield browser
        finally:
            browser.close()


def side_by_side(chromium: Chromium, shots: dict[str, bytes], path: Path) -> None:
    """One image of the tabs' screenshots side by side, each under its caption (drawn by the
    browser itself: no image library)."""
    cells = "".join(
        f'<figure><figcaption>{html.escape(caption)}</figcaption><img src="data:image/png;'
        f'base64,{base64.b64encode(png).decode()}"></figure>' for caption, png in shots.items())
    context = chromium.new_context(viewport={"width": 1600, "height": 100})
    try:
        page = context.new_page()
        page.set_content(
            "<style>body{margin:0;display:flex;gap:8px;background:#888;font:14px sans-serif}"
            "figure{margin:0;flex:1}figcaption{padding:4px 8px;background:#222;color:#fff}"
            "img{width:100%;display:block}</style>" + cells)
        page.wait_for_function("[...document.images].every((i) => i.complete)")
        page.screenshot(path=str(path), full_page=True)
    finally:
        context.close()


def test_a_message_typed_in_a_tab_on_one_process_streams_into_a_tab_on_the_other(
        servers, fake, chromium, capsys) -> None:
    """One browser (one cookie jar), two tabs of one conversation: the first on process
    one, the second on process two. What is typed in the first shows in the second, the
    reply streaming into it piece by piece with Stop shown meanwhile; what is typed in the
    second shows in the first; the second's session list shows the title the first gave."""
    reply = "Made by process one, streamed into the tab of process two, piece by piece."
    held = Held(text(reply), head=10, pace=0.15)
    fake.script(held, text("And this one by process two."))
    one, two = servers
    context = chromium.new_context()
    try:
        tab1 = Page(context)
        tab1.page.goto(one.url)  # the cookie, then a session, made by process one
        sid = tab1.session
        tab2 = Page(context)  # the same cookie: a cookie is the host's, whatever the port
        tab2.page.goto(f"{two.url}c/{sid}")
        assert tab2.session == sid
        expect(tab2.send_button).to_be_enabled()
        expect(tab2.messages()).to_have_count(0)

        tab1.say("Tell me something, slowly")
        expect(tab2.messages("user")).to_have_text(["Tell me something, slowly"])
        expect(tab2.stop_button).to_be_visible()
        first = tab2.wait_text(PARTIAL, [reply, ""])
        second = tab2.wait_text(PARTIAL, [reply, first])
        assert 0 < len(first) < len(second) < len(reply), (first, second)
        wait_event(held.arrived, "the fake streaming the reply's head")
        held.release.set()
        expect(tab2.messages("assistant")).to_have_text([reply])
        expect(tab2.stop_button).to_be_hidden()
        sessions = tab2.page.get_by_role("navigation", name="Sessions").get_by_role("link")
        expect(sessions).to_have_text(["Tell me something, slowly"])

        tab2.say("And from this tab?")
        conversation = ["Tell me something, slowly", reply, "And from this tab?",
                        "And this one by process two."]
        expect(tab1.messages()).to_have_text(conversation)
        expect(tab2.messages()).to_have_text(conversation)
        assert len(fake.requests) == 2
        assert tab1.errors == [] and tab2.errors == []

        shot = artifacts_dir() / "two-servers.png"
        side_by_side(chromium, {f"tab 1 · process one · {one.url}": tab1.page.screenshot(),
                                f"tab 2 · process two · {two.url}": tab2.page.screenshot()},
                     shot)
        assert shot.stat().st_size > 0
        with capsys.disabled():  # shown even under -q
            print(f"\nscreenshot: {shot}")
    finally:
        context.close()
