"""``celldialog chat`` on a pseudo-terminal against a loopback OpenAI-compatible server."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .fakes import Held, OpenAIServer, text, tool_call
from .harness import DEADLINE, Terminal

READY = r"leaves\.\s*\n"  # the banner's last line: the prompt after it is the real one
PROMPT = r"you> "


def _messages(server: OpenAIServer, index: int) -> list[dict]:
    return server.requests[index].body["messages"]


def _user_texts(messages: list[dict]) -> list[str]:
    """The user messages' text, whichever content form the adapter chose."""
    out = []
    for m in messages:
        if m["role"] == "user":
            c = m["content"]
            out.append(c if isinstance(c, str) else "".join(p.get("text", "") for p in c))
    return out


def test_an_exchange_streams_the_reply_and_says_which_model(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    # the reply comes in 5-character chunks; the first four (after the role chunk) are
    # paced like a model's tokens, then the rest is held back
    held = Held(text("Hello there, Ada. Nice to meet you."), head=5, pace=0.3)
    server.script(held)
    term = Terminal(["chat", "--user", "ada", "--session", "s1"], model_env, workdir)
    try:
        term.expect(r"model: openai:gpt-4o-mini \(CELLDIALOG_MODEL in the environment\)")
        term.expect(r"new session 's1'")
        term.expect(READY)
        term.expect(PROMPT)
        term.line("hi")
        # streamed: the start of the reply shows while the rest has not been sent
        term.expect(r"assistant> Hello there, Ada\.")
        assert held.arrived.wait(DEADLINE) and not held.release.is_set()
        held.release.set()
        term.expect(r" Nice to meet you\.\n")
        term.expect(PROMPT)
        # a turn that fails (the server has no reply left: a 400) is one red line, and
        # the chat goes on
        term.line("and now?")
        term.expect(r"error: .*no scripted reply left.*\n")
        term.expect(PROMPT)
        term.ctrl_d()
        assert term.wait() == 0
    finally:
        held.release.set()
        term.close()
    sent = _messages(server, 0)
    assert sent[0]["role"] == "system" and "helpful assistant" in sent[0]["content"]
    assert _user_texts(sent) == ["hi"]
    assert term.raw.count("Hello there, Ada.") == 1  # streamed text is not printed twice
    assert "Traceback" not in term.raw


def test_ctrl_c_cancels_a_held_reply_and_the_chat_goes_on_then_resumes(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    held = Held(text("A long answer that nobody will read."))
    server.script(held, text("Fresh answer."))
    term = Terminal(["chat"], model_env, workdir)  # the default store, user, session
    try:
        term.expect(READY)
        term.expect(PROMPT)
        term.line("question")
        assert held.arrived.wait(DEADLINE), "the request never reached the server"
        term.ctrl_c()
        term.expect(r"reply cancelled")
        term.expect(PROMPT)
        # the request in flight was aborted: the client hung up on the held stream
        assert held.client_left.wait(DEADLINE)
        term.line("again")
        term.expect(r"assistant> Fresh answer\.\n")
        term.expect(PROMPT)
        term.ctrl_c()  # at the prompt: leaves
        assert term.wait() == 0
    finally:
        held.release.set()
        term.close()
    assert "A long answer" not in term.raw
    # the second request carried the history: the cancelled question, then the new one
    assert _user_texts(_messages(server, 1)) == ["question", "again"]

    # the history is in SQLite under the user's data directory
    db = Path(model_env["XDG_DATA_HOME"]) / "celldialog" / "celldialog.db"
    assert db.is_file()
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from sqlite_master").fetchone()[0] > 0

    again = Terminal(["chat"], model_env, workdir)
    try:
        again.expect(r"resumed session 'default': 3 earlier messages:")
        again.expect(r"you: question\n")
        again.expect(r"you: again\n")
        again.expect(r"assistant: Fresh answer\.\n")
        again.expect(READY)
        again.expect(PROMPT)
        again.ctrl_d()
        assert again.wait() == 0
    finally:
        again.close()
    assert len(server.requests) == 2  # resuming asked the model nothing


def test_tool_calls_are_shown_as_they_run(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    server.script(tool_call("addItem", {"title": "milk"}), text("Added milk."))
    term = Terminal(["chat", "todo-agent", "--store", "memory"], model_env, workdir)
    try:
        term.expect(r"bundled\.todo-agent")
        term.expect(READY)
        term.expect(PROMPT)
        term.line("add milk")
        term.expect(r'→ addItem \{"title": "milk"\}')
        term.expect(r"← addItem done\.")
        term.expect(r"assistant> Added milk\.\n")
        term.expect(PROMPT)
        term.ctrl_d()
        assert term.wait() == 0
    finally:
        term.close()
    # the tool result went back to the model
    tool_results = [m for m in _messages(server, 1) if m["role"] == "tool"]
    assert tool_results and tool_results[0]["content"] == "addItem done."
