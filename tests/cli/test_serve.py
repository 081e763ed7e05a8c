"""``celldialog serve`` through the installed console script: the URL it prints, a port in
use, a bad --auth, a pattern without a dialog, Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

CLI = [sys.executable, "-m", "runtime.cli"]


@contextmanager
def serve(args: list[str], env: dict[str, str],
          cwd: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen([*CLI, "serve", "--port", "0", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving on "):
                yield line.split()[2].rstrip("/"), proc
                break
        else:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"no URL printed: {lines} {err}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_serve_prints_its_url_and_stops_on_ctrl_c(model_env: dict[str, str],
                                                  workdir: Path) -> None:
    with serve(["--store", "memory"], model_env, workdir) as (url, proc):
        assert url.startswith("http://127.0.0.1:")
        r = httpx.get(url + "/", follow_redirects=True)
        assert r.status_code == 200 and "<script" in r.text  # the page, its script linked
        r = httpx.get(url + "/", headers={"host": "evil.example"})
        assert r.status_code == 400  # not a loopback name: DNS rebinding is refused
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) in (0, 130, -signal.SIGINT)


def test_a_pattern_without_a_dialog_is_served_as_its_state(model_env: dict[str, str],
                                                           workdir: Path) -> None:
    with serve(["todo", "--store", "memory", "--args", '{"title": "Groceries"}'], model_env,
               workdir) as (url, _):
        with httpx.Client(base_url=url) as c:
            c.get("/")  # the first visit gets the cookie
            sid = c.get("/").headers["location"].removeprefix("/c/")
            with c.stream("GET", f"/api/sessions/{sid}/events") as r:
                data = next(line for line in r.iter_lines() if line.startswith("data: "))
        snapshot = json.loads(data[6:])
        assert set(snapshot["chat"].values()) == {None}
        assert "items" in snapshot["state"] and snapshot["cells"]["items"] == []


def test_a_port_in_use_is_one_line(env: dict[str, str], workdir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([*CLI, "serve", "--store", "memory", "--model", "local",
                            "--port", str(port)], env=env, cwd=workdir, capture_output=True,
                           text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_bad_auth_hook_is_one_line(env: dict[str, str], workdir: Path) -> None:
    for spec, says in (("nomodule_here:fn", "cannot load it"), ("json", "MODULE:FUNCTION"),
                       ("json:__doc__", "is not a function")):
        r = subprocess.run([*CLI, "serve", "--store", "memory", "--model", "local",
                            "--auth", spec], env=env, cwd=workdir, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr, (spec, r.stderr)


def test_the_secret_may_come_from_dotenv(model_env: dict[str, str], workdir: Path) -> None:
    from runtime.web.identity import COOKIE, CookieSigner

    secret = "a-secret-from-dotenv-" + "x" * 20
    (workdir / ".env").write_text(f"CELLDIALOG_WEB_SECRET={secret}\n")
    with serve(["--store", "memory"], model_env, workdir) as (url, _):
        cookie = httpx.get(url + "/").cookies[COOKIE]
    assert CookieSigner(secret.encode()).unsign(cookie) is not None
    assert not list(Path(model_env["XDG_DATA_HOME"]).rglob("web-secret"))  # none was made
    (workdir / ".env").write_text("CELLDIALOG_WEB_SECRET=short\n")
    r = subprocess.run([*CLI, "serve", "--store", "memory"], env=model_env, cwd=workdir,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "at least 32 bytes" in r.stderr
    assert "short" not in r.stderr and "Traceback" not in r.stderr  # never the secret
