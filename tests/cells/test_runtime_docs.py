"""The examples in docs/runtime.md and the README run as written (the quickstart twice on one
SQLite file: the second run finds the first's documents; the dialog offline)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def test_runtime_doc_examples_run() -> None:
    blocks = _blocks(ROOT / "docs" / "runtime.md")
    assert len(blocks) >= 2
    namespace: dict[str, object] = {"__name__": "docs_runtime"}
    for i, code in enumerate(blocks, 1):
        exec(compile(code, f"runtime.md python block {i}", "exec", dont_inherit=True), namespace)


def test_readme_quickstart_runs_twice(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    quickstart = _blocks(ROOT / "README.md")[0]
    for _ in range(2):
        exec(compile(quickstart, "README quickstart", "exec", dont_inherit=True),
             {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "['milk']" in out and "['milk', 'milk']" in out


def test_readme_dialog_example_runs(capsys) -> None:
    [dialog] = [b for b in _blocks(ROOT / "README.md") if "llm_dialog" in b]
    exec(compile(dialog, "README dialog", "exec", dont_inherit=True), {"__name__": "readme"})
    assert capsys.readouterr().out.strip().endswith("['milk']")
