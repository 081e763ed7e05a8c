"""``celldialog chat [PATTERN]``: a terminal conversation with a pattern's dialog.

The chat is a view of the pattern's cells, nothing more: a line typed is sent to the
dialog's input stream (``send``), the reply is shown as the ``partial`` cell grows and
completed from the ``messages`` cell, tool calls and their results are shown as they are
appended there, the pattern's own state (its other result cells: a todo agent's ``items``)
is shown when a step changed it, and ``pending`` going false ends the turn. So a chat shows
exactly what the graph holds, and the history lives in the store: a second run with the
same user and session resumes it (a short summary, not the whole history).

Two views of a reply (``_View``): on a terminal, a rich ``Live`` region: a spinner until the
first token, then the reply rendered as Markdown as it grows; Ctrl-C replaces it with
"(cancelled)" at once, since a cancelled reply is not kept (the dialog's rule: the history
holds the question, not the partial answer). Anywhere else (a pipe, a file), plain text as
it streams. A reply the model stopped at its ``max_tokens`` says so, one dim line (the
dialog's ``stop_reason`` output, read from the pattern's result).

Keys: Ctrl-C while a reply runs cancels it (an event on the dialog's ``cancel`` stream;
echo is off meanwhile, so no ``^C`` lands in the reply); a Ctrl-C at the prompt (a second
one, in effect), Ctrl-D or ``/exit`` leaves. Input is read with the event loop (no
thread), so leaving never waits for a blocked read; input that is not a terminal (a file,
``/dev/null``, a pipe) is read line by line, each line sent and shown, until its end.

A pattern can chat if its result has ``send`` (or ``add_message``), ``messages`` and
``pending``; ``partial``, ``error``, ``cancel`` (or ``cancel_generation``), ``dropped`` and
``stop_reason`` are used when present. The bundled chatbot and todo agent have them all.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import click

from .common import model_option, pattern_args, scope_options, store_option, store_url
from .errors import PatternNotUsable, redact

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from ..cells import Cell, Instance, Pattern
    from .common import ModelChoice

__all__ = ["command"]

LOCAL_NOTE = (
    "a tiny model: in the todo agent it makes the right call for 7 of 10 plain \"add\" "
    "requests and answers 18 of 20 questions without a tool (docs/local-model.md); for real "
    "work use a provider: --model sonnet with ANTHROPIC_API_KEY set")
"""Said under the model line when the model is the embedded one: what to expect of it, as
measured (``bench/local_model.py``), and the one-line way to a provider."""

RESULT_CHARS = 200  # characters of a tool result, a call's arguments or a state value shown


@click.command(name="chat")
@click.argument("pattern", required=False)
@model_option
@store_option("celldialog.db in the user data directory")
@scope_options
@click.option("--args", "args_json", default=None, metavar="JSON",
              help="The pattern's arguments, a JSON object.")
def command(pattern: str | None, model: str | None, store: str | None, space: str,
            user: str, session: str, args_json: str | None) -> None:
    """Chat with PATTERN's dialog (default: the bundled chatbot). The history is kept in
    the store per user and session: run again with the same ones to resume."""
    args = pattern_args(args_json)
    url = store_url(store, "")

    from .common import choose_model, default_store
    from .loading import DEFAULT_CHAT_PATTERN, load_pattern

    target = load_pattern(pattern or DEFAULT_CHAT_PATTERN)
    choice = choose_model(model)
    chat = _Chat(target, args, url or default_store(), space, user, session, choice)

    import anyio

    anyio.run(chat.main)


@dataclass(frozen=True)
class _Surface:
    """The cells and streams of a pattern's result that a chat drives and shows."""

    send: str
    cancel: str | None
    messages: Cell
    pending: Cell
    partial: Cell | None
    dropped: Cell | None
    stop_reason: Cell | None  # why the last reply stopped ("max_tokens": it was cut short)
    state: dict[str, Cell]  # the pattern's own cells (not the dialog's), shown as they change

    @classmethod
    def of(cls, inst: Instance) -> _Surface:
        from ..builtins import dialog_surface

        found = dialog_surface(inst)
        parts = found.parts
        if not found.is_chat:
            missing = [n for n in ("send", "messages", "pending")
                       if n not in (set(found.streams) | set(found.cells))]
            raise PatternNotUsable(
                f"pattern {inst.pattern.name} has no dialog to chat with: its result lacks "
                f"{', '.join(missing) or 'a dialog'} (return the llm_dialog's add_message as "
                "'send', its messages cell as 'messages' and its pending cell as 'pending')")
        pending = found.cell("pending")
        if pending is None:
            raise PatternNotUsable(
                f"pattern {inst.pattern.name} has no dialog to chat with: its result lacks "
                "pending (return the llm_dialog's pending cell as 'pending')")
        state = {k: found.cells[k] for k in sorted(found.state)}
        messages = found.cell("messages")
        assert parts["send"] is not None and messages is not None
        return cls(parts["send"], parts["cancel"], messages, pending, found.cell("partial"),
                   found.cell("dropped"), found.cell("stop_reason"), state)


class _State(Enum):
    PROMPT = "prompt"  # waiting for a line: Ctrl-C leaves
    TURN = "turn"  # a reply is running: Ctrl-C cancels it
    CANCELLING = "cancelling"  # cancelled, not ended yet: Ctrl-C leaves


# -- input --------------------------------------------------------------------------------


class _Lines:
    """Lines from a file descriptor: a terminal or a pipe is read when the event loop says
    it is readable; a file, ``/dev/null`` or anything else the loop cannot poll (epoll
    refuses them) is read directly, since reading it never blocks."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.eof = False
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # no standard input at all: its end, at once
            self.eof, mode = True, 0
        self.terminal = not self.eof and os.isatty(fd)
        self.pollable = self.terminal or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)

    async def readline(self) -> str | None:
        """The next line without its newline; None at the end of input (Ctrl-D)."""
        import anyio

        while b"\n" not in self.buffer and not self.eof:
            if self.pollable:
                try:
                    await anyio.wait_readable(self.fd)
                except (PermissionError, ValueError):  # not pollable after all: read it
                    self.pollable = False
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # the terminal went away
                chunk = b""
            if chunk:
                self.buffer += chunk
            else:
                self.eof = True
        line, newline, self.buffer = self.buffer.partition(b"\n")
        if not newline and not line:
            return None
        return line.decode(errors="replace").removesuffix("\r")


class _Echo:
    """The terminal's echo, off while a reply runs: a Ctrl-C is then no ``^C`` in the
    reply, and keys typed meanwhile do not scramble it (they are dropped at the prompt,
    which says so: a message sent while a reply runs is ignored by the dialog anyway)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.saved: list[Any] | None = None
        self.is_off = False
        if os.isatty(fd):
            import termios

            try:
                self.saved = termios.tcgetattr(fd)
            except termios.error:
                self.saved = None

    def off(self) -> None:
        if self.saved is None:
            return
        import termios

        attrs = termios.tcgetattr(self.fd)
        attrs[3] &= ~(termios.ECHO | termios.ECHOCTL)
        termios.tcsetattr(self.fd, termios.TCSANOW, attrs)
        self.is_off = True

    def on(self) -> bool:
        """Echo on again; True if keys typed while it was off were dropped."""
        if self.saved is None or not self.is_off:
            return False
        import fcntl
        import struct
        import termios

        try:  # how many bytes wait unread: typed while nobody could see them
            waiting = struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0" * 4))[0]
        except OSError:
            waiting = 0
        termios.tcflush(self.fd, termios.TCIFLUSH)  # what was typed unseen is not sent
        termios.tcsetattr(self.fd, termios.TCSANOW, self.saved)
        self.is_off = False
        return waiting > 0


# -- the views of a reply -----------------------------------------------------------------


class _View:
    """How a reply shows: ``begin`` when a model call starts, ``text`` with its text so far,
    ``finish`` with its final text (None: it had none), ``cancel`` when Ctrl-C stopped it,
    ``line`` for a line of its own (a tool call), ``close`` when the turn ends."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def begin(self) -> None: ...

    def text(self, value: str) -> None: ...

    def finish(self, final: str | None) -> None: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...

    def line(self, markup: str) -> None:
        self.console.print(markup, soft_wrap=True)


class _PlainView(_View):
    """Not a terminal: the reply as plain text, printed as it streams."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.streamed = ""  # the text of the running reply printed so far
        self.open_line = False  # a reply's text is being printed on the current line

    def begin(self) -> None:
        self.streamed = ""

    def text(self, value: str) -> None:
        if value.startswith(self.streamed):
            self._print(value[len(self.streamed):])
            self.streamed = value

    def finish(self, final: str | None) -> None:
        if final:
            if final.startswith(self.streamed):
                self._print(final[len(self.streamed):])
            else:  # the final text is not what streamed: show it whole
                self._end_line()
                self._print(final)
        self._end_line()
        self.streamed = ""

    def cancel(self) -> None:
        self._end_line()
        self.console.print("[dim](cancelled)[/]", soft_wrap=True)
        self.streamed = ""

    def close(self) -> None:
        self._end_line()

    def line(self, markup: str) -> None:
        self._end_line()
        super().line(markup)

    def _print(self, delta: str) -> None:
        if not delta:
            return
        if not self.open_line:
            self.console.print("[bold magenta]assistant>[/] ", end="")
            self.open_line = True
        self.console.print(delta, end="", markup=False, soft_wrap=True)

    def _end_line(self) -> None:
        if self.open_line:
            self.console.print()
            self.open_line = False


class _LiveView(_View):
    """A terminal: one ``Live`` region per model call, a spinner until the first token,
    then the reply as Markdown; finished, it stays as its final text (or goes, if the reply
    had none); cancelled, it becomes "(cancelled)"."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.live: Live | None = None

    def begin(self) -> None:
        from rich.live import Live
        from rich.spinner import Spinner

        self.close()
        self.live = Live(self._labelled(Spinner("dots", style="dim")), console=self.console,
                         refresh_per_second=12, redirect_stdout=False, redirect_stderr=False)
        self.live.start()

    def text(self, value: str) -> None:
        if self.live is not None and value:
            from rich.markdown import Markdown

            self.live.update(_Tail(self._labelled(Markdown(value))))

    def finish(self, final: str | None) -> None:
        from rich.markdown import Markdown

        if final:
            if self.live is None:
                self.console.print(self._labelled(Markdown(final)))
                return
            self.live.update(self._labelled(Markdown(final)))
        self._stop(keep=bool(final))

    def cancel(self) -> None:
        from rich.text import Text

        cancelled = self._labelled(Text("(cancelled)", style="dim"))
        if self.live is None:
            self.console.print(cancelled)
            return
        self.live.update(cancelled)
        self._stop(keep=True)

    def close(self) -> None:
        self._stop(keep=False)

    def _stop(self, keep: bool) -> None:
        live, self.live = self.live, None
        if live is not None:
            live.transient = not keep  # not kept: the region is erased
            live.stop()

    @staticmethod
    def _labelled(body: RenderableType) -> RenderableType:
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid()
        grid.add_column(no_wrap=True)
        grid.add_column()
        grid.add_row(Text("assistant> ", style="bold magenta"), body)
        return grid


class _Tail:
    """A renderable's last lines, one fewer than the terminal has rows: a reply taller than
    the screen streams at its end (a ``Live`` region cannot redraw what scrolled off); the
    whole of it is printed when it finishes."""

    def __init__(self, body: RenderableType) -> None:
        self.body = body

    def __rich_console__(self, console: Console, options: Any) -> Any:
        from rich.segment import Segment

        lines = console.render_lines(self.body, options.update(height=None), pad=False)
        for line in lines[-max(console.size.height - 1, 1):]:
            yield from line
            yield Segment.line()


# -- the chat -----------------------------------------------------------------------------


class _Chat:
    def __init__(self, pattern: Pattern, args: dict[str, Any] | None, url: str, space: str,
                 user: str, session: str, choice: ModelChoice) -> None:
        from rich.console import Console

        self.pattern = pattern
        self.args = args
        self.url = url
        self.space = space
        self.user = user
        self.session = session
        self.choice = choice
        self.console: Console = Console(highlight=False)
        self.view: _View = (_LiveView if self.console.is_terminal else _PlainView)(
            self.console)
        self.state = _State.PROMPT
        self.seen = 0  # messages already shown
        self.shown_state: dict[str, str] = {}  # the pattern's state as last shown (JSON)
        self.done: Any = None  # set when the running turn ends (anyio.Event)
        self.inst: Instance | None = None
        self.surface: _Surface | None = None

    # -- the program -------------------------------------------------------------------

    async def main(self) -> None:
        import anyio

        from .. import Runtime
        from .common import close_model, reachable, start

        echo = _Echo(0)
        try:
            async with Runtime(store=self.url, model=self.choice.model) as rt:
                inst = self.inst = start(rt, self.pattern, self.args, self.space, self.user,
                                         self.session)
                surface = self.surface = _Surface.of(inst)
                await reachable(self.choice.model)  # after the pattern: its problems first
                self._banner(surface)
                self.shown_state = {k: _json(c.get()) for k, c in surface.state.items()}
                surface.messages.sink(self._on_messages)
                surface.pending.sink(self._on_pending)
                if surface.partial is not None:
                    surface.partial.sink(self._on_partial)
                async with anyio.create_task_group() as tg:
                    await tg.start(self._signals, tg.cancel_scope)
                    await self._repl(echo)
                    tg.cancel_scope.cancel()
        finally:
            self.view.close()
            echo.on()
            await close_model(self.choice.model)

    def _banner(self, surface: _Surface) -> None:
        out = self.console
        out.print(f"[bold]celldialog chat[/] · {self.pattern.key}", soft_wrap=True)
        out.print(f"model: [bold]{self.choice.label}[/] ({self.choice.why})", soft_wrap=True)
        if self.choice.model.provider == "local":
            out.print(f"[dim]{LOCAL_NOTE}[/]", soft_wrap=True)
        from ..storage import redact

        where = redact(self.url).removeprefix("sqlite:///")  # a database password never shows
        out.print(f"store: {where} · user {self.user} · session {self.session}",
                  soft_wrap=True, markup=False)
        history = surface.messages.get() or []
        if history:
            out.print(f"[green]resumed session {_escape(repr(self.session))}[/]: "
                      f"{len(history)} messages" + (", the last:" if _previews(history)
                                                   else ""), soft_wrap=True)
            width = max(out.width - 16, 20)
            for who, text in _previews(history):
                out.print(f"[dim]  {who}: {_escape(_cut(text, width))}[/]", soft_wrap=True)
        else:
            out.print(f"new session {self.session!r}", soft_wrap=True, markup=False)
        self.seen = len(history)
        if surface.pending.get():
            out.print("[yellow]a reply is still marked running in this session (another "
                      "process, or one that stopped): new messages are ignored until it ends "
                      "or is taken over[/]", soft_wrap=True)
        keys = "Ctrl-C cancels a reply; " if surface.cancel else ""
        out.print(f"[dim]{keys}Ctrl-C at the prompt, Ctrl-D or /exit leaves.[/]",
                  soft_wrap=True)

    async def _repl(self, echo: _Echo) -> None:
        lines = _Lines(0)
        while True:
            self.state = _State.PROMPT
            if echo.on():
                self.console.print("[dim](what you typed during the reply was dropped: type "
                                   "it again)[/]", soft_wrap=True)
            self.console.print("[bold cyan]you>[/] ", end="")
            line = await lines.readline()
            if line is None:
                self.console.print()
                return
            if not lines.terminal:  # nobody typed it: show it, so the transcript reads
                self.console.print(line, markup=False, soft_wrap=True)
            text = line.strip()
            if text in ("/exit", "/quit"):
                return
            if text:
                echo.off()
                await self._turn(text)

    async def _turn(self, text: str) -> None:
        import anyio

        from ..errors import CelldialogError

        assert self.inst is not None and self.surface is not None
        surface = self.surface
        dropped = surface.dropped.get() if surface.dropped is not None else 0
        self.done = anyio.Event()
        self.state = _State.TURN
        self.view.begin()
        try:
            try:
                await self.inst.send(surface.send, text)
            except CelldialogError as e:
                self.view.close()
                self.view.line(f"[red]not sent:[/] {redact(str(e))}")
                return
            if surface.dropped is not None and surface.dropped.get() > dropped:
                self.view.close()
                self.view.line("[yellow]ignored: a reply is already running in this "
                               "session[/]")
                return
            if surface.pending.get():
                await self.done.wait()
            self._show_state()
        finally:
            self.view.close()

    async def _signals(self, scope: Any, *, task_status: Any) -> None:
        """Ctrl-C: cancel the running reply, or leave (at the prompt, or a second time)."""
        import anyio

        with anyio.open_signal_receiver(signal.SIGINT) as interrupts:
            task_status.started()
            async for _ in interrupts:
                assert self.inst is not None and self.surface is not None
                if self.state is _State.TURN and self.surface.cancel is not None:
                    self.state = _State.CANCELLING
                    self.view.cancel()  # at once: nothing more of the reply shows
                    self.inst.stream(self.surface.cancel).send(None)
                else:
                    self.view.close()
                    self.console.print()
                    scope.cancel()

    # -- what the cells say (sinks: they run in the commit that changed the cell) ----------

    def _on_pending(self, value: Any) -> None:
        if value is False and self.done is not None:
            self.done.set()

    def _on_partial(self, value: Any) -> None:
        if self.state is _State.TURN and isinstance(value, str):
            self.view.text(value)

    def _on_messages(self, value: Any) -> None:
        history = value or []
        new, self.seen = history[self.seen:], len(history)
        for message in new:
            self._show(message)

    # -- printing ----------------------------------------------------------------------

    def _show(self, message: dict[str, Any]) -> None:
        try:
            from ..builtins.llm_dialog import ERROR_PREFIX
        except ImportError:  # pragma: no cover - the prefix moved: show errors as text
            ERROR_PREFIX = "\0"
        from ..llm.types import StopReason

        live = self.state is _State.TURN  # not cancelled: the reply is still shown
        role = message.get("role")
        blocks = message.get("blocks") or []
        texts = "".join(b.get("text", "") for b in blocks if b.get("kind") == "text")
        if role == "user":
            results = [b for b in blocks if b.get("kind") == "tool_result"]
            for b in results:
                content = b.get("content")
                content = content if isinstance(content, str) else json.dumps(content)
                style = "red" if b.get("is_error") else "dim"
                self.view.line(f"[{style}]  ← {_escape(_cut(content))}[/]")
            if results:
                self._show_state()
                if live and self.surface is not None and self.surface.pending.get():
                    self.view.begin()  # the model is called again
            return
        calls = [b for b in blocks if b.get("kind") == "tool_use"]
        if texts.startswith(ERROR_PREFIX):
            self.view.close()
            self.view.line(
                f"[red]error:[/] {_escape(redact(texts[len(ERROR_PREFIX):].lstrip(': ')))}")
        elif live:
            self.view.finish(texts or None)
            stop = self.surface.stop_reason if self.surface is not None else None
            # the dialog writes it in the commit that stores its final reply: read here
            if texts and not calls and stop is not None and stop.get() == StopReason.MAX_TOKENS:
                self.view.line("[dim](cut short: the reply reached the model's max_tokens "
                               "limit)[/]")
        for b in calls:
            args = json.dumps(b.get("input"), ensure_ascii=False)
            self.view.line(f"[yellow]  → {_escape(str(b.get('name')))}[/] "
                           f"[dim]{_escape(_cut(args))}[/]")

    def _show_state(self) -> None:
        """The pattern's own cells that changed since they were last shown, one line each."""
        if self.surface is None:
            return
        for key, cell in self.surface.state.items():
            now = _json(cell.get())
            if self.shown_state.get(key) != now:
                self.shown_state[key] = now
                self.view.line(f"[cyan]  {_escape(key)}:[/] {_escape(_cut(now))}")


def _previews(history: list[Any]) -> list[tuple[str, str]]:
    """The last user text and the last assistant text after it: a resumed session's
    reminder of where it stopped."""
    out: list[tuple[str, str]] = []
    for message in reversed(history):
        if not isinstance(message, dict):
            continue
        blocks = message.get("blocks") or []
        text = "".join(b.get("text", "") for b in blocks
                       if isinstance(b, dict) and b.get("kind") == "text").strip()
        role = message.get("role")
        if not text or role not in ("user", "assistant"):
            continue
        if role == "user":
            out.append(("you", text))
            break
        if not out:
            out.append(("assistant", text))
    return out[::-1]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _cut(text: str, limit: int = RESULT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
