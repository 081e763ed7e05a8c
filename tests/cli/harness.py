"""Driving the real ``celldialog`` console script: in a subprocess, or in a pseudo-terminal.

``Terminal`` is a small expect: the program runs with a pty as its controlling terminal
(so Ctrl-C typed as ``\\x03`` is turned into SIGINT by the terminal driver, as for a person),
and ``expect`` reads its output until a pattern appears or a deadline passes; nothing
sleeps to wait for anything. ``expect`` reads the stream (control sequences removed), where
a region the program redraws (rich's ``Live``: a spinner, a reply as it grows) appears once
per redraw; ``screen()`` is what a person sees: the output played on ``Screen``, a small
terminal emulator (the cursor moves and erasures rich uses), scrollback included.
"""

from __future__ import annotations

import codecs
import fcntl
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[^\[\]]|\r")
DEADLINE = 20.0  # seconds any single wait may take before the test fails
COLUMNS, ROWS = 200, 40  # the pseudo-terminal's size


def celldialog() -> str:
    """The installed console script (``pip install -e .`` puts it beside the interpreter)."""
    beside = Path(sys.executable).with_name("celldialog")
    found = str(beside) if beside.exists() else shutil.which("celldialog")
    assert found, "the celldialog console script is not installed: pip install -e ."
    return found


def run(args: Sequence[str], env: Mapping[str, str], cwd: Path, *,
        module: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``celldialog ARGS`` (or ``python -m runtime.cli ARGS``) to completion."""
    head = [sys.executable, "-m", "runtime.cli"] if module else [celldialog()]
    return subprocess.run([*head, *args], env=dict(env), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


class Terminal:
    """``celldialog ARGS`` on a pseudo-terminal."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        # a wide terminal, so a line is never wrapped by the program
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.proc = subprocess.Popen(
            [celldialog(), *args], env=dict(env), cwd=cwd, stdin=slave, stdout=slave,
            stderr=slave, start_new_session=True,
            # the pty becomes the controlling terminal: the driver sends SIGINT for ^C
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.out = ""  # everything read, as it came
        self.raw = ""  # the same, control sequences removed
        self.pos = 0  # where the next expect starts looking
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _read(self, until: float) -> bool:
        left = until - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([self.master], [], [], left)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the program exited and the pty closed
            data = b""
        if not data:
            return False
        self.out += self._decoder.decode(data)  # a character may span two reads
        self.raw = ANSI.sub("", self.out)  # a sequence may too: strip the whole
        return True

    def screen(self) -> str:
        """What the terminal shows now, scrollback included (see ``Screen``)."""
        screen = Screen(COLUMNS)
        screen.feed(self.out)
        return screen.text()

    def expect(self, pattern: str, timeout: float = DEADLINE) -> re.Match[str]:
        """Read until ``pattern`` (a regex) appears after what earlier expects consumed."""
        regex = re.compile(pattern)
        until = time.monotonic() + timeout
        while True:
            m = regex.search(self.raw, self.pos)
            if m:
                self.pos = m.end()
                return m
            if not self._read(until):
                tail = self.raw[self.pos:][-2000:]
                raise AssertionError(f"no {pattern!r} in the output; after the last match:\n"
                                     f"{tail}")

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def line(self, text: str) -> None:
        self.send(text + "\r")

    def ctrl_c(self) -> None:
        self.send("\x03")

    def ctrl_d(self) -> None:
        self.send("\x04")

    def wait(self, timeout: float = DEADLINE) -> int:
        """The exit status, reading (and keeping) what the program still prints."""
        until = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < until:
            self._read(min(until, time.monotonic() + 0.2))
        while self._read(time.monotonic() + 0.2):
            pass
        try:
            return self.proc.wait(timeout=max(until - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"celldialog did not exit; output:\n{self.raw[-2000:]}"
                                 ) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


_CONTROL = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.")


class Screen:
    """A terminal emulator just large enough for what the chat prints: text with autowrap,
    CR, LF, backspace, cursor up/down/left/right and to a column, erase in line and in
    display; colours, cursor visibility and OSC sequences (links, titles) ignored. The
    screen has no height: every line written stays, as in a scrollback."""

    def __init__(self, columns: int = COLUMNS) -> None:
        self.columns = columns
        self.lines: list[list[str]] = [[]]
        self.row = self.col = 0
        self.pending_wrap = False  # at the last column: the next character wraps first

    def feed(self, text: str) -> None:
        pos = 0
        for m in _CONTROL.finditer(text):
            self._text(text[pos:m.start()])
            pos = m.end()
            if m.group(2):
                self._csi(m.group(1), m.group(2))
        self._text(text[pos:])

    def text(self) -> str:
        return "\n".join("".join(line).rstrip() for line in self.lines).rstrip("\n")

    def _line(self) -> list[str]:
        while len(self.lines) <= self.row:
            self.lines.append([])
        return self.lines[self.row]

    def _text(self, text: str) -> None:
        for ch in text:
            if ch == "\n":
                self.row += 1
                self.pending_wrap = False
                self._line()
            elif ch == "\r":
                self.col, self.pending_wrap = 0, False
            elif ch == "\b":
                self.col, self.pending_wrap = max(self.col - 1, 0), False
            elif ch >= " ":
                if self.pending_wrap:
                    self.row, self.col, self.pending_wrap = self.row + 1, 0, False
                line = self._line()
                line.extend(" " * (self.col + 1 - len(line)))
                line[self.col] = ch
                if self.col == self.columns - 1:
                    self.pending_wrap = True
                else:
                    self.col += 1

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?") or final in "mhl":
            return  # private modes (the cursor shown or hidden), colours
        n = int(params.split(";")[0] or 0) if params.split(";")[0].isdigit() else 0
        self.pending_wrap = False
        if final == "A":
            self.row = max(self.row - max(n, 1), 0)
        elif final == "B":
            self.row += max(n, 1)
        elif final == "C":
            self.col = min(self.col + max(n, 1), self.columns - 1)
        elif final == "D":
            self.col = max(self.col - max(n, 1), 0)
        elif final == "G":
            self.col = min(max(n, 1) - 1, self.columns - 1)
        elif final == "K":
            line = self._line()
            if n == 0:
                del line[self.col:]
            elif n == 1:
                line[: self.col + 1] = [" "] * min(self.col + 1, len(line))
            else:
                line.clear()
        elif final == "J":
            if n == 0:
                del self._line()[self.col:]
                del self.lines[self.row + 1:]
            else:
                self.lines = [[] for _ in self.lines]
