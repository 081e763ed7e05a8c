"""``celldialog chat`` on a pseudo-terminal against a loopback OpenAI-compatible server, and
with input that is not a terminal (a file, ``/dev/null``, a pipe)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import time
from pathlib import Path

from runtime.llm.types import Message, Response, Role, StopReason, TextBlock, Usage

from .fakes import MODEL, Held, OpenAIServer, text, tool_call
from .harness import DEADLINE, Terminal, celldialog

READY = r"leaves\.\s*\n"  # the banner's last line: the prompt after it is the real one
PROMPT = r"you> "
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"  # rich's "dots" frames


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


def _lines(screen: str) -> list[str]:
    return [line.rstrip() for line in screen.splitlines()]


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
        term.expect(r"Nice to meet you\.")
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
    # what the person sees: the reply once, whole, on the line of its label
    lines = _lines(term.screen())
    assert "assistant> Hello there, Ada. Nice to meet you." in lines, term.screen()
    assert term.screen().count("Hello there") == 1
    assert "Traceback" not in term.raw


def test_a_spinner_shows_until_the_first_token(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    held = Held(text("Here it is."), head=1)  # the role chunk only: no text yet
    server.script(held)
    term = Terminal(["chat", "--store", "memory"], model_env, workdir)
    try:
        term.expect(READY)
        term.expect(PROMPT)
        term.line("slow one")
        assert held.arrived.wait(DEADLINE)
        term.expect(rf"assistant> [{SPINNER}]")
        term.expect(rf"assistant> [{SPINNER}]")  # it turns: a second frame is drawn
        held.release.set()
        term.expect(r"Here it is\.")
        term.expect(PROMPT)
        term.ctrl_d()
        assert term.wait() == 0
    finally:
        held.release.set()
        term.close()
    screen = term.screen()
    assert "assistant> Here it is." in _lines(screen)
    assert not any(ch in screen for ch in SPINNER)  # gone once the reply came


def test_ctrl_c_cancels_a_held_reply_and_the_chat_goes_on_then_resumes(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    held = Held(text("A long answer that nobody will read."), head=4, pace=0.3)
    long = "Fresh answer. " + "More words follow here. " * 20
    server.script(held, text(long))
    term = Terminal(["chat"], model_env, workdir)  # the default store, user, session
    try:
        term.expect(READY)
        term.expect(PROMPT)
        term.line("question")
        assert held.arrived.wait(DEADLINE), "the request never reached the server"
        term.expect(r"assistant> A long")  # some of it showed
        term.ctrl_c()
        term.expect(r"\(cancelled\)")
        term.expect(PROMPT)
        # the request in flight was aborted: the client hung up on the held stream
        assert held.client_left.wait(DEADLINE)
        term.line("again")
        term.expect(r"Fresh answer\.")
        term.expect(PROMPT)
        term.ctrl_c()  # at the prompt: leaves
        assert term.wait() == 0
    finally:
        held.release.set()
        term.close()
    # the screen shows what the history holds: the question, no partial answer
    screen = term.screen()
    lines = _lines(screen)
    assert lines[lines.index("you> question") + 1] == "assistant> (cancelled)", screen
    assert "A long" not in screen
    # echo was off while the reply ran: the one ^C shown is the last, at the prompt
    assert screen.count("^C") == 1 and lines[-1] == "you> ^C", screen
    # the second request carried the history: the cancelled question, then the new one
    assert _user_texts(_messages(server, 1)) == ["question", "again"]

    # the history is in SQLite under the user's data directory
    db = Path(model_env["XDG_DATA_HOME"]) / "celldialog" / "celldialog.db"
    assert db.is_file()
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from sqlite_master").fetchone()[0] > 0

    again = Terminal(["chat"], model_env, workdir)
    try:
        again.expect(r"resumed session 'default': 3 messages, the last:")
        again.expect(r"you: again\n")
        again.expect(r"assistant: Fresh answer\. More words")
        again.expect(READY)
        again.expect(PROMPT)
        again.ctrl_d()
        assert again.wait() == 0
    finally:
        again.close()
    assert len(server.requests) == 2  # resuming asked the model nothing
    # a summary, not the history: the last exchange only, each on one line, cut short
    summary = _lines(again.screen())
    assert not any("question" in line for line in summary)
    preview = next(line for line in summary if line.startswith("  assistant: "))
    assert preview.endswith("…") and len(preview) < 200


def test_tool_calls_and_the_state_they_change_show_and_markdown_renders(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    server.script(tool_call("addItem", {"title": "milk"}),
                  text("Added **milk**. Run:\n\n```python\nprint('milk')\n```\n"))
    term = Terminal(["chat", "todo-agent", "--store", "memory"], model_env, workdir)
    try:
        term.expect(r"bundled\.todo-agent")
        term.expect(READY)
        term.expect(PROMPT)
        term.line("add milk")
        term.expect(r'→ addItem \{"title": "milk"\}')
        term.expect(r"← addItem done\.")
        term.expect(r'items: \[\{"title": "milk", "done": false\}\]')
        term.expect(r"open: 1")
        term.expect(r"assistant> Added milk\. Run:")
        term.expect(PROMPT)
        term.ctrl_d()
        assert term.wait() == 0
    finally:
        term.close()
    # the tool result went back to the model
    tool_results = [m for m in _messages(server, 1) if m["role"] == "tool"]
    assert tool_results and tool_results[0]["content"] == "addItem done."
    screen = term.screen()
    assert "print('milk')" in screen and "```" not in screen and "**" not in screen


def test_a_reply_cut_at_max_tokens_says_so(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    cut = Response(message=Message(role=Role.ASSISTANT, blocks=(TextBlock(text="Once upon a ti"),)),
                   stop_reason=StopReason.MAX_TOKENS, usage=Usage(input_tokens=5, output_tokens=9),
                   model=MODEL)
    server.script(cut, text("Done."))
    term = Terminal(["chat", "--store", "memory"], model_env, workdir)
    try:
        term.expect(READY)
        term.expect(PROMPT)
        term.line("tell a story")
        term.expect(r"assistant> Once upon a ti")
        term.expect(r"\(cut short: the reply reached the model's max_tokens limit\)")
        term.expect(PROMPT)
        term.line("thanks")
        term.expect(r"assistant> Done\.")
        term.expect(PROMPT)
        term.ctrl_d()
        assert term.wait() == 0
    finally:
        term.close()
    assert term.screen().count("cut short") == 1  # a reply that ended is not marked


# -- input that is not a terminal -------------------------------------------------------


def _chat(args: list[str], env: dict[str, str], cwd: Path,
          stdin: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([celldialog(), "chat", *args], env=env, cwd=cwd, stdin=stdin,
                          capture_output=True, text=True, timeout=60)


def test_input_from_dev_null_ends_the_chat_at_once(model_env: dict[str, str],
                                                   workdir: Path,
                                                   server: OpenAIServer) -> None:
    done = _chat(["--store", "memory"], model_env, workdir, subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "new session 'default'" in done.stdout and done.stdout.rstrip().endswith("you>")
    assert server.requests == []


def test_lines_from_a_file_are_sent_one_by_one(model_env: dict[str, str], workdir: Path,
                                               server: OpenAIServer) -> None:
    server.script(text("Hello, **Ada**."), text("Bye."))
    script = workdir / "lines.txt"
    script.write_text("hi\n\nbye")  # an empty line is skipped; the last has no newline
    with script.open() as stdin:
        done = _chat(["--store", "memory"], model_env, workdir, stdin)
    assert done.returncode == 0, done.stderr
    assert _user_texts(_messages(server, 1)) == ["hi", "bye"]
    # plain text (not a terminal): no control sequences, the Markdown as written, each
    # line shown after its prompt
    assert "\x1b" not in done.stdout
    assert re.search(r"you> hi\nassistant> Hello, \*\*Ada\*\*\.\nyou> \nyou> bye\n"
                     r"assistant> Bye\.\nyou> \n?$", done.stdout), done.stdout


def test_lines_from_a_pipe_are_sent_as_they_come(model_env: dict[str, str], workdir: Path,
                                                 server: OpenAIServer) -> None:
    server.script(tool_call("addItem", {"title": "milk"}), text("Added milk."))
    proc = subprocess.Popen([celldialog(), "chat", "todo-agent", "--store", "memory"],
                            env=model_env, cwd=workdir, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None
        proc.stdin.write("add milk\n")
        proc.stdin.flush()
        # the pipe stays open: the chat waits on it, having answered the line
        until = time.monotonic() + DEADLINE
        while len(server.requests) < 2 and time.monotonic() < until:
            time.sleep(0.05)
        assert len(server.requests) == 2 and proc.poll() is None
        stdout, stderr = proc.communicate(timeout=DEADLINE)  # closes the pipe: its end
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "→ addItem" in stdout and 'items: [{"title": "milk", "done": false}]' in stdout
    assert "assistant> Added milk." in stdout


def test_keys_typed_during_a_reply_are_not_echoed_and_are_dropped_saying_so(
        model_env: dict[str, str], workdir: Path, server: OpenAIServer) -> None:
    held = Held(text("Answer."), head=2)
    server.script(held, text("Second."))
    term = Terminal(["chat", "--store", "memory"], model_env, workdir)
    try:
        term.expect(READY)
        term.expect(PROMPT)
        term.line("first")
        assert held.arrived.wait(DEADLINE)
        term.expect(r"assistant> ")
        term.line("typed too soon")  # while the reply runs: nothing shows, nothing is sent
        held.release.set()
        term.expect(r"Answer\.")
        term.expect(r"\(what you typed during the reply was dropped: type it again\)")
        term.expect(PROMPT)
        term.line("second")
        term.expect(r"Second\.")
        term.expect(PROMPT)
        term.ctrl_d()
        assert term.wait() == 0
    finally:
        held.release.set()
        term.close()
    assert "typed too soon" not in term.raw
    assert _user_texts(_messages(server, 1)) == ["first", "second"]
