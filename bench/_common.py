"""What every benchmark script prints and times the same way: the clock (wall and CPU), the
machine's load (on a shared machine, how far to trust the figures) and the source measured."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

Span = tuple[float, float]  # (wall seconds, CPU seconds of this process)


def clock() -> Span:
    return time.perf_counter(), time.process_time()


def since(start: Span) -> Span:
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def load() -> str:
    """The machine's load average: on a shared machine, how far to trust the figures."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def source_state() -> str:
    """The commit measured, and whether runtime/ has uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "runtime"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return f"{ROOT} (not a git checkout)"
    return head[:72] + (" (+ uncommitted changes in runtime/)" if dirty else "")
