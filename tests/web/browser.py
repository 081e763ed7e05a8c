"""The browser tests' harness: ``celldialog serve`` run for real as a subprocess against the
loopback fake OpenAI server, and Debian's chromium driven by playwright (never a downloaded
browser: ``playwright install`` is not used here).

``Served`` starts the console command (``python -m runtime.cli serve``), reads the URL it
prints, and can be stopped and started again on the same port with the same store and
environment (so the signing secret in the user data directory, and so the cookies, stay
valid). ``Page`` wraps a playwright page with what every test reads: the messages by role,
the console's errors.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Playwright
from playwright.sync_api import Page as PwPage

from tests.cli.conftest import REPO

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STARTUP = 30.0  # seconds the server may take to print its URL
STOP = 15.0  # seconds it may take to stop on SIGTERM before it is killed
WAIT_MS = 10_000  # the longest any one expectation on the page waits
SERVING = re.compile(r"^serving on (http://\S+/) \(Ctrl-C stops\)$")


def launch(pw: Playwright) -> Browser:
    """Debian's chromium, headless. Missing, it is a failure (CI installs it), not a skip."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: the browser tests drive Debian's chromium "
                    "(apt-get install chromium); never `playwright install`", pytrace=False)
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def artifacts_dir() -> Path:
    """Where artifacts are kept after the run: ``$CELLDIALOG_ARTIFACTS``, else
    ``<repo>/.artifacts``."""
    where = Path(os.environ.get("CELLDIALOG_ARTIFACTS") or REPO / ".artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


class Served:
    """``celldialog serve [PATTERN] --store sqlite:///<dir>/web.db --port N`` in a
    subprocess; ``url`` is what it printed (``http://127.0.0.1:PORT/``)."""

    def __init__(self, env: Mapping[str, str], workdir: Path, pattern: str | None = None
                 ) -> None:
        self.env = dict(env)
        self.workdir = workdir
        self.pattern = pattern
        self.store = f"sqlite:///{workdir / 'web.db'}"
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []  # every line it printed, stdout and stderr, all runs

    def start(self) -> Served:
        assert self.proc is None, "already running"
        args = [sys.executable, "-m", "runtime.cli", "serve",
                *([self.pattern] if self.pattern else []),
                "--store", self.store, "--port", str(self.port)]
        self.proc = proc = subprocess.Popen(
            args, env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        found = threading.Event()
        url: list[str] = []

        def read(stream: Any, tag: str) -> None:  # drained to the end: the pipe never fills
            for line in stream:
                line = line.rstrip("\n")
                self.output.append(f"{tag}{line}")
                m = SERVING.match(line)
                if m and not found.is_set():
                    url.append(m.group(1))
                    found.set()
            if tag == "":  # stdout closed: it exited (or is exiting)
                found.set()

        for stream, tag in ((proc.stdout, ""), (proc.stderr, "stderr: ")):
            threading.Thread(target=read, args=(stream, tag), daemon=True).start()
        if not found.wait(STARTUP) or not url:
            self.stop()
            raise AssertionError(f"celldialog serve printed no URL within {STARTUP} s; "
                                 "its output:\n" + self.log())
        self.url = url[0]
        self.port = int(self.url.rsplit(":", 1)[1].rstrip("/"))  # the same port on restart
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not stopped within ``STOP`` seconds."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP)

    def restart(self) -> None:
        """Stop it and start it again on the same port, store and environment."""
        self.stop()
        self.start()

    def log(self) -> str:
        return "\n".join(self.output)

    def __enter__(self) -> Served:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Page:
    """A tab of the served page, with what the tests read of it. Console errors and uncaught
    exceptions are collected from the moment the tab opens."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.page: PwPage = context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    # the contract's parts, by role
    @property
    def message_box(self) -> Locator:
        return self.page.get_by_role("textbox", name="Message")

    @property
    def send_button(self) -> Locator:
        return self.page.get_by_role("button", name="Send", exact=True)

    @property
    def stop_button(self) -> Locator:
        return self.page.get_by_role("button", name="Stop", exact=True)

    def messages(self, role: str | None = None) -> Locator:
        return self.page.locator(f'[data-role="{role}"]' if role else "[data-role]")

    @property
    def session(self) -> str:
        """The session id in the page's URL (``/c/<id>``)."""
        m = re.search(r"/c/([^/?#]+)", self.page.url)
        assert m, f"not a conversation's URL: {self.page.url}"
        return m.group(1)

    def say(self, text: str) -> None:
        """Type a message and click Send."""
        self.message_box.fill(text)
        self.send_button.click()

    def texts(self, role: str) -> list[str]:
        return [t.strip() for t in self.messages(role).all_text_contents()]

    def wait_text(self, expression: str, arg: Any, timeout: float = WAIT_MS) -> Any:
        """Wait (on every animation frame) until the page function ``expression(arg)``
        returns something truthy; returns it."""
        return self.page.wait_for_function(expression, arg=arg, polling="raf",
                                           timeout=timeout).json_value()


def wait_event(event: threading.Event, what: str, timeout: float = WAIT_MS / 1000) -> None:
    """Wait for a ``threading.Event`` set by the fake server, failing with ``what``."""
    assert event.wait(timeout), f"{what} did not happen within {timeout} s"
