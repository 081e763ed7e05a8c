"""``celldialog serve`` in a real browser: Debian's chromium, driven by playwright, on the
page served by the real command in a subprocess, whose model is the real OpenAI adapter
talking to a loopback fake (the only mock, at the network edge).

The page is driven by its contract: a textbox named "Message", buttons "Send" and "Stop"
(Stop shown only while a reply is pending), and every message element carries
``data-role="user"`` or ``data-role="assistant"``. Nothing sleeps: every wait is on a
condition (playwright's ``expect``, ``wait_for_function``, a ``threading.Event`` of the
fake), each with a deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect, sync_playwright

from tests.cli.conftest import clean_env
from tests.cli.fakes import Held, OpenAIServer, text, tool_call
from tests.llm.fake_openai import render_chunks

from .browser import WAIT_MS, Page, Served, artifacts_dir, launch, wait_event

expect.set_options(timeout=WAIT_MS)

# the newest assistant element's text, once it is a part of `reply` longer than `before`
# and not all of it: a reply seen growing
PARTIAL = """([reply, before]) => {
  const all = document.querySelectorAll('[data-role="assistant"]');
  const t = all.length ? all[all.length - 1].textContent.trim() : '';
  return t.length > before.length && t !== reply.trim() && reply.startsWith(t) ? t : null;
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = launch(pw)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def fake() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


@pytest.fixture
def serve(tmp_path: Path, fake: OpenAIServer) -> Iterator[Callable[..., Served]]:
    """``serve(pattern=None)``: ``celldialog serve`` started against the fake; stopped (and
    its output printed, shown if the test failed) when the test ends."""
    env = {**clean_env(tmp_path), "OPENAI_BASE_URL": fake.base_url,
           "CELLDIALOG_MODEL": "openai:gpt-4o-mini"}
    workdir = tmp_path / "work"
    workdir.mkdir()
    started: list[Served] = []

    def start(pattern: str | None = None) -> Served:
        served = Served(env, workdir, pattern)
        started.append(served)
        return served.start()

    yield start
    for served in started:
        served.stop()
        print(f"--- celldialog serve {served.pattern or ''} output:\n{served.log()}")


@pytest.fixture
def user(browser: Browser, serve: Callable[..., Served]) -> Iterator[Callable[[], Page]]:
    """``user()``: a new browser context (its own cookie jar: another person) and a tab in
    it. Closed before the server stops."""
    made: list[Page] = []

    def new() -> Page:
        made.append(Page(browser.new_context()))
        return made[-1]

    yield new
    for tab in made:
        tab.context.close()


def head_text(reply: Held) -> str:
    """The text the fake streams before it holds: its first ``head`` chunks' content."""
    chunks = render_chunks(reply.response, include_usage=False)[: reply.head]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_a_reply_streams_in_and_the_console_stays_clean(serve, fake, user) -> None:
    reply = "Streaming works: one piece after another, until the whole reply is here."
    held = Held(text(reply), head=10, pace=0.15)
    fake.script(held)
    served = serve()
    tab = user()
    tab.page.goto(served.url)
    expect(tab.stop_button).to_be_hidden()

    tab.say("Tell me something, slowly")
    expect(tab.messages("user")).to_have_text(["Tell me something, slowly"])
    expect(tab.stop_button).to_be_visible()
    first = tab.wait_text(PARTIAL, [reply, ""])
    second = tab.wait_text(PARTIAL, [reply, first])
    assert 0 < len(first) < len(second) < len(reply.strip()), (first, second)
    assert len(second) <= len(head_text(held).strip())  # all of it while the fake held
    expect(tab.stop_button).to_be_visible()

    wait_event(held.arrived, "the fake streaming the reply's head")
    held.release.set()
    expect(tab.messages("assistant")).to_have_text([reply])
    expect(tab.stop_button).to_be_hidden()
    expect(tab.messages()).to_have_text(["Tell me something, slowly", reply])
    # no error of any kind, Content-Security-Policy violations included
    assert tab.errors == []


def test_stop_ends_the_reply_at_once_and_the_next_message_works(serve, fake, user) -> None:
    reply = "This reply is stopped before its end, so THE UNSEEN TAIL never shows."
    held = Held(text(reply), head=6, pace=0.15)  # over the runtime's flush interval
    fake.script(held, text("A second reply, after the stop."))
    served = serve()
    tab = user()
    tab.page.goto(served.url)

    tab.say("Start something long")
    tab.wait_text(PARTIAL, [reply, ""])  # streaming...
    wait_event(held.arrived, "the fake streaming the reply's head")  # ...and now holding
    expect(tab.stop_button).to_be_visible()
    tab.stop_button.click()
    at_stop = "".join(tab.texts("assistant"))
    expect(tab.stop_button).to_be_hidden(timeout=3000)  # the pending state ended, promptly
    expect(tab.send_button).to_be_enabled(timeout=3000)
    wait_event(held.client_left, "the server closing the model's stream on Stop", timeout=5)
    after = "".join(tab.texts("assistant"))
    assert len(after) <= len(at_stop) and at_stop.startswith(after), (at_stop, after)
    expect(tab.page.get_by_text("THE UNSEEN TAIL")).to_have_count(0)

    tab.say("And now?")
    expect(tab.messages("assistant").last).to_have_text("A second reply, after the stop.")
    expect(tab.messages("user")).to_have_text(["Start something long", "And now?"])
    expect(tab.stop_button).to_be_hidden()
    assert len(fake.requests) == 2
    assert tab.errors == []


def test_a_stop_the_server_refuses_leaves_the_reply_running_and_says_so(serve, fake,
                                                                        user) -> None:
    reply = "A reply whose stop was refused, so it ENDS AFTER ALL."
    held = Held(text(reply), head=6, pace=0.15)
    fake.script(held)
    served = serve()
    tab = user()
    tab.page.goto(served.url)
    tab.page.route("**/streams/cancel", lambda route: route.fulfill(
        status=503, content_type="application/json",
        body='{"error": "the server cannot take this event now: try again"}'))

    tab.say("Start something long")
    wait_event(held.arrived, "the fake streaming the reply's head")
    tab.stop_button.click()
    expect(tab.page.get_by_text("Not stopped: the server cannot take this event now")) \
        .to_be_visible()
    expect(tab.stop_button).to_be_enabled()  # still running: Stop can be pressed again
    held.release.set()
    expect(tab.messages("assistant").last).to_have_text(reply)  # the rest showed after all
    expect(tab.stop_button).to_be_hidden()


def test_reload_and_a_server_restart_restore_the_conversation(serve, fake, user) -> None:
    fake.script(text("Noted: the sky is green."), text("You told me the sky is green."))
    served = serve()
    tab = user()
    tab.page.goto(served.url)
    tab.say("Remember: the sky is green.")
    first_turn = ["Remember: the sky is green.", "Noted: the sky is green."]
    expect(tab.messages()).to_have_text(first_turn)
    url = tab.page.url

    tab.page.reload()
    assert tab.page.url == url
    expect(tab.messages()).to_have_text(first_turn)

    # the server stops and starts again on the same port; the page is not reloaded: its
    # EventSource reconnects by itself and gets a snapshot from the new process
    port = served.port
    tab.page.evaluate("window.__before_restart = true")  # gone if the page were reloaded
    with tab.page.expect_response(
            lambda r: r.url == f"{served.url}api/sessions/{tab.session}/events"
            and r.status == 200, timeout=30_000):
        served.restart()
        assert served.port == port
    assert tab.page.url == url
    assert tab.page.evaluate("window.__before_restart") is True, "the page was reloaded"
    expect(tab.messages()).to_have_text(first_turn)
    expect(tab.send_button).to_be_enabled()

    tab.say("What did I tell you?")
    expect(tab.messages()).to_have_text(
        [*first_turn, "What did I tell you?", "You told me the sky is green."])
    # the new process answered from the stored conversation: the model saw all of it
    sent = [m.get("content") for m in fake.requests[-1].body["messages"]]
    assert "Remember: the sky is green." in str(sent) and "Noted: the sky is green." in str(sent)


def test_another_browser_sees_nothing_of_the_first_users(serve, fake, user) -> None:
    fake.script(text("Your plan is safe with me."), text("Hello, Bob."))
    served = serve()
    ada = user()
    ada.page.goto(served.url)
    ada.say("Ada's secret plan for Tuesday")
    expect(ada.messages()).to_have_text(["Ada's secret plan for Tuesday",
                                         "Your plan is safe with me."])
    ada_sessions = ada.page.get_by_role("navigation", name="Sessions").get_by_role("link")
    expect(ada_sessions).to_have_text(["Ada's secret plan for Tuesday"])  # titled

    bob = user()  # another cookie jar
    bob.page.goto(served.url)
    assert bob.session != ada.session
    bob.say("Hi, I am Bob")
    expect(bob.messages()).to_have_text(["Hi, I am Bob", "Hello, Bob."])
    bob_sessions = bob.page.get_by_role("navigation", name="Sessions").get_by_role("link")
    expect(bob_sessions).to_have_text(["Hi, I am Bob"])
    expect(bob.page.get_by_text("secret plan")).to_have_count(0)

    response = bob.page.goto(f"{served.url}c/{ada.session}")
    assert response is not None and response.status == 404
    expect(bob.page.get_by_role("heading", name="No such conversation")).to_be_visible()
    expect(bob.messages()).to_have_count(0)
    expect(bob.page.get_by_text("secret plan")).to_have_count(0)
    expect(bob.page.get_by_text("safe with me")).to_have_count(0)


def test_the_pages_post_replayed_without_its_cookie_or_origin_is_refused(serve, fake,
                                                                         user) -> None:
    fake.script(text("First answer."), text("The answer to the accepted replay."))
    served = serve()
    tab = user()
    tab.page.goto(served.url)
    with tab.page.expect_request(lambda r: r.method == "POST"
                                 and r.url.endswith("/streams/send")) as posted:
        tab.say("Only this browser may say this")
    request = posted.value
    first_turn = ["Only this browser may say this", "First answer."]
    expect(tab.messages()).to_have_text(first_turn)
    assert request.url == f"{served.url}api/sessions/{tab.session}/streams/send"
    headers = request.all_headers()
    origin = served.url.rstrip("/")
    assert headers.get("origin") == origin, headers
    body = request.post_data_buffer
    assert body is not None
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in tab.context.cookies(served.url))
    assert cookie, "the page's browser holds no cookie"

    with httpx.Client(trust_env=False, timeout=10) as http:
        def replay(**extra: str) -> httpx.Response:
            return http.post(request.url, content=body,
                             headers={"content-type": headers["content-type"], **extra})

        refused = {
            "no cookie": replay(origin=origin),
            "another origin": replay(cookie=cookie, origin="http://evil.example"),
            "no origin": replay(cookie=cookie),
        }
        assert {k: r.status_code for k, r in refused.items()} == {
            "no cookie": 401, "another origin": 403, "no origin": 403}
        # none of them reached the conversation: the model was asked once, the page holds
        # the one turn
        assert len(fake.requests) == 1
        expect(tab.messages()).to_have_text(first_turn)

        # the same replay with both the cookie and the page's Origin is taken, so what the
        # server refused above was the missing cookie or the wrong Origin, nothing else;
        # the conversation then shows exactly one new message and its answer
        accepted = replay(cookie=cookie, origin=origin)
        assert accepted.status_code == 202, accepted.text
    expect(tab.messages()).to_have_text(
        [*first_turn, "Only this browser may say this", "The answer to the accepted replay."])
    assert len(fake.requests) == 2


def test_markup_in_a_reply_runs_nothing_and_shows_as_text(serve, fake, user) -> None:
    markup = ('Here: <img src=x onerror="window.__pwned=1"> and '
              "<script>window.__pwned=2</script> end.")
    fake.script(text(markup))
    served = serve()
    tab = user()
    tab.page.goto(served.url)
    tab.say(f"Echo this: {markup}")
    expect(tab.messages("assistant")).to_have_text([markup])
    expect(tab.messages("user")).to_have_text([f"Echo this: {markup}"])
    assert tab.page.evaluate("window.__pwned") is None
    assert '<img src=x onerror="window.__pwned=1">' in tab.messages("assistant").text_content()
    conversation = tab.page.get_by_role("log", name="Conversation")
    expect(conversation.locator("img")).to_have_count(0)
    expect(conversation.locator("script")).to_have_count(0)
    assert tab.page.evaluate("window.__pwned") is None
    assert tab.errors == []


def test_the_todo_agent_updates_the_list_beside_the_chat_screenshot(serve, fake, user,
                                                                     capsys) -> None:
    fake.script(tool_call("addItem", {"title": "buy milk"}), text("Added buy milk."))
    served = serve("todo-agent")
    tab = user()
    tab.page.goto(served.url)
    state = tab.page.get_by_role("complementary", name="State")
    expect(state).to_be_visible()
    expect(state).not_to_contain_text("buy milk")

    tab.say("Remind me to buy milk")
    expect(state.get_by_role("checkbox", name="buy milk")).not_to_be_checked()
    expect(tab.messages("assistant").last).to_have_text("Added buy milk.")
    expect(tab.page.get_by_role("log", name="Conversation")).to_contain_text("addItem")
    expect(tab.stop_button).to_be_hidden()

    # the list edited in place: an item ticked is one replace, one removed is one remove
    fake.script(tool_call("addItem", {"title": "eggs"}, id="call_2"),
                tool_call("markDone", {"title": "buy milk"}, id="call_3"), text("Done."))
    tab.say("Milk is bought; add eggs")
    expect(state.get_by_role("checkbox", name="buy milk")).to_be_checked()
    expect(state.get_by_role("checkbox", name="eggs")).not_to_be_checked()
    fake.script(tool_call("removeItem", {"title": "buy milk"}, id="call_4"), text("Removed."))
    tab.say("Drop the milk")
    expect(tab.messages("assistant").last).to_have_text("Removed.")
    expect(state.get_by_role("checkbox")).to_have_count(1)
    expect(state.get_by_role("checkbox", name="eggs")).not_to_be_checked()
    assert tab.errors == []

    shot = artifacts_dir() / "todo-agent.png"
    tab.page.screenshot(path=str(shot))
    assert shot.stat().st_size > 0
    with capsys.disabled():  # shown even under -q
        print(f"\nscreenshot: {shot}")


def test_all_the_model_sent_shows_while_it_pauses(serve, fake, user) -> None:
    """A model that pauses mid-reply (a slow token, a stall before a tool call, a held
    connection): the page shows all the text it sent before the pause, not only what had
    arrived by the last of the runtime's flushes. The fake sends its first four pieces at
    once, then holds; they must be on the page within a few seconds, while it still holds."""
    reply = "Four quick pieces, then a long pause before the rest of this reply."
    held = Held(text(reply), head=5)  # the head in one burst, then the pause
    fake.script(held)
    served = serve()
    tab = user()
    tab.page.goto(served.url)

    tab.say("Go on")
    wait_event(held.arrived, "the fake streaming the reply's head")
    expect(tab.messages("assistant")).to_have_text([head_text(held).strip()], timeout=3000)
    assert not held.release.is_set()
    held.release.set()
    expect(tab.messages("assistant")).to_have_text([reply])
    assert tab.errors == []


def test_a_text_cell_the_pattern_lets_the_user_set_is_edited_beside_the_chat(serve, fake,
                                                                             user) -> None:
    """The chatbot's notes (``notes`` with ``set_notes``): typed beside the chat, saved to
    the store, shown to the model in its next call, there again after a reload."""
    fake.script(text("Hello, Ada."))
    served = serve()
    tab = user()
    tab.page.goto(served.url)
    notes = tab.page.get_by_role("textbox", name="Notes")
    expect(notes).to_have_value("")
    notes.fill("Call me Ada. <b>not bold</b>")
    tab.page.get_by_role("button", name="Save Notes").click()
    tab.say("hi")
    expect(tab.messages("assistant").last).to_have_text("Hello, Ada.")
    system = fake.requests[-1].body["messages"][0]
    assert system["role"] == "system" and "Call me Ada. <b>not bold</b>" in system["content"]
    tab.page.reload()
    expect(tab.page.get_by_role("textbox", name="Notes")).to_have_value(
        "Call me Ada. <b>not bold</b>")
    expect(tab.page.locator("b")).to_have_count(0)
    assert tab.errors == []
