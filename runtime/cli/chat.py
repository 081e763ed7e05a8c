"""``celldialog chat [PATTERN]``: a terminal conversation with a pattern's dialog.

The chat is a view of the pattern's cells, nothing more: a line typed is sent to the
dialog's input stream (``send``), the reply is printed as the ``partial`` cell grows and
completed from the ``messages`` cell, tool calls and their results are printed as they are
appended there, and ``pending`` going false ends the turn. So a chat shows exactly what the
graph holds, and the history lives in the store: a second run with the same user and
session resumes it.

Keys: Ctrl-C while a reply runs cancels it (an event on the dialog's ``cancel`` stream); a
Ctrl-C at the prompt (a second one, in effect), Ctrl-D or ``/exit`` leaves. Input is read
from the terminal with the event loop (no thread), so leaving never waits for a blocked read.

A pattern can chat if its result has ``send`` (or ``add_message``), ``messages`` and
``pending``; ``partial``, ``error``, ``cancel`` (or ``cancel_generation``) and ``dropped``
are used when present. The bundled chatbot and todo agent have them all.
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

from .common import parse_json, scope_options, store_url
from .errors import PatternNotUsable, UsageProblem, redact

if TYPE_CHECKING:
    from rich.console import Console

    from ..cells import Cell, Instance, Pattern
    from .common import ModelChoice

__all__ = ["command"]

RESUME_SHOWN = 6  # earlier messages shown when a session resumes
RESULT_CHARS = 200  # characters of a tool result shown


@click.command(name="chat")
@click.argument("pattern", required=False)
@click.option("--model", default=None, metavar="NAME",
              help="The model (default: CELLDIALOG_MODEL, else the resolver's default).")
@click.option("--store", default=None, metavar="URL",
              help="sqlite:///path.db, a path, or memory (default: celldialog.db in the "
              "user data directory).")
@scope_options
@click.option("--args", "args_json", default=None, metavar="JSON",
              help="The pattern's arguments, a JSON object.")
def command(pattern: str | None, model: str | None, store: str | None, space: str,
            user: str | None, session: str | None, args_json: str | None) -> None:
    """Chat with PATTERN's dialog (default: the bundled chatbot). The history is kept in
    the store per user and session: run again with the same ones to resume."""
    args = parse_json(args_json, "--args") if args_json is not None else None
    if args is not None and not isinstance(args, dict):
        raise UsageProblem(f"--args must be a JSON object, got {type(args).__name__}")
    url = store_url(store, "")

    from .common import choose_model, default_store, default_user
    from .loading import DEFAULT_CHAT_PATTERN, load_pattern

    target = load_pattern(pattern or DEFAULT_CHAT_PATTERN)
    choice = choose_model(model)
    chat = _Chat(target, args, url or default_store(), space, user or default_user(),
                 session or "default", choice)

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

    @classmethod
    def of(cls, inst: Instance) -> _Surface:
        raw = inst.result.raw()
        keys = set(raw) if isinstance(raw, dict) else set()

        def stream(*names: str) -> str | None:
            return next((n for n in names if n in inst.streams), None)

        def cell(name: str) -> Cell | None:
            return inst.result.key(name).resolve() if name in keys else None

        send, messages, pending = stream("send", "add_message"), cell("messages"), cell(
            "pending")
        if send is None or messages is None or pending is None:
            missing = [n for n, v in (("send", send), ("messages", messages),
                                      ("pending", pending)) if v is None]
            raise PatternNotUsable(
                f"pattern {inst.pattern.name} has no dialog to chat with: its result lacks "
                f"{', '.join(missing)} (return the llm_dialog's add_message as 'send', its "
                "messages cell as 'messages' and its pending cell as 'pending')")
        return cls(send, stream("cancel", "cancel_generation"), messages, pending,
                   cell("partial"), cell("dropped"))


class _State(Enum):
    PROMPT = "prompt"  # waiting for a line: Ctrl-C leaves
    TURN = "turn"  # a reply is running: Ctrl-C cancels it
    CANCELLING = "cancelling"  # cancelled, not ended yet: Ctrl-C leaves


class _Lines:
    """Lines from a file descriptor, read when the event loop says it is readable."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.eof = False
        # a regular file is always readable (and cannot be polled); ttys and pipes can
        self.pollable = not stat.S_ISREG(os.fstat(fd).st_mode)

    async def readline(self) -> str | None:
        """The next line without its newline; None at the end of input (Ctrl-D)."""
        import anyio

        while b"\n" not in self.buffer and not self.eof:
            if self.pollable:
                await anyio.wait_readable(self.fd)
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
        return line.decode(errors="replace")


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
        self.state = _State.PROMPT
        self.streamed = ""  # the text of the running reply printed so far
        self.open_line = False  # a reply's text is being printed on the current line
        self.seen = 0  # messages already shown
        self.done: Any = None  # set when the running turn ends (anyio.Event)
        self.inst: Instance | None = None
        self.surface: _Surface | None = None

    # -- the program -------------------------------------------------------------------

    async def main(self) -> None:
        import anyio

        from .. import Runtime
        from .common import close_model, reachable, start

        model = self.choice.model
        try:
            async with Runtime(store=self.url, model=model) as rt:
                inst = self.inst = start(rt, self.pattern, self.args, self.space, self.user,
                                         self.session)
                surface = self.surface = _Surface.of(inst)
                await reachable(model)  # after the pattern: its problems are named first
                self._banner(surface)
                surface.messages.sink(self._on_messages)
                surface.pending.sink(self._on_pending)
                if surface.partial is not None:
                    surface.partial.sink(self._on_partial)
                async with anyio.create_task_group() as tg:
                    await tg.start(self._signals, tg.cancel_scope)
                    await self._repl()
                    tg.cancel_scope.cancel()
        finally:
            await close_model(model)

    def _banner(self, surface: _Surface) -> None:
        out = self.console
        out.print(f"[bold]celldialog chat[/] · {self.pattern.key}", soft_wrap=True)
        out.print(f"model: [bold]{self.choice.label}[/] ({self.choice.why})", soft_wrap=True)
        where = self.url.removeprefix("sqlite:///")
        out.print(f"store: {where} · user {self.user} · session {self.session}",
                  soft_wrap=True, markup=False)
        history = surface.messages.get() or []
        if history:
            shown = history[-RESUME_SHOWN:]
            out.print(f"[green]resumed session {self.session!r}[/]: {len(history)} earlier "
                      f"messages" + (f", the last {len(shown)}:" if len(shown) < len(history)
                                     else ":"), soft_wrap=True)
            for message in shown:
                self._show(message, resumed=True)
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

    async def _repl(self) -> None:
        lines = _Lines(0)
        while True:
            self.state = _State.PROMPT
            self.console.print("[bold cyan]you>[/] ", end="")
            line = await lines.readline()
            if line is None:
                self.console.print()
                return
            text = line.strip()
            if text in ("/exit", "/quit"):
                return
            if text:
                await self._turn(text)

    async def _turn(self, text: str) -> None:
        import anyio

        from ..errors import CelldialogError

        assert self.inst is not None and self.surface is not None
        surface = self.surface
        dropped = surface.dropped.get() if surface.dropped is not None else 0
        self.done = anyio.Event()
        self.streamed, self.open_line = "", False
        self.state = _State.TURN
        try:
            await self.inst.send(surface.send, text)
        except CelldialogError as e:
            self._line(f"[red]not sent:[/] {redact(str(e))}")
            return
        if surface.dropped is not None and surface.dropped.get() > dropped:
            self._line("[yellow]ignored: a reply is already running in this session[/]")
            return
        if surface.pending.get():
            await self.done.wait()
        self._end_line()

    async def _signals(self, scope: Any, *, task_status: Any) -> None:
        """Ctrl-C: cancel the running reply, or leave (at the prompt, or a second time)."""
        import anyio

        with anyio.open_signal_receiver(signal.SIGINT) as interrupts:
            task_status.started()
            async for _ in interrupts:
                assert self.inst is not None and self.surface is not None
                if self.state is _State.TURN and self.surface.cancel is not None:
                    self.state = _State.CANCELLING
                    self._end_line()
                    self.console.print(" [yellow]reply cancelled[/] [dim](Ctrl-C at the prompt "
                                       "leaves)[/]", soft_wrap=True)
                    self.inst.stream(self.surface.cancel).send(None)
                else:
                    self._end_line()
                    self.console.print()
                    scope.cancel()

    # -- what the cells say (sinks: they run in the commit that changed the cell) ----------

    def _on_pending(self, value: Any) -> None:
        if value is False and self.done is not None:
            self.done.set()

    def _on_partial(self, value: Any) -> None:
        if self.state is not _State.TURN or not isinstance(value, str):
            return
        if value.startswith(self.streamed):
            self._text(value[len(self.streamed):])
            self.streamed = value

    def _on_messages(self, value: Any) -> None:
        history = value or []
        new, self.seen = history[self.seen:], len(history)
        for message in new:
            self._show(message)

    # -- printing ----------------------------------------------------------------------

    def _text(self, delta: str) -> None:
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

    def _line(self, markup: str) -> None:
        self._end_line()
        self.console.print(markup, soft_wrap=True)

    def _show(self, message: dict[str, Any], resumed: bool = False) -> None:
        try:
            from ..builtins.llm_dialog import ERROR_PREFIX
        except ImportError:  # pragma: no cover - the prefix moved: show errors as text
            ERROR_PREFIX = "\0"
        role = message.get("role")
        blocks = message.get("blocks") or []
        texts = "".join(b.get("text", "") for b in blocks if b.get("kind") == "text")
        if role == "user":
            if texts and resumed:
                self._line(f"[dim]you:[/] {_escape(texts)}")
            for b in blocks:
                if b.get("kind") == "tool_result":
                    content = b.get("content")
                    content = content if isinstance(content, str) else json.dumps(content)
                    style = "red" if b.get("is_error") else "dim"
                    self._line(f"[{style}]  ← {_escape(_cut(content))}[/]")
            return
        if texts.startswith(ERROR_PREFIX):
            self._line(f"[red]error:[/] {_escape(redact(texts[len(ERROR_PREFIX):].lstrip(': ')))}")
        elif texts and resumed:
            self._line(f"[dim]assistant:[/] {_escape(texts)}")
        elif texts:
            if texts.startswith(self.streamed):
                self._text(texts[len(self.streamed):])
            else:  # the final text is not what streamed: show it whole
                self._end_line()
                self._text(texts)
        self._end_line()
        self.streamed = ""
        for b in blocks:
            if b.get("kind") == "tool_use":
                args = json.dumps(b.get("input"), ensure_ascii=False)
                self._line(f"[yellow]  → {_escape(str(b.get('name')))}[/] "
                           f"[dim]{_escape(_cut(args))}[/]")


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 1] + "…"


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
