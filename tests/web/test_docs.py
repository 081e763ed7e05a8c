"""docs/web.md's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "web.md"


def test_the_examples_build_apps(monkeypatch: pytest.MonkeyPatch) -> None:
    from starlette.applications import Starlette

    monkeypatch.setenv("CELLDIALOG_WEB_SECRET", "x" * 40)  # no secret file is written
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2
    apps = []
    for block in blocks:
        namespace: dict[str, object] = {}  # each block stands alone, as pasted
        exec(compile(block, str(DOC), "exec"), namespace)
        apps.append(namespace["app"])
    assert all(isinstance(app, Starlette) for app in apps)
    hook = namespace["from_proxy"]

    from starlette.requests import Request

    request = Request({"type": "http", "headers": [(b"x-authenticated-user", b"ada")]})
    assert hook(request) == "ada"  # type: ignore[operator]
