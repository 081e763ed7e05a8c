"""Driving the real ``celldialog`` console script: in a subprocess, or in a pseudo-terminal.

``Terminal`` is a small expect: the program runs with a pty as its controlling terminal
(so Ctrl-C typed as ``\\x03`` is turned into SIGINT by the terminal driver, as for a person),
and ``expect`` reads its output until a pattern appears or a deadline passes; nothing
sleeps to wait for anything.
"""

from __future__ import annotations

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

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
DEADLINE = 20.0  # seconds any single wait may take before the test fails


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
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
        self.proc = subprocess.Popen(
            [celldialog(), *args], env=dict(env), cwd=cwd, stdin=slave, stdout=slave,
            stderr=slave, start_new_session=True,
            # the pty becomes the controlling terminal: the driver sends SIGINT for ^C
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.raw = ""  # everything read, control sequences removed
        self.pos = 0  # where the next expect starts looking

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
        self.raw += ANSI.sub("", data.decode(errors="replace"))
        return True

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
