"""Real child processes for the tests that need several (a store shared by processes, a
turn owned by one and taken over by another): start one running a test module's ``main``,
and read the JSON lines it prints, each wait bounded so a silent child fails the test
instead of hanging it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0  # seconds: a bound on every wait for a child, never a pause


def start(module: str, *args: object) -> subprocess.Popen[str]:
    """``python -c "from <module> import main; main(*argv)"`` (each argument as text), with
    its stdin and stdout piped."""
    code = f"import sys; from {module} import main; main(*sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def record(proc: subprocess.Popen[str], key: str) -> dict[str, Any]:
    """The next JSON line the child prints that has ``key`` (blocking; ends if it exits)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        got = json.loads(line)
        if key in got:
            return got  # type: ignore[no-any-return]
    raise AssertionError(f"the child exited ({proc.wait()}) before printing {key!r}")


async def read(proc: subprocess.Popen[str], key: str, wait: float = WAIT) -> dict[str, Any]:
    """``record``, awaited in a thread for at most ``wait`` seconds."""
    with anyio.fail_after(wait):
        return await anyio.to_thread.run_sync(record, proc, key, abandon_on_cancel=True)


async def value(proc: subprocess.Popen[str], key: str, wait: float = WAIT) -> Any:
    """The value of ``key`` in the next line that has it."""
    return (await read(proc, key, wait))[key]


def send(proc: subprocess.Popen[str], line: str = "go") -> None:
    """A line on the child's stdin (a release it waits for)."""
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
